//! Settings of the produce path: [`WalWriterConfig`], [`SealPolicy`], [`Backpressure`]; an
//! invalid one is a [`ConfigError`].

use std::time::Duration;

use diskless_coordinator::ShardId;

use crate::ConfigError;

/// When the writer closes its buffer into a segment (besides a full buffer, which always does).
///
/// The default ([`WalWriterConfig::default`]) is [`SealPolicy::Adaptive`] with seals at least
/// 5 ms and 1.5 upload times apart (`min_interval`, `upload_multiple_pct`), 4 segments in flight
/// and 2 MiB `early_bytes` ([`SealPolicy::default`]). Measured with real idempotent clients
/// (BENCHMARKS.md, "Real clients"): about 3× the produce throughput of the fixed 250 ms interval
/// and a third of its latency at low load, at the same PUTs per GiB at high load; an idle writer
/// makes none. `early_bytes` took one producer's throughput from ~45 to ~146 MB/s (BENCHMARKS.md,
/// "Nisshi: throughput"). Spacing seals by the upload time keeps about 10 PUTs per second at low
/// load on an S3-Standard-like store while a fast store gets a short round trip (BENCHMARKS.md,
/// "Side by side with the peer": a librdkafka producer's per-connection limit of 5 requests in
/// flight makes every request of a connection wait for the seal, so the seal spacing sets the
/// round trip).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SealPolicy {
    /// [`WalWriterConfig::commit_interval`] after the buffer's first batch (KIP-1163's
    /// `diskless.append.commit.interval.ms`): every request waits up to the interval, at any load.
    Interval,
    /// Group commit: seal as soon as the upload pipeline has room — fewer than `max_in_flight`
    /// segments sealed and not yet uploaded — but not sooner than `min_interval` after the previous
    /// seal (which bounds the PUT rate of one writer to `1 / min_interval`) unless the buffer
    /// already holds `early_bytes`. While the pipeline is busy, requests accumulate and the next
    /// segment is bigger, up to `buffer_max_bytes`; so a request waits about one upload at high
    /// load and `min_interval` at most at low load. `commit_interval` stays the longest a batch
    /// ever waits. An idle writer makes no PUT.
    ///
    /// `early_bytes` is for the closed loop of a Kafka producer: one connection keeps at most 5
    /// requests of at most 1 MB (librdkafka's and the Java client's defaults) in flight, then
    /// waits for answers, so with `min_interval` alone it produces at most 5 MB per
    /// `min_interval` (~45 MB/s at 100 ms, BENCHMARKS.md "Nisshi: throughput"). A buffer of
    /// `early_bytes` is sealed at once: a segment that big costs few PUTs per byte (at most one per
    /// `early_bytes`), so the PUT bound becomes `1 / min_interval` per second or one per
    /// `early_bytes`, whichever allows more.
    Adaptive {
        /// The least time between two seals of less than `early_bytes` (at most
        /// `1 / min_interval` such PUTs per second).
        min_interval: Duration,
        /// Seal only while fewer segments than this are uploading or waiting for an upload slot
        /// (1: one upload at a time, the classic group commit; `max_concurrent_uploads`: a free slot).
        max_in_flight: usize,
        /// A buffer holding this many bytes is sealed without waiting for `min_interval` (when the
        /// pipeline has room). At least 1; `usize::MAX` never seals early.
        early_bytes: usize,
        /// The least time between two seals also follows the store: at least this percentage of
        /// the recent upload time (a moving average of the writer's uploads, each weighted
        /// 1/8), never more than `commit_interval` through this rule. 0: `min_interval` alone.
        ///
        /// Why: a seal wait about as long as an upload costs a request about one upload more,
        /// and keeps about one segment uploading at a time; so on a slow store (S3 Standard,
        /// ~60-100 ms per PUT) the writer makes about as many PUTs as the store answers in
        /// sequence (~10 per second at 150%), and on a fast one (S3 Express, a local server)
        /// `min_interval` bounds them, with a round trip a fast store allows (BENCHMARKS.md,
        /// "Side by side with the peer").
        upload_multiple_pct: u32,
    },
}

