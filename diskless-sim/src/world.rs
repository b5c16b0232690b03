//! The simulated cluster: brokers, producers, consumers, lifecycle workers, the fault schedule,
//! the periodic checks and the final checks.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use diskless_coordinator::{
    BatchCoordinator, Clock, CreateTopicRequest, DeleteRecordsRequest, EARLIEST_TIMESTAMP,
    ErrorCode, FindBatchesRequest, LATEST_TIMESTAMP, Layered, ListOffsetsRequest, TimestampType,
    TopicConfig, TopicIdPartition,
};
use diskless_core::lifecycle::{
    ObjectCleaner, OrphanCollector, ProducerExpirer, RetentionEnforcer,
};
use diskless_core::{
    Compression, FetchPartition, Fetcher, ListOffsetsPartition, PartitionResponse,
    ProducePartition, RecordBatch, RecordBatchBuilder, WalWriter, split_batches,
};
use diskless_storage::{ObjectKey, ObjectStorage, SeededKeys};
use diskless_testkit::storage::FaultyStorage;
use futures::StreamExt;
use parking_lot::Mutex;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep};
use uuid::Uuid;

use crate::cache::SimCache;
use crate::clock::SimClock;
use crate::oracle::{
    ACKED_READABLE, BOUNDS, BatchId, CONSUMER, Fail, LSO, OBJECTS, OFFSETS, Oracle, ReadOrder,
    SETUP, Sent, TIERED, record_value,
};
use crate::params::{PREFIX, Params, TIERED_PREFIX, TopicPlan, rng_for};
use crate::sync::{Flag, Stall};
use crate::trace::Trace;
use crate::wrappers::{
    CommitStalls, FaultyCommits, Gate, GatedCoordinator, GatedStorage, LandedAt, LinkStall,
    PhaseStorage,
};
use crate::{Components, SimConfig, SimReport, SimStats, Violation};

/// The partition leader epoch readers ask to be served with.
const LEADER_EPOCH: i32 = 7;
/// Byte limits of the final scan and the checker's coordinate reads.
const ALL_BYTES: u32 = 1 << 30;

/// Phases of a run.
const FAULTY: u8 = 0;
const CALM: u8 = 1;
const QUIET: u8 = 2;
const DONE: u8 = 3;

macro_rules! ev {
    ($world:expr, $($arg:tt)*) => {
        $world.event(format_args!($($arg)*))
    };
}

mod tiering;
mod txn;

/// One broker incarnation.
struct Node {
    id: usize,
    incarnation: u64,
    writer: WalWriter,
    fetcher: Fetcher,
    cache: Arc<SimCache>,
    /// This broker's commits stall on their way to the coordinator while it is on.
    link: Arc<Stall>,
    gate: Arc<Gate>,
    crashed: Flag,
    outstanding: AtomicUsize,
}

/// A produce request a writer has not answered yet.
struct Outstanding {
    node: usize,
    incarnation: u64,
    started: Instant,
    deadline: Instant,
    partition: TopicIdPartition,
}

struct TopicRt {
    name: String,
    config: Arc<TopicConfig>,
    partitions: i32,
    deleted: bool,
}

/// One producer: a partition, and an idempotent identity or none.
#[derive(Clone)]
struct ProducerSpec {
    index: u32,
    partition: TopicIdPartition,
    config: Arc<TopicConfig>,
    producer_id: Option<i64>,
    skew_ms: i64,
    compression: Compression,
}

enum Delivery {
    /// Acknowledged; `retried`: after more than one attempt (an earlier one may still land).
    Acked {
        retried: bool,
    },
    GaveUp,
    Failed(ErrorCode),
    TopicGone,
}

pub(crate) struct World {
    config: SimConfig,
    label: String,
    p: Params,
    clock: Arc<SimClock>,
    trace: Arc<Mutex<Trace>>,
    /// The shared storage as stored (no faults), for checks.
    raw_storage: Arc<dyn ObjectStorage>,
    /// The storage every actor uses (faulty, then calm).
    storage: Arc<PhaseStorage>,
    /// The coordinator as built (for checks); its commits may carry shard faults.
    raw: Arc<dyn BatchCoordinator>,
    /// The coordinator every actor uses.
    faulty: Arc<FaultyCommits>,
    shard_faults: Vec<Arc<FaultyCommits>>,
    slots: Vec<Mutex<Option<Arc<Node>>>>,
    incarnations: AtomicU64,
    topics: Mutex<BTreeMap<Uuid, TopicRt>>,
    oracle: Mutex<Oracle>,
    requests: Mutex<BTreeMap<u64, Outstanding>>,
    next_request: AtomicU64,
    next_producer: AtomicU32,
    next_consumer: AtomicU64,
    next_producer_id: AtomicI64,
    next_topic: AtomicU64,
    phase: AtomicU8,
    failed: Flag,
    violation: Mutex<Option<(&'static str, String, i64)>>,
    stats: Mutex<SimStats>,
    stall_used_ms: AtomicU64,
    lifecycle_clock: Arc<SimClock>,
    collector: Mutex<Arc<OrphanCollector>>,
    producers: Mutex<Vec<JoinHandle<()>>>,
    consumers: Mutex<Vec<JoinHandle<()>>>,
    closes: Mutex<Vec<JoinHandle<()>>>,
    /// The components' own faults stop here.
    calm_hook: Mutex<Option<Box<dyn FnOnce() + Send>>>,
    /// The fake transaction coordinator and the run's transaction settings.
    tc: Mutex<txn::Tc>,
    txn: txn::TxnParams,
    /// Every producer has returned (nothing is produced any more).
    producers_done: Flag,
    /// Every WAL batch was consolidated in the quiet period.
    drained: Flag,
    /// The tiering worker's host and its incarnations.
    tier_host: Mutex<Option<Arc<tiering::TierHost>>>,
    tier_incarnations: AtomicU64,
    /// The orphan collector of segment keys.
    tiered_collector: Mutex<Option<Arc<OrphanCollector>>>,
    /// Batch bytes fetchers served from tiered segments (`FETCH_TIERED_BYTES`).
    tiered_bytes: Arc<AtomicU64>,
}

impl World {
    fn event(&self, what: std::fmt::Arguments<'_>) {
        let at = self.clock.elapsed_ms();
        self.trace.lock().event(at, what);
    }

    fn fail(&self, (invariant, message): Fail) {
        let at = self.clock.elapsed_ms();
        let mut v = self.violation.lock();
        if v.is_none() {
            self.trace
                .lock()
                .event(at, format_args!("VIOLATION {invariant}: {message}"));
            *v = Some((invariant, message, at));
            self.failed.set();
        }
    }

    fn failed(&self) -> bool {
        self.violation.lock().is_some()
    }

    fn phase(&self) -> u8 {
        self.phase.load(Ordering::SeqCst)
    }

    fn rng(&self, what: &str, index: u64) -> fastrand::Rng {
        rng_for(self.config.seed, what, index)
    }

    fn stat(&self, f: impl FnOnce(&mut SimStats)) {
        f(&mut self.stats.lock());
    }

    fn up_nodes(&self) -> Vec<Arc<Node>> {
        self.slots.iter().filter_map(|s| s.lock().clone()).collect()
    }

    fn pick_node(&self, rng: &mut fastrand::Rng, avoid: Option<usize>) -> Option<Arc<Node>> {
        let mut up = self.up_nodes();
        if up.len() > 1 {
            up.retain(|n| Some(n.id) != avoid);
        }
        if up.is_empty() {
            return None;
        }
        let i = rng.usize(0..up.len());
        Some(up.swap_remove(i))
    }

    fn topic_live(&self, topic: Uuid) -> bool {
        self.topics.lock().get(&topic).is_some_and(|t| !t.deleted)
    }

    fn live_partitions(&self) -> Vec<TopicIdPartition> {
        self.topics
            .lock()
            .iter()
            .filter(|(_, t)| !t.deleted)
            .flat_map(|(id, t)| (0..t.partitions).map(move |i| TopicIdPartition::new(*id, i)))
            .collect()
    }

    /// Waits until virtual time `at_ms` since the start, or a violation.
    async fn wait_until(&self, at_ms: i64) -> bool {
        let left = at_ms.saturating_sub(self.clock.elapsed_ms()).max(0);
        tokio::select! {
            biased;
            _ = self.failed.wait() => false,
            _ = sleep(Duration::from_millis(left as u64)) => !self.failed(),
        }
    }

    // ---------------------------------------------------------------------------------------
    // Brokers

