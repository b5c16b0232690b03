//! `MeteredStorage`: each call emits each of its series exactly once, with the right labels and
//! bytes, seen by the `metrics` test recorder installed for that call alone.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use bytes::Bytes;
use diskless_common::metrics as m;
use diskless_storage::{
    MIN_PART_SIZE, MeteredStorage, ObjectKey, ObjectStorage, ObjectStoreStorage, StorageError,
};
use futures::{StreamExt, TryStreamExt};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use std::future::Future;
use std::sync::Arc;

/// What a series received during one call: a counter's total, or a histogram's sample count.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Seen {
    Counter(u64),
    Samples(usize),
}

/// One series: name, labels (sorted), what it received.
type Series = (String, Vec<(String, String)>, Seen);

/// Runs `call` on a current-thread runtime with a fresh test recorder installed for this thread
/// only, and returns its output and every series it emitted (sorted).
fn recorded<T>(call: impl Future<Output = T>) -> (T, Vec<Series>) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let output = metrics::with_local_recorder(&recorder, || runtime.block_on(call));
    let mut series: Vec<Series> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let (name, labels) = key.key().clone().into_parts();
            let mut labels: Vec<(String, String)> = labels
                .into_iter()
                .map(|l| (l.key().to_string(), l.value().to_string()))
                .collect();
            labels.sort();
            let seen = match value {
                DebugValue::Counter(n) => Seen::Counter(n),
                DebugValue::Histogram(samples) => Seen::Samples(samples.len()),
                DebugValue::Gauge(g) => panic!("unexpected gauge {name:?} = {g}"),
            };
            (name.as_str().to_string(), labels, seen)
        })
        .collect();
    series.sort();
    (output, series)
}

/// The series one call of `op` must emit: one request with `outcome`, one latency sample, and
/// (`put`/`get` only) `bytes`.
fn expected(op: &str, outcome: &str, bytes: Option<u64>) -> Vec<Series> {
    let label = |k: &str, v: &str| (k.to_string(), v.to_string());
    let mut series = vec![
        (
            m::STORAGE_REQUESTS.to_string(),
            vec![label(m::OP, op), label(m::OUTCOME, outcome)],
            Seen::Counter(1),
        ),
        (
            m::STORAGE_SECONDS.to_string(),
            vec![label(m::OP, op)],
            Seen::Samples(1),
        ),
    ];
    if let Some(bytes) = bytes {
        series.push((
            m::STORAGE_BYTES.to_string(),
            vec![label(m::OP, op)],
            Seen::Counter(bytes),
        ));
    }
    series.sort();
    series
}

fn metered() -> (Arc<ObjectStoreStorage>, MeteredStorage) {
    let inner = Arc::new(ObjectStoreStorage::in_memory());
    let storage = MeteredStorage::new(inner.clone() as Arc<dyn ObjectStorage>);
    (inner, storage)
}

fn key(name: &str) -> ObjectKey {
    ObjectKey::parse(name).unwrap()
}

fn chunks() -> [Bytes; 2] {
    [Bytes::from_static(b"abc"), Bytes::from_static(b"de")]
}

#[test]
fn upload_emits_one_put_with_the_bytes_sent() {
    let (inner, storage) = metered();
    let (result, series) = recorded(storage.upload(&key("wal/a"), &chunks()));
    result.unwrap();
    assert_eq!(series, expected("put", m::OK, Some(5)));
    assert_eq!(inner.counters().snapshot().put_requests, 1);
}

#[test]
fn a_failed_upload_is_an_error_with_no_bytes() {
    let (_, storage) = metered();
    let (result, _) = recorded(storage.upload(&key("wal/a"), &chunks()));
    result.unwrap();
    // Other content under the same key: refused.
    let other = [Bytes::from_static(b"other")];
    let (result, series) = recorded(storage.upload(&key("wal/a"), &other));
    assert!(result.is_err());
    assert_eq!(series, expected("put", m::ERROR, Some(0)));
}

#[test]
fn fetch_emits_one_get_with_the_bytes_returned() {
    let (_, storage) = metered();
    let (result, _) = recorded(storage.upload(&key("wal/a"), &chunks()));
    result.unwrap();
    let (result, series) = recorded(storage.fetch(&key("wal/a"), 1..4));
    assert_eq!(result.unwrap(), "bcd");
    assert_eq!(series, expected("get", m::OK, Some(3)));

    let (result, series) = recorded(storage.fetch(&key("wal/a"), 1..40));
    assert!(result.is_err(), "past the end");
    assert_eq!(series, expected("get", m::ERROR, Some(0)));

    let (result, series) = recorded(storage.fetch(&key("wal/missing"), 0..1));
    assert!(result.unwrap_err().is_not_found());
    assert_eq!(series, expected("get", m::ERROR, Some(0)));
}

