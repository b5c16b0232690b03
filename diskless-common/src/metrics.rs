//! The catalogue of every metric diskless-rs emits, through the [`metrics`](https://docs.rs/metrics)
//! facade (the Rust ecosystem's standard, as `log` is for logging).
//!
//! The library only *emits*: a host that already runs a `metrics` recorder (Prometheus, StatsD,
//! OpenTelemetry, its own) sees these series with no wiring; a host without one pays a relaxed
//! atomic load per emission. Call [`describe`] once after installing the recorder to attach units
//! and help texts. The example broker serves them in Prometheus text format (`--metrics-addr`).
//!
//! Where each series comes from:
//!
//! | series | kind | labels | emitted by |
//! |---|---|---|---|
//! | [`PRODUCE_SECONDS`] | histogram | `outcome` | `WalWriter`: append → answer of one request |
//! | [`PRODUCE_BYTES`] | counter | — | `WalWriter`: bytes of accepted batches |
//! | [`SEGMENT_BYTES`] | histogram | — | `WalWriter`: size of each sealed segment |
//! | [`SEGMENT_BATCHES`] | histogram | — | `WalWriter`: batches in each sealed segment |
//! | [`UPLOAD_SECONDS`] | histogram | `outcome` | `WalWriter`: upload of one segment, retries and hedges included |
//! | [`COMMIT_SECONDS`] | histogram | `outcome` | `WalWriter`: commit of one segment |
//! | [`WRITER_BUFFERED_BYTES`] | gauge | — | `WalWriter`: bytes buffered, not yet sealed |
//! | [`WRITER_PENDING_BYTES`] | gauge | — | `WalWriter`: bytes buffered or uploading (`max_pending_bytes` bounds it) |
//! | [`WRITER_UNCOMMITTED_BYTES`] | gauge | — | `WalWriter`: bytes not yet answered (`max_uncommitted_bytes` bounds it) |
//! | [`WRITER_SEGMENTS_IN_FLIGHT`] | gauge | — | `WalWriter`: segments sealed and not yet committed |
//! | [`FETCH_SECONDS`] | histogram | `outcome` | `Fetcher`: one fetch |
//! | [`FETCH_BYTES`] | counter | — | `Fetcher`: batch bytes returned |
//! | [`FETCH_TIERED_BYTES`] | counter | — | `Fetcher`: batch bytes returned from tiered segments (a part of [`FETCH_BYTES`]) |
//! | [`CACHE_HIT_BYTES`] / [`CACHE_MISS_BYTES`] | counter | — | `Fetcher`: bytes served from the `LocalCache` / read from storage |
//! | [`STORAGE_REQUESTS`] | counter | `op`, `outcome` | `MeteredStorage`: PUT / streamed PUT (`put_stream`) / GET / DELETE / LIST calls |
//! | [`STORAGE_SECONDS`] | histogram | `op` | `MeteredStorage`: latency of each call |
//! | [`STORAGE_BYTES`] | counter | `op` | `MeteredStorage`: bytes uploaded (`put`, `put_stream`) and downloaded (`get`) |
//! | [`COORDINATOR_SECONDS`] | histogram | `op`, `outcome` | `MeteredCoordinator`: each `BatchCoordinator` call |
//! | [`LIFECYCLE_PASSES`] | counter | `worker`, `outcome` | lifecycle workers: each pass |
//! | [`LIFECYCLE_ITEMS`] | counter | `worker` | lifecycle workers: batches, objects, producers or orphans each pass removed; segments the tiering worker registered |
//!
//! `outcome` is `ok` or `error`; `op` is the operation's name in snake case (`put`, `get`,
//! `commit_file`, ...); `worker` is `retention`, `cleaner`, `orphans`, `producers` or `tiering`.
//! Every operation emits each of its series exactly once, so counts agree with request counts.

/// Label: `ok` or `error`.
pub const OUTCOME: &str = "outcome";
/// Label: the operation (`put`, `get`, `commit_file`, ...).
pub const OP: &str = "op";
/// Label: the lifecycle worker (`retention`, `cleaner`, `orphans`, `producers`, `tiering`).
pub const WORKER: &str = "worker";
/// Value of [`OUTCOME`] for a call that succeeded.
pub const OK: &str = "ok";
/// Value of [`OUTCOME`] for a call that failed.
pub const ERROR: &str = "error";

