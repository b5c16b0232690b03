//! The answers of the produce path: one partition's answer ([`PartitionResponse`],
//! [`ProduceRecordError`]), the future a request's answers arrive through ([`PendingProduce`]),
//! and a buffered request's answer slots ([`Waiter`], [`Slot`]) with the ways they are filled and
//! sent, whichever step of the pipeline answers.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use diskless_common::metrics as m;
use diskless_coordinator::{ErrorCode, NO_TIMESTAMP, TopicIdPartition};
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::budget::{Acquired, Held};

/// A record that failed validation (Kafka's `BatchIndexAndErrorMessage`).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ProduceRecordError {
    /// The index of the failing record within its batch.
    pub batch_index: i32,
    /// What is wrong with it.
    pub message: String,
}

impl ProduceRecordError {
    /// The error of the record at `batch_index`.
    pub fn new(batch_index: i32, message: impl Into<String>) -> Self {
        ProduceRecordError {
            batch_index,
            message: message.into(),
        }
    }
}

/// The answer for one partition of a Produce request (Kafka's `PartitionProduceResponse`).
/// Built by the writer; [`PartitionResponse::error`] builds an error answer (e.g. for a host's
/// own refusals, or in tests).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PartitionResponse {
    /// The partition.
    pub partition: TopicIdPartition,
    /// [`ErrorCode::None`] on success.
    pub error: ErrorCode,
    /// A human-readable reason on error.
    pub error_message: Option<String>,
    /// The offset given to the partition's first record; `-1` on error.
    pub base_offset: i64,
    /// The commit time for LogAppendTime topics, else `-1`.
    pub log_append_time: i64,
    /// The partition's log start offset; `-1` when unknown.
    pub log_start_offset: i64,
    /// Per-record validation errors (Kafka's `record_errors`).
    pub record_errors: Vec<ProduceRecordError>,
}

impl PartitionResponse {
    /// An error answer: `error` with `message`, offsets and times `-1`, no record errors.
    pub fn error(
        partition: TopicIdPartition,
        error: ErrorCode,
        message: impl Into<String>,
    ) -> Self {
        PartitionResponse {
            partition,
            error,
            error_message: Some(message.into()),
            base_offset: -1,
            log_append_time: NO_TIMESTAMP,
            log_start_offset: -1,
            record_errors: Vec::new(),
        }
    }

    /// Adds a per-record validation error.
    pub fn with_record_error(mut self, record_error: ProduceRecordError) -> Self {
        self.record_errors.push(record_error);
        self
    }
}

/// The future of one request's answers, returned by [`WalWriter::append`](crate::WalWriter::append). It resolves, to one
/// answer per partition in request order, once the request's segment is committed (or failed).
///
/// # Cancel safety
///
/// Dropping a `PendingProduce` does not withdraw the request: by the time `append` returned it, the
/// request was in the writer's buffer, and it is sealed, uploaded and committed as if it were
/// still awaited (its batches get offsets and consumers see them). Only the answer is lost — the
/// assigned offsets, or the error. A host that drops it (a client disconnect, say) must assume the
/// request may be committed; a producer that retries it is deduplicated only if it is idempotent.
/// Polling it again after it resolved gives an empty `Vec`.
#[must_use = "the answers arrive through this future; dropping it does not cancel the request"]
pub struct PendingProduce {
    state: PendingState,
}

impl PendingProduce {
    /// The answers of a buffered request, to come through `rx` (`partitions` get a storage error
    /// if the writer goes away without answering).
    pub(super) fn waiting(
        rx: oneshot::Receiver<Vec<PartitionResponse>>,
        partitions: Vec<TopicIdPartition>,
    ) -> Self {
        PendingProduce {
            state: PendingState::Waiting { rx, partitions },
        }
    }
}

impl std::fmt::Debug for PendingProduce {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match &self.state {
            PendingState::Ready(_) => "ready",
            PendingState::Waiting { .. } => "waiting",
        };
        f.debug_struct("PendingProduce")
            .field("state", &state)
            .finish()
    }
}

