//! The writer's state that its parts share ([`Shared`], [`Counters`]) and a segment's way through
//! them: batches wait in the open [`Buffer`] as [`Entry`]s until the seal makes them one [`Sealed`]
//! segment, which the upload and then the committer take.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};

use bytes::Bytes;
use diskless_cache::LocalCache;
use diskless_coordinator::{BatchCoordinator, Clock, CommitBatch, CommitFileRequest, ErrorCode};
use diskless_storage::{KeySource, ObjectKey, ObjectStorage, StorageError};
use parking_lot::Mutex;
use tokio::sync::{Notify, Semaphore, mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::answer::{Waiter, complete_all};
use super::budget::{Budget, GaugeGuard};
use super::config::WalWriterConfig;
use crate::CommitSignal;
use crate::segment::PartitionGroups;

/// The counters behind [`WriterStats`](crate::WriterStats).
#[derive(Default)]
pub(super) struct Counters {
    pub(super) segments_closed: AtomicU64,
    pub(super) segments_uploaded: AtomicU64,
    pub(super) upload_failures: AtomicU64,
    pub(super) hedged_uploads: AtomicU64,
    pub(super) segments_committed: AtomicU64,
    pub(super) commit_failures: AtomicU64,
    pub(super) commit_timeouts: AtomicU64,
    pub(super) unknown_resolved: AtomicU64,
    pub(super) bytes_uploaded: AtomicU64,
    pub(super) batches_committed: AtomicU64,
}

/// What the writer's tasks share: settings, parts, the open buffer, the pipeline and the bounds.
pub(super) struct Shared {
    pub(super) config: WalWriterConfig,
    /// The runtime the writer's tasks run on (so that `seal_now` and `Drop` work from any thread).
    pub(super) runtime: tokio::runtime::Handle,
    pub(super) validations: Semaphore,
    /// Becomes true when the committer has answered everything and stopped.
    pub(super) finished: watch::Sender<bool>,
    /// Segments handed to the committer so far (counted under the buffer lock).
    pub(super) sealed: AtomicU64,
    /// Segments the committer has answered so far; closed when the committer ends.
    pub(super) answered: watch::Receiver<u64>,
    pub(super) storage: Arc<dyn ObjectStorage>,
    pub(super) coordinator: Arc<dyn BatchCoordinator>,
    pub(super) cache: Option<Arc<dyn LocalCache>>,
    pub(super) clock: Arc<dyn Clock>,
    /// Object keys: a UUID v7 at the clock's time (so fences and the coordinator see one time).
    pub(super) keys: Arc<dyn KeySource>,
    /// Notified after each commit that added a batch (`WalWriterBuilder::with_commit_signal`).
    pub(super) commit_signal: Option<CommitSignal>,
    pub(super) buffer: Mutex<Buffer>,
    /// `None` once the writer is closed.
    pub(super) pipeline: Mutex<Option<mpsc::UnboundedSender<Sealed>>>,
    /// Bytes buffered or uploading (see `WalWriterConfig::max_pending_bytes`).
    pub(super) budget: Budget,
    /// Bytes of requests not yet answered (see `WalWriterConfig::max_uncommitted_bytes`).
    pub(super) uncommitted: Budget,
    pub(super) uploads: Arc<Semaphore>,
    /// Segments sealed whose upload has not ended (uploading or waiting for a slot).
    pub(super) uploading: AtomicUsize,
    /// A moving average of the successful uploads' durations in microseconds (each new one
    /// weighted 1/8; 0 before the first): `SealPolicy::Adaptive`'s `upload_multiple_pct`.
    pub(super) upload_micros: AtomicU64,
    /// Wakes the timer when a buffer gets its first batch, when an upload ends, or on close.
    pub(super) timer: Notify,
    pub(super) closed: AtomicBool,
    pub(super) counters: Counters,
    /// Background deletes of objects the writer will not commit; `close` waits for them.
    pub(super) deletes: Mutex<Vec<JoinHandle<()>>>,
}

/// A batch waiting in the buffer: what its commit needs (built at `append`, so validation's
/// output is not kept; the byte offset is filled in at seal), its bytes, and where its answer goes.
pub(super) struct Entry {
    pub(super) commit: CommitBatch,
    pub(super) batch: Bytes,
    pub(super) target: Target,
}

/// Where a committed batch's result goes: its request (index into `Buffer::waiters`) and the
/// partition slot in that request's answer (the slot names the partition).
#[derive(Clone, Copy)]
pub(super) struct Target {
    pub(super) request: usize,
    pub(super) slot: usize,
}

#[derive(Default)]
pub(super) struct Buffer {
    /// The buffered batches, grouped by partition as the segment will lay them out.
    pub(super) entries: PartitionGroups<Entry>,
    pub(super) waiters: Vec<Waiter>,
    pub(super) bytes: usize,
    pub(super) opened_at: Option<Instant>,
    /// The writer clock's time (ms) when the earliest request in the buffer was handed to
    /// `append`: the segment's key carries it ([`seal_locked`]), so the commit deadline counts
    /// from when its oldest batch reached the writer, not from the seal (issue #25).
    pub(super) first_append_ms: Option<i64>,
    /// When the previous segment was sealed (for `SealPolicy::Adaptive`'s `min_interval`). Kept
    /// across seals (not reset by `std::mem::take` of the rest of the buffer).
    pub(super) last_seal: Option<Instant>,
}

/// A closed segment on its way through upload and commit. Its bytes live only in the upload task.
pub(super) struct Sealed {
    pub(super) key: ObjectKey,
    pub(super) size: u64,
    /// For each batch in the order of the commit request: where its result goes.
    pub(super) targets: Vec<Target>,
    pub(super) commit: CommitFileRequest,
    pub(super) waiters: Vec<Waiter>,
    pub(super) upload: JoinHandle<Result<(), StorageError>>,
    /// Keeps the segment counted in `WRITER_SEGMENTS_IN_FLIGHT` until it is answered.
    pub(super) gauge: GaugeGuard,
    /// When it was sealed, and when its oldest request reached the writer: the per-segment
    /// timing event of the committer (`commit_one`) splits a request's wait with them.
    pub(super) sealed_at: Instant,
    pub(super) oldest: Instant,
}

/// Answers every request of a segment that never reached the committer.
pub(super) fn fail_sealed(sealed: Sealed, error: ErrorCode, message: &str) {
    sealed.upload.abort();
    for w in sealed.waiters {
        complete_all(w, error, message);
    }
}
