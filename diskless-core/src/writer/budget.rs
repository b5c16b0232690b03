//! The writer's two memory bounds: pending bytes (buffered or uploading) and uncommitted bytes
//! (not yet answered), as semaphores of bytes.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::Backpressure;
use super::PendingProduce;
use super::commit::{Slot, fill_errors};
use diskless_coordinator::ErrorCode;

/// The outcome of taking permits from a bound.
pub(super) enum Acquired {
    Got(OwnedSemaphorePermit),
    /// Fail-fast mode and not enough permits now.
    Full,
    /// The writer is closed.
    Closed,
}

/// Takes `bytes` (at least 1, at most the whole `bound`) from `semaphore`, waiting or not.
pub(super) async fn acquire(
    semaphore: &Arc<Semaphore>,
    bytes: usize,
    bound: usize,
    mode: Backpressure,
) -> Acquired {
    // The bounds are at most Semaphore::MAX_PERMITS (checked at construction); beyond u32 a
    // request simply takes the whole bound.
    let want = u32::try_from(bytes.clamp(1, bound)).unwrap_or(u32::MAX);
    let want = want.min(u32::try_from(bound).unwrap_or(u32::MAX));
    match mode {
        Backpressure::Wait => match semaphore.clone().acquire_many_owned(want).await {
            Ok(p) => Acquired::Got(p),
            Err(_) => Acquired::Closed,
        },
        Backpressure::FailFast => match semaphore.clone().try_acquire_many_owned(want) {
            Ok(p) => Acquired::Got(p),
            Err(tokio::sync::TryAcquireError::NoPermits) => Acquired::Full,
            Err(tokio::sync::TryAcquireError::Closed) => Acquired::Closed,
        },
    }
}

/// Answers a request refused by a memory bound.
pub(super) fn refuse(slots: Vec<Slot>, refused: Acquired) -> PendingProduce {
    match refused {
        Acquired::Closed => {
            fill_errors(slots, ErrorCode::KafkaStorageError, "the writer is closed")
        }
        _ => fill_errors(
            slots,
            ErrorCode::KafkaStorageError,
            "the broker's produce buffer is full; retry later",
        ),
    }
}
