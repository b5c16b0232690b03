//! The produce path of diskless topics (KIP-1163): [`WalWriter`].
//!
//! A host broker hands every Produce request's partitions to [`WalWriter::append`]. The writer
//!
//! 1. validates each partition's records at once, as Kafka does (exactly one batch per partition,
//!    [`crate::validate::validate_produce_records`]; an invalid partition fails immediately; the
//!    other partitions of the same request go on);
//! 2. buffers the valid batches of all partitions and requests until the buffer holds
//!    [`WalWriterConfig::buffer_max_bytes`] or [`WalWriterConfig::commit_interval`] has passed since the
//!    first batch entered it;
//! 3. closes the buffer into one WAL segment (batches grouped by partition), uploads it under a fresh
//!    time-ordered key — several uploads may run at once;
//! 4. commits the segments' batch coordinates to the coordinator strictly in the order the segments
//!    were closed, so that one writer's batches of a partition keep their order;
//! 5. answers each request with the offsets the coordinator assigned, only after that commit.
//!
//! Failures follow the KIP: a failed upload answers every request of that segment with
//! `KAFKA_STORAGE_ERROR` and leaves no object (the writer deletes whatever an ambiguous attempt may
//! have left); a commit whose outcome is unknown answers `REQUEST_TIMED_OUT` and leaves the object for
//! orphan collection; a batch the coordinator rejects gets that batch's error only.
//!
//! Memory is bounded: bytes buffered plus bytes in flight never exceed
//! [`WalWriterConfig::max_pending_bytes`]; beyond it `append` waits (or fails fast, by option).
//!
//! # Throughput of one producer
//!
//! A producer with `max.in.flight.requests.per.connection = n` and batches of `b` bytes has at most
//! `n × b` bytes waiting for answers. Each answer takes about `wait + upload + commit`, where `wait` is
//! up to `commit_interval` (less when the broker's buffer fills by size first), so one producer gets at
//! most `n × b / (commit_interval/2 + upload_latency + commit_latency)` bytes/s on average. With the
//! defaults (250 ms, S3 p50 ≈ 100 ms, commit ≈ 10 ms) and `n = 5`, `b = 1 MiB` that is about 14 MiB/s.
//! A host tunes it by raising the producer's `batch.size`/`linger.ms` and in-flight count (idempotent
//! producers allow 5), by lowering `commit_interval` with a low-latency store (S3 Express-like, 25 ms:
//! a 50 ms interval gives p99 ≈ 150 ms), and, for the broker as a whole, by `max_concurrent_uploads`:
//! sustained broker throughput is bounded by `max_concurrent_uploads × buffer_max_bytes /
//! upload_latency` (Little's law). Commits happen in segment order, so the upload latency's tail
//! (S3's p99 is several times its p50) delays every segment behind a slow one:
//! [`WalWriterConfig::hedge_uploads_after`] (about the store's p95) trades a few extra PUTs for that
//! tail.

//!
//! # Building, flushing, closing
//!
//! [`WalWriter::builder`] takes the two required parts (object storage and coordinator); a cache,
//! a [`Clock`](diskless_common::Clock), a [`KeySource`](diskless_storage::KeySource) (or a seed)
//! and a [`WalWriterConfig`] are optional, and [`WalWriterBuilder::build`] rejects an invalid
//! configuration with a [`ConfigError`]. [`WalWriter::flush`] seals the buffer and waits until
//! every request appended before it is answered; [`WalWriter::seal_now`] only seals.
//! [`WalWriter::close`] answers everything, stops the writer and waits for its background deletes.
//!
//! # Metrics and tracing
//!
//! The writer emits, through the [`metrics`](https://docs.rs/metrics) facade, the series of
//! [`diskless_common::metrics`] marked `WalWriter` there: one `PRODUCE_SECONDS` per request
//! (labelled `ok` when every partition succeeded), `PRODUCE_BYTES` of accepted batches, one
//! `SEGMENT_BYTES` and `SEGMENT_BATCHES` per sealed segment, one `UPLOAD_SECONDS` per upload and one
//! `COMMIT_SECONDS` per commit call, and the four `WRITER_*` gauges (moved by increments, so several
//! writers in one process add up). Storage and coordinator calls are metered by wrapping them
//! ([`diskless_storage::MeteredStorage`], [`diskless_coordinator::MeteredCoordinator`]).
//!
//! `tracing` spans: `produce` (debug, one `append`), and per segment `seal` (info, a root span,
//! with the key, bytes and batches), its child `upload`, and `commit` (info).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use diskless_common::metrics as m;
use diskless_coordinator::{CommitBatch, ErrorCode, TopicConfig, TopicIdPartition};
use parking_lot::Mutex;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{Instrument, debug_span, warn};