/// Seconds from `WalWriter::append` to the request's answer.
pub const PRODUCE_SECONDS: &str = "diskless_produce_seconds";
/// Bytes of batches the writer accepted (validated and buffered).
pub const PRODUCE_BYTES: &str = "diskless_produce_bytes_total";
/// Size in bytes of each sealed WAL segment.
pub const SEGMENT_BYTES: &str = "diskless_segment_bytes";
/// Number of batches in each sealed WAL segment.
pub const SEGMENT_BATCHES: &str = "diskless_segment_batches";
/// Seconds to upload one segment (every attempt and hedge included).
pub const UPLOAD_SECONDS: &str = "diskless_upload_seconds";
/// Seconds to commit one segment to the coordinator.
pub const COMMIT_SECONDS: &str = "diskless_commit_seconds";
/// Bytes buffered by the writer and not yet sealed.
pub const WRITER_BUFFERED_BYTES: &str = "diskless_writer_buffered_bytes";
/// Bytes buffered or uploading.
pub const WRITER_PENDING_BYTES: &str = "diskless_writer_pending_bytes";
/// Bytes of requests not yet answered.
pub const WRITER_UNCOMMITTED_BYTES: &str = "diskless_writer_uncommitted_bytes";
/// Segments sealed and not yet committed.
pub const WRITER_SEGMENTS_IN_FLIGHT: &str = "diskless_writer_segments_in_flight";
/// Seconds of one `Fetcher::fetch`.
pub const FETCH_SECONDS: &str = "diskless_fetch_seconds";
/// Batch bytes returned by fetches.
pub const FETCH_BYTES: &str = "diskless_fetch_bytes_total";
/// Batch bytes returned by fetches from tiered segments (a part of [`FETCH_BYTES`]).
pub const FETCH_TIERED_BYTES: &str = "diskless_fetch_tiered_bytes_total";
/// Bytes a fetch found in the local cache.
pub const CACHE_HIT_BYTES: &str = "diskless_cache_hit_bytes_total";
/// Bytes a fetch had to read from object storage.
pub const CACHE_MISS_BYTES: &str = "diskless_cache_miss_bytes_total";
/// Object storage calls.
pub const STORAGE_REQUESTS: &str = "diskless_storage_requests_total";
/// Seconds of each object storage call.
pub const STORAGE_SECONDS: &str = "diskless_storage_seconds";
/// Bytes moved to (`op="put"`, `op="put_stream"`) and from (`op="get"`) object storage.
pub const STORAGE_BYTES: &str = "diskless_storage_bytes_total";
/// Seconds of each coordinator call.
pub const COORDINATOR_SECONDS: &str = "diskless_coordinator_seconds";
/// Lifecycle worker passes.
pub const LIFECYCLE_PASSES: &str = "diskless_lifecycle_passes_total";
/// What lifecycle passes removed (batches, objects, producer states, orphans), and the segments
/// the tiering worker registered.
pub const LIFECYCLE_ITEMS: &str = "diskless_lifecycle_items_total";

/// Attaches units and help texts to every series above, in the installed recorder. Call once,
/// after installing it (series emitted before still count; only their descriptions are missing).
pub fn describe() {
    use ::metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_histogram!(
        PRODUCE_SECONDS,
        Unit::Seconds,
        "WalWriter::append to the request's answer"
    );
    describe_counter!(
        PRODUCE_BYTES,
        Unit::Bytes,
        "bytes of batches the writer accepted"
    );
    describe_histogram!(
        SEGMENT_BYTES,
        Unit::Bytes,
        "size of each sealed WAL segment"
    );
    describe_histogram!(
        SEGMENT_BATCHES,
        Unit::Count,
        "batches in each sealed WAL segment"
    );
    describe_histogram!(
        UPLOAD_SECONDS,
        Unit::Seconds,
        "upload of one segment, retries and hedges included"
    );
    describe_histogram!(
        COMMIT_SECONDS,
        Unit::Seconds,
        "commit of one segment to the coordinator"
    );
    describe_gauge!(
        WRITER_BUFFERED_BYTES,
        Unit::Bytes,
        "bytes buffered, not yet sealed"
    );
    describe_gauge!(
        WRITER_PENDING_BYTES,
        Unit::Bytes,
        "bytes buffered or uploading"
    );
    describe_gauge!(
        WRITER_UNCOMMITTED_BYTES,
        Unit::Bytes,
        "bytes of requests not yet answered"
    );
    describe_gauge!(
        WRITER_SEGMENTS_IN_FLIGHT,
        Unit::Count,
        "segments sealed and not yet committed"
    );
    describe_histogram!(FETCH_SECONDS, Unit::Seconds, "one Fetcher::fetch");
    describe_counter!(FETCH_BYTES, Unit::Bytes, "batch bytes returned by fetches");
    describe_counter!(
        FETCH_TIERED_BYTES,
        Unit::Bytes,
        "batch bytes returned by fetches from tiered segments"
    );
    describe_counter!(
        CACHE_HIT_BYTES,
        Unit::Bytes,
        "bytes a fetch found in the local cache"
    );
    describe_counter!(
        CACHE_MISS_BYTES,
        Unit::Bytes,
        "bytes a fetch read from object storage"
    );
    describe_counter!(STORAGE_REQUESTS, Unit::Count, "object storage calls");
    describe_histogram!(
        STORAGE_SECONDS,
        Unit::Seconds,
        "latency of each object storage call"
    );
    describe_counter!(
        STORAGE_BYTES,
        Unit::Bytes,
        "bytes uploaded (put) and downloaded (get)"
    );
    describe_histogram!(
        COORDINATOR_SECONDS,
        Unit::Seconds,
        "latency of each coordinator call"
    );
    describe_counter!(LIFECYCLE_PASSES, Unit::Count, "lifecycle worker passes");
    describe_counter!(
        LIFECYCLE_ITEMS,
        Unit::Count,
        "what lifecycle passes removed"
    );
}
