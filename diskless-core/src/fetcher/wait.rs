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
        let deadline = Instant::now() + max_wait.min(self.config.max_wait_limit);
        let mut commits = self.commit_signal.subscribe();
        let min_bytes = usize::try_from(min_bytes).unwrap_or(usize::MAX);
        loop {
            // Seen before the read: a commit from here on ends the next wait at once.
            commits.borrow_and_update();
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