// The parts, lowest first; each uses only parts below it, so their imports form no circle:
// `config`; `budget` (config); `answer` (budget); `state` (answer, budget, config); `seal` and
// `commit` (state and what it uses; not each other); this module (the requests' API: all of
// them); `builder` (all, and this module's `WalWriter`, which it assembles and starts).
mod answer;
mod budget;
mod builder;
mod commit;
mod config;
mod resolve;
mod seal;
mod state;

pub use crate::ConfigError;
pub use answer::{PartitionResponse, PendingProduce, ProduceRecordError};
pub use builder::WalWriterBuilder;
pub use config::{
    Backpressure, DEFAULT_EARLY_SEAL_BYTES, DEFAULT_MIN_SEAL_INTERVAL, DEFAULT_UPLOAD_MULTIPLE_PCT,
    SealPolicy, WalWriterConfig,
};

use crate::validate::Validator;
use answer::{Slot, Waiter, fill_errors, ready, refuse};
use budget::Acquired;
use seal::{adaptive_ready, seal_locked};
use state::{Entry, Shared, Target};

/// One partition of a Produce request.
#[derive(Clone, Debug)]
pub struct ProducePartition {
    /// The partition.
    pub partition: TopicIdPartition,
    /// The topic's configuration (validation rules and timestamp type).
    pub config: Arc<TopicConfig>,
    /// The partition's `records` field: exactly one record batch (Produce v3+; anything else is
    /// answered `INVALID_RECORD`, and a partial trailing batch is dropped, as Kafka does).
    pub records: Bytes,
    /// For a transactional batch: the transaction the host's transaction coordinator verified this
    /// partition to be part of (see [`diskless_coordinator::CommitBatch::txn_seq`]); `None` when
    /// not verified (the batch is then accepted only inside a transaction the producer already
    /// has open in the partition). Ignored for other batches.
    pub txn_seq: Option<i64>,
}

impl ProducePartition {
    /// One partition's records, to be validated under `config` (not verified for a transaction).
    pub fn new(partition: TopicIdPartition, config: Arc<TopicConfig>, records: Bytes) -> Self {
        ProducePartition {
            partition,
            config,
            records,
            txn_seq: None,
        }
    }

    /// The same partition, verified for transaction `txn_seq`.
    pub fn with_txn_seq(mut self, txn_seq: i64) -> Self {
        self.txn_seq = Some(txn_seq);
        self
    }
}

/// Counters of a writer ([`WalWriter::stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WriterStats {
    /// Segments closed.
    pub segments_closed: u64,
    /// Segments uploaded.
    pub segments_uploaded: u64,
    /// Segments whose upload failed.
    pub upload_failures: u64,
    /// Uploads that were hedged (a second attempt started, see
    /// [`WalWriterConfig::hedge_uploads_after`]).
    pub hedged_uploads: u64,
    /// Segments committed.
    pub segments_committed: u64,
    /// Segments whose commit failed (rejected as a whole or outcome unknown).
    pub commit_failures: u64,
    /// Of those, commits abandoned after [`WalWriterConfig::commit_timeout`].
    pub commit_timeouts: u64,
    /// Commits whose outcome was unknown (answer lost, abandoned) and was then settled, applied
    /// or not, before their requests were answered (`writer/resolve.rs`).
    pub unknown_resolved: u64,
    /// Bytes uploaded (segment sizes).
    pub bytes_uploaded: u64,
    /// Batches appended by the coordinator (duplicates excluded).
    pub batches_committed: u64,
    /// Bytes currently buffered or being uploaded (bounded by `max_pending_bytes`).
    pub pending_bytes: u64,
    /// Bytes of requests not yet answered (bounded by `max_uncommitted_bytes`).
    pub uncommitted_bytes: u64,
}

/// A partition of a request that passed validation: its answer slot, its batch (the one batch
/// `validate_produce_records` allows) and what the commit needs of it.
type ValidPartition = (usize, Bytes, CommitBatch);

