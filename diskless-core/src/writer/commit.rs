//! Committing sealed segments strictly in seal order, and answering their requests.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use diskless_common::metrics as m;
use diskless_coordinator::{CoordinatorError, ErrorCode};
use diskless_storage::{ObjectKey, StorageError};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tracing::{Instrument, debug, info_span, warn};

use super::answer::{PartitionResponse, Slot, complete_all};
use super::resolve::{BatchIdentity, Resolved, resolve};
use super::state::{Sealed, Shared};

/// Takes closed segments in order: waits for each upload, commits, answers. `done` counts the
/// segments answered (what `WalWriter::flush` waits for); it is dropped when the task ends, which
/// tells the waiters that nothing more will be answered.
pub(super) async fn run_committer(
    shared: Arc<Shared>,
    mut rx: mpsc::UnboundedReceiver<Sealed>,
    done: watch::Sender<u64>,
) {
    while let Some(sealed) = rx.recv().await {
        let span = info_span!("commit", key = %sealed.key, batches = sealed.targets.len());
        commit_one(&shared, sealed).instrument(span).await;
        done.send_modify(|n| *n += 1);
    }
    shared.finished.send_replace(true);
}

/// Deletes an object the writer made and will not commit, in the background; `WalWriter::close`
/// waits for these deletes.
fn spawn_delete(shared: &Shared, key: ObjectKey, what: &'static str) {
    let storage = shared.storage.clone();
    let task = shared.runtime.spawn(
        async move {
            if let Err(e) = storage.delete(std::slice::from_ref(&key)).await {
                warn!(key = %key, error = %e, "could not delete {what}; orphan collection will");
            }
        }
        .in_current_span(),
    );
    let mut deletes = shared.deletes.lock();
    deletes.retain(|t| !t.is_finished());
    deletes.push(task);
}

