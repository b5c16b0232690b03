//! [`CommitSignal`]: "the log of some partition just grew", from the writers of a process to its
//! long-polling fetches ([`Fetcher::fetch_wait`](crate::Fetcher::fetch_wait)).
//!
//! A [`DisklessNode`](crate::DisklessNode) makes one and gives it to each of its writers, to its
//! fetcher and to its coordinator (a layer that notifies after transaction markers were written:
//! they move the last stable offset). A host composing the parts itself does the same with
//! [`WalWriterBuilder::with_commit_signal`](crate::WalWriterBuilder::with_commit_signal) and
//! [`FetcherBuilder::with_commit_signal`](crate::FetcherBuilder::with_commit_signal), and calls
//! [`CommitSignal::notify`] after anything else it appends to a log (its own marker writes).
//!
//! The signal says nothing about which partition: a waiting fetch wakes up and reads again. Writes
//! of other processes sharing the coordinator never reach it; a long-polling fetch sees them by
//! reading again every [`FetcherConfig::long_poll_interval`](crate::FetcherConfig::long_poll_interval).

use std::sync::Arc;

use async_trait::async_trait;
use diskless_coordinator::{
    BatchCoordinator, CoordinatorError, CoordinatorLayer, TxnMarker, TxnMarkerResult,
};
use tokio::sync::watch;

/// A shared, cheap to clone counter of successful commits that wakes the tasks watching it.
///
/// [`notify`](Self::notify) costs one uncontended lock and a wake-up of the current watchers (a
/// writer calls it once per committed segment, not per request); a watcher that was busy when it
/// fired sees it at its next [`watch::Receiver::changed`], notifications in between merged into one.
///
/// ```
/// use diskless_core::CommitSignal;
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let signal = CommitSignal::new();
/// let mut watcher = signal.subscribe();
/// signal.clone().notify();
/// watcher.changed().await.unwrap();
/// assert_eq!(signal.count(), 1);
/// # });
/// ```
#[derive(Clone, Debug)]
pub struct CommitSignal {
    sender: Arc<watch::Sender<u64>>,
}

impl Default for CommitSignal {
    fn default() -> Self {
        CommitSignal::new()
    }
}

impl CommitSignal {
    /// A signal nobody has notified yet.
    pub fn new() -> Self {
        CommitSignal {
            sender: Arc::new(watch::Sender::new(0)),
        }
    }

    /// Tells every watcher that a log grew (a commit or a transaction marker succeeded).
    pub fn notify(&self) {
        self.sender.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// A watcher: its [`changed`](watch::Receiver::changed) completes at the first
    /// [`notify`](Self::notify) after the subscription (or after its last
    /// [`borrow_and_update`](watch::Receiver::borrow_and_update)). It never reports the sender
    /// gone while this signal, or a clone of it, lives.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.sender.subscribe()
    }

    /// How many times it was notified (wrapping), for tests and diagnostics.
    pub fn count(&self) -> u64 {
        *self.sender.borrow()
    }
}

/// The coordinator layer of a [`DisklessNode`](crate::DisklessNode): notifies its signal after
/// transaction markers were written (a marker moves the last stable offset that `read_committed`
/// fetches wait for), whoever wrote them through the node's coordinator.
#[derive(Debug)]
pub(crate) struct NotifyOnMarkers(pub(crate) CommitSignal);

#[async_trait]
impl CoordinatorLayer for NotifyOnMarkers {
    async fn write_txn_markers(
        &self,
        inner: &dyn BatchCoordinator,
        markers: &[TxnMarker],
    ) -> Result<Vec<TxnMarkerResult>, CoordinatorError> {
        let results = inner.write_txn_markers(markers).await?;
        if results.iter().any(|r| r.error.is_ok() && !r.duplicate) {
            self.0.notify();
        }
        Ok(results)
    }
}
