//! The logical brokers of the process, partition leaders and the KIP-1163 rack trick.
//!
//! A diskless partition has no replica on any broker: every broker can append to it and read it.
//! Metadata still names a leader per partition (clients need one to send requests to); leaders are
//! spread round-robin over the brokers, and a client whose `client.id` contains
//! `diskless_rack_id=<rack>` gets leaders in its own rack (KIP-1163's trick for clients that cannot
//! send their rack in Metadata), so that its traffic stays in its availability zone.
//!
//! With a sharded coordinator (`--shards N`), leaders come from the produce-gateway plan instead
//! ([`GatewayLeaders`]): the leader of a partition is a gateway of its shard, so that each broker's
//! WAL segments mostly hold batches of one shard and its commits touch one shard.

use std::collections::{BTreeMap, BTreeSet};

use diskless_coordinator::TopicIdPartition;
use diskless_coordinator::sharded::Placements;
use diskless_core::gateway::{GatewayBroker, GatewayPlan, plan_produce_gateways};
use uuid::Uuid;

/// One logical broker.
#[derive(Clone, Debug)]
pub(crate) struct Node {
    pub id: i32,
    pub host: String,
    pub port: i32,
    pub rack: String,
}

/// All logical brokers of the process.
#[derive(Clone, Debug)]
pub(crate) struct Cluster {
    pub nodes: Vec<Node>,
    pub cluster_id: String,
}

/// The marker KIP-1163 puts in `client.id`.
const RACK_MARKER: &str = "diskless_rack_id=";

