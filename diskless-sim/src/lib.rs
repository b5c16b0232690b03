//! A deterministic simulation of a whole diskless cluster, run seed by seed (issue #13).
//!
//! One seed decides everything: the settings, the workload, the fault schedule and the
//! interleaving. Each run builds its own current-thread tokio runtime with a paused clock (virtual
//! time: the minutes a run simulates cost a fraction of a second), seeds every random generator
//! from the seed, and takes wall-clock time from a [`SimClock`] over tokio's clock and object keys
//! from seeded [`diskless_storage::SeededKeys`]. The same seed gives the same run, event for
//! event: [`SimReport::trace_hash`] hashes every event.
//!
//! # What runs
//!
//! - **Brokers** (3): each a [`diskless_core::WalWriter`] and a [`diskless_core::Fetcher`] with
//!   its own [`SimCache`] and a clock skewed by up to ±2 s, over one shared storage and one shared
//!   coordinator. Writer settings are drawn per run (buffer sizes, interval or adaptive seal
//!   policy, upload concurrency, hedging, backpressure mode, small memory bounds, a commit timeout
//!   of 1–5 s). A crash closes the broker's gate (calls not yet started fail, calls on the wire go
//!   on), disconnects its clients, closes its writer in the background and drops its cache; after
//!   a random downtime a new incarnation starts with new keys and a new skew.
//! - **Producers** (1–3 per partition, idempotent or plain, some compressing): batches of 1–5
//!   records whose values name the producer, the batch and the record (now and then a record
//!   larger than the writer's whole buffer); one batch in flight; a request timeout after which
//!   the same bytes go to another broker; retriable errors retried until a delivery timeout; an
//!   idempotent producer that gives a batch up bumps its epoch (KIP-360). Now and then a producer
//!   first sends a copy with a broken CRC, which must be refused.
//! - **Consumers** (one per partition): fetch from the offset they track through a random
//!   broker, jump to the log start (ListOffsets EARLIEST) on `OFFSET_OUT_OF_RANGE`.
//! - **Transactions** (issue #14): 1–3 transactional producers, TV1-like (one epoch across
//!   transactions) or TV2-like (an epoch bump per transaction), each transaction writing 1–3
//!   rounds of batches to 2–3 partitions and committing or aborting at random (aborting, and
//!   taking a new epoch, when a batch was not acknowledged); now and then a producer abandons its
//!   transaction and restarts later, and a zombie of it sends batches of the old transaction
//!   with the old epoch, verified or not. A fake transaction coordinator issues transaction
//!   numbers (`txn_seq`), verifies partitions, bumps epochs, aborts (and fences) transactions
//!   open past its timeout, and writes markers until done through refused, lost and stalled
//!   `write_txn_markers` calls (a stalled call lands when released). In some runs it also loses
//!   track of a decided transaction now and then, as a host whose pending markers stayed on
//!   another node: the producer may begin its next transaction at once, and the old markers are
//!   written seconds later (issue #31; the coordinator keeps the next transaction out of the
//!   open one and a marker ends only its own transaction). A `read_committed` consumer
//!   per partition applies Kafka's client algorithm (aborted list per fetch, skip a producer's
//!   transactional batches from its aborted transaction's first offset to its ABORT marker, skip
//!   control batches).
//! - **Lifecycle workers** on their own schedules and settings, aggressive ones included (an
//!   orphan collector with a candidate age and recheck delay of a few milliseconds): retention,
//!   the object cleaner, the orphan collector (its host restarts now and then, losing its state),
//!   producer-id expiry; DeleteRecords now and then; in some runs a topic is deleted and another
//!   one created under its name. Retention, DeleteRecords and topic deletion act on tiered
//!   segments as on WAL batches.
//! - **Tiered segments** (issue #15): a [`TieringWorker`](diskless_core::lifecycle::TieringWorker)
//!   on a host of its own (its own schedule, storage and coordinator gate, fetcher and cache)
//!   consolidates WAL batches into segments under the prefix `tiered`, with drawn settings,
//!   aggressive ones included: topics' `segment.bytes` from Kafka's minimum of 14 bytes (one
//!   batch per segment) to 64 KiB, `segment.ms` from 1 ms to 20 s, small `index.interval.bytes`
//!   and `segment.index.bytes`; a `min_age` of 0 to 3 s, 1 to 32 segments per pass, byte-sized
//!   parts and read windows. Its host crashes now and then (the pass is dropped mid-way, the
//!   worker's state is lost) and, during the faults, drops a pass that runs past its timeout. A
//!   second orphan collector (prefix `tiered`, settings of its own, restarted with the first)
//!   collects the segments no registration followed. A replay reader re-reads a partition from
//!   its log start through the brokers now and then, across the tier boundary that consumers
//!   near the tail rarely cross.
//! - **Faults**, during the first phase (30–50 virtual seconds): `FaultyStorage` (storage errors,
//!   ambiguous uploads, log-normal latency, unreadable objects); a [`FlakyStore`] below
//!   `ObjectStoreStorage` (503s, uploads that land and fail, slow uploads that land after the
//!   attempt timeout, S3's 409 while one is in flight), so that its own retries and
//!   create-or-verify run under faults; upload stalls; commits refused, applied with the answer
//!   lost, or stalled ([`FaultyCommits`], on the router and, for [`Variant::Sharded`], on single
//!   shards: partial commits); segment registrations (`register_segment`) refused, applied with
//!   the answer lost, or stalled past the caller's RPC timeout; streamed (multipart) segment
//!   uploads failing mid-stream; a stalled upload, commit or registration is a request on the
//!   wire that lands when released, even after its caller gave up; broker and tiering-host
//!   crashes; clock skew; cache eviction storms. Then a calm phase (producers go on, no faults), then a quiet phase (no produce) until
//!   every orphan and dead object is gone.
//!
//! # Invariants
//!
//! Each violation names its invariant ([`Violation::invariant`]):
//!
//! 1. [`ACKED_READABLE`]: every batch served is one a producer sent, byte for byte except the
//!    base offset, the partition leader epoch asked for and, for LogAppendTime, the timestamp
//!    type bit, max timestamp (= the acknowledged log append time) and CRC, with a valid CRC;
//!    every acknowledged batch is in the log at its acknowledged offset until retention or
//!    DeleteRecords removed it; an idempotent producer's batch appears at most once, at its
//!    acknowledged offset; a corrupt batch is never acknowledged. Checked on every consumer read
//!    and by a final scan of every partition through a fault-free fetcher.
//! 2. [`OFFSETS`]: offsets are contiguous from the log start to the high watermark and never
//!    reused (an offset always holds the same batch, batches never overlap, an acknowledged
//!    offset holds the acknowledged batch); the high watermark and log start offset never go
//!    back and the high watermark covers every acknowledgement. Checked on every fetch answer,
//!    every periodic check (the whole log's coordinates) and the final scan.
//! 3. [`OBJECTS`]: at every periodic check, every object referenced by a live batch or a live
//!    tiered segment is in the store (read bypassing the faults); in the quiet period the
//!    unreferenced objects under both prefixes (orphans, dead WAL objects and segments) keep
//!    going away until none is left — a window in which every lifecycle worker had several passes
//!    (a full orphan cycle of the slower collector twice over) without progress is a violation.
//! 4. [`BOUNDS`]: writers stay within `max_pending_bytes` and `max_uncommitted_bytes`, caches
//!    within their capacity; every produce request is answered within `commit_interval` + every
//!    storage stall of the run + (requests ahead of it + 1) × (upload bound + 2 ×
//!    `commit_timeout`) + 1 s (commits are serial; each is given up after `commit_timeout`, and
//!    an unknown outcome is settled within `commit_timeout` more); every producer's
//!    delivery ends; `close()` returns within that bound, for crashed and live brokers. Once
//!    nothing is produced and every transaction ended, the WAL tier drains: no offset of a live
//!    partition is left in it (ListOffsets `-4` reaches the high watermark; every batch is due
//!    after `segment.ms` + `min_age`), so the coordinator's WAL batch rows are none; a window of
//!    that long plus five tiering passes without a new low is a violation (progress, not a
//!    deadline, so the paused clock cannot make it flake).
//! 5. [`CONSUMER`]: a consumer never sees a batch twice or out of order; each idempotent
//!    producer's batches are read in the order it sent them.
//! 6. [`NO_DIRTY_READ`]: a `read_committed` consumer never returns a batch of an aborted or
//!    undecided transaction.
//! 7. [`NO_LOST_COMMIT`]: it never skips a batch of a committed transaction, and once every
//!    transaction ended it has returned every acknowledged batch of every committed transaction
//!    exactly once, in order (unless retention or DeleteRecords removed it first).
//! 8. [`LSO`]: the last stable offset never goes back, stays within the log start and the high
//!    watermark, bounds `read_committed` answers, and equals the high watermark once the quiet
//!    phase's transactions ended (the coordinator's timeout aborts those left open).
//! 9. [`ATOMIC`]: every marker served is the one the transaction coordinator wrote at its offset,
//!    of the type it decided; no transaction is returned in one partition and skipped in another;
//!    no marker the transaction coordinator writes is refused.
//! 10. [`TIERED`]: at every periodic check, per live partition: its registered segments
//!     (`list_tiered_segments`) ascend without gap or overlap, end below the high watermark, and
//!     their objects are in the store; walking `find_batches` from the log start, segments and
//!     WAL batches form one contiguous log (no offset in two tiers, no WAL batch at or below a
//!     segment's end, no segment reaching the high watermark).
//!
//! [`ACKED_READABLE`] spans both tiers: consumers, `read_committed` consumers, the replay reader
//! and the final scan (which runs after the drain, so reads every batch from segments) are served
//! through unchanged fetchers; [`SimStats::consumer_tiered_bytes`] and
//! [`SimStats::final_tiered_bytes`] count the bytes served from segments (`FETCH_TIERED_BYTES`).
//!
//! # Determinism
//!
//! Besides seeding, two things in this crate keep a run reproducible. Stalls and one-shot flags
//! use one `tokio::sync::Notify` ([`Stall`]), not `tokio::sync::watch`, which wakes its waiters in
//! an order drawn from tokio's unseedable per-runtime generator (so the testkit's own stalls are
//! not used). The SQLite coordinator's calls run to completion on the runtime's thread
//! ([`BlockingCoordinator`]), so no virtual time passes while its connection thread works. In the
//! library, `select!`s are biased and a fetch reads its objects in key order.
//!
//! # Not simulated
//!
//! PostgreSQL (it needs a server; its concurrency has its own tests), a local disk cache tier
//! (`SimCache` is memory only), ListOffsets `-4`/`-5`, real HTTP stores, several
//! threads (one runtime thread: interleavings at await points only), a coordinator crash or
//! restart, the host broker (network layer, metadata, leader epochs), multi-partition produce
//! requests, consumer groups, transactional offset commits, a transaction coordinator's own
//! durability (its restarts and coordinator epochs), and ListOffsets by timestamp.
//!
//! # Running
//!
//! [`run`] runs one seed against a built-in [`Variant`]; [`run_with`] runs it against components
//! a factory builds (a user's own `ObjectStorage` and `BatchCoordinator`). A failing run returns a
//! [`Violation`] whose `Display` names the invariant, the seed and one command that replays it.
//! `tests/sim.rs` runs a fixed set of seeds per variant in CI; `DISKLESS_SIM_SEEDS`,
//! `DISKLESS_SIM_START_SEED`, `DISKLESS_SIM_VARIANT`, `DISKLESS_SIM_KEEP_GOING` and
//! `DISKLESS_SIM_DISABLE` make it a soak.

