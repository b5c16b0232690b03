//! Everything a seed decides about a run before it starts: sizes, settings, rates, schedules.

use std::time::Duration;

use diskless_coordinator::{TimestampType, TopicConfig};
use diskless_core::lifecycle::{
    CleanerConfig, OrphanConfig, ProducerExpiryConfig, RetentionConfig, TieringConfig,
};
use diskless_core::{Backpressure, FetcherConfig, SealPolicy, WalWriterConfig};
use diskless_testkit::storage::{FaultConfig, Latency};

use crate::Faults;
use crate::trace::fnv1a;

/// The object key prefix of every writer (and of the orphan collector).
pub(crate) const PREFIX: &str = "wal";
/// The key prefix of tiered segments (and of the second orphan collector).
pub(crate) const TIERED_PREFIX: &str = "tiered";

/// A generator seeded from the run's seed and a name: every actor draws from its own, so adding
/// an actor does not shift the others' draws.
pub(crate) fn rng_for(seed: u64, what: &str, index: u64) -> fastrand::Rng {
    let mut h = fnv1a(&seed.to_le_bytes(), 0xcbf2_9ce4_8422_2325);
    h = fnv1a(what.as_bytes(), h);
    h = fnv1a(&index.to_le_bytes(), h);
    fastrand::Rng::with_seed(h)
}

fn ms(rng: &mut fastrand::Rng, lo: u64, hi: u64) -> Duration {
    Duration::from_millis(rng.u64(lo..=hi))
}

/// The `producer.id.expiration.ms` of the short-lived topic, from a generator of its own (the
/// other draws stay as they were). A client's own retries reach the coordinator up to the
/// delivery timeout plus `max_commit_age` after the batch's first commit; Kafka forgets a producer
/// that retries longer than its expiration (its documented hazard), so the simulation keeps the
/// *effective* expiration above that: either the setting itself (`max_commit_age + delivery
/// timeout + 10 s`), or — on three runs in four where the coordinators' floor of twice
/// `max_commit_age` covers it — a setting **below** the commit age (1 ms up to it), which only the
/// floor ([`diskless_coordinator::producer_expired`], issue #25) keeps from forgetting a state
/// that stalled commits still need.
fn producer_id_expiration_ms(
    seed: u64,
    max_commit_age: Duration,
    delivery_timeout: Duration,
) -> i64 {
    let r = &mut rng_for(seed, "producer expiration", 0);
    let covering = max_commit_age + delivery_timeout + Duration::from_secs(10);
    let floor = Duration::from_millis(
        diskless_coordinator::producer_state_floor_ms(max_commit_age).unsigned_abs(),
    );
    let low = floor >= covering && r.u8(0..4) != 0;
    let ms = if low {
        r.u64(1..=max_commit_age.as_millis().max(1) as u64)
    } else {
        covering.as_millis() as u64
    };
    i64::try_from(ms).unwrap_or(i64::MAX)
}

/// One topic to create.
#[derive(Clone, Debug)]
pub(crate) struct TopicPlan {
    pub(crate) name: String,
    pub(crate) partitions: i32,
    pub(crate) config: TopicConfig,
}

/// The settings of one run.
#[derive(Clone, Debug)]
pub(crate) struct Params {
    pub(crate) brokers: usize,
    pub(crate) writer: WalWriterConfig,
    pub(crate) fetcher: FetcherConfig,
    pub(crate) cache_capacity: u64,
    pub(crate) fault_storage: FaultConfig,
    pub(crate) calm_storage: FaultConfig,
    /// The coordinators' commit deadline.
    pub(crate) max_commit_age: Duration,
    pub(crate) orphan: OrphanConfig,
    pub(crate) cleaner: CleanerConfig,
    pub(crate) retention: RetentionConfig,
    pub(crate) expiry: ProducerExpiryConfig,
    pub(crate) orphan_every: Duration,
    pub(crate) cleaner_every: Duration,
    pub(crate) retention_every: Duration,
    pub(crate) expiry_every: Duration,
    pub(crate) check_every: Duration,
    /// Faults are injected during `[0, fault_phase)`.
    pub(crate) fault_phase: Duration,
    /// Producers and consumers go on without faults for this long after it.
    pub(crate) calm_phase: Duration,
    pub(crate) max_skew_ms: i64,
    pub(crate) topics: Vec<TopicPlan>,
    pub(crate) producers_per_partition: (u32, u32),
    pub(crate) idempotent_share: f64,
    pub(crate) think: (u64, u64),
    pub(crate) poll: (u64, u64),
    /// A producer's wait for one answer (Kafka's `request.timeout.ms`).
    pub(crate) request_timeout: Duration,
    /// A producer gives a batch up after this long (Kafka's `delivery.timeout.ms`).
    pub(crate) delivery_timeout: Duration,
    pub(crate) retry_backoff: Duration,
    /// The longest one storage stall lasts, and all of them together.
    pub(crate) max_stall: Duration,
    pub(crate) stall_budget: Duration,
    /// The longest a commit stall lasts.
    pub(crate) max_commit_stall: Duration,
    /// Bound of one upload: hedging delay, the slowest injected latency (twice) and the storage's
    /// own deadline.
    pub(crate) upload_bound: Duration,
    pub(crate) delete_records_every: (u64, u64),
    /// Delete (and recreate) a topic once during the faulty phase.
    pub(crate) delete_topic: bool,
    /// The tiering worker's settings and schedule.
    pub(crate) tiering: TieringConfig,
    pub(crate) tiering_every: Duration,
    /// A pass running longer is dropped (cancelled) by its host.
    pub(crate) tiering_pass_timeout: Duration,
    /// The orphan collector of segment keys.
    pub(crate) tiered_orphan: OrphanConfig,
    pub(crate) tiered_orphan_every: Duration,
    /// A caller's wait for a stalled `register_segment` (an RPC timeout).
    pub(crate) register_timeout: Duration,
}