/// The rack a client names in its `client.id` (`...diskless_rack_id=<rack>...`), if any.
pub(crate) fn client_rack(client_id: &str) -> Option<&str> {
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
    pub(crate) fn controller_id(&self) -> i32 {
        self.nodes.first().map_or(-1, |n| n.id)
    }

    /// The leader announced for a partition: round-robin from a per-topic start, within the client's
    /// rack when it names one that exists.
    pub(crate) fn leader_for(
        &self,
        topic_id: Uuid,
        partition: i32,
        client_rack: Option<&str>,
    ) -> i32 {
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
    pub(crate) fn replicas(&self, leader: i32) -> Vec<i32> {
        let mut out = vec![leader];
        out.extend(self.nodes.iter().map(|n| n.id).filter(|&id| id != leader));
        out
    }

    /// The group coordinator of a group (spread by hash; the group state is shared by all brokers of
    /// the process, so any would answer).
    pub(crate) fn coordinator_for(&self, key: &str) -> Option<&Node> {
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

/// Partition leaders chosen with [`plan_produce_gateways`] (KIP-1163 produce gateways), for a
/// sharded coordinator. Built from the brokers (with their racks) and the stored placement of every
/// topic; a pure function of both, so every broker of every restart announces the same leaders.
///
/// The leader of partition `p` of shard `s` for a client in rack `r`:
/// - the rack: `r` if some broker is in it; otherwise (no rack given, or an unknown one) the `s mod
///   n`-th of the `n` racks (sorted by name), so that a rack-less client still sends each shard's
///   partitions to one place, and different shards to different racks;
/// - the broker: the `k mod g`-th of the `g` gateways of `s` in that rack (ascending ids), where `k`
///   is `p`'s rank among the partitions of its topic on shard `s`. With one gateway per shard and
///   rack (as many brokers per rack as shards or fewer) all partitions of a shard go to the same
///   broker; with more, they are spread over brokers that each serve that shard alone.
#[derive(Debug)]
pub(crate) struct GatewayLeaders {
    plan: GatewayPlan,
    placements: Placements,
    /// The racks that have brokers, sorted.
    racks: Vec<String>,
}

impl GatewayLeaders {
    /// The plan for `nodes` and `placements` (every topic's shard per partition).
    pub(crate) fn new(nodes: &[Node], placements: Placements) -> Self {
        let brokers: Vec<GatewayBroker> = nodes
            .iter()
            .map(|n| GatewayBroker::new(n.id, Some(n.rack.clone())))
            .collect();
        let mut shards = BTreeMap::new();
        for (topic, placement) in &placements {
            for (p, shard) in placement.iter().enumerate() {
                if let Ok(p) = i32::try_from(p) {
                    shards.insert(TopicIdPartition::new(*topic, p), *shard);
                }
            }
        }
        let racks: BTreeSet<String> = nodes.iter().map(|n| n.rack.clone()).collect();
        GatewayLeaders {
            plan: plan_produce_gateways(&brokers, &shards),
            placements,
            racks: racks.into_iter().collect(),
        }
    }

    /// Whether this plan was built from `placements`.
    pub(crate) fn is_for(&self, placements: &Placements) -> bool {
        self.placements == *placements
    }

    /// The leader of every partition `0..partitions` of `topic_id` for a client in `client_rack`;
    /// `None` if the topic has no stored placement of that size (the caller falls back to the
    /// unsharded spreading).
    pub(crate) fn leaders(
        &self,
        topic_id: Uuid,
        partitions: i32,
        client_rack: Option<&str>,
    ) -> Option<Vec<i32>> {
        let placement = self.placements.get(&topic_id)?;
        if usize::try_from(partitions).ok()? != placement.len() || self.racks.is_empty() {
            return None;
        }
        let client_rack = client_rack.filter(|r| self.racks.iter().any(|x| x == r));
        let mut rank: BTreeMap<u32, usize> = BTreeMap::new();
        placement
            .iter()
            .map(|&shard| {
                let k = rank.entry(shard).or_default();
                let this = *k;
                *k += 1;
                let rack = match client_rack {
                    Some(r) => r,
                    None => self.racks[shard as usize % self.racks.len()].as_str(),
                };
                let gateways = self.plan.gateways(shard, Some(rack));
                (!gateways.is_empty()).then(|| gateways[this % gateways.len()])
            })
            .collect()
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

    fn nodes(racks: &[&str]) -> Vec<Node> {
        racks
            .iter()
            .enumerate()
            .map(|(i, r)| Node {
                id: i as i32 + 1,
                host: "127.0.0.1".into(),
                port: 19092 + i as i32,
                rack: r.to_string(),
            })
            .collect()
    }

    fn placements(topics: &[(u128, &[u32])]) -> Placements {
        topics
            .iter()
            .map(|(id, shards)| (Uuid::from_u128(*id), shards.to_vec().into()))
            .collect()
    }

    /// Partition → shard of one topic, and the leaders a client gets for it.
    fn by_shard(shards: &[u32], leaders: &[i32]) -> BTreeMap<u32, BTreeSet<i32>> {
        let mut out: BTreeMap<u32, BTreeSet<i32>> = BTreeMap::new();
        for (s, l) in shards.iter().zip(leaders) {
            out.entry(*s).or_default().insert(*l);
        }
        out
    }

    #[test]
    fn gateway_leaders_one_broker_per_rack_serves_every_shard_of_its_rack() {
        let n = nodes(&["rack-1", "rack-2", "rack-3"]);
        let shards = [0, 1, 2, 0, 1, 2, 0, 1, 2];
        let g = GatewayLeaders::new(&n, placements(&[(7, &shards)]));
        let topic = Uuid::from_u128(7);
        for (rack, id) in [("rack-1", 1), ("rack-2", 2), ("rack-3", 3)] {
            assert_eq!(g.leaders(topic, 9, Some(rack)).unwrap(), vec![id; 9]);
        }
        // Without a rack (or with an unknown one): each shard's partitions on one broker, the three
        // shards on three brokers.
        let leaders = g.leaders(topic, 9, None).unwrap();
        let per_shard = by_shard(&shards, &leaders);
        assert!(per_shard.values().all(|l| l.len() == 1), "{per_shard:?}");
        let all: BTreeSet<i32> = per_shard.values().flatten().copied().collect();
        assert_eq!(all.len(), 3);
        assert_eq!(g.leaders(topic, 9, Some("elsewhere")).unwrap(), leaders);
    }

    #[test]
    fn gateway_leaders_keep_a_shard_on_one_broker_of_the_clients_rack() {
        // Two racks of three brokers, three shards: in each rack every broker is the gateway of one
        // shard.
        let n = nodes(&["a", "b", "a", "b", "a", "b"]);
        let t1 = [0, 1, 2, 0, 1, 2, 0, 1];
        let t2 = [2, 0, 1, 2];
        let g = GatewayLeaders::new(&n, placements(&[(1, &t1), (2, &t2)]));
        let rack_of = |id: i32| n.iter().find(|x| x.id == id).unwrap().rack.clone();
        for rack in ["a", "b"] {
            let mut shard_broker: BTreeMap<u32, i32> = BTreeMap::new();
            for (topic, shards) in [(1u128, &t1[..]), (2, &t2[..])] {
                let leaders = g
                    .leaders(Uuid::from_u128(topic), shards.len() as i32, Some(rack))
                    .unwrap();
                for (s, l) in shards.iter().zip(&leaders) {
                    assert_eq!(rack_of(*l), rack, "leader {l} is not in rack {rack}");
                    // Every partition of a shard, in every topic, goes to the same broker.
                    assert_eq!(*shard_broker.entry(*s).or_insert(*l), *l, "shard {s}");
                }
            }
            let brokers: BTreeSet<i32> = shard_broker.values().copied().collect();
            assert_eq!(brokers.len(), 3, "one broker per shard in rack {rack}");
        }
    }

    #[test]
    fn gateway_leaders_spread_a_shard_over_its_own_gateways() {
        // One rack, four brokers, two shards: two gateways per shard, each serving that shard alone.
        let n = nodes(&["r", "r", "r", "r"]);
        let shards = [0, 1, 0, 1, 0, 1, 0, 1];
        let g = GatewayLeaders::new(&n, placements(&[(3, &shards)]));
        let leaders = g.leaders(Uuid::from_u128(3), 8, Some("r")).unwrap();
        let per_shard = by_shard(&shards, &leaders);
        assert_eq!(per_shard[&0].len(), 2);
        assert_eq!(per_shard[&1].len(), 2);
        assert!(per_shard[&0].is_disjoint(&per_shard[&1]));
    }

    #[test]
    fn gateway_leaders_are_deterministic_and_fall_back_when_unknown() {
        let shards = [0, 1, 2, 3, 0, 1];
        let p = placements(&[(5, &shards)]);
        let n = nodes(&["x", "y", "x", "z", "y"]);
        let mut reversed = n.clone();
        reversed.reverse();
        let a = GatewayLeaders::new(&n, p.clone());
        let b = GatewayLeaders::new(&reversed, p.clone());
        assert!(a.is_for(&p) && !a.is_for(&Placements::new()));
        let topic = Uuid::from_u128(5);
        for rack in [None, Some("x"), Some("y"), Some("z"), Some("w")] {
            assert_eq!(a.leaders(topic, 6, rack), b.leaders(topic, 6, rack));
            assert_eq!(a.leaders(topic, 6, rack), a.leaders(topic, 6, rack));
            if let Some(r) = rack.filter(|r| *r != "w") {
                for l in a.leaders(topic, 6, rack).unwrap() {
                    assert_eq!(n[(l - 1) as usize].rack, r);
                }
            }
        }
        assert_eq!(a.leaders(Uuid::from_u128(6), 6, None), None);
        assert_eq!(a.leaders(topic, 7, None), None);
        assert_eq!(GatewayLeaders::new(&[], p).leaders(topic, 6, None), None);
    }
}