mod blocking;
mod cache;
mod clock;
mod flaky;
mod metrics;
mod oracle;
mod params;
mod sync;
mod trace;
mod world;
mod wrappers;

pub use blocking::{BlockingCoordinator, block_on};
pub use cache::SimCache;
pub use clock::{SIM_EPOCH_MS, SimClock};
pub use flaky::{FlakyRates, FlakyStore};
pub use oracle::{
    ACKED_READABLE, ATOMIC, BOUNDS, CONSUMER, LSO, NO_DIRTY_READ, NO_LOST_COMMIT, OBJECTS, OFFSETS,
    SETUP, TIERED,
};
pub use sync::Stall;
pub use trace::fnv1a;
pub use wrappers::{CommitStalls, FaultyCommits};

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use diskless_coordinator::sharded::{MemoryShardMap, ShardedConfig, ShardedCoordinator};
use diskless_coordinator::sqlite::{SqliteCoordinator, SqliteOptions};
use diskless_coordinator::{BatchCoordinator, Clock};
use diskless_storage::{
    ObjectStorage, ObjectStoreStorage, RetryConfig, StorageOptions, object_store,
};
use diskless_testkit::coordinator::InMemoryCoordinator;

/// The coordinator a built-in run uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Variant {
    /// The in-memory reference model (`InMemoryCoordinator`).
    Model,
    /// The SQLite coordinator on an in-memory database, each call run to completion
    /// ([`BlockingCoordinator`]).
    Sqlite,
    /// A 3-shard `ShardedCoordinator` over model shards (each behind its own
    /// [`FaultyCommits`]), `MemoryShardMap`, seeded owner shuffles.
    Sharded,
}

