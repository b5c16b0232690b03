//! Sealing the buffer into a segment, and uploading it (hedged), then into the cache.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use diskless_cache::{BlockKey, LocalCache};
use diskless_common::metrics as m;
use diskless_coordinator::{CommitFileRequest, ErrorCode};
use diskless_storage::{ObjectKey, ObjectStorage, StorageError};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::{Instrument, debug, field, info_span};

use super::answer::complete_all;
use super::budget::{GaugeGuard, Held};
use super::config::SealPolicy;
use super::state::{Buffer, Entry, Sealed, Shared, fail_sealed};

/// Closes the buffer into a segment and starts its upload. Called with the buffer locked, so that
/// segments enter the commit pipeline in the order they were closed.
pub(super) fn seal_locked(shared: &Arc<Shared>, buffer: &mut Buffer) {
    // A root span: a segment is no one request's (nor the previous upload's that may seal it);
    // its upload's span is a child of it.
    let span = info_span!(
        parent: None,
        "seal",
        key = field::Empty,
        bytes = field::Empty,
        batches = field::Empty
    );
    let _entered = span.enter();
    let Buffer {
        entries,
        waiters,
        bytes: buffered,
        first_append_ms,
        ..
    } = std::mem::take(buffer);
    let sealed_at = Instant::now();
    buffer.last_seal = Some(sealed_at);
    metrics::gauge!(m::WRITER_BUFFERED_BYTES).decrement(buffered as f64);
    let mut waiters = waiters;
    // The key's time is when the segment's oldest request reached the writer (never later than
    // now): a commit lands at most `max_commit_age` after any of its batches was handed over,
    // however long the batch waited for memory or for the seal. Producer expiry's floor rests on
    // it (`diskless_coordinator::producer_expired`).
    let now_ms = shared.clock.now_ms();
    let uuid = shared
        .keys
        .next_uuid(first_append_ms.map_or(now_ms, |t| t.min(now_ms)));
    let key = match ObjectKey::generate_with_uuid(&shared.config.object_prefix, uuid) {
        Ok(key) => key,
        Err(e) => {
            // The prefix was checked at construction; this cannot happen, but answer rather than panic.
            for w in waiters.drain(..) {
                complete_all(w, ErrorCode::KafkaStorageError, &e.to_string());
            }
            return;
        }
    };
    // The batches move into the segment's chunks (no copy, no clone); their commit coordinates
    // are listed in the segment's order (grouped by partition), which keeps each partition's
    // batches in the order they were appended.
    let mut targets = Vec::with_capacity(entries.len());
    let mut batches = Vec::with_capacity(entries.len());
    let (chunks, size) = entries.into_segment(|_, entry, byte_offset| {
        let Entry {
            mut commit,
            batch,
            target,
        } = entry;
        commit.byte_offset = byte_offset;
        batches.push(commit);
        targets.push(target);
        batch
    });
    span.record("key", field::display(&key));
    span.record("bytes", size);
    span.record("batches", targets.len());
    metrics::histogram!(m::SEGMENT_BYTES).record(size as f64);
    metrics::histogram!(m::SEGMENT_BATCHES).record(targets.len() as f64);
    let commit = CommitFileRequest {
        object_key: key.as_str().to_string(),
        uploader_broker_id: shared.config.broker_id,
        object_size: size,
        owners: shared.config.owners.clone(),
        batches,
    };
    shared
        .counters
        .segments_closed
        .fetch_add(1, Ordering::Relaxed);
    debug!(key = %key, size, batches = targets.len(), "segment closed");

    let oldest = waiters.iter().map(|w| w.started).min().unwrap_or(sealed_at);
    let permits: Vec<Held> = waiters.iter_mut().filter_map(|w| w.permit.take()).collect();
    shared.uploading.fetch_add(1, Ordering::AcqRel);
    let upload = {
        let storage = shared.storage.clone();
        let uploads = shared.uploads.clone();
        let cache = shared.cache.clone();
        let block_size = shared.config.cache_block_size;
        let key = key.clone();
        let hedge_after = shared.config.hedge_uploads_after;
        let writer = shared.clone();
        let in_flight = InFlight(shared.clone());
        let span = info_span!("upload", key = %key, bytes = size);
        let task = async move {
            let _slot = uploads.acquire_owned().await.ok();
            let started = Instant::now();
            let result = upload_hedged(storage.as_ref(), &key, &chunks, hedge_after, || {
                writer
                    .counters
                    .hedged_uploads
                    .fetch_add(1, Ordering::Relaxed);
            })
            .await;
            let took = started.elapsed();
            let outcome = if result.is_ok() { m::OK } else { m::ERROR };
            metrics::histogram!(m::UPLOAD_SECONDS, m::OUTCOME => outcome)
                .record(took.as_secs_f64());
            if result.is_ok() {
                record_upload_time(&writer, took);
                // Fresh data is read soon, mostly by this broker: keep the segment in the cache.
                // Blocks are keyed by object, so nobody finds them before the commit.
                if let Some(cache) = cache {
                    fill_cache(cache.as_ref(), key.as_str(), &chunks, size, block_size).await;
                }
            }
            // The segment's bytes and its share of the budget go now, not at the commit.
            drop(chunks);
            drop(permits);
            drop(in_flight);
            // Room in the pipeline: an adaptive writer seals what has accumulated meanwhile.
            {
                let mut buffer = writer.buffer.lock();
                if adaptive_ready(&writer, &buffer) {
                    seal_locked(&writer, &mut buffer);
                }
            }
            writer.timer.notify_one();
            result
        };
        shared.runtime.spawn(task.instrument(span))
    };
    let sealed = Sealed {
        key,
        size,
        targets,
        commit,
        waiters: std::mem::take(&mut waiters),
        upload,
        gauge: GaugeGuard::new(m::WRITER_SEGMENTS_IN_FLIGHT, 1.0),
        sealed_at,
        oldest,
    };
    let pipeline = shared.pipeline.lock();
    match pipeline.as_ref() {
        Some(tx) => match tx.send(sealed) {
            // Counted under the buffer lock, in the order the committer takes segments, for
            // `WalWriter::flush`.
            Ok(()) => {
                shared.sealed.fetch_add(1, Ordering::AcqRel);
            }
            Err(mpsc::error::SendError(sealed)) => {
                fail_sealed(sealed, ErrorCode::KafkaStorageError, "the writer is closed");
            }
        },
        None => fail_sealed(sealed, ErrorCode::KafkaStorageError, "the writer is closed"),
    }
}