    fn start_node(self: &Arc<Self>, id: usize) -> Option<Arc<Node>> {
        let incarnation = self.incarnations.fetch_add(1, Ordering::SeqCst);
        let mut rng = self.rng("node", incarnation);
        let skew = if self.p.max_skew_ms > 0 {
            rng.i64(-self.p.max_skew_ms..=self.p.max_skew_ms)
        } else {
            0
        };
        let clock = self.clock.skewed(skew);
        let gate = Gate::new();
        let storage: Arc<dyn ObjectStorage> = Arc::new(GatedStorage {
            gate: gate.clone(),
            inner: self.storage.clone(),
        });
        let link = Arc::new(Stall::default());
        let coordinator: Arc<dyn BatchCoordinator> = Arc::new(Layered::new(
            self.faulty.clone(),
            GatedCoordinator {
                gate: gate.clone(),
                link: Some(LinkStall {
                    stall: link.clone(),
                    coordinator: self.faulty.clone(),
                }),
            },
        ));
        let cache = Arc::new(SimCache::new(self.p.cache_capacity));
        let writer = WalWriter::builder(storage.clone(), coordinator.clone())
            .with_config(
                self.p
                    .writer
                    .clone()
                    .with_broker_id(i32::try_from(id).unwrap_or(i32::MAX)),
            )
            .with_cache(cache.clone())
            .with_clock(clock)
            .with_keys(Arc::new(SeededKeys::new(rng.u64(..))))
            .build();
        let writer = match writer {
            Ok(w) => w,
            Err(e) => {
                self.fail((SETUP, format!("writer of broker {id}: {e}")));
                return None;
            }
        };
        let fetcher = match Fetcher::builder(storage, coordinator)
            .with_config(self.p.fetcher.clone())
            .with_cache(cache.clone())
            .build()
        {
            Ok(f) => f,
            Err(e) => {
                self.fail((SETUP, format!("fetcher of broker {id}: {e}")));
                return None;
            }
        };
        ev!(
            self,
            "broker {id} up (incarnation {incarnation}, skew {skew} ms)"
        );
        Some(Arc::new(Node {
            id,
            incarnation,
            writer,
            fetcher,
            cache,
            link,
            gate,
            crashed: Flag::default(),
            outstanding: AtomicUsize::new(0),
        }))
    }

    fn restart(self: &Arc<Self>, id: usize) {
        if self.slots[id].lock().is_some() {
            return;
        }
        if let Some(node) = self.start_node(id) {
            *self.slots[id].lock() = Some(node);
        }
    }

    /// Kills broker `id`: its gate closes, its requests' clients are disconnected, its writer is
    /// closed in the background (it must return in bounded time) and its cache is gone.
    fn crash(self: &Arc<Self>, id: usize) {
        let Some(node) = self.slots[id].lock().take() else {
            return;
        };
        node.gate.close();
        node.crashed.set();
        let ahead = node.outstanding.load(Ordering::SeqCst);
        let bound = self.p.answer_bound(ahead);
        ev!(
            self,
            "broker {id} crashed (incarnation {}, {ahead} requests unanswered)",
            node.incarnation
        );
        self.stat(|s| s.crashes += 1);
        let world = self.clone();
        let close = tokio::spawn(async move {
            let started = Instant::now();
            if tokio::time::timeout(bound, node.writer.close())
                .await
                .is_err()
            {
                world.fail((
                    BOUNDS,
                    format!(
                        "close() of crashed broker {} (incarnation {}) did not return within {bound:?}",
                        node.id, node.incarnation
                    ),
                ));
            } else {
                ev!(
                    world,
                    "broker {} incarnation {} closed after {} ms",
                    node.id,
                    node.incarnation,
                    started.elapsed().as_millis()
                );
            }
        });
        self.closes.lock().push(close);
    }

    // ---------------------------------------------------------------------------------------
    // Topics

    async fn create_topic(self: &Arc<Self>, plan: &TopicPlan) -> Option<Uuid> {
        let n = self.next_topic.fetch_add(1, Ordering::SeqCst);
        let topic_id = Uuid::from_u64_pair(self.config.seed, n + 1);
        let request = CreateTopicRequest {
            topic_id,
            name: plan.name.clone(),
            partitions: plan.partitions,
            config: plan.config.clone(),
        };
        if let Err(e) = self.raw.create_topic(request).await {
            self.fail((SETUP, format!("create topic {}: {e}", plan.name)));
            return None;
        }
        ev!(
            self,
            "topic {} created as {topic_id} ({} partitions)",
            plan.name,
            plan.partitions
        );
        self.topics.lock().insert(
            topic_id,
            TopicRt {
                name: plan.name.clone(),
                config: Arc::new(plan.config.clone()),
                partitions: plan.partitions,
                deleted: false,
            },
        );
        let mut oracle = self.oracle.lock();
        for i in 0..plan.partitions {
            oracle.add_partition(TopicIdPartition::new(topic_id, i));
        }
        Some(topic_id)
    }

    /// Starts the producers and the consumer of every partition of a topic.
    fn start_clients(self: &Arc<Self>, topic_id: Uuid) {
        let Some((config, partitions)) = self
            .topics
            .lock()
            .get(&topic_id)
            .map(|t| (t.config.clone(), t.partitions))
        else {
            return;
        };
        let mut rng = self.rng("clients", topic_id.as_u64_pair().1);
        for i in 0..partitions {
            let partition = TopicIdPartition::new(topic_id, i);
            let (lo, hi) = self.p.producers_per_partition;
            for _ in 0..rng.u32(lo..=hi) {
                let index = self.next_producer.fetch_add(1, Ordering::SeqCst);
                let producer_id = (rng.f64() < self.p.idempotent_share)
                    .then(|| self.next_producer_id.fetch_add(1, Ordering::SeqCst));
                let skew_ms = if self.p.max_skew_ms > 0 {
                    rng.i64(-self.p.max_skew_ms..=self.p.max_skew_ms)
                } else {
                    0
                };
                let compression = match rng.u8(0..10) {
                    0 => Compression::Gzip,
                    1 => Compression::Snappy,
                    2 => Compression::Lz4,
                    3 => Compression::Zstd,
                    _ => Compression::None,
                };
                let spec = ProducerSpec {
                    index,
                    partition,
                    config: config.clone(),
                    producer_id,
                    skew_ms,
                    compression,
                };
                let world = self.clone();
                self.producers
                    .lock()
                    .push(tokio::spawn(async move { world.producer(spec).await }));
            }
            let world = self.clone();
            let index = self.next_consumer.fetch_add(1, Ordering::SeqCst);
            self.consumers.lock().push(tokio::spawn(async move {
                world.consumer(partition, index).await
            }));
            let world = self.clone();
            let index = self.next_consumer.fetch_add(1, Ordering::SeqCst);
            self.consumers.lock().push(tokio::spawn(async move {
                world.rc_consumer(partition, index).await
            }));
        }
    }

    // ---------------------------------------------------------------------------------------
    // Producers

    async fn producer(self: Arc<Self>, spec: ProducerSpec) {
        let mut rng = self.rng("producer", u64::from(spec.index));
        let mut idle = self.rng("producer idle", u64::from(spec.index));
        let clock = self.clock.skewed(spec.skew_ms);
        let mut epoch: i16 = 0;
        let mut sequence: i32 = 0;
        let mut batch_no: u32 = 0;
        loop {
            sleep(Duration::from_millis(
                rng.u64(self.p.think.0..=self.p.think.1),
            ))
            .await;
            // Now and then a long pause (producer-id expiry may forget the producer meanwhile).
            if rng.u32(0..200) == 0 {
                sleep(Duration::from_millis(rng.u64(10_000..=60_000))).await;
            }
            if self.phase() >= QUIET || self.failed() || !self.topic_live(spec.partition.topic_id) {
                return;
            }
            batch_no += 1;
            let id: BatchId = (spec.index, batch_no);
            let records = rng.usize(1..=5);
            let now = clock.now_ms();
            let mut builder = RecordBatchBuilder::new().compression(spec.compression);
            if let Some(pid) = spec.producer_id {
                builder = builder.producer(pid, epoch, sequence);
            }
            for r in 0..records {
                let key = rng.bool().then(|| format!("k{}", rng.u32(0..100)));
                // Now and then a record larger than the writer's whole buffer (or memory bound).
                let pad = if rng.u32(0..60) == 0 {
                    rng.usize(2_000..=20_000)
                } else {
                    rng.usize(0..=120)
                };
                let value = record_value(id, r, pad);
                builder = builder.record(
                    now + r as i64,
                    key.as_deref().map(str::as_bytes),
                    Some(&value),
                );
            }
            let bytes = match builder.build() {
                Ok(b) => b.into_bytes(),
                Err(e) => {
                    self.fail((SETUP, format!("building a batch: {e}")));
                    return;
                }
            };
            self.oracle.lock().sent.insert(
                id,
                Sent {
                    partition: spec.partition,
                    bytes: bytes.clone(),
                    idempotent: spec.producer_id.is_some(),
                    log_append_time: spec.config.timestamp_type == TimestampType::LogAppendTime,
                    acked: None,
                    seen_at: BTreeSet::new(),
                    txn: None,
                },
            );
            self.stat(|s| s.batches_sent += 1);
            if rng.u32(0..50) == 0 {
                self.send_corrupt(&spec, &mut rng, &bytes).await;
            }
            let delivery = self
                .deliver(&spec, &mut rng, id, bytes, epoch, sequence, None)
                .await;
            match delivery {
                Delivery::Acked { retried } => {
                    sequence = diskless_core::increment_sequence(sequence, records as i32);
                    // A producer may fall idle right after a batch that took a retry, while an
                    // earlier attempt of it is still stalled on its way to the coordinator: the
                    // case producer expiry must not forget the producer in (issue #25). From a
                    // generator of its own, so the producer's other draws stay as they were.
                    if retried && idle.u32(0..2) == 0 {
                        let most = self.p.max_commit_age + self.p.max_commit_stall;
                        let pause = Duration::from_millis(idle.u64(1..=most.as_millis() as u64));
                        ev!(
                            self,
                            "producer {} idle for {pause:?} after a retried batch",
                            id.0
                        );
                        // In steps, so that the idle producer stops with the produce phase.
                        let until = Instant::now() + pause;
                        while Instant::now() < until && self.phase() < QUIET && !self.failed() {
                            sleep((until - Instant::now()).min(Duration::from_secs(1))).await;
                        }
                    }
                }
                Delivery::GaveUp | Delivery::Failed(_) => {
                    if let Delivery::Failed(code) = &delivery {
                        ev!(self, "producer {} batch {} failed: {code:?}", id.0, id.1);
                    }
                    // KIP-360: an idempotent producer that lost track of a batch bumps its epoch
                    // and starts its sequence over.
                    if spec.producer_id.is_some() {
                        epoch = epoch.saturating_add(1);
                        sequence = 0;
                    }
                }
                Delivery::TopicGone => return,
            }
        }
    }

