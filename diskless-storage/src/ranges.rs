//! Ranged reads: fetch several byte ranges of one object with the fewest GETs.
//!
//! A fetch often needs several batches of one WAL segment. Each GET costs a request (money and
//! latency), while reading a few unneeded bytes between two needed ranges is cheap. So
//! [`plan_ranged_reads`] merges ranges that overlap, touch, or are separated by at most
//! [`RangeReadConfig::max_gap`] bytes into one request, and [`fetch_ranges`] runs the requests
//! concurrently and slices each requested range back out of the bytes fetched.

use crate::{ObjectKey, ObjectStorage, StorageError};
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use std::ops::Range;

/// Settings of [`fetch_ranges`]. Start from [`RangeReadConfig::default()`] and change what you
/// need with the `with_*` methods; [`RangeReadConfig::validate`] rejects invalid values.
///
/// ```
/// use diskless_storage::RangeReadConfig;
/// let config = RangeReadConfig::default().with_max_gap(64 << 10).with_concurrency(4);
/// assert!(config.validate().is_ok());
/// assert!(config.with_concurrency(0).validate().is_err());
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RangeReadConfig {
    /// Ranges separated by at most this many bytes are read by one GET (the bytes in between are
    /// read and dropped). Default 1 MiB, the break-even point of a GET's cost against transfer
    /// commonly used with S3 (also `object_store`'s default).
    pub max_gap: u64,
    /// GETs in flight at once for one call (at least 1). Default 8.
    pub concurrency: usize,
}

impl Default for RangeReadConfig {
    fn default() -> Self {
        RangeReadConfig {
            max_gap: 1024 * 1024,
            concurrency: 8,
        }
    }
}

diskless_common::with_setters!(RangeReadConfig {
    with_max_gap => max_gap: [u64],
    with_concurrency => concurrency: [usize],
});

impl RangeReadConfig {
    /// Checks the settings (every `max_gap` is valid; `concurrency` must be at least 1): an
    /// invalid value is a [`StorageError::Config`] naming the field, never clamped.
    /// [`fetch_ranges`] calls it; a component holding a config should call it when built.
    pub fn validate(&self) -> Result<(), StorageError> {
        if self.concurrency == 0 {
            return Err(StorageError::Config(
                "range_read.concurrency: must be at least 1".into(),
            ));
        }
        Ok(())
    }
}

/// Which GETs to send for a set of ranges, and where each requested range lies in their results
/// (an output of [`plan_ranged_reads`]; `#[non_exhaustive]`: fields may be added).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReadPlan {
    /// The byte ranges to GET, sorted, non-empty and disjoint, separated by more than the gap.
    pub requests: Vec<Range<u64>>,
    /// For each requested range, in input order: the index of the request that covers it and the
    /// range's offsets within that request's bytes.
    pub slices: Vec<(usize, Range<usize>)>,
}

/// Plans the GETs for `ranges` (in any order, possibly overlapping): the fewest requests such that
/// every range lies within one request and consecutive requests are more than `max_gap` bytes
/// apart. Fails with [`StorageError::InvalidRange`] on an empty or inverted range.
///
/// ```
/// use diskless_storage::plan_ranged_reads;
/// let plan = plan_ranged_reads("k", &[0..10, 12..20, 100..110], 4).unwrap();
/// assert_eq!(plan.requests, vec![0..20, 100..110]);
/// assert_eq!(plan.slices, vec![(0, 0..10), (0, 12..20), (1, 0..10)]);
/// ```
pub fn plan_ranged_reads(
    key: &str,
    ranges: &[Range<u64>],
    max_gap: u64,
) -> Result<ReadPlan, StorageError> {
    for range in ranges {
        if range.start >= range.end {
            return Err(StorageError::InvalidRange {
                key: key.to_string(),
                start: range.start,
                end: range.end,
                size: None,
            });
        }
        if usize::try_from(range.end - range.start).is_err() {
            return Err(StorageError::InvalidRange {
                key: key.to_string(),
                start: range.start,
                end: range.end,
                size: None,
            });
        }
    }
    let mut order: Vec<usize> = (0..ranges.len()).collect();
    order.sort_by_key(|&i| (ranges[i].start, ranges[i].end));

    let mut requests: Vec<Range<u64>> = Vec::new();
    let mut request_of = vec![0usize; ranges.len()];
    for &i in &order {
        let r = &ranges[i];
        match requests.last_mut() {
            Some(last) if r.start <= last.end.saturating_add(max_gap) => {
                last.end = last.end.max(r.end);
            }
            _ => requests.push(r.clone()),
        }
        request_of[i] = requests.len() - 1;
    }
    let mut slices = Vec::with_capacity(ranges.len());
    for (i, r) in ranges.iter().enumerate() {
        let req = &requests[request_of[i]];
        let start = usize::try_from(r.start - req.start).map_err(|_| too_large(key, req))?;
        let end = usize::try_from(r.end - req.start).map_err(|_| too_large(key, req))?;
        slices.push((request_of[i], start..end));
    }
    Ok(ReadPlan { requests, slices })
}

fn too_large(key: &str, range: &Range<u64>) -> StorageError {
    StorageError::InvalidRange {
        key: key.to_string(),
        start: range.start,
        end: range.end,
        size: None,
    }
}