#[test]
fn delete_emits_one_delete_whatever_the_number_of_keys() {
    let (_, storage) = metered();
    let keys: Vec<ObjectKey> = (0..1500).map(|i| key(&format!("wal/{i}"))).collect();
    let (result, series) = recorded(storage.delete(&keys));
    assert_eq!(result.unwrap().len(), 1500);
    assert_eq!(series, expected("delete", m::OK, None));
}

#[test]
fn a_listing_is_one_list_call_recorded_at_its_end() {
    let (_, storage) = metered();
    for name in ["wal/a", "wal/b", "wal/c"] {
        let (result, _) = recorded(storage.upload(&key(name), &chunks()));
        result.unwrap();
    }
    let (listed, series) = recorded(storage.list("wal").try_collect::<Vec<_>>());
    assert_eq!(listed.unwrap().len(), 3);
    assert_eq!(series, expected("list", m::OK, None));

    let (listed, series) = recorded(
        storage
            .list_with_offset("wal", "wal/a")
            .try_collect::<Vec<_>>(),
    );
    assert_eq!(listed.unwrap().len(), 2);
    assert_eq!(series, expected("list", m::OK, None));

    // An invalid prefix: the stream yields the error; the listing is one call that failed.
    let (listed, series) = recorded(storage.list("../x").collect::<Vec<_>>());
    assert!(listed.iter().all(Result::is_err) && !listed.is_empty());
    assert_eq!(series, expected("list", m::ERROR, None));
}

#[test]
fn a_listing_dropped_early_counts_once_and_an_unpolled_one_not_at_all() {
    let (_, storage) = metered();
    for name in ["wal/a", "wal/b"] {
        let (result, _) = recorded(storage.upload(&key(name), &chunks()));
        result.unwrap();
    }
    let (first, series) = recorded(async {
        let mut listing = storage.list("wal");
        listing.next().await
        // Dropped here, before its end.
    });
    assert!(first.unwrap().is_ok());
    assert_eq!(series, expected("list", m::OK, None));

    let ((), series) = recorded(async {
        drop(storage.list("wal"));
    });
    assert_eq!(series, vec![]);

    // Polled again after its end: still one call.
    let (count, series) = recorded(async {
        let mut listing = storage.list("wal");
        let mut count = 0;
        while listing.next().await.is_some() {
            count += 1;
        }
        assert!(listing.next().await.is_none());
        count
    });
    assert_eq!(count, 2);
    assert_eq!(series, expected("list", m::OK, None));
}

#[test]
fn pointers_to_storages_are_storages() {
    let boxed: Box<dyn ObjectStorage> = Box::new(ObjectStoreStorage::in_memory());
    let storage = MeteredStorage::new(boxed);
    let (result, series) = recorded(storage.upload(&key("wal/a"), &chunks()));
    result.unwrap();
    assert_eq!(series, expected("put", m::OK, Some(5)));
    let shared: Arc<dyn ObjectStorage> = Arc::new(storage);
    let (result, series) = recorded(shared.fetch(&key("wal/a"), 0..5));
    assert_eq!(result.unwrap(), "abcde");
    assert_eq!(series, expected("get", m::OK, Some(5)));
    assert!(format!("{shared:?}").contains("MeteredStorage"));
}

/// A stream of `len` bytes in chunks of 64 KiB.
fn byte_stream(len: usize) -> futures::stream::BoxStream<'static, Result<Bytes, StorageError>> {
    let data = Bytes::from(vec![7u8; len]);
    let chunks: Vec<Result<Bytes, StorageError>> = (0..len)
        .step_by(64 * 1024)
        .map(|start| Ok(data.slice(start..len.min(start + 64 * 1024))))
        .collect();
    futures::stream::iter(chunks).boxed()
}

#[test]
fn a_streamed_upload_emits_one_put_stream_with_its_size_whatever_its_parts() {
    let (inner, storage) = metered();
    let len = 2 * MIN_PART_SIZE + 3;
    let (result, series) =
        recorded(storage.upload_stream(&key("tiered/a"), byte_stream(len), MIN_PART_SIZE));
    assert_eq!(result.unwrap(), len as u64);
    assert_eq!(series, expected("put_stream", m::OK, Some(len as u64)));
    // The requests are in the storage's counters: create, three parts, complete.
    let stats = inner.counters().snapshot();
    assert_eq!((stats.put_requests, stats.put_parts), (5, 3));
}

#[test]
fn a_failed_streamed_upload_is_an_error_with_no_bytes() {
    let (_, storage) = metered();
    let failing = byte_stream(MIN_PART_SIZE + 1)
        .chain(futures::stream::once(async {
            Err(StorageError::Config("producer failed".into()))
        }))
        .boxed();
    let (result, series) =
        recorded(storage.upload_stream(&key("tiered/b"), failing, MIN_PART_SIZE));
    assert!(matches!(result, Err(StorageError::Config(_))), "{result:?}");
    assert_eq!(series, expected("put_stream", m::ERROR, Some(0)));
}