impl Variant {
    /// Every variant.
    pub const ALL: [Variant; 3] = [Variant::Model, Variant::Sqlite, Variant::Sharded];

    /// The name used in replay commands (`DISKLESS_SIM_VARIANT`).
    pub fn name(self) -> &'static str {
        match self {
            Variant::Model => "model",
            Variant::Sqlite => "sqlite",
            Variant::Sharded => "sharded",
        }
    }

    /// The variant of a name.
    pub fn parse(name: &str) -> Option<Variant> {
        Variant::ALL.into_iter().find(|v| v.name() == name)
    }
}

impl std::fmt::Display for Variant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Which kinds of faults a run injects. All on by default; switching one off (`DISKLESS_SIM_
/// DISABLE=<name>,...` in the test harness) isolates a finding while the others keep running.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Faults {
    /// Storage calls failing (uploads, fetches, deletes, listings).
    pub storage_errors: bool,
    /// Uploads that land and report a failure.
    pub ambiguous_uploads: bool,
    /// Storage latency (log-normal).
    pub slow_storage: bool,
    /// Uploads stalled until released.
    pub upload_stalls: bool,
    /// Objects unreadable for a while.
    pub unreadable_objects: bool,
    /// Commits refused (not applied).
    pub commits_refused: bool,
    /// Commits applied with the answer lost.
    pub commits_lost: bool,
    /// Commits stalled until released (longer than the writer's commit timeout too).
    pub commit_stalls: bool,
    /// Broker crashes and restarts.
    pub crashes: bool,
    /// Broker, producer and lifecycle clocks off by up to ±2 s.
    pub clock_skew: bool,
    /// Brokers' caches emptied at once.
    pub cache_storms: bool,
    /// The lifecycle host restarting (the orphan collectors lose their state) and the tiering
    /// host crashing (its pass dropped mid-way, its state lost).
    pub lifecycle_restarts: bool,
    /// The transaction coordinator losing a decided transaction's ending for a while: the
    /// producer begins its next transaction before the markers are written (issue #31).
    pub lost_txn_endings: bool,
}