    /// Sends a copy of `bytes` with one byte of its records flipped: its CRC no longer matches, and
    /// no broker may accept it (Kafka answers `CORRUPT_MESSAGE`).
    async fn send_corrupt(
        self: &Arc<Self>,
        spec: &ProducerSpec,
        rng: &mut fastrand::Rng,
        bytes: &Bytes,
    ) {
        let Some(node) = self.pick_node(rng, None) else {
            return;
        };
        let mut corrupt = bytes.to_vec();
        if let Some(last) = corrupt.last_mut() {
            *last ^= 0x5a;
        }
        let answer = self.submit(&node, spec, Bytes::from(corrupt), None);
        let answer = tokio::select! {
            biased;
            a = answer => a.ok().flatten(),
            _ = node.crashed.wait() => None,
            _ = sleep(self.p.request_timeout) => None,
        };
        if let Some(a) = answer {
            ev!(
                self,
                "producer {} sent a corrupt batch to broker {}: {:?}",
                spec.index,
                node.id,
                a.error
            );
            self.stat(|s| s.corrupt_sent += 1);
            if a.error.is_ok() {
                self.fail((
                    ACKED_READABLE,
                    format!(
                        "broker {} acknowledged a batch whose CRC does not match at offset {}",
                        node.id, a.base_offset
                    ),
                ));
            }
        }
    }

    /// Sends one batch until it is acknowledged, fails for good, or its delivery timeout passes;
    /// after a timeout or a disconnection the next attempt goes to another broker. A transactional
    /// batch carries the transaction it was verified for (`txn_seq`) on every attempt.
    #[allow(clippy::too_many_arguments)]
    async fn deliver(
        self: &Arc<Self>,
        spec: &ProducerSpec,
        rng: &mut fastrand::Rng,
        id: BatchId,
        bytes: Bytes,
        epoch: i16,
        sequence: i32,
        txn_seq: Option<i64>,
    ) -> Delivery {
        let started = Instant::now();
        let mut avoid = None;
        let mut attempt = 0u32;
        loop {
            let elapsed = started.elapsed();
            if elapsed >= self.p.delivery_timeout {
                ev!(
                    self,
                    "producer {} batch {} given up after {attempt} attempts",
                    id.0,
                    id.1
                );
                self.stat(|s| s.given_up += 1);
                return Delivery::GaveUp;
            }
            if self.failed() {
                return Delivery::TopicGone;
            }
            if !self.topic_live(spec.partition.topic_id) {
                return Delivery::TopicGone;
            }
            let Some(node) = self.pick_node(rng, avoid) else {
                sleep(self.p.retry_backoff).await;
                continue;
            };
            attempt += 1;
            self.stat(|s| s.produce_requests += 1);
            let answer = self.submit(&node, spec, bytes.clone(), txn_seq);
            let wait = self
                .p
                .request_timeout
                .min(self.p.delivery_timeout - elapsed);
            let outcome = tokio::select! {
                biased;
                a = answer => Some(a.ok().flatten()),
                _ = node.crashed.wait() => None,
                _ = sleep(wait) => Some(None),
            };
            let Some(answer) = outcome else {
                ev!(
                    self,
                    "producer {} batch {} attempt {attempt} at broker {}: disconnected",
                    id.0,
                    id.1,
                    node.id
                );
                avoid = Some(node.id);
                sleep(self.p.retry_backoff).await;
                continue;
            };
            let Some(answer) = answer else {
                ev!(
                    self,
                    "producer {} batch {} attempt {attempt} at broker {}: client timeout",
                    id.0,
                    id.1,
                    node.id
                );
                self.stat(|s| s.client_timeouts += 1);
                avoid = Some(node.id);
                continue;
            };
            ev!(
                self,
                "producer {} batch {} (epoch {epoch} seq {sequence}) attempt {attempt} at broker {}: {:?} offset {} lat {}",
                id.0,
                id.1,
                node.id,
                answer.error,
                answer.base_offset,
                answer.log_append_time
            );
            match answer.error {
                ErrorCode::None => {
                    let result =
                        self.oracle
                            .lock()
                            .ack(id, answer.base_offset, answer.log_append_time);
                    if let Err(f) = result {
                        self.fail(f);
                    }
                    self.stat(|s| s.acked += 1);
                    return Delivery::Acked {
                        retried: attempt > 1,
                    };
                }
                ErrorCode::UnknownTopicOrPartition if !self.topic_live(spec.partition.topic_id) => {
                    return Delivery::TopicGone;
                }
                ErrorCode::OutOfOrderSequenceNumber | ErrorCode::InvalidProducerEpoch => {
                    self.stat(|s| s.producer_fenced += 1);
                    return Delivery::Failed(answer.error);
                }
                code if code.is_retriable() => {
                    let fenced = answer
                        .error_message
                        .as_deref()
                        .is_some_and(|m| m.contains("fenced"));
                    self.stat(|s| {
                        s.retriable_errors += 1;
                        s.fenced_commits += u64::from(fenced);
                    });
                    sleep(self.p.retry_backoff).await;
                }
                code => {
                    self.stat(|s| s.failed += 1);
                    return Delivery::Failed(code);
                }
            }
        }
    }

    /// The broker side of a produce request: runs to its end whatever the client does, and
    /// checks that the writer answers within its bound.
    fn submit(
        self: &Arc<Self>,
        node: &Arc<Node>,
        spec: &ProducerSpec,
        records: Bytes,
        txn_seq: Option<i64>,
    ) -> oneshot::Receiver<Option<PartitionResponse>> {
        let (tx, rx) = oneshot::channel();
        let request = self.next_request.fetch_add(1, Ordering::SeqCst);
        let ahead = node.outstanding.fetch_add(1, Ordering::SeqCst);
        let started = Instant::now();
        self.requests.lock().insert(
            request,
            Outstanding {
                node: node.id,
                incarnation: node.incarnation,
                started,
                deadline: started + self.p.answer_bound(ahead),
                partition: spec.partition,
            },
        );
        let world = self.clone();
        let node = node.clone();
        let partition = ProducePartition {
            partition: spec.partition,
            config: spec.config.clone(),
            records,
            txn_seq,
        };
        tokio::spawn(async move {
            let answers = node.writer.produce(vec![partition]).await;
            node.outstanding.fetch_sub(1, Ordering::SeqCst);
            let done = world.requests.lock().remove(&request);
            if let Some(o) = done
                && Instant::now() > o.deadline
            {
                world.fail((
                    BOUNDS,
                    format!(
                        "broker {} answered a produce request to {} after {} ms, bound {} ms",
                        o.node,
                        o.partition,
                        o.started.elapsed().as_millis(),
                        (o.deadline - o.started).as_millis()
                    ),
                ));
            }
            if answers.len() != 1 {
                world.fail((
                    BOUNDS,
                    format!(
                        "a produce request of one partition got {} answers",
                        answers.len()
                    ),
                ));
            }
            let _ = tx.send(answers.into_iter().next());
        });
        rx
    }

    // ---------------------------------------------------------------------------------------
    // Consumers