/// [`SealPolicy::Adaptive`]'s default `min_interval`: 5 ms (at most 200 PUTs per second per
/// writer at low load on a store that answers in under ~3 ms; a slower store spaces seals by
/// [`DEFAULT_UPLOAD_MULTIPLE_PCT`] of its upload time instead). Why 5 and not 10: beside the peer
/// at 5 MB/s on a fast store, every request of a librdkafka connection waits for the seal, and
/// 10 ms left the p99 ~10% above the peer's (BENCHMARKS.md, "Side by side with the peer").
pub const DEFAULT_MIN_SEAL_INTERVAL: Duration = Duration::from_millis(5);

/// [`SealPolicy::Adaptive`]'s default `upload_multiple_pct`: 150 (seals at least 1.5 upload
/// times apart: ~10 PUTs per second at low load on S3 Standard).
pub const DEFAULT_UPLOAD_MULTIPLE_PCT: u32 = 150;

/// [`SealPolicy::Adaptive`]'s default `early_bytes`: 2 MiB (at most one PUT per 2 MiB sealed
/// early; about 0.5 PUTs per 1,000 messages of 1 KiB).
pub const DEFAULT_EARLY_SEAL_BYTES: usize = 2 << 20;

impl Default for SealPolicy {
    /// [`SealPolicy::Adaptive`]: seals at least [`DEFAULT_MIN_SEAL_INTERVAL`] (5 ms) and
    /// [`DEFAULT_UPLOAD_MULTIPLE_PCT`] of the recent upload time apart unless 2 MiB are buffered,
    /// up to 4 segments in flight (the default `max_concurrent_uploads`).
    fn default() -> Self {
        SealPolicy::Adaptive {
            min_interval: DEFAULT_MIN_SEAL_INTERVAL,
            max_in_flight: 4,
            early_bytes: DEFAULT_EARLY_SEAL_BYTES,
            upload_multiple_pct: DEFAULT_UPLOAD_MULTIPLE_PCT,
        }
    }
}

impl SealPolicy {
    /// Group commit with a PUT-rate bound of 1 / `min_interval` (or one per
    /// [`DEFAULT_EARLY_SEAL_BYTES`]) and up to `max_in_flight` segments uploading; the interval
    /// does not follow the upload time (`upload_multiple_pct` 0).
    pub fn adaptive(min_interval: Duration, max_in_flight: usize) -> Self {
        SealPolicy::Adaptive {
            min_interval,
            max_in_flight,
            early_bytes: DEFAULT_EARLY_SEAL_BYTES,
            upload_multiple_pct: 0,
        }
    }

    /// This policy with `upload_multiple_pct` (see [`SealPolicy::Adaptive`]; 0: `min_interval`
    /// alone). [`SealPolicy::Interval`] is returned unchanged.
    pub fn with_upload_multiple_pct(self, pct: u32) -> Self {
        match self {
            SealPolicy::Adaptive {
                min_interval,
                max_in_flight,
                early_bytes,
                ..
            } => SealPolicy::Adaptive {
                min_interval,
                max_in_flight,
                early_bytes,
                upload_multiple_pct: pct,
            },
            other => other,
        }
    }

    /// This policy with `early_bytes` (see [`SealPolicy::Adaptive`]; `usize::MAX`: never early).
    /// [`SealPolicy::Interval`] is returned unchanged.
    pub fn with_early_bytes(self, bytes: usize) -> Self {
        match self {
            SealPolicy::Adaptive {
                min_interval,
                max_in_flight,
                upload_multiple_pct,
                ..
            } => SealPolicy::Adaptive {
                min_interval,
                max_in_flight,
                early_bytes: bytes,
                upload_multiple_pct,
            },
            other => other,
        }
    }