impl Default for Faults {
    fn default() -> Self {
        Faults {
            storage_errors: true,
            ambiguous_uploads: true,
            slow_storage: true,
            upload_stalls: true,
            unreadable_objects: true,
            commits_refused: true,
            commits_lost: true,
            commit_stalls: true,
            crashes: true,
            clock_skew: true,
            cache_storms: true,
            lifecycle_restarts: true,
            lost_txn_endings: true,
        }
    }
}

impl Faults {
    /// The names of the fault kinds, as [`Faults::set`] takes them.
    pub const NAMES: [&'static str; 13] = [
        "storage-errors",
        "ambiguous-uploads",
        "slow-storage",
        "upload-stalls",
        "unreadable-objects",
        "commits-refused",
        "commits-lost",
        "commit-stalls",
        "crashes",
        "clock-skew",
        "cache-storms",
        "lifecycle-restarts",
        "lost-txn-endings",
    ];

    fn flag(&mut self, name: &str) -> Option<&mut bool> {
        Some(match name {
            "storage-errors" => &mut self.storage_errors,
            "ambiguous-uploads" => &mut self.ambiguous_uploads,
            "slow-storage" => &mut self.slow_storage,
            "upload-stalls" => &mut self.upload_stalls,
            "unreadable-objects" => &mut self.unreadable_objects,
            "commits-refused" => &mut self.commits_refused,
            "commits-lost" => &mut self.commits_lost,
            "commit-stalls" => &mut self.commit_stalls,
            "crashes" => &mut self.crashes,
            "clock-skew" => &mut self.clock_skew,
            "cache-storms" => &mut self.cache_storms,
            "lifecycle-restarts" => &mut self.lifecycle_restarts,
            "lost-txn-endings" => &mut self.lost_txn_endings,
            _ => return None,
        })
    }