    async fn consumer(self: Arc<Self>, partition: TopicIdPartition, index: u64) {
        let mut rng = self.rng("consumer", index);
        let mut position = 0i64;
        let mut jumped = true;
        let mut order = ReadOrder::default();
        let mut last_hw = -1i64;
        let max_bytes = rng.u32(200..=20_000);
        loop {
            if self.failed() || self.phase() == DONE || !self.topic_live(partition.topic_id) {
                return;
            }
            if self.phase() == QUIET && position >= last_hw && last_hw >= 0 {
                ev!(self, "consumer of {partition} caught up at {position}");
                return;
            }
            sleep(Duration::from_millis(
                rng.u64(self.p.poll.0..=self.p.poll.1),
            ))
            .await;
            let Some(node) = self.pick_node(&mut rng, None) else {
                continue;
            };
            let (floors, stable_floor) = {
                let oracle = self.oracle.lock();
                (oracle.floors(partition), oracle.stable_floor(partition))
            };
            self.stat(|s| s.fetches += 1);
            let request = FetchPartition {
                partition,
                fetch_offset: position,
                partition_max_bytes: max_bytes,
                leader_epoch: LEADER_EPOCH,
                isolation: Default::default(),
            };
            let answer = match node
                .fetcher
                .fetch(&[request], max_bytes.saturating_mul(2))
                .await
            {
                Ok(mut v) if v.len() == 1 => v.remove(0),
                Ok(v) => {
                    self.fail((
                        CONSUMER,
                        format!("a fetch of one partition got {} answers", v.len()),
                    ));
                    return;
                }
                Err(e) => {
                    ev!(
                        self,
                        "consumer {partition} fetch at {position} via broker {}: {e}",
                        node.id
                    );
                    continue;
                }
            };
            if !self.topic_live(partition.topic_id) {
                return;
            }
            match answer.error {
                ErrorCode::None => {}
                ErrorCode::OffsetOutOfRange => {
                    self.stat(|s| s.out_of_range += 1);
                    let listed = node
                        .fetcher
                        .list_offsets(&[ListOffsetsPartition {
                            partition,
                            timestamp: EARLIEST_TIMESTAMP,
                            leader_epoch: LEADER_EPOCH,
                            isolation: Default::default(),
                        }])
                        .await;
                    let start = match listed.as_deref() {
                        Ok([one]) if one.error.is_ok() => one.offset,
                        _ => continue,
                    };
                    ev!(
                        self,
                        "consumer {partition} out of range at {position}, log start {start}"
                    );
                    if start > position {
                        position = start;
                        jumped = true;
                    }
                    continue;
                }
                code => {
                    ev!(
                        self,
                        "consumer {partition} fetch at {position} via broker {}: {code:?}",
                        node.id
                    );
                    self.stat(|s| s.fetch_errors += 1);
                    continue;
                }
            }
            let observed = self.oracle.lock().observe(
                partition,
                answer.high_watermark,
                answer.log_start_offset,
                floors,
                "fetch",
            );
            let observed = observed.and_then(|()| {
                self.oracle.lock().observe_stable(
                    partition,
                    answer.last_stable_offset,
                    answer.high_watermark,
                    answer.log_start_offset,
                    stable_floor,
                    "fetch",
                )
            });
            if let Err(f) = observed {
                self.fail(f);
                return;
            }
            last_hw = answer.high_watermark;
            let batches = match split_batches(answer.records_bytes()) {
                Ok(b) => b,
                Err(e) => {
                    self.fail((
                        CONSUMER,
                        format!("fetch of {partition} at {position}: records do not frame: {e}"),
                    ));
                    return;
                }
            };
            ev!(
                self,
                "consumer {partition} fetched {} batches at {position} via broker {} (hw {}, lso {})",
                batches.len(),
                node.id,
                answer.high_watermark,
                answer.log_start_offset
            );
            for batch in batches {
                if let Err(f) =
                    self.consume(partition, &batch, &mut position, &mut jumped, &mut order)
                {
                    self.fail(f);
                    return;
                }
            }
        }
    }

    /// Checks one served batch against the consumer's position and the oracle.
    fn consume(
        &self,
        partition: TopicIdPartition,
        batch: &RecordBatch,
        position: &mut i64,
        jumped: &mut bool,
        order: &mut ReadOrder,
    ) -> Result<(), Fail> {
        let (base, last) = (batch.base_offset(), batch.last_offset());
        let contiguous = if *jumped {
            base <= *position && *position <= last
        } else {
            base == *position
        };
        if !contiguous {
            let invariant = if base < *position { CONSUMER } else { OFFSETS };
            return Err((
                invariant,
                format!(
                    "consumer of {partition} at {position} (after a jump: {jumped}) was served {base}..={last}"
                ),
            ));
        }
        let mut oracle = self.oracle.lock();
        if batch.attributes().is_control() {
            oracle.served_marker(partition, batch, LEADER_EPOCH, "consumer")?;
        } else {
            let id = oracle.served(partition, batch, LEADER_EPOCH, "consumer")?;
            order.check(&oracle, id, CONSUMER)?;
        }
        drop(oracle);
        *position = last + 1;
        *jumped = false;
        self.stat(|s| s.batches_consumed += 1);
        Ok(())
    }

    // ---------------------------------------------------------------------------------------
    // Workload and faults

    async fn delete_records_loop(self: Arc<Self>) {
        let mut rng = self.rng("delete-records", 0);
        let (lo, hi) = self.p.delete_records_every;
        while self.phase() < QUIET && !self.failed() {
            sleep(Duration::from_millis(rng.u64(lo..=hi))).await;
            let parts = self.live_partitions();
            if parts.is_empty() || self.phase() >= QUIET {
                continue;
            }
            let p = parts[rng.usize(0..parts.len())];
            let Some((lso, hw)) = self.watermarks(p).await else {
                continue;
            };
            let offset = if rng.u8(0..4) == 0 {
                -1
            } else {
                rng.i64(lso..=hw)
            };
            match self
                .faulty
                .delete_records(&[DeleteRecordsRequest {
                    partition: p,
                    offset,
                }])
                .await
            {
                Ok(answers) => {
                    if let Some(a) = answers.first() {
                        ev!(
                            self,
                            "delete records {p} to {offset}: {:?} low watermark {}",
                            a.error,
                            a.low_watermark
                        );
                        if a.error.is_ok() {
                            self.oracle.lock().log_start_moved(p, a.low_watermark);
                            self.stat(|s| s.delete_records += 1);
                        }
                    }
                }
                Err(e) => ev!(self, "delete records {p}: {e}"),
            }
        }
    }

    /// Deletes one topic during the faulty phase and creates another with the same name.
    async fn delete_topic_once(self: Arc<Self>) {
        let mut rng = self.rng("delete-topic", 0);
        let at = rng.u64(5_000..=self.p.fault_phase.as_millis() as u64);
        if !self.wait_until(at as i64).await {
            return;
        }
        let live: Vec<(Uuid, String)> = self
            .topics
            .lock()
            .iter()
            .filter(|(_, t)| !t.deleted)
            .map(|(id, t)| (*id, t.name.clone()))
            .collect();
        if live.is_empty() {
            return;
        }
        let (topic_id, name) = live[rng.usize(0..live.len())].clone();
        if let Some(t) = self.topics.lock().get_mut(&topic_id) {
            t.deleted = true;
        }
        self.oracle.lock().remove_topic(topic_id);
        match self.faulty.delete_topic(topic_id).await {
            Ok(()) => {
                ev!(self, "topic {name} ({topic_id}) deleted");
                self.stat(|s| s.topics_deleted += 1);
            }
            Err(e) => {
                self.fail((SETUP, format!("deleting topic {name}: {e}")));
                return;
            }
        }
        sleep(Duration::from_millis(rng.u64(500..=5_000))).await;
        if self.phase() >= QUIET {
            return;
        }
        let Some(plan) = self.p.topics.iter().find(|t| t.name == name).cloned() else {
            return;
        };
        if let Some(id) = self.create_topic(&plan).await {
            self.start_clients(id);
        }
    }

    /// One broker's link to the coordinator stalls now and then during the faulty phase (its
    /// commits wait, then land; other brokers' go on): a client's retry through another broker is
    /// acknowledged while its first attempt is still on its way, and lands late (issue #25). An
    /// actor with a generator of its own, so the other fault draws stay as they were.
    async fn link_stalls_loop(self: Arc<Self>) {
        if !self.config.faults.commit_stalls {
            return;
        }
        let mut rng = self.rng("link stalls", 0);
        while self.phase() == FAULTY && !self.failed() {
            sleep(Duration::from_millis(rng.u64(1_000..=8_000))).await;
            if self.phase() != FAULTY {
                return;
            }
            let Some(node) = self.pick_node(&mut rng, None) else {
                continue;
            };
            let d =
                Duration::from_millis(rng.u64(100..=self.p.max_commit_stall.as_millis() as u64));
            ev!(
                self,
                "fault: broker {} commits stalled on their way for {} ms",
                node.id,
                d.as_millis()
            );
            self.stat(|s| s.faults += 1);
            node.link.stall();
            let world = self.clone();
            tokio::spawn(async move {
                sleep(d).await;
                node.link.release();
                ev!(world, "fault: broker {} commits released", node.id);
            });
        }
    }