/// Uploads a segment; with `hedge_after`, a second identical upload starts if the first has not
/// finished by then, and the first success wins (the other is dropped, which cancels it; a cancelled
/// PUT that lands anyway wrote the same bytes under the same key). Fails only when every attempt
/// failed, with the last error.
async fn upload_hedged(
    storage: &dyn ObjectStorage,
    key: &ObjectKey,
    chunks: &[Bytes],
    hedge_after: Option<Duration>,
    on_hedge: impl FnOnce(),
) -> Result<(), StorageError> {
    let first = storage.upload(key, chunks);
    let Some(after) = hedge_after else {
        return first.await;
    };
    tokio::pin!(first);
    // `biased`: polled in order, so a run under a simulated clock is deterministic.
    tokio::select! {
        biased;
        result = &mut first => return result,
        _ = tokio::time::sleep(after) => {}
    }
    on_hedge();
    debug!(key = %key, "upload is slow, hedging with a second attempt");
    let second = storage.upload(key, chunks);
    tokio::pin!(second);
    tokio::select! {
        biased;
        result = &mut first => match result {
            Ok(()) => Ok(()),
            Err(_) => second.await,
        },
        result = &mut second => match result {
            Ok(()) => Ok(()),
            Err(_) => first.await,
        },
    }
}

/// One sealed segment counted in `Shared::uploading` until its upload ends (also when the upload
/// task is aborted or panics, so an adaptive writer never waits for a slot that cannot free).
struct InFlight(Arc<Shared>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.uploading.fetch_sub(1, Ordering::AcqRel);
        self.0.timer.notify_one();
    }
}

/// Folds one successful upload's duration into the writer's moving average (new = old + (d -
/// old) / 8; the first upload sets it).
fn record_upload_time(shared: &Shared, took: Duration) {
    let took = u64::try_from(took.as_micros()).unwrap_or(u64::MAX).max(1);
    let _ = shared
        .upload_micros
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |old| {
            Some(if old == 0 {
                took
            } else {
                old - old / 8 + took / 8
            })
        });
}

