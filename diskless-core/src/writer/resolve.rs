//! Learning what a commit whose answer was lost did, before answering its requests.
//!
//! A commit can fail without saying whether it applied ([`CoordinatorError::OutcomeUnknown`]: the
//! connection broke after the commit was sent, the writer's `commit_timeout` abandoned the call,
//! a COMMIT failed in a way the database does not explain). Answering `REQUEST_TIMED_OUT` (Kafka's
//! "possibly persisted") is honest but not enough for an idempotent producer in practice: the
//! fault campaign (chaos/, `pg-cut`) showed librdkafka appending records twice. One request's
//! commit applied and was answered `REQUEST_TIMED_OUT`; another partition's commit had not applied,
//! so the producer's next batch there was refused `OUT_OF_ORDER_SEQUENCE_NUMBER`; librdkafka then
//! bumps its epoch (KIP-360) and sends every unacknowledged batch again under the new epoch, where
//! no sequence check can recognise the one that had been appended. Under Kafka a leader that
//! answers `REQUEST_TIMED_OUT` has appended the batch, so that sequence never happens there.
//!
//! So the writer settles the outcome first ([`resolve`]), with two calls every coordinator with
//! the lifecycle capability serves:
//!
//! 1. [`BatchCoordinator::fence_orphans`] on the object key. It is atomic with respect to every
//!    `commit_file` (the orphan collector's guarantee): if the key comes back fenced, the commit
//!    did not apply and never will — every batch is answered `KAFKA_STORAGE_ERROR` (retriable,
//!    not persisted) and the object is deleted. Otherwise the coordinator knows the object: the
//!    commit applied (on a sharded coordinator: on the shards that know it; the others are fenced
//!    now).
//! 2. For each idempotent batch of an applied commit, [`BatchCoordinator::producer_state`]: the
//!    producer's last batches in the partition hold it (same epoch and sequences) with the offsets
//!    it was given, which are the answer. A batch not found there, where the window shows it
//!    cannot have been pushed out (`surely_absent`), was not appended by this commit (rejected, a
//!    duplicate, or on a shard that did not apply) and is answered `KAFKA_STORAGE_ERROR`: its
//!    retry is judged by the coordinator as any other; otherwise it keeps `REQUEST_TIMED_OUT`. A
//!    batch without
//!    a producer id cannot be identified this way and keeps `REQUEST_TIMED_OUT` (possibly
//!    persisted: a retry of a non-idempotent producer may duplicate, as with Kafka).
//!
//! Each call is retried until [`WalWriterConfig::commit_timeout`](super::WalWriterConfig) has
//! passed since the resolution began; if the coordinator stays unreachable the outcome stays
//! unknown and every request is answered `REQUEST_TIMED_OUT`, as before. Tested in
//! `diskless-core/tests/produce_fetch.rs` (`unknown_commit_outcome_*`).

use std::time::Duration;

use diskless_coordinator::{
    BatchCoordinator, Capability, CommitBatchResult, CoordinatorError, ErrorCode, NO_PRODUCER_ID,
    PRODUCER_BATCH_WINDOW, ProducerState, TopicIdPartition,
};
use diskless_storage::ObjectKey;
use tokio::time::Instant;
use tracing::{debug, warn};

/// What an idempotent batch is known by in its producer's state.
#[derive(Clone, Copy, Debug)]
pub(super) struct BatchIdentity {
    pub(super) partition: TopicIdPartition,
    pub(super) producer_id: i64,
    pub(super) producer_epoch: i16,
    pub(super) base_sequence: i32,
    pub(super) last_sequence: i32,
}

/// What a commit with an unknown outcome turned out to have done.
pub(super) enum Resolved {
    /// It applied: one result per batch of the commit.
    Applied(Vec<CommitBatchResult>),
    /// It did not and never will (the key is fenced): the object is garbage.
    NotApplied,
    /// Still unknown (the coordinator could not be asked in time).
    Unknown,
}