    /// The policy a host's two options name (the example broker's `--seal-policy` and
    /// `--seal-min-interval-ms`, the Nisshi host's `--diskless-seal-*`), so every host reads them
    /// alike: neither is the default policy; `interval` is [`SealPolicy::Interval`]; a minimum
    /// interval alone means `adaptive` with exactly it, not following the upload time (0:
    /// `interval`); `adaptive` alone is the default policy. An adaptive policy keeps the default
    /// `max_in_flight` (the
    /// default `max_concurrent_uploads`). Anything else is [`ConfigError::Invalid`] (field
    /// `seal_policy`).
    ///
    /// ```
    /// use std::time::Duration;
    /// use diskless_core::SealPolicy;
    ///
    /// assert_eq!(SealPolicy::from_options(None, None).unwrap(), SealPolicy::default());
    /// assert_eq!(SealPolicy::from_options(None, Some(0)).unwrap(), SealPolicy::Interval);
    /// assert_eq!(
    ///     SealPolicy::from_options(Some("adaptive"), Some(20)).unwrap(),
    ///     SealPolicy::adaptive(Duration::from_millis(20), 4)
    /// );
    /// assert!(SealPolicy::from_options(Some("interval"), Some(20)).is_err());
    /// assert!(SealPolicy::from_options(Some("eager"), None).is_err());
    /// ```
    pub fn from_options(
        name: Option<&str>,
        min_interval_ms: Option<u64>,
    ) -> Result<SealPolicy, ConfigError> {
        let default = SealPolicy::default();
        let SealPolicy::Adaptive { max_in_flight, .. } = default else {
            return Err(ConfigError::invalid(
                "seal_policy",
                "the default policy is not adaptive",
            ));
        };
        let adaptive = |min: Duration| SealPolicy::adaptive(min, max_in_flight);
        match (name, min_interval_ms) {
            (None, None) => Ok(default),
            (None | Some("interval"), Some(0)) | (Some("interval"), None) => {
                Ok(SealPolicy::Interval)
            }
            (Some("interval"), Some(_)) => Err(ConfigError::invalid(
                "seal_policy",
                "a minimum seal interval applies to the adaptive policy only",
            )),
            (None | Some("adaptive"), Some(ms)) => Ok(adaptive(Duration::from_millis(ms))),
            (Some("adaptive"), None) => Ok(default),
            (Some(other), _) => Err(ConfigError::invalid(
                "seal_policy",
                format!("expected interval or adaptive, not {other:?}"),
            )),
        }
    }
}

/// What [`WalWriter::append`](crate::WalWriter::append) does when the pending-bytes bound is reached.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Backpressure {
    /// Wait until enough earlier segments are committed (the default).
    #[default]
    Wait,
    /// Fail the request at once with `KAFKA_STORAGE_ERROR` (retriable).
    FailFast,
}