/// The produce path: buffers batches of many partitions into WAL segments, uploads them, commits
/// their coordinates and answers the requests. See the [module documentation](self).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use std::sync::Arc;
/// use diskless_core::{ProducePartition, RecordBatchBuilder, WalWriter, WalWriterConfig};
/// use diskless_coordinator::{BatchCoordinator, Clock, CreateTopicRequest, ErrorCode, SystemClock, TopicConfig, TopicIdPartition};
/// use diskless_coordinator::sqlite::SqliteCoordinator;
/// use diskless_storage::ObjectStoreStorage;
///
/// let clock = Arc::new(SystemClock);
/// let coordinator = Arc::new(SqliteCoordinator::in_memory(clock.clone()).await.unwrap());
/// let topic_id = uuid::Uuid::from_u128(7);
/// coordinator.create_topic(CreateTopicRequest {
///     topic_id, name: "t".into(), partitions: 1, config: TopicConfig::default(),
/// }).await.unwrap();
/// let writer = WalWriter::builder(Arc::new(ObjectStoreStorage::in_memory()), coordinator)
///     .with_clock(clock.clone())
///     .with_config(WalWriterConfig::default().with_broker_id(1))
///     .build()
///     .unwrap();
/// let batch = RecordBatchBuilder::new().record(clock.now_ms(), None, Some(b"hello")).build().unwrap();
/// let answers = writer.produce(vec![ProducePartition::new(
///     TopicIdPartition::new(topic_id, 0),
///     Arc::new(TopicConfig::default()),
///     batch.into_bytes(),
/// )]).await;
/// assert_eq!(answers[0].error, ErrorCode::None);
/// assert_eq!(answers[0].base_offset, 0);
/// writer.close().await;
/// # }
/// ```
pub struct WalWriter {
    shared: Arc<Shared>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    /// Serializes `close` calls, so that every caller waits for the whole shutdown.
    closing: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for WalWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WalWriter")
            .field("config", &self.shared.config)
            .finish_non_exhaustive()
    }
}

impl WalWriter {
    /// Validates and buffers one Produce request's partitions. Returns once the request is buffered
    /// (after waiting for memory, see [`Backpressure`]); the returned future resolves to one answer per
    /// partition, in request order, once the request's segment is committed.
    ///
    /// Requests are buffered in call order: a request appended before another is committed no later.
    ///
    /// # Cancel safety
    ///
    /// `append` waits only before the request enters the buffer (for a validation slot, then for
    /// the uncommitted-bytes and pending-bytes bounds); entering the buffer and returning happen
    /// without a further `.await`. So if the `append` future is dropped before it completes, the
    /// request was not buffered and is never committed (the bytes it had taken from the bounds go
    /// back); once it has returned the [`PendingProduce`], the request will be committed whatever
    /// happens to that future (see its own "Cancel safety").
    pub async fn append(&self, partitions: Vec<ProducePartition>) -> PendingProduce {
        let span = debug_span!("produce", partitions = partitions.len());
        self.append_inner(partitions).instrument(span).await
    }