    /// Switches the fault kind `name` (one of [`Faults::NAMES`]) on or off; `false` for an
    /// unknown name.
    pub fn set(&mut self, name: &str, on: bool) -> bool {
        match self.flag(name) {
            Some(flag) => {
                *flag = on;
                true
            }
            None => false,
        }
    }

    /// The names of the kinds switched off.
    pub fn disabled(&self) -> Vec<&'static str> {
        let mut copy = self.clone();
        Faults::NAMES
            .into_iter()
            .filter(|n| copy.flag(n).is_some_and(|f| !*f))
            .collect()
    }
}

/// What one run does: `SimConfig::new(seed, variant)` and `with_*` for the rest.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct SimConfig {
    /// Decides everything else.
    pub seed: u64,
    /// The coordinator of a built-in run ([`run`]).
    pub variant: Variant,
    /// The fault kinds injected.
    pub faults: Faults,
    /// Print every trace event to stderr as it happens (a replay).
    pub echo: bool,
    /// How many of the last events a [`Violation`] carries.
    pub trace_tail: usize,
}

impl SimConfig {
    /// Seed `seed` of `variant`, every fault on, no echo, the last 60 events kept.
    pub fn new(seed: u64, variant: Variant) -> Self {
        SimConfig {
            seed,
            variant,
            faults: Faults::default(),
            echo: false,
            trace_tail: 60,
        }
    }

    /// Sets [`SimConfig::faults`].
    pub fn with_faults(mut self, faults: Faults) -> Self {
        self.faults = faults;
        self
    }

    /// Sets [`SimConfig::echo`].
    pub fn with_echo(mut self, echo: bool) -> Self {
        self.echo = echo;
        self
    }

    /// Sets [`SimConfig::trace_tail`].
    pub fn with_trace_tail(mut self, trace_tail: usize) -> Self {
        self.trace_tail = trace_tail;
        self
    }

    /// The command that replays this run with the crate's test harness.
    pub fn replay_command(&self, variant: &str) -> String {
        let disabled = self.faults.disabled();
        let disable = if disabled.is_empty() {
            String::new()
        } else {
            format!("DISKLESS_SIM_DISABLE={} ", disabled.join(","))
        };
        format!(
            "DISKLESS_SIM_SEED={} DISKLESS_SIM_VARIANT={variant} {disable}cargo test -p diskless-sim --test sim replay -- --nocapture",
            self.seed
        )
    }
}