    async fn faults_loop(self: Arc<Self>) {
        let mut rng = self.rng("faults", 0);
        let f = self.config.faults.clone();
        let sharded = !self.shard_faults.is_empty();
        while self.phase() == FAULTY && !self.failed() {
            sleep(Duration::from_millis(rng.u64(100..=2_000))).await;
            if self.phase() != FAULTY {
                return;
            }
            // The coordinator a commit fault goes to: the whole router, or one shard.
            let target = |rng: &mut fastrand::Rng| -> (Arc<FaultyCommits>, String) {
                if sharded && rng.bool() {
                    let i = rng.usize(0..self.shard_faults.len());
                    (self.shard_faults[i].clone(), format!("shard {i}"))
                } else {
                    (self.faulty.clone(), "coordinator".to_string())
                }
            };
            match rng.u8(0..10) {
                0 if f.upload_stalls => {
                    let used = Duration::from_millis(self.stall_used_ms.load(Ordering::SeqCst));
                    let d =
                        Duration::from_millis(rng.u64(100..=self.p.max_stall.as_millis() as u64));
                    if used + d > self.p.stall_budget || self.storage.stall.waiting() > 0 {
                        continue;
                    }
                    self.stall_used_ms
                        .fetch_add(d.as_millis() as u64, Ordering::SeqCst);
                    ev!(self, "fault: uploads stalled for {} ms", d.as_millis());
                    self.stat(|s| s.faults += 1);
                    self.storage.stall.stall();
                    let world = self.clone();
                    tokio::spawn(async move {
                        sleep(d).await;
                        world.storage.stall.release();
                        ev!(world, "fault: uploads released");
                    });
                }
                1 if f.commit_stalls => {
                    let (c, name) = target(&mut rng);
                    let d = Duration::from_millis(
                        rng.u64(100..=self.p.max_commit_stall.as_millis() as u64),
                    );
                    ev!(
                        self,
                        "fault: commits stalled at {name} for {} ms",
                        d.as_millis()
                    );
                    self.stat(|s| s.faults += 1);
                    c.stall_commits();
                    let world = self.clone();
                    tokio::spawn(async move {
                        sleep(d).await;
                        c.release_commits();
                        ev!(world, "fault: commits released at {name}");
                    });
                }
                2 if f.commits_refused => {
                    let (c, name) = target(&mut rng);
                    let n = rng.u32(1..=3);
                    ev!(self, "fault: next {n} commits refused at {name}");
                    self.stat(|s| s.faults += 1);
                    c.fail_next_commits(n);
                }
                3 if f.commits_lost => {
                    let (c, name) = target(&mut rng);
                    let n = rng.u32(1..=3);
                    ev!(
                        self,
                        "fault: next {n} commits applied with the answer lost at {name}"
                    );
                    self.stat(|s| s.faults += 1);
                    c.lose_next_commits(n);
                }
                4 if f.crashes => {
                    let up: Vec<usize> = self.up_nodes().iter().map(|n| n.id).collect();
                    if up.len() < 2 {
                        continue;
                    }
                    let id = up[rng.usize(0..up.len())];
                    self.crash(id);
                    let down = Duration::from_millis(rng.u64(200..=8_000));
                    let world = self.clone();
                    tokio::spawn(async move {
                        sleep(down).await;
                        if world.phase() < DONE && !world.failed() {
                            world.restart(id);
                        }
                    });
                }
                5 if f.unreadable_objects => {
                    let keys = self.stored_keys().await.unwrap_or_default();
                    if keys.is_empty() {
                        continue;
                    }
                    let key = keys.iter().nth(rng.usize(0..keys.len())).cloned();
                    if let Some(key) = key.and_then(|k| ObjectKey::parse(&k).ok()) {
                        let d = Duration::from_millis(rng.u64(100..=5_000));
                        ev!(self, "fault: {key} unreadable for {} ms", d.as_millis());
                        self.stat(|s| s.faults += 1);
                        self.storage.faulty.make_unreadable_for(&key, d);
                    }
                }
                6 if f.cache_storms => {
                    for node in self.up_nodes() {
                        if rng.bool() {
                            node.cache.clear();
                        }
                    }
                    ev!(self, "fault: cache eviction storm");
                    self.stat(|s| s.faults += 1);
                }
                7 if f.lifecycle_restarts => {
                    let Some(fresh) = self.new_collector() else {
                        return;
                    };
                    *self.collector.lock() = fresh;
                    let Some(fresh) = self.new_tiered_collector() else {
                        return;
                    };
                    *self.tiered_collector.lock() = Some(fresh);
                    ev!(
                        self,
                        "fault: lifecycle host restarted (orphan collectors' state lost)"
                    );
                    self.stat(|s| s.faults += 1);
                }
                8 if f.commits_refused || f.commits_lost || f.commit_stalls => {
                    let (c, name) = target(&mut rng);
                    match rng.u8(0..3) {
                        0 if f.commits_refused => {
                            let n = rng.u32(1..=3);
                            ev!(self, "fault: next {n} marker calls refused at {name}");
                            c.fail_next_markers(n);
                        }
                        1 if f.commits_lost => {
                            let n = rng.u32(1..=3);
                            ev!(
                                self,
                                "fault: next {n} marker calls applied with the answer lost at {name}"
                            );
                            c.lose_next_markers(n);
                        }
                        2 if f.commit_stalls => {
                            let d = Duration::from_millis(
                                rng.u64(100..=self.p.max_commit_stall.as_millis() as u64),
                            );
                            ev!(
                                self,
                                "fault: marker calls stalled at {name} for {} ms",
                                d.as_millis()
                            );
                            c.stall_markers();
                            let world = self.clone();
                            tokio::spawn(async move {
                                sleep(d).await;
                                c.release_markers();
                                ev!(world, "fault: marker calls released at {name}");
                            });
                        }
                        _ => continue,
                    }
                    self.stat(|s| s.faults += 1);
                }
                9 => {
                    let (c, name) = target(&mut rng);
                    match rng.u8(0..4) {
                        0 if f.commits_refused => {
                            let n = rng.u32(1..=3);
                            ev!(
                                self,
                                "fault: next {n} segment registrations refused at {name}"
                            );
                            c.fail_next_registers(n);
                        }
                        1 if f.commits_lost => {
                            let n = rng.u32(1..=3);
                            ev!(
                                self,
                                "fault: next {n} segment registrations applied with the answer lost at {name}"
                            );
                            c.lose_next_registers(n);
                        }
                        2 if f.commit_stalls => {
                            let d = Duration::from_millis(
                                rng.u64(100..=self.p.max_commit_stall.as_millis() as u64),
                            );
                            ev!(
                                self,
                                "fault: segment registrations stalled at {name} for {} ms (callers time out after {} ms)",
                                d.as_millis(),
                                self.p.register_timeout.as_millis()
                            );
                            c.stall_registers(self.p.register_timeout);
                            let world = self.clone();
                            tokio::spawn(async move {
                                sleep(d).await;
                                c.release_registers();
                                ev!(world, "fault: segment registrations released at {name}");
                            });
                        }
                        3 if f.lifecycle_restarts => self.crash_tier_host(),
                        _ => continue,
                    }
                    self.stat(|s| s.faults += 1);
                }
                _ => {}
            }
        }
    }

    fn new_collector(&self) -> Option<Arc<OrphanCollector>> {
        match OrphanCollector::new(
            self.faulty.clone(),
            self.storage.clone(),
            self.lifecycle_clock.clone(),
            self.p.orphan.clone(),
        ) {
            Ok(c) => Some(Arc::new(c)),
            Err(e) => {
                self.fail((SETUP, format!("orphan collector: {e}")));
                None
            }
        }
    }

    /// Faults off: stalls released, commits no longer fail, every broker up.
    fn calm_down(self: &Arc<Self>) {
        self.phase.store(CALM, Ordering::SeqCst);
        self.storage.calm_on.store(true, Ordering::SeqCst);
        if let Some(calm) = self.calm_hook.lock().take() {
            calm();
        }
        self.storage.stall.release();
        for c in std::iter::once(&self.faulty).chain(self.shard_faults.iter()) {
            c.fail_next_commits(0);
            c.lose_next_commits(0);
            c.release_commits();
            c.fail_next_markers(0);
            c.lose_next_markers(0);
            c.release_markers();
        }
        self.calm_registers();
        for id in 0..self.slots.len() {
            self.restart(id);
        }
        ev!(self, "phase: calm (faults off)");
    }

    // ---------------------------------------------------------------------------------------
    // Lifecycle

    async fn retention_loop(self: Arc<Self>) {
        let enforcer = match RetentionEnforcer::new(self.faulty.clone(), self.p.retention.clone()) {
            Ok(e) => e,
            Err(e) => return self.fail((SETUP, format!("retention enforcer: {e}"))),
        };
        // Retention stops with the producers, so that nothing becomes garbage during the final
        // liveness wait (time keeps moving).
        while self.phase() < QUIET && !self.failed() {
            sleep(self.p.retention_every).await;
            match enforcer.run_pass().await {
                Ok(r) => {
                    if r.batches_deleted > 0 {
                        ev!(
                            self,
                            "retention: {} batches, {} bytes, more {}",
                            r.batches_deleted,
                            r.bytes_deleted,
                            r.more
                        );
                        self.stat(|s| s.retention_deleted += r.batches_deleted);
                    }
                }
                Err(e) => ev!(self, "retention failed: {e}"),
            }
        }
    }

