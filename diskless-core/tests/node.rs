//! `DisklessNode`, the one composition point: what it builds from one config, which workers it
//! starts for which coordinator capabilities, and what it refuses.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use diskless_coordinator::*;
use diskless_core::*;
use diskless_storage::ObjectStoreStorage;
use diskless_testkit::coordinator::{InMemoryCoordinator, OnlyCapabilities};

const T0: i64 = 1_700_000_000_000;

async fn topic(c: &dyn BatchCoordinator) -> TopicIdPartition {
    let topic_id = uuid::Uuid::from_u128(0x5eed);
    c.create_topic(CreateTopicRequest {
        topic_id,
        name: "node".into(),
        partitions: 1,
        config: TopicConfig::default(),
    })
    .await
    .unwrap();
    TopicIdPartition::new(topic_id, 0)
}

fn records(value: &str) -> bytes::Bytes {
    RecordBatchBuilder::new()
        .record(T0, None, Some(value.as_bytes()))
        .build()
        .unwrap()
        .as_bytes()
        .clone()
}

/// With defaults: one writer per broker id, produce through any of them and read through the
/// fetcher; the cache block size set once is the fetcher's; every standard worker runs against a
/// coordinator serving every capability (orphan collectors on the writers' and the segments'
/// prefixes); `close` answers and stops everything.
#[tokio::test(start_paused = true)]
async fn one_config_builds_writers_fetcher_and_the_standard_workers() {
    let clock = ManualClock::new(T0);
    let model = Arc::new(InMemoryCoordinator::new(clock.clone()));
    let p = topic(model.as_ref()).await;
    let node = DisklessNode::builder(Arc::new(ObjectStoreStorage::in_memory()), model)
        .with_clock(clock)
        .with_config(
            NodeConfig::default()
                .with_broker_ids(vec![1, 2])
                .with_cache_block_size(64 << 10),
        )
        .build()
        .unwrap();
    assert_eq!(
        node.writers().keys().copied().collect::<Vec<_>>(),
        vec![1, 2]
    );
    assert_eq!(node.fetcher().config().cache_block_size, 64 << 10);
    for (id, value) in [(1, "one"), (2, "two")] {
        let answer = node
            .writer(id)
            .unwrap()
            .produce(vec![ProducePartition::new(
                p,
                Arc::new(TopicConfig::default()),
                records(value),
            )])
            .await;
        assert_eq!(answer[0].error, ErrorCode::None, "{answer:?}");
    }
    let fetched = node
        .fetcher()
        .fetch(
            &[FetchPartition {
                partition: p,
                fetch_offset: 0,
                partition_max_bytes: 1 << 20,
                leader_epoch: 0,
                isolation: Default::default(),
            }],
            1 << 20,
        )
        .await
        .unwrap();
    assert_eq!(fetched[0].high_watermark, 2);
    let stats = node.lifecycle_stats().expect("workers run").clone();
    assert!(stats.orphans_on("wal").is_some());
    assert!(stats.orphans_on("tiered").is_some());
    tokio::time::sleep(Duration::from_secs(301)).await;
    assert!(stats.retention.passes() >= 1, "retention ran");
    assert!(stats.tiering.passes() >= 1, "tiering ran");
    node.close().await;
}

/// Workers of a capability the coordinator does not serve are not started: a coordinator of the
/// log alone gets none, one without tiering gets no tiering worker and no segment collector, one
/// with tiering but without lifecycle no tiering worker.
#[tokio::test(start_paused = true)]
async fn workers_follow_the_coordinators_capabilities() {
    let clock = ManualClock::new(T0);
    let build = |capabilities: Capabilities| {
        let coordinator: Arc<dyn BatchCoordinator> = Arc::new(Layered::new(
            Arc::new(InMemoryCoordinator::new(clock.clone())),
            OnlyCapabilities(capabilities),
        ));
        DisklessNode::builder(Arc::new(ObjectStoreStorage::in_memory()), coordinator)
            .with_clock(clock.clone())
            .build()
            .unwrap()
    };
    let log_only = build(Capabilities::LOG);
    assert!(log_only.lifecycle_stats().is_none());
    assert_eq!(log_only.coordinator().capabilities(), Capabilities::LOG);
    log_only.close().await;

    let no_tiering = build(Capabilities::ALL.without(Capability::Tiering));
    let stats = no_tiering.lifecycle_stats().unwrap().clone();
    assert!(stats.orphans_on("wal").is_some());
    assert!(stats.orphans_on("tiered").is_none());
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert_eq!(stats.tiering.passes(), 0);
    no_tiering.close().await;

    // Tiering without lifecycle: the segments it could not register would never be collected
    // and the WAL bytes it moved never deleted, so it is not started either.
    let tiering_alone = build(Capabilities::LOG.with(Capability::Tiering));
    assert!(tiering_alone.lifecycle_stats().is_none());
    tiering_alone.close().await;
}

/// Settings are checked before anything starts: no broker id, a broker id twice, or an invalid
/// part's setting (named by the part's own check) are refused.
#[tokio::test]
async fn invalid_settings_are_refused() {
    let build = |config: NodeConfig| {
        DisklessNode::builder(
            Arc::new(ObjectStoreStorage::in_memory()),
            Arc::new(InMemoryCoordinator::new(ManualClock::new(T0))),
        )
        .with_config(config)
        .build()
    };
    for (config, field) in [
        (NodeConfig::default().with_broker_ids(vec![]), "broker_ids"),
        (
            NodeConfig::default().with_broker_ids(vec![3, 3]),
            "broker_ids",
        ),
        (
            NodeConfig::default().with_cache_block_size(0),
            "cache_block_size",
        ),
    ] {
        let e = build(config).unwrap_err();
        assert!(e.to_string().contains(field), "{e}");
    }
    // A zero interval is the lifecycle runner's refusal.
    let e = build(NodeConfig::default().with_lifecycle(
        NodeLifecycleConfig::default().with_retention_interval(Some(Duration::ZERO)),
    ))
    .unwrap_err();
    assert!(e.to_string().contains("retention"), "{e}");
}

/// Outside a tokio runtime the build is refused (nothing can be spawned), not a panic.
#[test]
fn building_outside_a_runtime_is_refused() {
    let built = DisklessNode::builder(
        Arc::new(ObjectStoreStorage::in_memory()),
        Arc::new(InMemoryCoordinator::new(ManualClock::new(T0))),
    )
    .build();
    assert!(matches!(built, Err(ConfigError::NoRuntime)), "{built:?}");
}
