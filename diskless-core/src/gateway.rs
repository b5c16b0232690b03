//! Produce gateways (KIP-1163 `PreferredProduceBrokers`): which brokers a producer should send each
//! diskless partition's batches to, so that a broker's WAL segments mostly hold batches of one
//! coordinator shard and its commits touch one shard.
//!
//! [`plan_produce_gateways`] is a pure, deterministic function of the live brokers (with their racks)
//! and the shard of each partition. Per rack, independently:
//!
//! - shards are ordered by load (their partition count, heaviest first, ties by shard id), brokers by
//!   id;
//! - **at least as many brokers as shards**: broker `i` becomes a gateway of shard `order[i mod S]`,
//!   so every broker serves exactly one shard (its segments touch one shard) and the shards' gateway
//!   counts differ by at most one, the heavier shards getting the extra brokers;
//! - **fewer brokers than shards**: each shard gets one gateway, assigned heaviest first to the broker
//!   with the least load so far (ties: lowest id) — the longest-processing-time rule, so brokers'
//!   loads differ by at most the heaviest shard's.
//!
//! A client is told the gateways of the partition's shard in its own rack, or, if its rack has no
//! broker (or it sent none), the shard's gateways in every rack. Only an empty broker list leaves a
//! partition without a preferred broker. Old clients that ignore the field still work: any broker can
//! produce to any partition, only at a higher commit fan-out.
//!
//! ```
//! use diskless_core::gateway::{GatewayBroker, plan_produce_gateways};
//! use diskless_coordinator::TopicIdPartition;
//! use std::collections::BTreeMap;
//!
//! let brokers: Vec<GatewayBroker> = (0..6)
//!     .map(|id| GatewayBroker::new(id, Some(format!("rack-{}", id % 2))))
//!     .collect();
//! let topic = uuid::Uuid::from_u128(1);
//! let shards: BTreeMap<_, _> = (0..9).map(|p| (TopicIdPartition::new(topic, p), (p % 3) as u32)).collect();
//! let plan = plan_produce_gateways(&brokers, &shards);
//! // Three brokers per rack, three shards: each broker is the gateway of exactly one shard.
//! let p0 = TopicIdPartition::new(topic, 0);
//! let preferred = plan.preferred_produce_brokers(p0, Some("rack-1"));
//! assert_eq!(preferred.len(), 1);
//! assert_eq!(preferred[0] % 2, 1); // a broker of rack-1
//! assert_eq!(plan.shards_of_broker(preferred[0]), vec![0]);
//! ```

use diskless_coordinator::{ShardId, TopicIdPartition};
use std::collections::{BTreeMap, BTreeSet};

/// A live broker as the gateway plan sees it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GatewayBroker {
    /// The broker id.
    pub broker_id: i32,
    /// Its rack (`broker.rack`), if any. Brokers without a rack form one group of their own.
    pub rack: Option<String>,
}

impl GatewayBroker {
    /// A broker.
    pub fn new(broker_id: i32, rack: Option<String>) -> Self {
        GatewayBroker { broker_id, rack }
    }
}

/// The gateways chosen by [`plan_produce_gateways`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GatewayPlan {
    /// shard → rack → gateway broker ids (ascending).
    gateways: BTreeMap<ShardId, BTreeMap<Option<String>, Vec<i32>>>,
    partition_shards: BTreeMap<TopicIdPartition, ShardId>,
}

impl GatewayPlan {
    /// The gateways of `shard` in `rack` (empty if the rack has no broker or the shard no partition).
    pub fn gateways(&self, shard: ShardId, rack: Option<&str>) -> &[i32] {
        self.gateways
            .get(&shard)
            .and_then(|racks| racks.get(&rack.map(str::to_string)))
            .map_or(&[], Vec::as_slice)
    }

    /// The brokers a client in `client_rack` should produce `partition` to, best first: the
    /// partition's shard's gateways in the client's rack, or else in every rack (by rack, then id).
    /// Empty only for an unknown partition or when there are no brokers.
    pub fn preferred_produce_brokers(
        &self,
        partition: TopicIdPartition,
        client_rack: Option<&str>,
    ) -> Vec<i32> {
        let Some(shard) = self.partition_shards.get(&partition) else {
            return Vec::new();
        };
        let Some(racks) = self.gateways.get(shard) else {
            return Vec::new();
        };
        if let Some(rack) = client_rack
            && let Some(local) = racks.get(&Some(rack.to_string()))
            && !local.is_empty()
        {
            return local.clone();
        }
        racks.values().flatten().copied().collect()
    }

    /// The shards `broker_id` is a gateway of (ascending).
    pub fn shards_of_broker(&self, broker_id: i32) -> Vec<ShardId> {
        self.gateways
            .iter()
            .filter(|(_, racks)| racks.values().any(|b| b.contains(&broker_id)))
            .map(|(s, _)| *s)
            .collect()
    }
}