    async fn cleaner_loop(self: Arc<Self>) {
        let cleaner = match ObjectCleaner::new(
            self.faulty.clone(),
            self.storage.clone(),
            None,
            self.lifecycle_clock.clone(),
            self.p.cleaner.clone(),
        ) {
            Ok(c) => c,
            Err(e) => return self.fail((SETUP, format!("object cleaner: {e}"))),
        };
        while self.phase() < DONE && !self.failed() {
            sleep(self.p.cleaner_every).await;
            match cleaner.run_pass().await {
                Ok(r) => {
                    if r.offered > 0 {
                        ev!(
                            self,
                            "cleaner: offered {}, deleted {}, not deleted {}",
                            r.offered,
                            r.deleted,
                            r.not_deleted
                        );
                        self.stat(|s| s.objects_cleaned += r.deleted);
                    }
                }
                Err(e) => ev!(self, "cleaner failed: {e}"),
            }
        }
    }

    async fn orphan_loop(self: Arc<Self>) {
        while self.phase() < DONE && !self.failed() {
            sleep(self.p.orphan_every).await;
            let collector = self.collector.lock().clone();
            match collector.run_pass().await {
                Ok(r) => {
                    if r.new_suspects > 0
                        || r.deleted > 0
                        || r.not_deleted > 0
                        || r.deferred > 0
                        || r.dropped > 0
                    {
                        ev!(self, "orphans: {r:?}");
                        self.stat(|s| s.orphans_deleted += r.deleted);
                    }
                }
                Err(e) => ev!(self, "orphan pass failed: {e}"),
            }
        }
    }

    async fn expiry_loop(self: Arc<Self>) {
        let expirer = match ProducerExpirer::new(self.faulty.clone(), self.p.expiry.clone()) {
            Ok(e) => e,
            Err(e) => return self.fail((SETUP, format!("producer expirer: {e}"))),
        };
        while self.phase() < DONE && !self.failed() {
            sleep(self.p.expiry_every).await;
            match expirer.run_pass().await {
                Ok(r) => {
                    if r.expired > 0 {
                        ev!(self, "producer expiry: {} expired", r.expired);
                        self.stat(|s| s.producers_expired += r.expired);
                    }
                }
                Err(e) => ev!(self, "producer expiry failed: {e}"),
            }
        }
    }

    // ---------------------------------------------------------------------------------------
    // Checks

    /// Log start and high watermark from the coordinator.
    async fn watermarks(&self, p: TopicIdPartition) -> Option<(i64, i64)> {
        let asks = [
            ListOffsetsRequest {
                partition: p,
                timestamp: EARLIEST_TIMESTAMP,
                isolation: Default::default(),
            },
            ListOffsetsRequest {
                partition: p,
                timestamp: LATEST_TIMESTAMP,
                isolation: Default::default(),
            },
        ];
        match self.raw.list_offsets(&asks).await.as_deref() {
            Ok([a, b]) if a.error.is_ok() && b.error.is_ok() => Some((a.offset, b.offset)),
            _ => None,
        }
    }

    /// The keys in the raw store.
    async fn stored_keys(&self) -> Result<BTreeSet<String>, String> {
        let mut keys = BTreeSet::new();
        for prefix in [PREFIX, TIERED_PREFIX] {
            let mut listing = self.raw_storage.list(prefix);
            while let Some(meta) = listing.next().await {
                let meta = meta.map_err(|e| format!("listing the raw store: {e}"))?;
                keys.insert(meta.key.into_string());
            }
        }
        Ok(keys)
    }

    /// The objects referenced by live batches and tiered segments of live partitions, from the
    /// coordinator (each partition read from its log start to its high watermark, segments then
    /// WAL batches as `find_batches` answers), and the watermarks checked. The walk checks that
    /// the two tiers hold one contiguous log: each answer starts at the item holding the position
    /// (a segment may start below it: it was registered since the last answer), every next item
    /// starts where the last ended, no WAL batch starts at or below a segment's end and no
    /// segment reaches the high watermark.
    async fn referenced(
        &self,
    ) -> Result<(BTreeMap<String, TopicIdPartition>, tiering::Walked), Fail> {
        let mut out = BTreeMap::new();
        let mut walked = tiering::Walked::default();
        for p in self.live_partitions() {
            let floors = self.oracle.lock().floors(p);
            let Some((lso, hw)) = self.watermarks(p).await else {
                continue;
            };
            self.oracle.lock().observe(p, hw, lso, floors, "checker")?;
            walked.high_watermarks.insert(p, hw);
            let mut position = lso;
            while position < hw {
                let request = FindBatchesRequest {
                    partition: p,
                    offset: position,
                    max_bytes: ALL_BYTES,
                    isolation: Default::default(),
                };
                let found = self
                    .raw
                    .find_batches(&[request], ALL_BYTES)
                    .await
                    .map_err(|e| (OBJECTS, format!("checker: find_batches of {p}: {e}")))?;
                let Some(answer) = found.into_iter().next() else {
                    break;
                };
                if !answer.error.is_ok()
                    || (answer.batches.is_empty() && answer.segments.is_empty())
                {
                    break;
                }
                let segments = answer.segments.iter().map(|s| {
                    (
                        s.base_offset,
                        s.end_offset,
                        Some(s.object_key.as_str()),
                        true,
                    )
                });
                let batches = answer.batches.iter().map(|b| {
                    // A marker has no object.
                    let key = (!b.is_control()).then_some(b.object_key.as_str());
                    (b.base_offset, b.last_offset, key, false)
                });
                let mut first = true;
                let mut after_segment = false;
                for (base, last, key, segment) in segments.chain(batches) {
                    let contiguous = if first {
                        base <= position
                            && position <= last
                            && (segment || base == position || position == lso)
                    } else {
                        base == position
                    };
                    if !contiguous {
                        let (invariant, what) = if segment || after_segment {
                            (TIERED, "offsets in two tiers or a gap between them")
                        } else {
                            (OFFSETS, "a gap or an overlap")
                        };
                        return Err((
                            invariant,
                            format!(
                                "checker: {p} from {lso} to {hw}: at {position} the coordinator has {} {base}..={last} ({what})",
                                if segment { "segment" } else { "batch" }
                            ),
                        ));
                    }
                    if segment && last >= hw {
                        return Err((
                            TIERED,
                            format!(
                                "checker: {p}: segment {base}..={last} reaches the high watermark {hw}"
                            ),
                        ));
                    }
                    if let Some(key) = key {
                        out.insert(key.to_string(), p);
                    }
                    if segment {
                        walked.segments += 1;
                    } else {
                        walked.wal_batches += 1;
                    }
                    first = false;
                    after_segment = segment;
                    position = last + 1;
                }
            }
        }
        Ok((out, walked))
    }

    /// Invariant 3 (safety): every object a live batch or segment references is in the store;
    /// and invariant `tiered` ([`World::check_tiered`]).
    async fn check_objects(
        &self,
    ) -> Result<(BTreeMap<String, TopicIdPartition>, BTreeSet<String>), Fail> {
        let listed = self.listed_segments().await?;
        let (referenced, walked) = self.referenced().await?;
        let stored = self.stored_keys().await.map_err(|e| (OBJECTS, e))?;
        for (key, p) in &referenced {
            if stored.contains(key) {
                continue;
            }
            let info = self.raw.object_info(key).await.ok().flatten();
            return Err((
                OBJECTS,
                format!(
                    "object {key} holds live batches of {p} but is not in the store (coordinator: {info:?})"
                ),
            ));
        }
        self.check_tiered(&listed, &walked, &stored)?;
        Ok((referenced, stored))
    }

    fn check_bounds(&self) -> Result<(), Fail> {
        for node in self.up_nodes() {
            let s = node.writer.stats();
            let w = &self.p.writer;
            if s.pending_bytes > w.max_pending_bytes as u64
                || s.uncommitted_bytes > w.max_uncommitted_bytes as u64
            {
                return Err((
                    BOUNDS,
                    format!(
                        "broker {}: pending {} (max {}), uncommitted {} (max {})",
                        node.id,
                        s.pending_bytes,
                        w.max_pending_bytes,
                        s.uncommitted_bytes,
                        w.max_uncommitted_bytes
                    ),
                ));
            }
            let c = diskless_cache::LocalCache::stats(node.cache.as_ref());
            if c.bytes > node.cache.capacity() {
                return Err((
                    BOUNDS,
                    format!("broker {}: cache holds {} bytes", node.id, c.bytes),
                ));
            }
        }
        let now = Instant::now();
        if let Some(o) = self.requests.lock().values().find(|o| o.deadline < now) {
            return Err((
                BOUNDS,
                format!(
                    "broker {} (incarnation {}) has not answered a produce request to {} after {} ms, bound {} ms",
                    o.node,
                    o.incarnation,
                    o.partition,
                    o.started.elapsed().as_millis(),
                    (o.deadline - o.started).as_millis()
                ),
            ));
        }
        Ok(())
    }