/// Asks `coordinator` what the commit of `key` (whose batches are `batches`, in commit order) did,
/// retrying failed calls until `budget` has passed.
pub(super) async fn resolve(
    coordinator: &dyn BatchCoordinator,
    key: &ObjectKey,
    batches: &[BatchIdentity],
    already_committed: bool,
    budget: Duration,
) -> Resolved {
    // `fence_orphans` neither fences nor returns a key without a UUID v7 time, so for such a key
    // "not returned" would not mean "known": only keys a `KeySource` made as its contract says
    // are settled.
    if !coordinator.capabilities().contains(Capability::Lifecycle) || key.created_at().is_none() {
        return Resolved::Unknown;
    }
    let key = key.as_str();
    let deadline = Instant::now() + budget;
    if !already_committed {
        let keys = [key.to_string()];
        let Some(fenced) = retrying(deadline, "fence", || coordinator.fence_orphans(&keys)).await
        else {
            return Resolved::Unknown;
        };
        if fenced.iter().any(|k| k == key) {
            debug!(
                key,
                "the commit's answer was lost; it did not apply (fenced now)"
            );
            return Resolved::NotApplied;
        }
    }
    let mut results = Vec::with_capacity(batches.len());
    for b in batches {
        if b.producer_id == NO_PRODUCER_ID {
            results.push(CommitBatchResult::error(ErrorCode::RequestTimedOut));
            continue;
        }
        let Some(state) = retrying(deadline, "producer state", || {
            coordinator.producer_state(b.partition, b.producer_id)
        })
        .await
        else {
            return Resolved::Unknown;
        };
        results.push(match state {
            // No state: the batch was not appended (appending it would have made one).
            None => CommitBatchResult::error(ErrorCode::KafkaStorageError),
            // A newer epoch keeps no batches of this one: nothing tells any more.
            Some(s) if s.producer_epoch != b.producer_epoch => {
                CommitBatchResult::error(ErrorCode::RequestTimedOut)
            }
            // The window holds the producer's last PRODUCER_BATCH_WINDOW batches: an appended
            // batch is in it unless later ones pushed it out, which `surely_absent` rules out
            // before answering "not persisted".
            Some(s) => {
                match s.batches.iter().find(|p| {
                    p.base_sequence == b.base_sequence && p.last_sequence == b.last_sequence
                }) {
                    Some(p) => CommitBatchResult {
                        error: ErrorCode::None,
                        base_offset: p.base_offset,
                        log_append_time: p.log_append_time,
                        log_start_offset: -1,
                        duplicate: false,
                    },
                    None if surely_absent(&s, b) => {
                        CommitBatchResult::error(ErrorCode::KafkaStorageError)
                    }
                    None => CommitBatchResult::error(ErrorCode::RequestTimedOut),
                }
            }
        });
    }
    debug!(key, "the commit's answer was lost; it applied");
    Resolved::Applied(results)
}

/// Whether `b`, not in its producer's window `s` (same epoch), was certainly not appended: the
/// window never dropped a batch of this epoch (it is not full), or `b` lies within or after it
/// (sequences not wrapping), where it would be if it had been appended.
fn surely_absent(s: &ProducerState, b: &BatchIdentity) -> bool {
    let (Some(first), Some(last)) = (s.batches.first(), s.batches.last()) else {
        return true;
    };
    s.batches.len() < PRODUCER_BATCH_WINDOW
        || (first.base_sequence <= last.last_sequence && b.base_sequence >= first.base_sequence)
}

/// `call` until it succeeds or `deadline` passes (`None`), backing off from 10 ms to 1 s.
async fn retrying<T, F, Fut>(deadline: Instant, what: &str, mut call: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, CoordinatorError>>,
{
    let mut backoff = Duration::from_millis(10);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, call()).await {
            Ok(Ok(v)) => return Some(v),
            Ok(Err(e)) if Instant::now() + backoff < deadline => {
                debug!(error = %e, what, "resolving a lost commit answer: retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
            Ok(Err(e)) => {
                warn!(error = %e, what, "could not learn what a lost commit did");
                return None;
            }
            Err(_) => {
                warn!(what, "could not learn what a lost commit did in time");
                return None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use diskless_coordinator::ProducerBatch;
    use uuid::Uuid;

    fn state(seqs: &[(i32, i32)]) -> ProducerState {
        let mut s = ProducerState::new(1, 0, 0);
        s.batches = seqs
            .iter()
            .map(|&(base_sequence, last_sequence)| ProducerBatch {
                base_sequence,
                last_sequence,
                base_offset: 0,
                last_offset: 0,
                log_append_time: -1,
            })
            .collect();
        s
    }

    fn batch(base_sequence: i32) -> BatchIdentity {
        BatchIdentity {
            partition: TopicIdPartition::new(Uuid::nil(), 0),
            producer_id: 1,
            producer_epoch: 0,
            base_sequence,
            last_sequence: base_sequence,
        }
    }

    /// "Not persisted" only where an appended batch would still be in the window.
    #[test]
    fn absence_is_claimed_only_where_the_window_would_show_the_batch() {
        assert!(surely_absent(&state(&[]), &batch(3)));
        assert!(surely_absent(&state(&[(0, 0), (1, 1)]), &batch(0)));
        let full = state(&[(10, 10), (11, 11), (12, 12), (13, 13), (14, 14)]);
        assert!(surely_absent(&full, &batch(12)));
        assert!(surely_absent(&full, &batch(15)));
        // Older than a full window: it may have been appended and pushed out.
        assert!(!surely_absent(&full, &batch(9)));
        // A window whose sequences wrap: nothing is claimed.
        let wrapped = state(&[
            (i32::MAX - 2, i32::MAX - 2),
            (i32::MAX - 1, i32::MAX - 1),
            (i32::MAX, i32::MAX),
            (0, 0),
            (1, 1),
        ]);
        assert!(!surely_absent(&wrapped, &batch(5)));
    }
}