/// Fetches `ranges` of one object with the GETs of [`plan_ranged_reads`], concurrently, and
/// returns the bytes of each range in input order. Any range past the object's end fails the call
/// with [`StorageError::InvalidRange`]; an invalid `config` with [`StorageError::Config`].
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// use diskless_storage::{ObjectKey, ObjectStorage, ObjectStoreStorage, RangeReadConfig, fetch_ranges};
/// let storage = ObjectStoreStorage::in_memory();
/// let key = ObjectKey::parse("wal/segment-1").unwrap();
/// storage.upload(&key, &[bytes::Bytes::from_static(b"0123456789")]).await.unwrap();
/// let parts = fetch_ranges(&storage, &key, &[1..3, 4..6, 8..10], &RangeReadConfig::default())
///     .await
///     .unwrap();
/// assert_eq!(parts, vec!["12", "45", "89"]);
/// assert_eq!(storage.counters().snapshot().get_requests, 1);
/// # });
/// ```
pub async fn fetch_ranges(
    storage: &dyn ObjectStorage,
    key: &ObjectKey,
    ranges: &[Range<u64>],
    config: &RangeReadConfig,
) -> Result<Vec<Bytes>, StorageError> {
    config.validate()?;
    let plan = plan_ranged_reads(key.as_str(), ranges, config.max_gap)?;
    tracing::debug!(
        key = %key,
        ranges = ranges.len(),
        requests = plan.requests.len(),
        "ranged read"
    );
    let fetched: Vec<Bytes> = futures::stream::iter(plan.requests.iter().cloned())
        .map(|r| storage.fetch(key, r))
        .buffered(config.concurrency)
        .try_collect()
        .await?;
    plan.slices
        .iter()
        .map(|(req, slice)| {
            let bytes = &fetched[*req];
            if slice.end > bytes.len() {
                // A storage that returned a short read: never hand out a truncated range.
                return Err(StorageError::InvalidRange {
                    key: key.to_string(),
                    start: plan.requests[*req].start,
                    end: plan.requests[*req].end,
                    size: None,
                });
            }
            Ok(bytes.slice(slice.clone()))
        })
        .collect()
}

#[cfg(test)]
// Also when clippy runs without the workspace's clippy.toml (allow-unwrap-in-tests).
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    #[allow(clippy::single_range_in_vec_init)]
    fn rejects_empty_and_inverted() {
        assert!(plan_ranged_reads("k", &[0..0], 10).is_err());
        #[allow(clippy::reversed_empty_ranges)]
        let inverted = [5..3];
        assert!(plan_ranged_reads("k", &inverted, 10).is_err());
        assert_eq!(plan_ranged_reads("k", &[], 10).unwrap().requests, vec![]);
    }

    #[test]
    fn merges_overlapping_adjacent_and_near() {
        let plan = plan_ranged_reads("k", &[20..30, 0..10, 10..15, 5..8, 40..50], 10).unwrap();
        assert_eq!(plan.requests, vec![0..50]);
        let plan = plan_ranged_reads("k", &[20..30, 0..10, 10..15, 5..8, 41..50], 10).unwrap();
        assert_eq!(plan.requests, vec![0..30, 41..50]);
        assert_eq!(plan.slices[4], (1, 0..9));
        assert_eq!(plan.slices[0], (0, 20..30));
        let plan = plan_ranged_reads("k", &[0..10, 10..20], 0).unwrap();
        assert_eq!(plan.requests, vec![0..20]);
    }

    fn ranges() -> impl Strategy<Value = Vec<Range<u64>>> {
        proptest::collection::vec((0u64..10_000, 1u64..500), 0..20)
            .prop_map(|v| v.into_iter().map(|(s, l)| s..s + l).collect())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        #[test]
        fn plan_is_sound_and_minimal(ranges in ranges(), max_gap in 0u64..2_000) {
            let plan = plan_ranged_reads("k", &ranges, max_gap).unwrap();
            prop_assert_eq!(plan.slices.len(), ranges.len());
            // Requests are sorted, non-empty, and more than max_gap apart: no two can be merged,
            // so the count is minimal.
            for w in plan.requests.windows(2) {
                prop_assert!(w[0].start < w[0].end);
                prop_assert!(w[1].start > w[0].end + max_gap);
            }
            // Every range maps to exactly its bytes within its request.
            for (r, (req, slice)) in ranges.iter().zip(&plan.slices) {
                let q = &plan.requests[*req];
                prop_assert!(q.start <= r.start && r.end <= q.end);
                prop_assert_eq!(q.start + slice.start as u64, r.start);
                prop_assert_eq!(q.start + slice.end as u64, r.end);
            }
            // Every request starts and ends at the bounds of requested ranges (no wasted edges)
            // and every byte in it is within max_gap of a requested byte.
            for q in &plan.requests {
                prop_assert!(ranges.iter().any(|r| r.start == q.start));
                prop_assert!(ranges.iter().any(|r| r.end == q.end));
                let mut covered: Vec<&Range<u64>> =
                    ranges.iter().filter(|r| q.start <= r.start && r.end <= q.end).collect();
                covered.sort_by_key(|r| r.start);
                let mut reach = q.start;
                for r in covered {
                    prop_assert!(r.start <= reach + max_gap);
                    reach = reach.max(r.end);
                }
                prop_assert_eq!(reach, q.end);
            }
        }
    }
}