    async fn append_inner(&self, partitions: Vec<ProducePartition>) -> PendingProduce {
        let started = Instant::now();
        let shared = &self.shared;
        // Before any wait: the segment's key carries the earliest of these (see `Buffer`).
        let appended_ms = shared.clock.now_ms();
        let names: Vec<TopicIdPartition> = partitions.iter().map(|p| p.partition).collect();
        if shared.closed.load(Ordering::Acquire) {
            return ready_errors(
                &names,
                ErrorCode::KafkaStorageError,
                "the writer is closed",
                started,
            );
        }

        // What the request pins in memory: its whole payload (valid partitions' batches are slices
        // of the same network buffer as the invalid ones), so that is what the bounds count.
        let request_bytes: usize = partitions.iter().map(|p| p.records.len()).sum();

        // 1. Validate every partition; the answer slots of invalid ones are filled now.
        let Ok(validating) = shared.validations.acquire().await else {
            return ready_errors(
                &names,
                ErrorCode::KafkaStorageError,
                "the writer is closed",
                started,
            );
        };
        let now_ms = shared.clock.now_ms();
        let mut validator = Validator::default();
        let mut responses = Vec::with_capacity(partitions.len());
        let mut valid: Vec<ValidPartition> = Vec::with_capacity(partitions.len());
        let mut bytes = 0usize;
        for (slot, p) in partitions.into_iter().enumerate() {
            let partition = p.partition;
            match validate_partition(&mut validator, p, now_ms) {
                Ok((batch, commit)) => {
                    bytes += batch.len();
                    responses.push(Slot::Pending(partition));
                    valid.push((slot, batch, commit));
                }
                Err(response) => responses.push(Slot::Done(*response)),
            }
        }
        if valid.is_empty() {
            return fill_errors(responses, ErrorCode::None, "", started);
        }

        // 2. Memory bounds. A request larger than a whole bound waits for everything else. Both
        // are always taken in this order (uncommitted, then pending), so requests cannot deadlock.
        drop(validating);
        let backpressure = shared.config.backpressure;
        let uncommitted = match shared
            .uncommitted
            .acquire(request_bytes, backpressure)
            .await
        {
            Acquired::Got(p) => p,
            refused => return refuse(responses, refused, started),
        };
        let permit = match shared.budget.acquire(request_bytes, backpressure).await {
            Acquired::Got(p) => p,
            refused => return refuse(responses, refused, started),
        };

        // 3. Buffer the whole request into one segment (no `.await` from here on).
        let (tx, rx) = oneshot::channel();
        let mut buffer = shared.buffer.lock();
        if shared.closed.load(Ordering::Acquire) {
            drop(buffer);
            return fill_errors(
                responses,
                ErrorCode::KafkaStorageError,
                "the writer is closed",
                started,
            );
        }
        if !buffer.entries.is_empty() && buffer.bytes + bytes > shared.config.buffer_max_bytes {
            seal_locked(shared, &mut buffer);
        }
        let request = buffer.waiters.len();
        for (slot, batch, commit) in valid {
            buffer.entries.push(
                commit.partition,
                Entry {
                    commit,
                    batch,
                    target: Target { request, slot },
                },
            );
        }
        buffer.waiters.push(Waiter {
            tx,
            slots: responses,
            started,
            permit: Some(permit),
            _uncommitted: uncommitted,
        });
        buffer.bytes += bytes;
        buffer.first_append_ms = Some(
            buffer
                .first_append_ms
                .map_or(appended_ms, |t| t.min(appended_ms)),
        );
        metrics::counter!(m::PRODUCE_BYTES).increment(bytes as u64);
        metrics::gauge!(m::WRITER_BUFFERED_BYTES).increment(bytes as f64);
        if buffer.opened_at.is_none() {
            buffer.opened_at = Some(Instant::now());
            shared.timer.notify_one();
        }
        if buffer.bytes >= shared.config.buffer_max_bytes || adaptive_ready(shared, &buffer) {
            seal_locked(shared, &mut buffer);
        }
        drop(buffer);
        PendingProduce::waiting(rx, names)
    }

    /// [`append`](Self::append) and wait for the answers.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future cancels the request only if it is dropped while `append` is still
    /// waiting (for validation or memory); once the request is buffered, dropping loses only the
    /// answer and the request is committed anyway. The caller cannot tell which from outside: use
    /// [`append`](Self::append) and keep the [`PendingProduce`] when that matters.
    pub async fn produce(&self, partitions: Vec<ProducePartition>) -> Vec<PartitionResponse> {
        self.append(partitions).await.await
    }

    /// Closes the current buffer into a segment now, whatever its size and age, and returns
    /// without waiting for its upload or commit (see [`flush`](Self::flush) for that).
    pub fn seal_now(&self) {
        let mut buffer = self.shared.buffer.lock();
        if !buffer.entries.is_empty() {
            seal_locked(&self.shared, &mut buffer);
        }
    }

    /// Seals the buffer now and waits until every request appended before the call (every
    /// `append` that had returned its [`PendingProduce`]) is answered: committed, or failed.
    /// Requests appended meanwhile may be answered too; `append`s still waiting for memory are not
    /// waited for. Returns at once on a closed writer whose requests are all answered.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future only stops the waiting; the seal has happened.
    pub async fn flush(&self) {
        let target = {
            let mut buffer = self.shared.buffer.lock();
            if !buffer.entries.is_empty() {
                seal_locked(&self.shared, &mut buffer);
            }
            self.shared.sealed.load(Ordering::Acquire)
        };
        let mut answered = self.shared.answered.clone();
        // Err: the committer has ended, so nothing more will be answered.
        let _ = answered.wait_for(|n| *n >= target).await;
    }

