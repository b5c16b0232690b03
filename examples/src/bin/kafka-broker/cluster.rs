//! The logical brokers of the process, partition leaders and the KIP-1163 rack trick.
//!
//! A diskless partition has no replica on any broker: every broker can append to it and read it.
//! Metadata still names a leader per partition (clients need one to send requests to); leaders are
//! spread round-robin over the brokers, and a client whose `client.id` contains
//! `diskless_rack_id=<rack>` gets leaders in its own rack (KIP-1163's trick for clients that cannot
//! send their rack in Metadata), so that its traffic stays in its availability zone.

use uuid::Uuid;

/// One logical broker.
#[derive(Clone, Debug)]
pub struct Node {
    pub id: i32,
    pub host: String,
    pub port: i32,
    pub rack: String,
}

/// All logical brokers of the process.
#[derive(Clone, Debug)]
pub struct Cluster {
    pub nodes: Vec<Node>,
    pub cluster_id: String,
}

/// The marker KIP-1163 puts in `client.id`.
const RACK_MARKER: &str = "diskless_rack_id=";

/// The rack a client names in its `client.id` (`...diskless_rack_id=<rack>...`), if any.
pub fn client_rack(client_id: &str) -> Option<&str> {
    let start = client_id.find(RACK_MARKER)? + RACK_MARKER.len();
    let rest = &client_id[start..];
    let end = rest
        .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
        .unwrap_or(rest.len());
    let rack = &rest[..end];
    (!rack.is_empty()).then_some(rack)
}

impl Cluster {
    /// The controller announced in Metadata (CreateTopics/DeleteTopics go there; any broker would do).
    pub fn controller_id(&self) -> i32 {
        self.nodes.first().map_or(-1, |n| n.id)
    }

    /// The leader announced for a partition: round-robin from a per-topic start, within the client's
    /// rack when it names one that exists.
    pub fn leader_for(&self, topic_id: Uuid, partition: i32, client_rack: Option<&str>) -> i32 {
        let in_rack: Vec<&Node> = match client_rack {
            Some(rack) => self.nodes.iter().filter(|n| n.rack == rack).collect(),
            None => Vec::new(),
        };
        let candidates: Vec<&Node> = if in_rack.is_empty() {
            self.nodes.iter().collect()
        } else {
            in_rack
        };
        if candidates.is_empty() {
            return -1;
        }
        let start = (topic_id.as_u128() % candidates.len() as u128) as usize;
        let index = (start + usize::try_from(partition).unwrap_or(0)) % candidates.len();
        candidates[index].id
    }

    /// The replica list announced for a partition: every broker, the leader first (any broker serves a
    /// diskless partition).
    pub fn replicas(&self, leader: i32) -> Vec<i32> {
        let mut out = vec![leader];
        out.extend(self.nodes.iter().map(|n| n.id).filter(|&id| id != leader));
        out
    }

    /// The group coordinator of a group (spread by hash; the group state is shared by all brokers of
    /// the process, so any would answer).
    pub fn coordinator_for(&self, key: &str) -> Option<&Node> {
        if self.nodes.is_empty() {
            return None;
        }
        // FNV-1a: stable across runs.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in key.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        self.nodes.get((h % self.nodes.len() as u64) as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster() -> Cluster {
        Cluster {
            nodes: (1..=3)
                .map(|i| Node {
                    id: i,
                    host: "127.0.0.1".into(),
                    port: 19091 + i,
                    rack: format!("rack-{i}"),
                })
                .collect(),
            cluster_id: "c".into(),
        }
    }

    #[test]
    fn rack_is_parsed_from_client_id() {
        assert_eq!(client_rack("app diskless_rack_id=rack-2"), Some("rack-2"));
        assert_eq!(client_rack("diskless_rack_id=az1,x"), Some("az1"));
        assert_eq!(client_rack("diskless_rack_id="), None);
        assert_eq!(client_rack("rdkafka"), None);
    }

    #[test]
    fn leaders_spread_round_robin_and_follow_the_rack() {
        let c = cluster();
        let topic = Uuid::from_u128(7);
        let leaders: Vec<i32> = (0..6).map(|p| c.leader_for(topic, p, None)).collect();
        for id in 1..=3 {
            assert_eq!(leaders.iter().filter(|&&l| l == id).count(), 2);
        }
        for p in 0..6 {
            assert_eq!(c.leader_for(topic, p, Some("rack-3")), 3);
        }
        // An unknown rack falls back to all brokers.
        assert_eq!(c.leader_for(topic, 0, Some("nope")), leaders[0]);
        assert_eq!(c.replicas(2), vec![2, 1, 3]);
    }
}