enum PendingState {
    Ready(Option<Vec<PartitionResponse>>),
    Waiting {
        rx: oneshot::Receiver<Vec<PartitionResponse>>,
        partitions: Vec<TopicIdPartition>,
    },
}

impl Future for PendingProduce {
    type Output = Vec<PartitionResponse>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.state {
            PendingState::Ready(v) => Poll::Ready(v.take().unwrap_or_default()),
            PendingState::Waiting { rx, partitions } => match Pin::new(rx).poll(cx) {
                Poll::Ready(Ok(v)) => Poll::Ready(v),
                // The writer went away without answering: every partition gets a storage error.
                Poll::Ready(Err(_)) => Poll::Ready(
                    partitions
                        .iter()
                        .map(|p| {
                            PartitionResponse::error(
                                *p,
                                ErrorCode::KafkaStorageError,
                                "the writer shut down before the request was committed",
                            )
                        })
                        .collect(),
                ),
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

/// The answer slot of one partition of a buffered request.
pub(super) enum Slot {
    /// Waiting for the coordinator.
    Pending(TopicIdPartition),
    /// Answered (validation failure, or the commit result of its first batch).
    Done(PartitionResponse),
}

/// A request waiting in the buffer for its segment's commit.
pub(super) struct Waiter {
    pub(super) tx: oneshot::Sender<Vec<PartitionResponse>>,
    pub(super) slots: Vec<Slot>,
    /// When `append` was called (for `PRODUCE_SECONDS`).
    pub(super) started: Instant,
    /// The request's share of the pending-bytes budget. At seal it moves to the upload task and is
    /// released once the segment's bytes are uploaded (or failed): a segment waiting for its turn to
    /// commit holds only metadata, so one slow upload does not hold the budget of later ones.
    pub(super) permit: Option<Held>,
    /// The request's share of the uncommitted-bytes bound, released when it is answered.
    pub(super) _uncommitted: Held,
}

/// Records one request's [`m::PRODUCE_SECONDS`]: `ok` when every partition succeeded.
pub(super) fn record_produce(started: Instant, answers: &[PartitionResponse]) {
    let outcome = if answers.iter().all(|r| r.error.is_ok()) {
        m::OK
    } else {
        m::ERROR
    };
    metrics::histogram!(m::PRODUCE_SECONDS, m::OUTCOME => outcome)
        .record(started.elapsed().as_secs_f64());
}

/// A request answered at once, without entering the buffer.
pub(super) fn ready(answers: Vec<PartitionResponse>, started: Instant) -> PendingProduce {
    record_produce(started, &answers);
    PendingProduce {
        state: PendingState::Ready(Some(answers)),
    }
}

/// Answers a request that never entered the buffer: pending slots get `error`.
pub(super) fn fill_errors(
    slots: Vec<Slot>,
    error: ErrorCode,
    message: &str,
    started: Instant,
) -> PendingProduce {
    ready(finish_slots(slots, error, message), started)
}

/// Turns slots into answers; slots still pending get `error`.
pub(super) fn finish_slots(
    slots: Vec<Slot>,
    error: ErrorCode,
    message: &str,
) -> Vec<PartitionResponse> {
    slots
        .into_iter()
        .map(|slot| match slot {
            Slot::Done(r) => r,
            Slot::Pending(p) => PartitionResponse::error(p, error, message),
        })
        .collect()
}

/// Answers a request; its still-pending slots get `error`.
pub(super) fn complete_all(waiter: Waiter, error: ErrorCode, message: &str) {
    let answers = finish_slots(waiter.slots, error, message);
    record_produce(waiter.started, &answers);
    // The requester may have gone away (its `PendingProduce` dropped); nothing to do then.
    let _ = waiter.tx.send(answers);
}

/// Answers a request refused by a memory bound.
pub(super) fn refuse(slots: Vec<Slot>, refused: Acquired, started: Instant) -> PendingProduce {
    match refused {
        Acquired::Closed => fill_errors(
            slots,
            ErrorCode::KafkaStorageError,
            "the writer is closed",
            started,
        ),
        _ => fill_errors(
            slots,
            ErrorCode::KafkaStorageError,
            "the broker's produce buffer is full; retry later",
            started,
        ),
    }
}