/// The least time between two seals of an adaptive writer now: `min_interval`, or
/// `upload_multiple_pct` percent of the recent upload time when that is longer (this part never
/// more than `commit_interval`).
pub(super) fn seal_spacing(shared: &Shared, min_interval: Duration, pct: u32) -> Duration {
    if pct == 0 {
        return min_interval;
    }
    let recent = shared.upload_micros.load(Ordering::Acquire);
    let linked = Duration::from_micros(recent.saturating_mul(u64::from(pct)) / 100)
        .min(shared.config.commit_interval);
    min_interval.max(linked)
}

/// Whether an adaptive writer seals the (non-empty) buffer now: the pipeline has room, and the
/// seal spacing ([`seal_spacing`]) has passed since the previous seal or the buffer holds
/// `early_bytes`.
pub(super) fn adaptive_ready(shared: &Shared, buffer: &Buffer) -> bool {
    let SealPolicy::Adaptive {
        min_interval,
        max_in_flight,
        early_bytes,
        upload_multiple_pct,
    } = shared.config.seal_policy
    else {
        return false;
    };
    let spacing = seal_spacing(shared, min_interval, upload_multiple_pct);
    !buffer.entries.is_empty()
        && shared.uploading.load(Ordering::Acquire) < max_in_flight
        && (buffer.bytes >= early_bytes
            || buffer
                .last_seal
                .is_none_or(|t| t + spacing <= Instant::now()))
}

/// Closes the buffer `commit_interval` after its first batch, and, for an adaptive writer, when the
/// pipeline has room once `min_interval` has passed since the previous seal (at once when the
/// buffer holds `early_bytes`: a buffer that reached them while the pipeline was full).
pub(super) async fn run_timer(shared: Arc<Shared>) {
    loop {
        if shared.closed.load(Ordering::Acquire) {
            return;
        }
        let next = {
            let buffer = shared.buffer.lock();
            buffer.opened_at.map(|at| {
                let mut deadline = at + shared.config.commit_interval;
                if let SealPolicy::Adaptive {
                    min_interval,
                    max_in_flight,
                    early_bytes,
                    upload_multiple_pct,
                } = shared.config.seal_policy
                    && shared.uploading.load(Ordering::Acquire) < max_in_flight
                {
                    if buffer.bytes >= early_bytes {
                        deadline = Instant::now();
                    } else if let Some(last) = buffer.last_seal {
                        let spacing = seal_spacing(&shared, min_interval, upload_multiple_pct);
                        deadline = deadline.min(last + spacing);
                    }
                }
                deadline
            })
        };
        match next {
            None => shared.timer.notified().await,
            Some(deadline) => {
                tokio::select! {
                    biased;
                    _ = tokio::time::sleep_until(deadline) => {
                        let mut buffer = shared.buffer.lock();
                        let due = buffer
                            .opened_at
                            .is_some_and(|t| t + shared.config.commit_interval <= Instant::now());
                        if due || adaptive_ready(&shared, &buffer) {
                            seal_locked(&shared, &mut buffer);
                        }
                    }
                    _ = shared.timer.notified() => {}
                }
            }
        }
    }
}

/// Puts a freshly uploaded segment into the cache, cut into aligned blocks.
async fn fill_cache(
    cache: &dyn LocalCache,
    key: &str,
    chunks: &[Bytes],
    size: u64,
    block_size: u64,
) {
    let object: Arc<str> = Arc::from(key);
    // Each block is allocated at its exact final size (the last one is usually shorter): a
    // `Bytes` keeps its whole allocation, and the cache weighs blocks by length.
    let capacity = |index: u64| {
        usize::try_from(block_size.min(size.saturating_sub(index.saturating_mul(block_size))))
            .unwrap_or(0)
    };
    let mut block = Vec::with_capacity(capacity(0));
    let mut index = 0u64;
    for chunk in chunks {
        let mut rest = &chunk[..];
        while !rest.is_empty() {
            let room = usize::try_from(block_size).unwrap_or(usize::MAX) - block.len();
            let take = room.min(rest.len());
            block.extend_from_slice(&rest[..take]);
            rest = &rest[take..];
            if block.len() as u64 == block_size {
                let full = std::mem::replace(&mut block, Vec::with_capacity(capacity(index + 1)));
                cache
                    .insert(
                        BlockKey::new(object.clone(), block_size, index),
                        Bytes::from(full),
                    )
                    .await;
                index += 1;
            }
        }
    }
    if !block.is_empty() {
        cache
            .insert(BlockKey::new(object, block_size, index), Bytes::from(block))
            .await;
    }
}