    /// Seals the buffer, waits until every buffered request is answered, stops the writer, and
    /// waits for the writer's background deletes (of objects whose upload failed, or whose commit
    /// was certainly refused), so that no writer task outlives the call. Later `append`s fail with
    /// `KAFKA_STORAGE_ERROR`. Every concurrent caller waits for the whole shutdown.
    ///
    /// # Cancel safety
    ///
    /// The writer is closed as soon as the call starts; dropping the future stops only the
    /// waiting. The tasks and deletes it was waiting for run on, detached, and a later `close`
    /// does not wait for them again.
    pub async fn close(&self) {
        let _closing = self.closing.lock().await;
        shutdown(&self.shared);
        let tasks = std::mem::take(&mut *self.tasks.lock());
        let joined = !tasks.is_empty();
        for task in tasks {
            if let Err(e) = task.await {
                warn!(error = %e, "a writer task failed");
            }
        }
        if joined {
            // The committer has ended (even by a panic): nothing more will be answered.
            self.shared.finished.send_replace(true);
        }
        let mut finished = self.shared.finished.subscribe();
        // Err: the sender is gone, which cannot be while `self` holds `shared`.
        let _ = finished.wait_for(|done| *done).await;
        // The committer has ended, so no delete starts after these.
        loop {
            let next = self.shared.deletes.lock().pop();
            let Some(delete) = next else { break };
            if let Err(e) = delete.await {
                warn!(error = %e, "a writer's background delete failed");
            }
        }
    }

    /// The writer's counters.
    pub fn stats(&self) -> WriterStats {
        let c = &self.shared.counters;
        WriterStats {
            segments_closed: c.segments_closed.load(Ordering::Relaxed),
            segments_uploaded: c.segments_uploaded.load(Ordering::Relaxed),
            upload_failures: c.upload_failures.load(Ordering::Relaxed),
            hedged_uploads: c.hedged_uploads.load(Ordering::Relaxed),
            segments_committed: c.segments_committed.load(Ordering::Relaxed),
            commit_failures: c.commit_failures.load(Ordering::Relaxed),
            commit_timeouts: c.commit_timeouts.load(Ordering::Relaxed),
            unknown_resolved: c.unknown_resolved.load(Ordering::Relaxed),
            bytes_uploaded: c.bytes_uploaded.load(Ordering::Relaxed),
            batches_committed: c.batches_committed.load(Ordering::Relaxed),
            pending_bytes: self.shared.budget.used(),
            uncommitted_bytes: self.shared.uncommitted.used(),
        }
    }
}

impl Drop for WalWriter {
    fn drop(&mut self) {
        // Answer what is buffered and let the tasks end on their own.
        shutdown(&self.shared);
    }
}

fn shutdown(shared: &Arc<Shared>) {
    let mut buffer = shared.buffer.lock();
    shared.closed.store(true, Ordering::Release);
    if !buffer.entries.is_empty() {
        seal_locked(shared, &mut buffer);
    }
    // Dropping the sender ends the committer once it has committed everything sealed.
    shared.pipeline.lock().take();
    drop(buffer);
    shared.budget.close();
    shared.uncommitted.close();
    shared.validations.close();
    shared.timer.notify_one();
}

fn ready_errors(
    names: &[TopicIdPartition],
    error: ErrorCode,
    message: &str,
    started: Instant,
) -> PendingProduce {
    ready(
        names
            .iter()
            .map(|p| PartitionResponse::error(*p, error, message))
            .collect(),
        started,
    )
}

/// Validates one partition's records: the library's one place for Kafka's produce rules
/// ([`Validator::validate_produce_records`]: exactly one batch per partition, then every batch
/// check). The transaction rules are the coordinator's, at the commit. An invalid partition gets its error at once;
/// a valid one gives its batch (the records, without a trailing partial batch) and its commit
/// coordinates (byte offset 0 until the segment is laid out).
fn validate_partition(
    validator: &mut Validator,
    p: ProducePartition,
    now_ms: i64,
) -> Result<(Bytes, CommitBatch), Box<PartitionResponse>> {
    let ProducePartition {
        partition,
        config,
        records,
        txn_seq,
    } = p;
    match validator.validate_produce_records_owned(records, &config, now_ms) {
        Ok((batch, meta)) => {
            let mut commit = meta.commit_batch(partition, 0);
            if commit.transactional {
                commit.txn_seq = txn_seq;
            }
            Ok((batch.into_bytes(), commit))
        }
        Err(e) => {
            let mut response = PartitionResponse::error(partition, e.error_code(), e.to_string());
            if !e.record_errors.is_empty() {
                // Kafka's `record_errors`: every failing record.
                response.record_errors = e
                    .record_errors
                    .iter()
                    .map(|(index, message)| ProduceRecordError {
                        batch_index: i32::try_from(*index).unwrap_or(i32::MAX),
                        message: message.clone(),
                    })
                    .collect();
            } else if let Some(index) = e.record_index {
                response.record_errors.push(ProduceRecordError {
                    // A batch holds at most i32::MAX records (its record count is an i32).
                    batch_index: i32::try_from(index).unwrap_or(i32::MAX),
                    message: e.to_string(),
                });
            }
            Err(Box::new(response))
        }
    }
}