/// Settings of a [`WalWriter`](crate::WalWriter): [`Default`], then a `with_<field>` per setting
/// to change. [`WalWriterConfig::validate`] (called by [`WalWriterBuilder::build`]) rejects values
/// out of range; none is clamped.
///
/// ```
/// use std::time::Duration;
/// use diskless_core::{SealPolicy, WalWriterConfig};
///
/// let config = WalWriterConfig::default()
///     .with_broker_id(3)
///     .with_commit_interval(Duration::from_millis(100))
///     .with_seal_policy(SealPolicy::adaptive(Duration::from_millis(20), 2));
/// assert!(config.validate().is_ok());
/// assert!(config.with_buffer_max_bytes(0).validate().is_err());
/// // The default seals adaptively, at least 5 ms and 1.5 upload times apart; KIP-1163's fixed
/// // interval is one call away.
/// assert_eq!(
///     WalWriterConfig::default().seal_policy,
///     SealPolicy::adaptive(Duration::from_millis(5), 4).with_upload_multiple_pct(150)
/// );
/// let kip = WalWriterConfig::default().with_seal_policy(SealPolicy::Interval);
/// assert_eq!(kip.commit_interval, Duration::from_millis(250));
/// ```
///
/// [`WalWriterBuilder::build`]: crate::WalWriterBuilder::build
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct WalWriterConfig {
    /// The id of the broker that uploads (recorded with each object).
    pub broker_id: i32,
    /// The prefix of object keys: objects are named `<prefix>/<uuid v7>`.
    pub object_prefix: String,
    /// Close the buffer into a segment once it holds this many bytes (KIP-1163
    /// `diskless.append.buffer.max.bytes`). Default 8 MiB.
    pub buffer_max_bytes: usize,
    /// Close the buffer this long after its first batch arrived (KIP-1163
    /// `diskless.append.commit.interval.ms`). Greater than zero, at most a year. Default 250 ms. With [`SealPolicy::Adaptive`] the
    /// buffer usually closes sooner; this stays the longest any batch waits.
    pub commit_interval: Duration,
    /// When to close the buffer besides a full buffer and `commit_interval`. Default
    /// [`SealPolicy::default`] (adaptive, seals at least 5 ms and 1.5 upload times apart);
    /// [`SealPolicy::Interval`] is KIP-1163's fixed interval.
    pub seal_policy: SealPolicy,
    /// How many segments may upload at once (at least 1). Default 4.
    pub max_concurrent_uploads: usize,
    /// Bound on bytes buffered plus bytes being uploaded (a segment waiting only for its commit
    /// holds no payload). At least `buffer_max_bytes`, at most `u32::MAX` (the bounds are counted
    /// in a `u32` of bytes). A request larger than the whole bound is not refused: it takes the
    /// whole bound, so it waits until everything before it has uploaded. Default 64 MiB.
    pub max_pending_bytes: usize,
    /// Bound on bytes of requests not yet answered: buffered, uploading, or uploaded and waiting for
    /// their commit. Commits are serial, so a slow coordinator would otherwise let uploaded segments
    /// (their metadata and waiting requests) pile up without limit. At least `max_pending_bytes`,
    /// at most `u32::MAX`; a request larger than the bound takes the whole bound. Default 256 MiB.
    pub max_uncommitted_bytes: usize,
    /// What `append` does at that bound.
    pub backpressure: Backpressure,
    /// The coordinator shards that own this writer's objects (KIP-1164 owner list). Default `[0]`.
    pub owners: Vec<ShardId>,
    /// Block size used to put freshly uploaded segments into the cache; must equal the fetcher's.
    /// At least 1. Default [`crate::DEFAULT_CACHE_BLOCK_SIZE`].
    pub cache_block_size: u64,
    /// How many requests may be validated at once. Validating a compressed batch decompresses it
    /// (up to 32 × `max.message.bytes`, see [`crate::default_decompression_limit`]) before the
    /// request is counted in `max_pending_bytes`, so this bounds that memory too. At least 1.
    /// Default 8.
    pub max_concurrent_validations: usize,
    /// Start a second, identical upload of a segment whose first attempt has not finished after
    /// this long, and take whichever lands first (a hedged request). Commits happen in segment
    /// order, so one slow upload delays every later segment: hedging cuts that tail for a few extra
    /// PUTs (create-only uploads make the duplicate harmless: same key, same bytes). `None` (the
    /// default) never hedges; about the store's p95 upload latency is a good value. `Some(ZERO)`
    /// starts the second attempt as soon as the first is found not finished (every PUT doubled).
    pub hedge_uploads_after: Option<Duration>,
    /// How long the writer waits for the coordinator's answer to a segment's commit. After it, the
    /// call is abandoned (its outcome is unknown: it may still apply) and the writer settles the
    /// outcome before answering (`writer/resolve.rs`, ARCHITECTURE.md "Produce path"): it fences
    /// the key, which either shows the commit applied (each idempotent batch then gets its
    /// offsets) or makes sure it never will (`KAFKA_STORAGE_ERROR`, the object deleted). Settling
    /// gets the same time again; if the coordinator cannot be asked in it, every request of the
    /// segment is answered `REQUEST_TIMED_OUT` (retriable) and the object is left to the orphan
    /// collector. It must stay well below the coordinators' `max_commit_age` (default 10 minutes,
    /// [`diskless_coordinator::DEFAULT_MAX_COMMIT_AGE`]), past which a late commit is refused
    /// anyway. Later segments commit without waiting for an abandoned call, so a timed-out
    /// request's batches may land after later ones (as after any Kafka `REQUEST_TIMED_OUT`; an
    /// idempotent producer's sequence checks keep its order). Greater than zero. Default 30 s
    /// (Kafka's `request.timeout.ms`).
    pub commit_timeout: Duration,
}

impl Default for WalWriterConfig {
    fn default() -> Self {
        WalWriterConfig {
            broker_id: 0,
            object_prefix: "wal".to_string(),
            buffer_max_bytes: 8 << 20,
            commit_interval: Duration::from_millis(250),
            seal_policy: SealPolicy::default(),
            max_concurrent_uploads: 4,
            max_pending_bytes: 64 << 20,
            max_uncommitted_bytes: 256 << 20,
            backpressure: Backpressure::Wait,
            owners: vec![0],
            cache_block_size: crate::DEFAULT_CACHE_BLOCK_SIZE,
            max_concurrent_validations: 8,
            hedge_uploads_after: None,
            commit_timeout: Duration::from_secs(30),
        }
    }
}

/// The longest interval a writer accepts for a timer (`commit_interval`, `min_interval`): a year.
/// Longer values mean nothing for a produce path, and would overflow the timer's `Instant`
/// arithmetic near `Duration::MAX`.
const MAX_INTERVAL: Duration = Duration::from_secs(365 * 24 * 3600);