/// Chooses per (shard, rack) the gateway broker(s); see the [module docs](self). Deterministic: the
/// order of `brokers` does not matter, and duplicates are ignored.
pub fn plan_produce_gateways(
    brokers: &[GatewayBroker],
    partition_shards: &BTreeMap<TopicIdPartition, ShardId>,
) -> GatewayPlan {
    let mut weights: BTreeMap<ShardId, u64> = BTreeMap::new();
    for shard in partition_shards.values() {
        *weights.entry(*shard).or_default() += 1;
    }
    // Heaviest first, ties by shard id.
    let mut order: Vec<(ShardId, u64)> = weights.into_iter().collect();
    order.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));

    let mut racks: BTreeMap<Option<String>, BTreeSet<i32>> = BTreeMap::new();
    let mut seen = BTreeSet::new();
    let mut sorted: Vec<&GatewayBroker> = brokers.iter().collect();
    sorted.sort();
    for b in sorted {
        // A broker id listed twice (with different racks) counts once, in its first rack by order.
        if seen.insert(b.broker_id) {
            racks.entry(b.rack.clone()).or_default().insert(b.broker_id);
        }
    }

    let mut gateways: BTreeMap<ShardId, BTreeMap<Option<String>, Vec<i32>>> = BTreeMap::new();
    if !order.is_empty() {
        for (rack, ids) in racks {
            let ids: Vec<i32> = ids.into_iter().collect();
            let mut add = |shard: ShardId, broker: i32| {
                gateways
                    .entry(shard)
                    .or_default()
                    .entry(rack.clone())
                    .or_default()
                    .push(broker);
            };
            if ids.len() >= order.len() {
                for (i, broker) in ids.iter().enumerate() {
                    add(order[i % order.len()].0, *broker);
                }
            } else {
                let mut load = vec![0u64; ids.len()];
                for (shard, weight) in &order {
                    let (i, _) = load
                        .iter()
                        .enumerate()
                        .min_by_key(|(i, l)| (**l, *i))
                        .unwrap_or((0, &0));
                    load[i] += weight;
                    add(*shard, ids[i]);
                }
            }
        }
        for racks in gateways.values_mut() {
            for ids in racks.values_mut() {
                ids.sort_unstable();
            }
        }
    }
    GatewayPlan {
        gateways,
        partition_shards: partition_shards.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn partitions(shards: &[u32]) -> BTreeMap<TopicIdPartition, ShardId> {
        let topic = uuid::Uuid::from_u128(9);
        shards
            .iter()
            .enumerate()
            .map(|(p, s)| (TopicIdPartition::new(topic, p as i32), *s))
            .collect()
    }

    #[test]
    fn kip_scenario_three_racks_three_brokers_twelve_shards() {
        // KIP-1164 scenario 1: 3 racks with one broker each, 12 shards: each broker is the gateway
        // of all 12 shards in its rack.
        let brokers: Vec<_> = (0..3)
            .map(|i| GatewayBroker::new(i, Some(format!("r{i}"))))
            .collect();
        let shards: Vec<u32> = (0..12).collect();
        let plan = plan_produce_gateways(&brokers, &partitions(&shards));
        for b in 0..3 {
            assert_eq!(plan.shards_of_broker(b).len(), 12);
        }
        for s in 0..12 {
            assert_eq!(plan.gateways(s, Some("r1")), &[1]);
        }
    }

    #[test]
    fn more_brokers_than_shards_gives_one_shard_per_broker() {
        let brokers: Vec<_> = (0..7).map(|i| GatewayBroker::new(i, None)).collect();
        // Shard 1 is the heaviest and gets the extra broker.
        let plan = plan_produce_gateways(&brokers, &partitions(&[0, 1, 1, 2]));
        for b in 0..7 {
            assert_eq!(plan.shards_of_broker(b).len(), 1);
        }
        assert_eq!(plan.gateways(1, None).len(), 3);
        assert_eq!(plan.gateways(0, None).len(), 2);
        assert_eq!(plan.gateways(2, None).len(), 2);
    }

    #[test]
    fn client_in_a_rack_without_brokers_gets_every_rack() {
        let brokers = vec![
            GatewayBroker::new(1, Some("a".into())),
            GatewayBroker::new(2, Some("b".into())),
        ];
        let p = partitions(&[0]);
        let plan = plan_produce_gateways(&brokers, &p);
        let first = *p.keys().next().unwrap();
        assert_eq!(plan.preferred_produce_brokers(first, Some("a")), vec![1]);
        assert_eq!(
            plan.preferred_produce_brokers(first, Some("zzz")),
            vec![1, 2]
        );
        assert_eq!(plan.preferred_produce_brokers(first, None), vec![1, 2]);
        let unknown = TopicIdPartition::new(uuid::Uuid::from_u128(77), 0);
        assert!(plan.preferred_produce_brokers(unknown, None).is_empty());
        assert!(
            plan_produce_gateways(&[], &p)
                .preferred_produce_brokers(first, None)
                .is_empty()
        );
    }

    fn inputs() -> impl Strategy<Value = (Vec<GatewayBroker>, Vec<u32>)> {
        let broker = (0i32..40, prop::option::of(0u8..4))
            .prop_map(|(id, rack)| GatewayBroker::new(id, rack.map(|r| format!("rack-{r}"))));
        (
            prop::collection::vec(broker, 0..20),
            prop::collection::vec(0u32..8, 0..60),
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        #[test]
        fn every_partition_gets_a_broker_in_the_clients_rack_when_one_exists(
            (brokers, shards) in inputs(), client_rack in prop::option::of(0u8..5),
        ) {
            let p = partitions(&shards);
            let plan = plan_produce_gateways(&brokers, &p);
            let client_rack = client_rack.map(|r| format!("rack-{r}"));
            let live: BTreeSet<i32> = brokers.iter().map(|b| b.broker_id).collect();
            // The rack each broker id counts in (the first by the plan's ordering).
            let mut sorted = brokers.clone();
            sorted.sort();
            let mut rack_of: BTreeMap<i32, Option<String>> = BTreeMap::new();
            for b in &sorted {
                rack_of.entry(b.broker_id).or_insert(b.rack.clone());
            }
            let rack_has_broker = client_rack.is_some()
                && rack_of.values().any(|r| *r == client_rack);
            for partition in p.keys() {
                let preferred = plan.preferred_produce_brokers(*partition, client_rack.as_deref());
                prop_assert_eq!(preferred.is_empty(), live.is_empty());
                for b in &preferred {
                    prop_assert!(live.contains(b));
                    if rack_has_broker {
                        prop_assert_eq!(&rack_of[b], &client_rack);
                    }
                }
            }
        }

        #[test]
        fn load_is_spread_evenly_within_each_rack((brokers, shards) in inputs()) {
            let p = partitions(&shards);
            let plan = plan_produce_gateways(&brokers, &p);
            let mut weight: BTreeMap<u32, u64> = BTreeMap::new();
            for s in &shards {
                *weight.entry(*s).or_default() += 1;
            }
            let heaviest = weight.values().copied().max().unwrap_or(0);
            let mut sorted = brokers.clone();
            sorted.sort();
            let mut racks: BTreeMap<Option<String>, BTreeSet<i32>> = BTreeMap::new();
            let mut seen = BTreeSet::new();
            for b in &sorted {
                if seen.insert(b.broker_id) {
                    racks.entry(b.rack.clone()).or_default().insert(b.broker_id);
                }
            }
            for (rack, ids) in &racks {
                if weight.is_empty() {
                    break;
                }
                // Every shard has a gateway in every rack.
                for s in weight.keys() {
                    prop_assert!(!plan.gateways(*s, rack.as_deref()).is_empty());
                }
                let loads: Vec<u64> = ids
                    .iter()
                    .map(|b| {
                        plan.shards_of_broker(*b)
                            .iter()
                            .map(|s| weight[s])
                            .sum()
                    })
                    .collect();
                if ids.len() >= weight.len() {
                    // One shard per broker; gateway counts per shard differ by at most one.
                    for b in ids {
                        prop_assert_eq!(plan.shards_of_broker(*b).len(), 1);
                    }
                    let counts: Vec<usize> = weight
                        .keys()
                        .map(|s| plan.gateways(*s, rack.as_deref()).len())
                        .collect();
                    let (min, max) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
                    prop_assert!(max - min <= 1);
                } else {
                    for s in weight.keys() {
                        prop_assert_eq!(plan.gateways(*s, rack.as_deref()).len(), 1);
                    }
                    let (min, max) = (loads.iter().min().unwrap(), loads.iter().max().unwrap());
                    prop_assert!(max - min <= heaviest, "loads {:?}", loads);
                }
            }
        }

        #[test]
        fn deterministic_whatever_the_broker_order((brokers, shards) in inputs(), seed in any::<u64>()) {
            let p = partitions(&shards);
            let mut shuffled = brokers.clone();
            let mut rng = seed;
            for i in (1..shuffled.len()).rev() {
                rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                shuffled.swap(i, (rng >> 33) as usize % (i + 1));
            }
            prop_assert_eq!(plan_produce_gateways(&brokers, &p), plan_produce_gateways(&shuffled, &p));
        }
    }
}
