//! The writer's metrics, seen by a test recorder: each operation emits each of its series exactly
//! once (issue 16), and the storage and coordinator wrappers the host applies agree with them.
//!
//! One `#[test]` with a thread-local recorder (`metrics::with_local_recorder`) around a
//! current-thread runtime, so every task of the writer records into it and nothing else does.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use diskless_common::metrics as m;
use diskless_coordinator::{
    BatchCoordinator, CoordinatorMetrics, CreateTopicRequest, ErrorCode, ManualClock,
    MeteredCoordinator, TopicConfig, TopicIdPartition,
};
use diskless_core::{ProducePartition, RecordBatchBuilder, SealPolicy, WalWriter, WalWriterConfig};
use diskless_storage::{MeteredStorage, ObjectStorage, ObjectStoreStorage};
use diskless_testkit::coordinator::{CommitFaults, InMemoryCoordinator};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use metrics_util::{CompositeKey, MetricKind};

const NOW: i64 = 1_750_000_000_000;

/// A series: its kind, name and sorted labels.
type Series = (MetricKind, String, Vec<(String, String)>);

fn series(key: &CompositeKey) -> Series {
    let mut labels: Vec<(String, String)> = key
        .key()
        .labels()
        .map(|l| (l.key().to_string(), l.value().to_string()))
        .collect();
    labels.sort();
    (key.kind(), key.key().name().to_string(), labels)
}

struct Seen(BTreeMap<Series, DebugValue>);

impl Seen {
    fn get(&self, kind: MetricKind, name: &str, labels: &[(&str, &str)]) -> Option<&DebugValue> {
        let mut labels: Vec<(String, String)> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        labels.sort();
        self.0.get(&(kind, name.to_string(), labels))
    }

    /// The values a histogram recorded (empty if it never was).
    fn histogram(&self, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
        match self.get(MetricKind::Histogram, name, labels) {
            Some(DebugValue::Histogram(values)) => values.iter().map(|v| v.into_inner()).collect(),
            None => Vec::new(),
            other => panic!("{name} is not a histogram: {other:?}"),
        }
    }

    fn counter(&self, name: &str, labels: &[(&str, &str)]) -> Option<u64> {
        match self.get(MetricKind::Counter, name, labels) {
            Some(DebugValue::Counter(v)) => Some(*v),
            None => None,
            other => panic!("{name} is not a counter: {other:?}"),
        }
    }

    fn gauge(&self, name: &str) -> Option<f64> {
        match self.get(MetricKind::Gauge, name, &[]) {
            Some(DebugValue::Gauge(v)) => Some(v.into_inner()),
            None => None,
            other => panic!("{name} is not a gauge: {other:?}"),
        }
    }

    /// Every series whose name starts with `prefix`.
    fn names(&self, prefix: &str) -> Vec<&Series> {
        self.0.keys().filter(|s| s.1.starts_with(prefix)).collect()
    }
}

/// What one run of the writer produced, for the assertions.
struct Run {
    /// Bytes of the valid batches produced.
    batch_bytes: u64,
    /// Bytes the writer uploaded (`WriterStats::bytes_uploaded`).
    bytes_uploaded: u64,
}

/// Produces `SEGMENTS` segments of `PER_SEGMENT` requests (one partition, one batch each) and
/// one request with a corrupt batch; then a segment whose commit the coordinator refuses.
const SEGMENTS: usize = 3;
const PER_SEGMENT: usize = 2;

async fn run() -> Run {
    let clock = ManualClock::new(NOW);
    let inner: Arc<dyn BatchCoordinator> = Arc::new(InMemoryCoordinator::new(clock.clone()));
    let faulty = CommitFaults::wrap(inner);
    let coordinator = Arc::new(MeteredCoordinator::new(faulty.clone(), CoordinatorMetrics));
    let storage: Arc<dyn ObjectStorage> = Arc::new(ObjectStoreStorage::in_memory());
    let storage = Arc::new(MeteredStorage::new(storage));

    let topic_id = uuid::Uuid::from_u128(16);
    coordinator
        .create_topic(CreateTopicRequest {
            topic_id,
            name: "t".into(),
            partitions: 1,
            config: TopicConfig::default(),
        })
        .await
        .unwrap();
    let partition = TopicIdPartition::new(topic_id, 0);
    let config = Arc::new(TopicConfig::default());
    let writer = WalWriter::builder(storage.clone(), coordinator.clone())
        .with_clock(clock.clone())
        .with_seed(16)
        // Seals only when told to (flush), so that the segments are exactly the ones below.
        .with_config(
            WalWriterConfig::default()
                .with_seal_policy(SealPolicy::Interval)
                .with_commit_interval(Duration::from_secs(3600)),
        )
        .build()
        .unwrap();
    let request = |i: usize| {
        let batch = RecordBatchBuilder::new()
            .record(NOW, None, Some(format!("value-{i}").as_bytes()))
            .build()
            .unwrap();
        ProducePartition::new(partition, config.clone(), batch.into_bytes())
    };

    let mut batch_bytes = 0u64;
    let mut pending = Vec::new();
    for s in 0..SEGMENTS {
        for r in 0..PER_SEGMENT {
            let p = request(s * PER_SEGMENT + r);
            batch_bytes += p.records.len() as u64;
            pending.push(writer.append(vec![p]).await);
        }
        writer.flush().await;
    }
    for answer in futures::future::join_all(pending).await {
        assert_eq!(answer[0].error, ErrorCode::None, "{answer:?}");
    }

    // A corrupt batch: refused at validation, never buffered.
    let mut corrupt = request(100).records.to_vec();
    let last = corrupt.len() - 1;
    corrupt[last] ^= 0xff;
    let refused = writer
        .produce(vec![ProducePartition::new(
            partition,
            config.clone(),
            corrupt.into(),
        )])
        .await;
    assert_ne!(refused[0].error, ErrorCode::None);

    // A segment whose commit certainly did not apply: answered with an error, its object deleted.
    faulty.fail_next_commits(1);
    let p = request(200);
    batch_bytes += p.records.len() as u64;
    let failed = writer.append(vec![p]).await;
    writer.flush().await;
    assert_ne!(failed.await[0].error, ErrorCode::None);

    let bytes_uploaded = writer.stats().bytes_uploaded;
    writer.close().await;
    Run {
        batch_bytes,
        bytes_uploaded,
    }
}