diskless_common::with_setters!(WalWriterConfig {
    with_broker_id => broker_id: [i32],
    with_object_prefix => object_prefix: into [String],
    with_buffer_max_bytes => buffer_max_bytes: [usize],
    with_commit_interval => commit_interval: [Duration],
    with_seal_policy => seal_policy: [SealPolicy],
    with_max_concurrent_uploads => max_concurrent_uploads: [usize],
    with_max_pending_bytes => max_pending_bytes: [usize],
    with_max_uncommitted_bytes => max_uncommitted_bytes: [usize],
    with_backpressure => backpressure: [Backpressure],
    with_owners => owners: [Vec<ShardId>],
    with_cache_block_size => cache_block_size: [u64],
    with_max_concurrent_validations => max_concurrent_validations: [usize],
    with_hedge_uploads_after => hedge_uploads_after: [Option<Duration>],
    with_commit_timeout => commit_timeout: [Duration],
});

impl WalWriterConfig {
    /// Checks every setting; the first one out of range is the error. Values are never clamped:
    /// what passes is what the writer uses.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |field, reason: &str| Err(ConfigError::invalid(field, reason));
        // The byte bounds are semaphores taken with `acquire_many(u32)`; the counts of tasks are
        // semaphores too.
        let max_bytes = usize::try_from(u32::MAX).unwrap_or(usize::MAX);
        if self.buffer_max_bytes == 0 {
            return invalid("buffer_max_bytes", "must be > 0");
        }
        if self.commit_interval.is_zero() {
            return invalid("commit_interval", "must be > 0");
        }
        if self.commit_interval > MAX_INTERVAL {
            return invalid("commit_interval", "must be at most a year");
        }
        if let SealPolicy::Adaptive {
            min_interval,
            max_in_flight,
            early_bytes,
            ..
        } = self.seal_policy
        {
            if early_bytes == 0 {
                return invalid("seal_policy", "SealPolicy::Adaptive needs early_bytes >= 1");
            }
            if max_in_flight == 0 {
                return invalid(
                    "seal_policy",
                    "SealPolicy::Adaptive needs max_in_flight >= 1",
                );
            }
            if min_interval > MAX_INTERVAL {
                return invalid(
                    "seal_policy",
                    "SealPolicy::Adaptive's min_interval must be at most a year",
                );
            }
        }
        if self.max_concurrent_uploads == 0 {
            return invalid("max_concurrent_uploads", "must be > 0");
        }
        if self.max_concurrent_uploads > tokio::sync::Semaphore::MAX_PERMITS {
            return invalid("max_concurrent_uploads", "is too large");
        }
        if self.max_pending_bytes < self.buffer_max_bytes {
            return invalid("max_pending_bytes", "must be >= buffer_max_bytes");
        }
        if self.max_pending_bytes > max_bytes {
            return invalid("max_pending_bytes", "must be at most u32::MAX (4 GiB - 1)");
        }
        if self.max_uncommitted_bytes < self.max_pending_bytes {
            return invalid("max_uncommitted_bytes", "must be >= max_pending_bytes");
        }
        if self.max_uncommitted_bytes > max_bytes {
            return invalid(
                "max_uncommitted_bytes",
                "must be at most u32::MAX (4 GiB - 1)",
            );
        }
        if self.owners.is_empty() {
            return invalid("owners", "must not be empty");
        }
        if self.cache_block_size == 0 {
            return invalid("cache_block_size", "must be > 0");
        }
        if usize::try_from(self.cache_block_size).is_err() {
            return invalid("cache_block_size", "must fit in memory (usize)");
        }
        if self.max_concurrent_validations == 0 {
            return invalid("max_concurrent_validations", "must be > 0");
        }
        if self.max_concurrent_validations > tokio::sync::Semaphore::MAX_PERMITS {
            return invalid("max_concurrent_validations", "is too large");
        }
        if self.commit_timeout.is_zero() {
            return invalid("commit_timeout", "must be > 0");
        }
        // An empty prefix names objects `<uuid v7>`.
        if !self.object_prefix.is_empty()
            && let Err(e) = diskless_storage::validate_prefix(&self.object_prefix)
        {
            return Err(ConfigError::invalid("object_prefix", e.to_string()));
        }
        Ok(())
    }
}