    async fn checker_loop(self: Arc<Self>) {
        while self.phase() < DONE && !self.failed() {
            // In the quiet period the liveness wait checks the objects itself.
            if self.phase() >= QUIET {
                sleep(self.p.check_every.max(Duration::from_secs(30))).await;
            } else {
                sleep(self.p.check_every).await;
            }
            if let Err(f) = self.check_bounds() {
                self.fail(f);
                return;
            }
            match self.check_objects().await {
                Ok((referenced, stored)) => {
                    ev!(
                        self,
                        "check: {} objects stored, {} referenced",
                        stored.len(),
                        referenced.len()
                    );
                    self.stat(|s| s.checks += 1);
                }
                Err(f) => {
                    self.fail(f);
                    return;
                }
            }
        }
    }

    /// Reads every live partition from its log start to its high watermark through a fetcher
    /// with no faults and no cache: contiguous offsets, every batch one that was sent, every
    /// acknowledged batch present.
    async fn final_scan(&self) -> Result<(), Fail> {
        let fetcher = Fetcher::builder(self.raw_storage.clone(), self.raw.clone())
            .build()
            .map_err(|e| (SETUP, format!("final scan's fetcher: {e}")))?;
        for p in self.live_partitions() {
            let floors = self.oracle.lock().floors(p);
            let Some((lso, hw)) = self.watermarks(p).await else {
                return Err((OFFSETS, format!("final scan: no watermarks for {p}")));
            };
            self.oracle
                .lock()
                .observe(p, hw, lso, floors, "final scan")?;
            let mut position = lso;
            let mut first = true;
            let mut order = ReadOrder::default();
            let mut scanned = BTreeMap::new();
            while position < hw {
                let request = FetchPartition {
                    partition: p,
                    fetch_offset: position,
                    partition_max_bytes: ALL_BYTES,
                    leader_epoch: LEADER_EPOCH,
                    isolation: Default::default(),
                };
                let answer = fetcher.fetch(&[request], ALL_BYTES).await.map_err(|e| {
                    (
                        ACKED_READABLE,
                        format!("final scan of {p} at {position}: {e}"),
                    )
                })?;
                let Some(answer) = answer.into_iter().next() else {
                    return Err((ACKED_READABLE, format!("final scan of {p}: no answer")));
                };
                if !answer.error.is_ok() {
                    return Err((
                        ACKED_READABLE,
                        format!(
                            "final scan of {p} at {position} (log start {lso}, high watermark {hw}): {:?} {}",
                            answer.error,
                            answer.error_message.unwrap_or_default()
                        ),
                    ));
                }
                let batches = split_batches(answer.records_bytes())
                    .map_err(|e| (ACKED_READABLE, format!("final scan of {p}: {e}")))?;
                if batches.is_empty() {
                    return Err((
                        OFFSETS,
                        format!(
                            "final scan of {p}: nothing at {position} below the high watermark {hw}"
                        ),
                    ));
                }
                for batch in batches {
                    let (base, last) = (batch.base_offset(), batch.last_offset());
                    let ok = if first {
                        base <= position && position <= last
                    } else {
                        base == position
                    };
                    if !ok {
                        return Err((
                            OFFSETS,
                            format!("final scan of {p}: at {position} found {base}..={last}"),
                        ));
                    }
                    first = false;
                    let mut oracle = self.oracle.lock();
                    if batch.attributes().is_control() {
                        oracle.served_marker(p, &batch, LEADER_EPOCH, "final scan")?;
                        position = last + 1;
                        continue;
                    }
                    let id = oracle.served(p, &batch, LEADER_EPOCH, "final scan")?;
                    order.check(&oracle, id, ACKED_READABLE)?;
                    scanned.insert(base, id);
                    position = last + 1;
                }
            }
            if position != hw {
                return Err((
                    OFFSETS,
                    format!("final scan of {p}: ended at {position}, high watermark {hw}"),
                ));
            }
            let checked = self.oracle.lock().acked_present(p, lso, &scanned)?;
            let acked = self.oracle.lock().acked_count(p);
            ev!(
                self,
                "final scan {p}: {lso}..{hw}, {} batches, {checked} of {acked} acknowledged batches live",
                scanned.len()
            );
            self.stat(|s| s.final_batches += scanned.len() as u64);
        }
        Ok(())
    }
}

/// Runs one simulation over the given components.
pub(crate) async fn simulate(
    config: SimConfig,
    label: String,
    clock: Arc<SimClock>,
    components: Components,
    tiered_bytes: Arc<AtomicU64>,
) -> Result<SimReport, Box<Violation>> {
    let p = Params::derive(
        config.seed,
        &config.faults,
        components.max_commit_age,
        components.storage_deadline,
    );
    let trace = Arc::new(Mutex::new(Trace::new(config.trace_tail, config.echo)));
    let raw_storage: Arc<dyn ObjectStorage> = Arc::new(LandedAt::new(
        components.storage,
        clock.clone(),
        trace.clone(),
        components.dates_by_sim_clock,
    ));
    let storage = Arc::new(PhaseStorage {
        faulty: Arc::new(FaultyStorage::new(
            raw_storage.clone(),
            p.fault_storage.clone(),
        )),
        calm: Arc::new(FaultyStorage::new(
            raw_storage.clone(),
            p.calm_storage.clone(),
        )),
        calm_on: Arc::new(std::sync::atomic::AtomicBool::new(false)),
        stall: Arc::new(Stall::default()),
    });
    let faulty = CommitStalls::wrap(components.coordinator.clone());
    let lifecycle_skew = if p.max_skew_ms > 0 {
        rng_for(config.seed, "lifecycle", 0).i64(-p.max_skew_ms..=p.max_skew_ms)
    } else {
        0
    };
    let lifecycle_clock = clock.skewed(lifecycle_skew);
    let collector = match OrphanCollector::new(
        faulty.clone(),
        storage.clone(),
        lifecycle_clock.clone(),
        p.orphan.clone(),
    ) {
        Ok(c) => Arc::new(c),
        Err(e) => {
            return Err(Box::new(Violation {
                seed: config.seed,
                replay: config.replay_command(&label),
                variant: label,
                invariant: SETUP,
                message: format!("orphan collector: {e}"),
                at_ms: 0,
                trace_tail: Vec::new(),
            }));
        }
    };
    let world = Arc::new(World {
        trace,
        label,
        raw_storage,
        storage,
        raw: components.coordinator,
        faulty,
        shard_faults: components.shard_faults,
        slots: (0..p.brokers).map(|_| Mutex::new(None)).collect(),
        incarnations: AtomicU64::new(0),
        topics: Mutex::new(BTreeMap::new()),
        oracle: Mutex::new(Oracle::default()),
        requests: Mutex::new(BTreeMap::new()),
        next_request: AtomicU64::new(0),
        next_producer: AtomicU32::new(0),
        next_consumer: AtomicU64::new(0),
        next_producer_id: AtomicI64::new(1000),
        next_topic: AtomicU64::new(0),
        phase: AtomicU8::new(FAULTY),
        failed: Flag::default(),
        violation: Mutex::new(None),
        stats: Mutex::new(SimStats::default()),
        stall_used_ms: AtomicU64::new(0),
        lifecycle_clock,
        collector: Mutex::new(collector),
        producers: Mutex::new(Vec::new()),
        consumers: Mutex::new(Vec::new()),
        closes: Mutex::new(Vec::new()),
        calm_hook: Mutex::new(components.calm),
        tc: Mutex::new(txn::Tc::default()),
        txn: txn::TxnParams::derive(config.seed),
        producers_done: Flag::default(),
        drained: Flag::default(),
        tier_host: Mutex::new(None),
        tier_incarnations: AtomicU64::new(0),
        tiered_collector: Mutex::new(None),
        tiered_bytes,
        clock,
        p,
        config,
    });
    let outcome = drive(&world).await;
    world.phase.store(DONE, Ordering::SeqCst);
    if let Err(f) = outcome {
        world.fail(f);
    }
    let stats = world.stats.lock().clone();
    let trace = world.trace.lock();
    let violation = world.violation.lock().clone();
    match violation {
        Some((invariant, message, at_ms)) => Err(Box::new(Violation {
            seed: world.config.seed,
            variant: world.label.clone(),
            invariant,
            message,
            at_ms,
            replay: world.config.replay_command(&world.label),
            trace_tail: trace.tail(),
        })),
        None => Ok(SimReport {
            seed: world.config.seed,
            variant: world.label.clone(),
            trace_hash: trace.hash(),
            events: trace.events(),
            virtual_ms: world.clock.elapsed_ms(),
            stats,
        }),
    }
}

/// The phases of a run, then the final checks.
async fn drive(world: &Arc<World>) -> Result<(), Fail> {
    let p = world.p.clone();
    ev!(
        world,
        "start: seed {} variant {} commit timeout {:?} max commit age {:?} orphan M {:?} R {:?} every {:?} grace {:?} lifecycle skew {} ms producer expiration {:?} ms",
        world.config.seed,
        world.label,
        p.writer.commit_timeout,
        p.max_commit_age,
        p.orphan.max_commit_age,
        p.orphan.recheck_delay,
        p.orphan_every,
        p.cleaner.grace,
        world.lifecycle_clock.skew_ms(),
        p.topics
            .iter()
            .map(|t| t.config.producer_id_expiration_ms)
            .min()
    );
    for id in 0..p.brokers {
        world.restart(id);
    }
    let mut topic_ids = Vec::new();
    for plan in &p.topics {
        if let Some(id) = world.create_topic(plan).await {
            topic_ids.push(id);
        }
    }
    if world.failed() {
        return Ok(());
    }
    for id in topic_ids {
        world.start_clients(id);
    }
    for _ in 0..world.txn.producers {
        let index = world.next_producer.fetch_add(1, Ordering::SeqCst);
        let pid = world.next_producer_id.fetch_add(1, Ordering::SeqCst);
        let tv2 = world.rng("txn-kind", u64::from(index)).f64() < world.txn.tv2_share;
        let w = world.clone();
        world.producers.lock().push(tokio::spawn(async move {
            w.txn_producer(index, pid, tv2).await
        }));
    }
    let mut background = vec![
        tokio::spawn(world.clone().faults_loop()),
        tokio::spawn(world.clone().link_stalls_loop()),
        tokio::spawn(world.clone().delete_records_loop()),
        tokio::spawn(world.clone().retention_loop()),
        tokio::spawn(world.clone().cleaner_loop()),
        tokio::spawn(world.clone().orphan_loop()),
        tokio::spawn(world.clone().expiry_loop()),
        tokio::spawn(world.clone().checker_loop()),
        tokio::spawn(world.clone().tc_sweeper()),
        tokio::spawn(world.clone().tiering_loop()),
        tokio::spawn(world.clone().tiered_orphan_loop()),
        tokio::spawn(world.clone().replay_loop()),
    ];
    if p.delete_topic {
        background.push(tokio::spawn(world.clone().delete_topic_once()));
    }

    let fault_end = p.fault_phase.as_millis() as i64;
    if !world.wait_until(fault_end).await {
        return Ok(());
    }
    world.calm_down();
    let calm_end = fault_end + p.calm_phase.as_millis() as i64;
    if !world.wait_until(calm_end).await {
        return Ok(());
    }
    world.phase.store(QUIET, Ordering::SeqCst);
    ev!(world, "phase: quiet (no more produce)");

    // Every delivery ends within its delivery timeout (plus a long pause a producer may be in).
    let producers = std::mem::take(&mut *world.producers.lock());
    let deadline = p.delivery_timeout + Duration::from_secs(61) + p.retry_backoff;
    if tokio::time::timeout(deadline, futures::future::join_all(producers))
        .await
        .is_err()
    {
        return Err((
            BOUNDS,
            format!("producers still delivering {deadline:?} after the produce phase ended"),
        ));
    }
    world.producers_done.set();
    // Consumers catch up.
    let consumers = std::mem::take(&mut *world.consumers.lock());
    if tokio::time::timeout(
        Duration::from_secs(120),
        futures::future::join_all(consumers),
    )
    .await
    .is_err()
    {
        // A transaction left open for good holds the read_committed consumers back.
        world.check_stable_at_end().await?;
        return Err((
            ACKED_READABLE,
            "consumers did not catch up within 120 s of quiet".to_string(),
        ));
    }
    if world.failed() {
        return Ok(());
    }
    // Every transaction ended (the coordinator's timeout aborts those their producers left), and
    // the read_committed consumers returned every committed batch.
    if !world.tc_idle() {
        return Err((
            LSO,
            "transactions still open or ending after the consumers caught up".to_string(),
        ));
    }
    world.check_stable_at_end().await?;
    let checked = world.oracle.lock().committed_returned()?;
    ev!(
        world,
        "read_committed: {checked} committed batches returned"
    );
    // Every WAL batch is consolidated into segments: the coordinator's batch rows are bounded by
    // what segment.ms and min_age keep in the WAL tier, here none.
    world.drain_wal_tier().await?;
    if world.failed() {
        return Ok(());
    }

    // Liveness: every orphan and dead object goes, once the collector's and cleaner's delays
    // have passed (and, for shards, the release of owners that never applied).
    // Both collectors (WAL keys and segment keys) have their settings: the slower decides.
    let (o, t) = (&p.orphan, &p.tiered_orphan);
    let orphan_every = p.orphan_every.max(p.tiered_orphan_every);
    let orphan_wait = o
        .max_commit_age
        .max(t.max_commit_age)
        .max(p.max_commit_age * 2)
        + o.recheck_delay.max(t.recheck_delay)
        + p.cleaner.grace
        + (orphan_every + p.cleaner_every) * 3
        + Duration::from_millis(2 * p.max_skew_ms as u64)
        + Duration::from_secs(10);
    let start_wait = world.clock.elapsed_ms();
    let min_end = start_wait + orphan_wait.as_millis() as i64;
    if !world.wait_until(min_end).await {
        return Ok(());
    }
    // From then on the unreferenced objects must keep going away: at most one no-progress window
    // (every worker gets several passes in it, a full orphan cycle twice over) without progress.
    let stored = world.stored_keys().await.map_err(|e| (OBJECTS, e))?.len() as u64;
    let cycle = |o: &diskless_core::lifecycle::OrphanConfig, every: Duration| {
        let passes_per_cycle = stored / o.max_listed_per_pass.max(1) + 2;
        every * u32::try_from(passes_per_cycle * 3).unwrap_or(u32::MAX)
            + o.recheck_delay * 2
            + o.full_sweep_interval.min(Duration::from_secs(3_600))
    };
    let window = cycle(&p.orphan, p.orphan_every)
        .max(cycle(&p.tiered_orphan, p.tiered_orphan_every))
        + p.cleaner_every * 3
        + p.cleaner.grace
        + Duration::from_secs(10);
    let window_ms = window.as_millis() as i64;
    let give_up = min_end + 12 * 3_600_000;
    let mut best = usize::MAX;
    let mut progress_at = world.clock.elapsed_ms();
    let leftover = loop {
        let (referenced, stored) = world.check_objects().await?;
        let unreferenced: Vec<String> = stored
            .iter()
            .filter(|k| !referenced.contains_key(*k))
            .cloned()
            .collect();
        let now = world.clock.elapsed_ms();
        if unreferenced.is_empty() {
            break None;
        }
        if unreferenced.len() < best {
            best = unreferenced.len();
            progress_at = now;
        }
        if now - progress_at > window_ms || now >= give_up {
            break Some(unreferenced);
        }
        if !world.wait_until(now + 5_000).await {
            return Ok(());
        }
    };
    if let Some(keys) = leftover {
        let mut details = Vec::new();
        for key in keys.iter().take(5) {
            let info = world.raw.object_info(key).await.ok().flatten();
            details.push(format!("{key}: {info:?}"));
        }
        return Err((
            OBJECTS,
            format!(
                "{} objects neither referenced nor deleted {} s into the quiet period, none gone in the last {} s: {}",
                keys.len(),
                (world.clock.elapsed_ms() - start_wait) / 1000,
                window_ms / 1000,
                details.join("; ")
            ),
        ));
    }
    ev!(world, "liveness: every stored object is referenced");
    world.phase.store(DONE, Ordering::SeqCst);
    for task in background {
        task.abort();
    }

    // Every writer closes in bounded time; crashed ones closed already.
    for node in world.up_nodes() {
        let bound = p.answer_bound(node.outstanding.load(Ordering::SeqCst));
        if tokio::time::timeout(bound, node.writer.close())
            .await
            .is_err()
        {
            return Err((
                BOUNDS,
                format!(
                    "close() of broker {} did not return within {bound:?}",
                    node.id
                ),
            ));
        }
    }
    let closes = std::mem::take(&mut *world.closes.lock());
    for close in closes {
        let _ = close.await;
    }
    if world.failed() {
        return Ok(());
    }
    // Let the broker-side tasks of the last answers finish.
    sleep(Duration::from_millis(1)).await;
    if let Some(o) = world.requests.lock().values().next() {
        return Err((
            BOUNDS,
            format!("a produce request to {} was never answered", o.partition),
        ));
    }
    let consumed = crate::metrics::read(&world.tiered_bytes);
    world.final_scan().await?;
    let scanned = crate::metrics::read(&world.tiered_bytes) - consumed;
    world.stat(|s| {
        s.consumer_tiered_bytes = consumed;
        s.final_tiered_bytes = scanned;
    });
    let stats = world.stats.lock().clone();
    ev!(world, "end: {stats:?}");
    Ok(())
}
