//! [`BlockingCoordinator`]: runs each call of a coordinator to completion on the calling thread.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::Thread;

use diskless_coordinator::{
    BatchCoordinator, CoordinatorError, CoordinatorLayer, CoordinatorOp, Layered,
};
use futures::future::BoxFuture;

/// Wakes a parked thread.
struct ThreadWaker(Thread);

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// Runs `future` to completion on this thread, parking between polls.
///
/// Inside a tokio task this blocks the runtime's thread: nothing else runs and, under a paused
/// clock, no virtual time passes until the future is done. Only for futures that complete by
/// themselves (work on other threads), never for ones that need this runtime to make progress.
///
/// The future runs outside tokio's cooperative budget ([`tokio::task::unconstrained`]): a tokio
/// resource (a `tokio::sync::Mutex`, say) polled by a task that has spent its budget answers
/// `Pending` and hands its wake-up to the scheduler, which never runs while this thread is
/// blocked — a deadlock.
pub fn block_on<F: Future>(future: F) -> F::Output {
    let mut future = pin!(tokio::task::unconstrained(future));
    let waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
        std::thread::park();
    }
}

/// A [`BatchCoordinator`] wrapper whose calls each run to completion inside the async method,
/// blocking the calling thread ([`block_on`]).
///
/// The SQLite coordinator runs its statements on a connection thread. Under a paused tokio clock,
/// the runtime would auto-advance virtual time while it waits for that thread, so how much
/// virtual time a call takes — and so the whole run — would depend on the host's speed. Wrapped,
/// a call takes no virtual time and the run is reproducible. Only for coordinators that make
/// progress without the caller's runtime (the in-memory SQLite coordinator does: one connection,
/// no pool).
#[derive(Debug)]
pub struct BlockingCoordinator;

impl BlockingCoordinator {
    /// Wraps `inner`.
    #[allow(clippy::new_ret_no_self)] // The layer is only ever used wrapped around a coordinator.
    pub fn new(inner: Arc<dyn BatchCoordinator>) -> Layered<BlockingCoordinator> {
        Layered::new(inner, BlockingCoordinator)
    }
}

impl CoordinatorLayer for BlockingCoordinator {
    fn around<'a, T: Send + 'a>(
        &'a self,
        _op: CoordinatorOp,
        call: BoxFuture<'a, Result<T, CoordinatorError>>,
    ) -> BoxFuture<'a, Result<T, CoordinatorError>> {
        Box::pin(async move { block_on(call) })
    }
}