async fn commit_one(shared: &Arc<Shared>, sealed: Sealed) {
    let Sealed {
        key,
        size,
        targets,
        commit,
        mut waiters,
        upload,
        gauge: _in_flight,
        sealed_at,
        oldest,
    } = sealed;
    let picked = Instant::now();
    let counters = &shared.counters;
    let uploaded = match upload.await {
        Ok(result) => result,
        Err(join) => Err(StorageError::Transient {
            source: Box::new(join),
        }),
    };
    if let Err(e) = uploaded {
        counters.upload_failures.fetch_add(1, Ordering::Relaxed);
        warn!(key = %key, error = %e, "segment upload failed");
        // An attempt may have landed before the failure was seen: leave no garbage.
        spawn_delete(shared, key, "a failed upload");
        for w in waiters {
            complete_all(
                w,
                ErrorCode::KafkaStorageError,
                &format!("upload of the WAL segment failed: {e}"),
            );
        }
        return;
    }
    counters.segments_uploaded.fetch_add(1, Ordering::Relaxed);
    counters.bytes_uploaded.fetch_add(size, Ordering::Relaxed);

    let timeout = shared.config.commit_timeout;
    // What identifies each batch in its producer's state, should the answer be lost.
    let identities: Vec<BatchIdentity> = commit
        .batches
        .iter()
        .map(|b| BatchIdentity {
            partition: b.partition,
            producer_id: b.producer_id,
            producer_epoch: b.producer_epoch,
            base_sequence: b.base_sequence,
            last_sequence: b.last_sequence,
        })
        .collect();
    let started = Instant::now();
    let answer = match tokio::time::timeout(timeout, shared.coordinator.commit_file(commit)).await {
        Ok(answer) => answer,
        Err(_) => {
            counters.commit_timeouts.fetch_add(1, Ordering::Relaxed);
            // Abandoned: the call may still apply (until the coordinator's commit deadline), so the
            // object stays; the orphan collector fences and deletes it if it never committed.
            Err(CoordinatorError::OutcomeUnknown(
                format!("no answer from the coordinator within the commit timeout ({timeout:?})")
                    .into(),
            ))
        }
    };
    let outcome = if answer.is_ok() { m::OK } else { m::ERROR };
    metrics::histogram!(m::COMMIT_SECONDS, m::OUTCOME => outcome)
        .record(started.elapsed().as_secs_f64());
    // A commit that may have applied is settled before anything is answered (resolve.rs: why an
    // idempotent producer needs it).
    let mut fenced = false;
    let answer = match answer {
        Err(e) if !e.certainly_not_applied() => {
            let already = matches!(e, CoordinatorError::ObjectAlreadyCommitted(_));
            match resolve(
                shared.coordinator.as_ref(),
                &key,
                &identities,
                already,
                timeout,
            )
            .await
            {
                Resolved::Applied(results) => {
                    counters.unknown_resolved.fetch_add(1, Ordering::Relaxed);
                    warn!(key = %key, error = %e, "segment commit answer lost; it applied");
                    Ok(results)
                }
                Resolved::NotApplied => {
                    counters.unknown_resolved.fetch_add(1, Ordering::Relaxed);
                    fenced = true;
                    Err(CoordinatorError::ObjectFenced(format!(
                        "{key}: the commit's answer was lost ({e}); it did not apply, and the key \
                         is fenced"
                    )))
                }
                Resolved::Unknown => Err(e),
            }
        }
        other => other,
    };
    // Where the oldest request of this segment waited, in order: for the seal, for the
    // segments sealed before it (commits are in seal order), for the rest of its own upload,
    // and for the coordinator. `RUST_LOG=diskless_core::writer::commit=debug` prints it per
    // segment (BENCHMARKS.md, issue #30: where the latency at low load comes from).
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    debug!(
        key = %key,
        bytes = size,
        requests = waiters.len(),
        seal_wait_ms = ms(sealed_at.saturating_duration_since(oldest)),
        ordering_ms = ms(picked.saturating_duration_since(sealed_at)),
        upload_rest_ms = ms(started.saturating_duration_since(picked)),
        commit_ms = ms(started.elapsed()),
        total_ms = ms(oldest.elapsed()),
        "segment timing"
    );
    match answer {
        Ok(results) => {
            counters.segments_committed.fetch_add(1, Ordering::Relaxed);
            // Wake the long-polling fetches: the logs grew (a duplicate added nothing).
            if let Some(signal) = &shared.commit_signal
                && results.iter().any(|r| r.error.is_ok() && !r.duplicate)
            {
                signal.notify();
            }
            for (entry, result) in targets.iter().zip(results.iter()) {
                if result.error.is_ok() && !result.duplicate {
                    counters.batches_committed.fetch_add(1, Ordering::Relaxed);
                }
                let Some(slot) = waiters
                    .get_mut(entry.request)
                    .and_then(|w| w.slots.get_mut(entry.slot))
                else {
                    continue;
                };
                let rejected = |partition| match result.error {
                    // A batch verified for the producer's next transaction while the previous
                    // one is still open in the partition: Kafka's `ReplicaManager` answers a
                    // produce whose verification says CONCURRENT_TRANSACTIONS with
                    // NOT_ENOUGH_REPLICAS, which every client retries.
                    ErrorCode::ConcurrentTransactions => PartitionResponse::error(
                        partition,
                        ErrorCode::NotEnoughReplicas,
                        "Unable to verify the partition has been added to the transaction. \
                         Underlying error: CONCURRENT_TRANSACTIONS",
                    ),
                    code => PartitionResponse::error(
                        partition,
                        code,
                        format!("batch rejected by the coordinator: {code}"),
                    ),
                };
                match slot {
                    // The partition's first batch gives the answer's offsets.
                    Slot::Pending(partition) if result.error.is_ok() => {
                        *slot = Slot::Done(PartitionResponse {
                            partition: *partition,
                            error: ErrorCode::None,
                            error_message: None,
                            base_offset: result.base_offset,
                            log_append_time: result.log_append_time,
                            log_start_offset: result.log_start_offset,
                            record_errors: Vec::new(),
                        })
                    }
                    Slot::Pending(partition) => *slot = Slot::Done(rejected(*partition)),
                    // One batch per partition today (validate_produce_records); kept so that a
                    // partition's answer fails if any of its batches is rejected.
                    Slot::Done(r) if r.error.is_ok() && !result.error.is_ok() => {
                        *r = rejected(r.partition)
                    }
                    Slot::Done(_) => {}
                }
            }
            if results.len() != targets.len() {
                warn!(
                    key = %key,
                    expected = targets.len(),
                    got = results.len(),
                    "coordinator answered a different number of batches"
                );
            }
            for w in waiters {
                complete_all(
                    w,
                    ErrorCode::UnknownServerError,
                    "the coordinator did not answer for this batch",
                );
            }
        }
        Err(e) => {
            counters.commit_failures.fetch_add(1, Ordering::Relaxed);
            // Only errors that say the commit certainly did not apply make the object garbage;
            // anything else (outcome unknown, "already committed" after some retry layer) keeps it
            // for the orphan collector, which asks the coordinator first.
            let certainly_not_applied = e.certainly_not_applied();
            let code = match &e {
                // Settled: not applied, so not persisted (librdkafka may send it again safely).
                _ if fenced => ErrorCode::KafkaStorageError,
                CoordinatorError::OutcomeUnknown(_)
                | CoordinatorError::ObjectAlreadyCommitted(_) => ErrorCode::RequestTimedOut,
                other => other.error_code(),
            };
            warn!(key = %key, error = %e, "segment commit failed");
            if certainly_not_applied {
                spawn_delete(shared, key, "an uncommitted segment");
            }
            for w in waiters {
                complete_all(w, code, &format!("commit of the WAL segment failed: {e}"));
            }
        }
    }
}