#[test]
fn each_operation_emits_each_of_its_series_once() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let result = metrics::with_local_recorder(&recorder, || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(run())
    });
    let seen = Seen(
        snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .map(|(key, _, _, value)| (series(&key), value))
            .collect(),
    );

    let ok = [(m::OUTCOME, m::OK)];
    let error = [(m::OUTCOME, m::ERROR)];
    let valid_requests = SEGMENTS * PER_SEGMENT;
    let uploaded_segments = SEGMENTS + 1;

    // One latency per request: the valid ones ok; the corrupt one and the refused commit's error.
    assert_eq!(
        seen.histogram(m::PRODUCE_SECONDS, &ok).len(),
        valid_requests
    );
    assert_eq!(seen.histogram(m::PRODUCE_SECONDS, &error).len(), 2);
    // Bytes of every batch accepted into the buffer (the corrupt one never was).
    assert_eq!(
        seen.counter(m::PRODUCE_BYTES, &[]),
        Some(result.batch_bytes)
    );

    // One size and one batch count per sealed segment.
    let sizes = seen.histogram(m::SEGMENT_BYTES, &[]);
    assert_eq!(sizes.len(), uploaded_segments);
    assert_eq!(sizes.iter().sum::<f64>() as u64, result.bytes_uploaded);
    let mut batches = seen.histogram(m::SEGMENT_BATCHES, &[]);
    batches.sort_by(f64::total_cmp);
    assert_eq!(batches, [1.0, 2.0, 2.0, 2.0]);

    // One upload per segment, one commit call per uploaded segment.
    assert_eq!(
        seen.histogram(m::UPLOAD_SECONDS, &ok).len(),
        uploaded_segments
    );
    assert!(seen.histogram(m::UPLOAD_SECONDS, &error).is_empty());
    assert_eq!(seen.histogram(m::COMMIT_SECONDS, &ok).len(), SEGMENTS);
    assert_eq!(seen.histogram(m::COMMIT_SECONDS, &error).len(), 1);

    // The wrappers see the same operations: one commit_file call per commit, one PUT per upload
    // (its bytes the segments'), one DELETE for the refused segment's object.
    let commit_file = |outcome| [(m::OP, "commit_file"), (m::OUTCOME, outcome)];
    assert_eq!(
        seen.histogram(m::COORDINATOR_SECONDS, &commit_file(m::OK))
            .len(),
        SEGMENTS
    );
    assert_eq!(
        seen.histogram(m::COORDINATOR_SECONDS, &commit_file(m::ERROR))
            .len(),
        1
    );
    let put = [(m::OP, "put"), (m::OUTCOME, m::OK)];
    assert_eq!(
        seen.counter(m::STORAGE_REQUESTS, &put),
        Some(uploaded_segments as u64)
    );
    assert_eq!(
        seen.counter(m::STORAGE_BYTES, &[(m::OP, "put")]),
        Some(result.bytes_uploaded)
    );
    // `close` waited for the background delete, so it is counted.
    assert_eq!(
        seen.counter(
            m::STORAGE_REQUESTS,
            &[(m::OP, "delete"), (m::OUTCOME, m::OK)]
        ),
        Some(1)
    );

    // The gauges moved, and are back to zero once the writer is closed.
    for gauge in [
        m::WRITER_BUFFERED_BYTES,
        m::WRITER_PENDING_BYTES,
        m::WRITER_UNCOMMITTED_BYTES,
        m::WRITER_SEGMENTS_IN_FLIGHT,
    ] {
        assert_eq!(seen.gauge(gauge), Some(0.0), "{gauge}");
    }

    // Nothing else under the writer's names (no series with unexpected labels).
    let writer_series: Vec<_> = seen
        .names("diskless_")
        .into_iter()
        .filter(|s| {
            !s.1.starts_with("diskless_coordinator") && !s.1.starts_with("diskless_storage")
        })
        .map(|s| (s.1.clone(), s.2.clone()))
        .collect();
    assert_eq!(writer_series.len(), 12, "{writer_series:#?}");
}