/// Counters of a run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SimStats {
    /// Logical batches the producers sent.
    pub batches_sent: u64,
    /// Produce requests (attempts).
    pub produce_requests: u64,
    /// Batches acknowledged.
    pub acked: u64,
    /// Batches given up after the delivery timeout.
    pub given_up: u64,
    /// Batches failed for good (non-retriable error).
    pub failed: u64,
    /// Answers `OUT_OF_ORDER_SEQUENCE_NUMBER` or `INVALID_PRODUCER_EPOCH` (the producer bumps its
    /// epoch).
    pub producer_fenced: u64,
    /// Retriable errors answered.
    pub retriable_errors: u64,
    /// Of those, commits the coordinator refused because the orphan collector had fenced the
    /// object (the commit point at work).
    pub fenced_commits: u64,
    /// Requests a producer stopped waiting for.
    pub client_timeouts: u64,
    /// Batches sent with a corrupted copy first (which must be refused).
    pub corrupt_sent: u64,
    /// Fetch requests.
    pub fetches: u64,
    /// Fetches answered with an error (other than out of range).
    pub fetch_errors: u64,
    /// Fetches out of range (the consumer then jumps to the log start).
    pub out_of_range: u64,
    /// Batches consumers read and checked.
    pub batches_consumed: u64,
    /// Batches the final scan read and checked.
    pub final_batches: u64,
    /// Faults injected by the schedule (crashes apart).
    pub faults: u64,
    /// Broker crashes.
    pub crashes: u64,
    /// DeleteRecords calls applied.
    pub delete_records: u64,
    /// Topics deleted.
    pub topics_deleted: u64,
    /// Batches retention deleted.
    pub retention_deleted: u64,
    /// Objects the cleaner deleted.
    pub objects_cleaned: u64,
    /// Orphans the collector deleted.
    pub orphans_deleted: u64,
    /// Producer states expired.
    pub producers_expired: u64,
    /// Periodic checks passed.
    pub checks: u64,
    /// Transactions the transaction coordinator committed.
    pub txns_committed: u64,
    /// Transactions it aborted (asked to, fenced, or timed out).
    pub txns_aborted: u64,
    /// Of those, aborted by the transaction timeout.
    pub txn_timeouts: u64,
    /// Transactions their producer abandoned (it restarted later).
    pub txns_abandoned: u64,
    /// Transactions whose markers the transaction coordinator wrote late, after letting the
    /// producer begin its next transaction (a host that lost the pending ending, issue #31).
    pub txns_released_early: u64,
    /// Markers written (duplicates apart).
    pub markers_written: u64,
    /// Batches zombies (fenced producer instances) sent.
    pub zombie_batches: u64,
    /// Batches `read_committed` consumers returned.
    pub rc_returned: u64,
    /// Batches `read_committed` consumers skipped as aborted.
    pub rc_skipped: u64,
    /// Tiering passes that ran to their end.
    pub tiering_passes: u64,
    /// Tiering passes dropped because they ran past the host's pass timeout.
    pub tiering_cancelled: u64,
    /// Crashes of the tiering host (its pass dropped, its state lost).
    pub tiering_crashes: u64,
    /// Segments registered.
    pub segments_registered: u64,
    /// WAL batches they took.
    pub batches_tiered: u64,
    /// Segments the coordinator refused as stale.
    pub segments_stale: u64,
    /// Segments whose build, upload or registration failed.
    pub segments_failed: u64,
    /// Keys of discarded segments the worker fenced and deleted.
    pub segments_discarded: u64,
    /// Segment objects the orphan collector of segment keys deleted.
    pub tiered_orphans_deleted: u64,
    /// Batch bytes the consumers and replay readers were served from tiered segments
    /// (`FETCH_TIERED_BYTES`).
    pub consumer_tiered_bytes: u64,
    /// Batch bytes the final scan was served from tiered segments.
    pub final_tiered_bytes: u64,
    /// Batches the replay reader (log start to the tail, through the brokers) read and checked.
    pub replay_batches: u64,
    /// Offsets of live partitions in the WAL tier when the quiet period's drain began.
    pub wal_offsets_at_quiet: u64,
    /// Virtual time the tiering worker took to consolidate them all (ms).
    pub drain_ms: u64,
}

/// A run that held every invariant.
#[derive(Clone, Debug)]
pub struct SimReport {
    /// The seed.
    pub seed: u64,
    /// The variant (or the label of a [`run_with`] run).
    pub variant: String,
    /// FNV-1a over every event of the run: equal for two runs of the same seed.
    pub trace_hash: u64,
    /// Events in the trace.
    pub events: u64,
    /// Virtual time the run took (ms).
    pub virtual_ms: i64,
    /// Counters.
    pub stats: SimStats,
}

/// A broken invariant.
#[derive(Clone, Debug)]
pub struct Violation {
    /// The seed.
    pub seed: u64,
    /// The variant (or label).
    pub variant: String,
    /// Which invariant ([`ACKED_READABLE`], [`OFFSETS`], [`OBJECTS`], [`BOUNDS`], [`CONSUMER`],
    /// [`NO_DIRTY_READ`], [`NO_LOST_COMMIT`], [`LSO`], [`ATOMIC`], [`TIERED`]; or [`SETUP`] when
    /// the run could not start).
    pub invariant: &'static str,
    /// What was seen.
    pub message: String,
    /// Virtual time of the violation (ms since the start).
    pub at_ms: i64,
    /// The command that replays the run.
    pub replay: String,
    /// The last events before it.
    pub trace_tail: Vec<String>,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "invariant `{}` violated (seed {}, variant {}, at {} ms): {}",
            self.invariant, self.seed, self.variant, self.at_ms, self.message
        )?;
        writeln!(f, "replay: {}", self.replay)?;
        if !self.trace_tail.is_empty() {
            writeln!(f, "last events:")?;
            for line in &self.trace_tail {
                writeln!(f, "  {line}")?;
            }
        }
        Ok(())
    }
}

