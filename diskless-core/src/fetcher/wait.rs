//! [`Fetcher::fetch_wait`]: Kafka's long-polling Fetch (`DelayedFetch`).

use std::time::Duration;

use tokio::time::Instant;

use super::{FetchError, FetchPartition, FetchedPartition, Fetcher};

impl Fetcher {
    /// Serves a Fetch request as Kafka does with its `min_bytes` and `max_wait_ms`: reads
    /// ([`Fetcher::fetch`]) and answers at once when nothing is asked (`requests` empty: no read
    /// at all), when the records read add up to at least `min_bytes`, when a partition answered
    /// with an error (`OFFSET_OUT_OF_RANGE`, `UNKNOWN_TOPIC_OR_PARTITION`, `KAFKA_STORAGE_ERROR`,
    /// ...) or when the read failed as a whole (`Err`); otherwise waits and reads again, until
    /// `max_wait` (at most [`FetcherConfig::max_wait_limit`](super::FetcherConfig::max_wait_limit))
    /// has passed since the call, and answers its last read.
    ///
    /// It reads again as soon as the fetcher's [`CommitSignal`](crate::CommitSignal)
    /// ([`Fetcher::commit_signal`]) is notified — a writer sharing it committed, a transaction
    /// marker was written through a [`DisklessNode`](crate::DisklessNode)'s coordinator — and at
    /// the latest every [`FetcherConfig::long_poll_interval`](super::FetcherConfig::long_poll_interval),
    /// which is how commits of other processes sharing the coordinator are seen. A notification
    /// during a read is not lost: the next wait ends at once.
    ///
    /// A host resolves the partitions it cannot serve (unknown topic, not a diskless partition)
    /// itself and leaves them out: as in Kafka, those do not cut the wait short. Time is tokio's
    /// (`tokio::time`: a test with paused time drives it).
    ///
    /// Each read is one [`Fetcher::fetch`] for the metrics and tracing (a read that does not end
    /// the wait is counted too).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`Fetcher::fetch`]: it only reads and waits.
    pub async fn fetch_wait(
        &self,
        requests: &[FetchPartition],
        fetch_max_bytes: u32,
        min_bytes: u32,
        max_wait: Duration,
    ) -> Result<Vec<FetchedPartition>, FetchError> {
        if requests.is_empty() {
            return Ok(Vec::new());
        }
        let min_bytes = usize::try_from(min_bytes).unwrap_or(usize::MAX);
        self.long_poll(max_wait, || async {
            let result = self.fetch(requests, fetch_max_bytes).await;
            let done = match &result {
                Err(_) => true,
                Ok(parts) => {
                    parts.iter().any(|p| !p.error.is_ok())
                        || parts
                            .iter()
                            .map(FetchedPartition::records_len)
                            .sum::<usize>()
                            >= min_bytes
                }
            };
            (result, done)
        })
        .await
    }

    /// The waiting of [`Fetcher::fetch_wait`] around a read of the host's own: calls `read`,
    /// which answers its result and whether that ends the wait (`true`: enough bytes, an error),
    /// and calls it again each time the [`CommitSignal`](crate::CommitSignal) is notified or
    /// [`FetcherConfig::long_poll_interval`](super::FetcherConfig::long_poll_interval) passes,
    /// until it answers `true` or `max_wait` (at most
    /// [`FetcherConfig::max_wait_limit`](super::FetcherConfig::max_wait_limit)) has passed since the
    /// call; returns the last result. `read` runs at least once.
    ///
    /// For a host whose Fetch mixes these diskless partitions with partitions of its own (classic
    /// topics): its `read` reads both, and it notifies the signal after its own appends, so one
    /// wait serves the whole request as Kafka's `DelayedFetch` does.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use std::time::Duration;
    /// # use diskless_core::Fetcher;
    /// # use diskless_coordinator::{BatchCoordinator, ManualClock};
    /// # use diskless_storage::{ObjectStorage, ObjectStoreStorage};
    /// # use diskless_testkit::coordinator::InMemoryCoordinator;
    /// # tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap().block_on(async {
    /// # let storage: Arc<dyn ObjectStorage> = Arc::new(ObjectStoreStorage::in_memory());
    /// # let coordinator: Arc<dyn BatchCoordinator> =
    /// #     Arc::new(InMemoryCoordinator::new(ManualClock::new(1_700_000_000_000)));
    /// let fetcher = Fetcher::builder(storage, coordinator).build().unwrap();
    /// let signal = fetcher.commit_signal().clone();
    /// let mut reads = 0;
    /// let answer = fetcher
    ///     .long_poll(Duration::from_secs(5), || {
    ///         reads += 1;
    ///         if reads == 1 {
    ///             signal.notify(); // what the host's own append does
    ///         }
    ///         let done = reads == 2;
    ///         async move { (reads, done) }
    ///     })
    ///     .await;
    /// assert_eq!(answer, 2, "woken by the signal, read again, done");
    /// # });
    /// ```
    ///
    /// # Cancel safety
    ///
    /// Cancel safe when `read`'s futures are: it only reads and waits.
    pub async fn long_poll<T, F, Fut>(&self, max_wait: Duration, mut read: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = (T, bool)>,
    {
        let deadline = Instant::now() + max_wait.min(self.config.max_wait_limit);
        let mut commits = self.commit_signal.subscribe();
        loop {
            // Seen before the read: a commit from here on ends the next wait at once.
            commits.borrow_and_update();
            let (result, done) = read().await;
            let now = Instant::now();
            if done || now >= deadline {
                return result;
            }
            let wait = (deadline - now).min(self.config.long_poll_interval);
            // The fetcher holds the signal, so `changed` never fails; a timeout reads again.
            let _ = tokio::time::timeout(wait, commits.changed()).await;
        }
    }
}