impl Params {
    pub(crate) fn derive(
        seed: u64,
        faults: &Faults,
        max_commit_age: Duration,
        storage_deadline: Duration,
    ) -> Params {
        let mut rng = rng_for(seed, "params", 0);
        let r = &mut rng;

        let commit_timeout = ms(r, 1_000, 5_000);
        let buffer_max_bytes = r.usize(2_048..=16_384);
        let max_pending_bytes = buffer_max_bytes * r.usize(1..=4);
        let block = [512u64, 1024, 2048, 4096][r.usize(0..4)];
        let max_concurrent_uploads = r.usize(1..=4);
        let commit_interval = ms(r, 20, 100);
        let seal_policy = if r.bool() {
            SealPolicy::adaptive(
                ms(r, 0, commit_interval.as_millis() as u64),
                r.usize(1..=max_concurrent_uploads),
            )
        } else {
            SealPolicy::Interval
        };
        // Half the adaptive writers also space seals by their upload time (the default's rule,
        // `upload_multiple_pct`), drawn from a stream of its own so that every other draw of a
        // seed stays as it was.
        let seal_policy = seal_policy.with_upload_multiple_pct(
            if rng_for(seed, "seal-upload-multiple", 0).bool() {
                150
            } else {
                0
            },
        );
        // The draws keep their order (a seed replays the same run): arguments of a chain are
        // evaluated in order, as the fields of the struct literal these were.
        let writer = WalWriterConfig::default()
            .with_object_prefix(PREFIX)
            .with_buffer_max_bytes(buffer_max_bytes)
            .with_commit_interval(commit_interval)
            .with_seal_policy(seal_policy)
            .with_max_concurrent_uploads(max_concurrent_uploads)
            .with_max_pending_bytes(max_pending_bytes)
            .with_max_uncommitted_bytes(max_pending_bytes * r.usize(1..=4))
            .with_backpressure(if r.u8(0..5) == 0 {
                Backpressure::FailFast
            } else {
                Backpressure::Wait
            })
            .with_cache_block_size(block)
            .with_max_concurrent_validations(r.usize(1..=8))
            .with_hedge_uploads_after(r.bool().then(|| ms(r, 30, 300)))
            .with_commit_timeout(commit_timeout);
        let fetcher = FetcherConfig::default()
            .with_cache_block_size(block)
            .with_max_concurrent_objects(r.usize(1..=4));

        let latency = if faults.slow_storage {
            let p50 = ms(r, 2, 40);
            Some(Latency::log_normal(p50, p50 * r.u32(2..=10)))
        } else {
            None
        };
        let rate = |r: &mut fastrand::Rng, on: bool, max: f64| if on { r.f64() * max } else { 0.0 };
        let fault_storage = FaultConfig::default()
            .with_seed(r.u64(..))
            .with_upload_failure_rate(rate(r, faults.storage_errors, 0.08))
            .with_ambiguous_upload_rate(rate(r, faults.ambiguous_uploads, 0.08))
            .with_fetch_failure_rate(rate(r, faults.storage_errors, 0.08))
            .with_delete_failure_rate(rate(r, faults.storage_errors, 0.2))
            .with_list_failure_rate(rate(r, faults.storage_errors, 0.2))
            .with_latency(latency.clone());
        let calm_storage = FaultConfig::default()
            .with_seed(r.u64(..))
            .with_latency(latency.clone());
        let slowest_call = latency.as_ref().map_or(Duration::ZERO, |l| l.max);
        let upload_bound = writer.hedge_uploads_after.unwrap_or(Duration::ZERO)
            + slowest_call * 2
            + storage_deadline;

        // The collector's settings: aggressive (it fences young objects whose commits are merely
        // slow: safe since #12, the commit point refuses fenced keys), moderate, or the defaults.
        let mut orphan = OrphanConfig::new(PREFIX);
        let orphan_every = match r.u8(0..10) {
            0..4 => {
                orphan.max_commit_age = ms(r, 0, 3_000);
                orphan.recheck_delay = ms(r, 0, 3_000);
                ms(r, 200, 2_000)
            }
            4..7 => {
                orphan.max_commit_age = ms(r, 0, 2 * max_commit_age.as_millis() as u64);
                orphan.recheck_delay = ms(r, 0, 60_000);
                ms(r, 1_000, 10_000)
            }
            _ => ms(r, 5_000, 20_000),
        };
        orphan.known_batch = r.usize(1..=50);
        orphan.max_listed_per_pass = r.u64(20..=500);
        orphan.max_suspects = r.usize(5..=1_000);
        orphan.max_deletes_per_pass = r.usize(1..=100);
        orphan.full_sweep_interval = match r.u8(0..3) {
            0 => Duration::ZERO,
            1 => Duration::from_secs(60),
            _ => orphan.full_sweep_interval,
        };
        // Between full sweeps the collector skips objects dated below the floor of its last clean
        // cycle, which holds only while the store's clock is within `max_commit_age` of its own
        // (OrphanCollector docs); otherwise an orphan that lands just behind the listing waits for
        // the next full sweep. The store dates by the unskewed clock, the collector's is skewed:
        // below that margin, full sweeps come often enough for the liveness check.
        let max_skew_ms: i64 = if faults.clock_skew { 2_000 } else { 0 };
        if orphan.max_commit_age.as_millis() as i64 <= max_skew_ms + 1_000
            && orphan.full_sweep_interval > Duration::from_secs(60)
        {
            orphan.full_sweep_interval = Duration::from_secs(r.u64(0..=60));
        }
        let cleaner = CleanerConfig::default()
            .with_grace(if r.u8(0..3) == 0 {
                ms(r, 1_000, 10_000)
            } else {
                Duration::from_secs(60)
            })
            .with_batch_size(r.u32(1..=100))
            .with_max_rounds_per_pass(r.u32(1..=4));
        let retention = RetentionConfig::default()
            .with_max_batches_per_call(r.u32(1..=50))
            .with_max_calls_per_pass(r.u32(1..=4));
        let expiry = ProducerExpiryConfig::default()
            .with_max_producers_per_call(r.u32(1..=20))
            .with_max_calls_per_pass(r.u32(1..=4));

        let request_timeout = commit_timeout * 2 + writer.commit_interval + upload_bound;
        let delivery_timeout = request_timeout.mul_f64(1.0 + 4.0 * r.f64());
        let fault_phase = ms(r, 30_000, 50_000);

        let short = TopicConfig {
            retention_ms: r.i64(5_000..=30_000),
            retention_bytes: if r.bool() { r.i64(4_096..=32_768) } else { -1 },
            producer_id_expiration_ms: producer_id_expiration_ms(
                seed,
                max_commit_age,
                delivery_timeout,
            ),
            ..TopicConfig::default()
        };
        let append_time = TopicConfig {
            timestamp_type: TimestampType::LogAppendTime,
            ..TopicConfig::default()
        };
        let topics = vec![
            TopicPlan {
                name: "orders".into(),
                partitions: r.i32(2..=4),
                config: short,
            },
            TopicPlan {
                name: "events".into(),
                partitions: r.i32(2..=4),
                config: append_time,
            },
        ];

        let mut p = Params {
            brokers: 3,
            writer,
            fetcher,
            cache_capacity: r.u64(4_096..=65_536),
            fault_storage,
            calm_storage,
            max_commit_age,
            orphan,
            cleaner,
            retention,
            expiry,
            orphan_every,
            cleaner_every: ms(r, 1_000, 15_000),
            retention_every: ms(r, 500, 10_000),
            expiry_every: ms(r, 5_000, 30_000),
            check_every: ms(r, 500, 3_000),
            fault_phase,
            calm_phase: ms(r, 15_000, 25_000),
            max_skew_ms,
            topics,
            producers_per_partition: (1, r.u32(1..=3)),
            idempotent_share: 0.5 + r.f64() * 0.5,
            think: (100, r.u64(300..=1_500)),
            poll: (50, r.u64(200..=800)),
            request_timeout,
            delivery_timeout,
            retry_backoff: ms(r, 20, 200),
            max_stall: ms(r, 500, 10_000),
            stall_budget: Duration::from_secs(20),
            max_commit_stall: ms(r, 1_000, 60_000),
            upload_bound,
            delete_records_every: (2_000, r.u64(3_000..=15_000)),
            delete_topic: r.u8(0..3) == 0,
            tiering: TieringConfig::default(),
            tiering_every: Duration::ZERO,
            tiering_pass_timeout: Duration::ZERO,
            tiered_orphan: OrphanConfig::new(TIERED_PREFIX),
            tiered_orphan_every: Duration::ZERO,
            register_timeout: Duration::ZERO,
        };
        p.derive_tiering(seed, faults);
        p
    }