impl std::error::Error for Violation {}

/// What a run simulates: the shared storage and coordinator, as stored (the simulation adds the
/// faults), and what the simulation must know about them.
pub struct Components {
    /// The object storage (faults of its own, if any, must stop in [`Components::calm`]).
    pub storage: Arc<dyn ObjectStorage>,
    /// The coordinator, reading time from the clock the factory was given.
    pub coordinator: Arc<dyn BatchCoordinator>,
    /// The coordinator's `max_commit_age`: the quiet period waits for twice it.
    pub max_commit_age: Duration,
    /// The longest one storage call may take by itself (its own retries and timeouts), for the
    /// bound on produce answers.
    pub storage_deadline: Duration,
    /// Whether the storage dates listed objects by the clock the factory was given (otherwise,
    /// e.g. `object_store`'s in-memory store with the wall clock, the simulation dates them by
    /// when their upload returned).
    pub dates_by_sim_clock: bool,
    /// Fault injectors on single shards (commit faults may target one of them); may be empty.
    pub shard_faults: Vec<Arc<FaultyCommits>>,
    /// Called when the faults stop (components with faults of their own stop them here).
    pub calm: Option<Box<dyn FnOnce() + Send>>,
}

impl std::fmt::Debug for Components {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Components")
            .field("storage", &self.storage)
            .field("coordinator", &self.coordinator)
            .field("max_commit_age", &self.max_commit_age)
            .field("storage_deadline", &self.storage_deadline)
            .field("dates_by_sim_clock", &self.dates_by_sim_clock)
            .field("shard_faults", &self.shard_faults)
            .field("calm", &self.calm.is_some())
            .finish()
    }
}

impl Components {
    /// Components with nothing of their own to stop or date: the storage dates objects by the
    /// wall clock and takes no time by itself.
    pub fn new(
        storage: Arc<dyn ObjectStorage>,
        coordinator: Arc<dyn BatchCoordinator>,
        max_commit_age: Duration,
    ) -> Self {
        Components {
            storage,
            coordinator,
            max_commit_age,
            storage_deadline: Duration::ZERO,
            dates_by_sim_clock: false,
            shard_faults: Vec::new(),
            calm: None,
        }
    }
}

/// Runs one seed of a built-in variant.
pub fn run(config: &SimConfig) -> Result<SimReport, Box<Violation>> {
    let variant = config.variant;
    let seed = config.seed;
    let faults = config.faults.clone();
    run_with(config, variant.name(), move |clock| {
        builtin(variant, seed, faults, clock)
    })
}

/// Runs one seed against the components `factory` builds. `factory` runs inside the run's
/// runtime and is given the coordinator's clock; components must take time only from it and
/// from tokio's clock, and randomness only from seeded generators, for the run to be
/// reproducible.
pub fn run_with<F, Fut>(
    config: &SimConfig,
    label: &str,
    factory: F,
) -> Result<SimReport, Box<Violation>>
where
    F: FnOnce(Arc<SimClock>) -> Fut,
    Fut: Future<Output = Result<Components, String>>,
{
    let setup = |message: String| {
        Box::new(Violation {
            seed: config.seed,
            variant: label.to_string(),
            invariant: SETUP,
            message,
            at_ms: 0,
            replay: config.replay_command(label),
            trace_tail: Vec::new(),
        })
    };
    // Library code that seeds from fastrand's thread-local generator derives from the seed.
    fastrand::seed(config.seed);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .map_err(|e| setup(format!("building the runtime: {e}")))?;
    // The fetchers' `FETCH_TIERED_BYTES`, counted for this thread (the runtime's only one).
    let recorder = metrics::TieredBytes::default();
    let tiered_bytes = recorder.handle();
    ::metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            let clock = SimClock::new(SIM_EPOCH_MS);
            let components = factory(clock.clone()).await.map_err(setup)?;
            world::simulate(
                config.clone(),
                label.to_string(),
                clock,
                components,
                tiered_bytes,
            )
            .await
        })
    })
}

/// The components of a built-in variant: `object_store`'s in-memory store behind a
/// [`FlakyStore`] and an `ObjectStoreStorage` with fast retries, and the variant's coordinator.
async fn builtin(
    variant: Variant,
    seed: u64,
    faults: Faults,
    clock: Arc<SimClock>,
) -> Result<Components, String> {
    let mut rng = params::rng_for(seed, "components", 0);
    let max_commit_age = [20u64, 60, 600][rng.usize(0..3)];
    let max_commit_age = Duration::from_secs(max_commit_age);
    let retry = RetryConfig::default()
        .with_max_attempts(4)
        .with_initial_backoff(Duration::from_millis(10))
        .with_max_backoff(Duration::from_millis(200))
        .with_attempt_timeout(Duration::from_secs(2))
        .with_deadline(Duration::from_secs(6))
        .with_seed(Some(rng.u64(..)));
    let rate = |rng: &mut fastrand::Rng, on: bool, max: f64| if on { rng.f64() * max } else { 0.0 };
    let rates = FlakyRates {
        put_fail: rate(&mut rng, faults.storage_errors, 0.05),
        put_ambiguous: rate(&mut rng, faults.ambiguous_uploads, 0.05),
        put_slow: rate(&mut rng, faults.ambiguous_uploads, 0.04),
        slow: Duration::from_secs(3),
        get_fail: rate(&mut rng, faults.storage_errors, 0.03),
        delete_fail: rate(&mut rng, faults.storage_errors, 0.1),
    };
    let flaky = Arc::new(FlakyStore::new(
        Arc::new(object_store::memory::InMemory::new()),
        clock.clone(),
        rng.u64(..),
        rates,
    ));
    let storage = ObjectStoreStorage::from_object_store(flaky.clone(), "")
        .and_then(|s| s.with_options(StorageOptions::default().with_retry(retry.clone())))
        .map_err(|e| format!("storage: {e}"))?;
    let clock: Arc<dyn Clock> = clock;
    let mut shard_faults = Vec::new();
    let coordinator: Arc<dyn BatchCoordinator> = match variant {
        Variant::Model => {
            Arc::new(InMemoryCoordinator::new(clock).with_max_commit_age(max_commit_age))
        }
        Variant::Sqlite => {
            let options = SqliteOptions::default().with_max_commit_age(max_commit_age);
            // Opened to completion too: no virtual time passes while its thread starts.
            let sqlite = block_on(SqliteCoordinator::in_memory_with(options, clock))
                .map_err(|e| format!("sqlite: {e}"))?;
            Arc::new(BlockingCoordinator::new(Arc::new(sqlite)))
        }
        Variant::Sharded => {
            let mut shards: Vec<Arc<dyn BatchCoordinator>> = Vec::new();
            for _ in 0..3 {
                let model = Arc::new(
                    InMemoryCoordinator::new(clock.clone()).with_max_commit_age(max_commit_age),
                );
                let faulty = CommitStalls::wrap(model);
                shard_faults.push(faulty.clone());
                shards.push(faulty);
            }
            let router = ShardedCoordinator::open(
                shards,
                Arc::new(MemoryShardMap::new()),
                clock,
                ShardedConfig::default()
                    .with_seed(rng.u64(..))
                    .with_max_commit_age(max_commit_age),
            )
            .await
            .map_err(|e| format!("sharded: {e}"))?;
            Arc::new(router)
        }
    };
    Ok(Components {
        storage: Arc::new(storage),
        coordinator,
        max_commit_age,
        // Retries within the deadline, plus a slow PUT's last attempt cut at its timeout.
        storage_deadline: retry.deadline + retry.attempt_timeout,
        dates_by_sim_clock: true,
        shard_faults,
        calm: Some(Box::new(move || flaky.calm())),
    })
}