    /// The tiering settings, from a generator of their own (the other draws stay as they were):
    /// the worker's (a `min_age` of 0 to 3 s, small parts and read windows, few segments per
    /// pass, 1 to 8 per partition, 1 to 4 partitions at once), its schedule, the topics' segment settings (`segment.bytes`
    /// from Kafka's minimum of 14 bytes, one batch per segment, to 64 KiB; `segment.ms`
    /// of 1 ms to 20 s, so that every batch is consolidated in the quiet phase), mid-stream
    /// upload failures, and the second orphan collector's settings.
    fn derive_tiering(&mut self, seed: u64, faults: &Faults) {
        let mut rng = rng_for(seed, "tiering", 0);
        let r = &mut rng;
        self.tiering = TieringConfig::default()
            .with_prefix(TIERED_PREFIX)
            .with_min_age(ms(r, 0, 3_000))
            .with_max_segments_per_pass(r.u32(1..=32))
            .with_max_bytes_per_pass(if r.bool() {
                r.u64(1..=64 << 10)
            } else {
                1 << 30
            })
            .with_candidate_page(r.u32(1..=10))
            .with_max_batches_per_segment(if r.u8(0..4) == 0 {
                r.u32(1..=5)
            } else {
                r.u32(5..=500)
            })
            .with_part_size(r.usize(1..=16 << 10))
            .with_read_window(r.u64(1..=32 << 10));
        self.tiering_every = ms(r, 300, 3_000);
        self.tiering_pass_timeout = ms(r, 500, 20_000);
        for topic in &mut self.topics {
            let c = &mut topic.config;
            c.segment_bytes = match r.u8(0..10) {
                0 => r.i32(14..=400),
                1..4 => r.i32(400..=4_096),
                _ => r.i32(4_096..=64 << 10),
            };
            c.segment_ms = if r.u8(0..4) == 0 {
                r.i64(1..=2_000)
            } else {
                r.i64(2_000..=20_000)
            };
            c.index_interval_bytes = r.i32(0..=2_048);
            c.segment_index_bytes = match r.u8(0..6) {
                0 => r.i32(4..=24),
                1 => r.i32(24..=256),
                _ => c.segment_index_bytes,
            };
        }
        let rate = |r: &mut fastrand::Rng, on: bool, max: f64| if on { r.f64() * max } else { 0.0 };
        let mid_stream = rate(r, faults.storage_errors, 0.08);
        self.fault_storage = self
            .fault_storage
            .clone()
            .with_mid_stream_failure_rate(mid_stream);
        let mut orphan = OrphanConfig::new(TIERED_PREFIX);
        self.tiered_orphan_every = if r.bool() {
            orphan.max_commit_age = ms(r, 0, 3_000);
            orphan.recheck_delay = ms(r, 0, 3_000);
            ms(r, 200, 2_000)
        } else {
            orphan.max_commit_age = ms(r, 0, 2 * self.max_commit_age.as_millis() as u64);
            orphan.recheck_delay = ms(r, 0, 20_000);
            ms(r, 1_000, 10_000)
        };
        orphan.known_batch = r.usize(1..=50);
        orphan.max_listed_per_pass = r.u64(20..=500);
        orphan.max_suspects = r.usize(5..=1_000);
        orphan.max_deletes_per_pass = r.usize(1..=100);
        // Full sweeps often enough for the liveness check whatever the skew (see the WAL
        // collector's settings).
        orphan.full_sweep_interval = Duration::from_secs(r.u64(0..=60));
        self.tiered_orphan = orphan;
        self.register_timeout = ms(r, 200, 5_000);
        self.tiering = self
            .tiering
            .clone()
            .with_max_segments_per_partition(r.u32(1..=8))
            .with_max_concurrent_builds(r.u32(1..=4));
    }

    /// The longest a writer may take to answer a request that found `ahead` requests unanswered
    /// in it: its buffer's interval, every storage stall of the run, and for each request ahead
    /// and itself one upload and one commit (commits are serial; each is given up after
    /// `commit_timeout`, and a commit given up or answered "outcome unknown" is settled in at most
    /// `commit_timeout` more: `diskless-core/src/writer/resolve.rs`), plus a second of slack.
    pub(crate) fn answer_bound(&self, ahead: usize) -> Duration {
        let per = self.upload_bound + self.writer.commit_timeout * 2;
        self.writer.commit_interval
            + self.stall_budget
            + per * u32::try_from(ahead + 1).unwrap_or(u32::MAX)
            + Duration::from_secs(1)
    }
}
