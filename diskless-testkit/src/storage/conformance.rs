//! The cases every [`ObjectStorage`] must pass.
//!
//! Each case is a public async function taking the storage under test and panicking (with a
//! message) on a violation, like `object_store`'s integration tests. Run them with
//! [`storage_conformance!`](crate::storage_conformance), which makes one test per case (so that
//! the test runner lists, runs and reports each case on its own), or all in one test with
//! [`run_all`]. Every case works under its own random prefix (`conformance/<uuid>/<case>`), so a
//! factory may return storages sharing one bucket or directory.
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
//! use diskless_storage::ObjectStoreStorage;
//! use diskless_testkit::storage::conformance;
//! use std::sync::Arc;
//!
//! conformance::run_all(async || Arc::new(ObjectStoreStorage::in_memory())).await;
//! # });
//! ```
//!
//! The cases are listed once, in `__storage_conformance_cases!`; [`CASES`], [`run_all`] and the
//! macro's tests follow from that list, and a unit test checks that it names every case of this
//! file.

// The cases are tests: an unexpected error fails the case, with the failed call named.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::fixture::Fixture;
use bytes::Bytes;
use diskless_common::{Clock, SystemClock};
use diskless_storage::{
    KeySource, MIN_PART_SIZE, ObjectKey, ObjectMeta, ObjectStorage, RandomKeys, StorageError,
};
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, UNIX_EPOCH};

/// Size of the object of [`large_object`]: 16 MiB and a bit, so that it is not a power of two.
pub const LARGE_OBJECT_SIZE: usize = 16 * 1024 * 1024 + 12_345;

/// Number of uploads [`concurrent_uploads`] runs at once.
pub const CONCURRENT_UPLOADS: usize = 32;

/// Calls back `$callback! { { $($args)* } case, case [tag], ... }` with every case of the suite,
/// in the order [`run_all`] runs them: the one list of cases. Tag `shared`: the case takes an
/// `Arc<dyn ObjectStorage>` (to share it with tasks) instead of a `&dyn ObjectStorage`.
#[doc(hidden)]
#[macro_export]
macro_rules! __storage_conformance_cases {
    ($($callback:ident)::+ { $($args:tt)* }) => {
        $($callback)::+! {
            { $($args)* }
            upload_then_fetch_edges,
            fetch_invalid_ranges,
            empty_object,
            create_only,
            retry_after_ambiguous_upload,
            idempotent_delete,
            list_by_prefix,
            list_with_offset,
            invalid_keys_rejected,
            large_object,
            upload_stream_round_trip,
            upload_stream_empty,
            upload_stream_failure_leaves_nothing,
            concurrent_uploads [shared],
        }
    };
}

/// Defines [`CASES`] and [`run_all`] from the case list.
macro_rules! define_from_cases {
    ({} $($case:ident $([$tag:ident])?),* $(,)?) => {
        /// The names of all cases, in the order [`run_all`] runs them.
        pub const CASES: &[&str] = &[$(stringify!($case)),*];

        /// Runs every case, each with a fresh storage from `factory`; panics on the first
        /// violation.
        pub async fn run_all<F, S>(factory: F)
        where
            F: AsyncFn() -> S,
            S: Fixture<dyn ObjectStorage>,
        {
            $( __storage_case_runner!($($tag)?)(stringify!($case), $case, &factory).await; )*
        }
    };
}

/// The runner of a case with these tags: [`run_case`], or [`run_shared_case`] for `shared`.
#[doc(hidden)]
#[macro_export]
macro_rules! __storage_case_runner {
    () => {
        $crate::storage::conformance::run_case
    };
    (shared) => {
        $crate::storage::conformance::run_shared_case
    };
}

__storage_conformance_cases!(define_from_cases {});

/// Runs one case taking a `&dyn ObjectStorage` on a fresh storage from `factory`. A factory
/// returning `None` skips the case.
pub async fn run_case<C, F, S>(name: &str, case: C, factory: F)
where
    C: AsyncFnOnce(&dyn ObjectStorage),
    F: AsyncFnOnce() -> S,
    S: Fixture<dyn ObjectStorage>,
{
    run_shared_case(name, async |storage| case(&*storage).await, factory).await;
}

/// Runs one case taking an `Arc<dyn ObjectStorage>` (the `shared` ones) on a fresh storage from
/// `factory`. A factory returning `None` skips the case.
pub async fn run_shared_case<C, F, S>(name: &str, case: C, factory: F)
where
    C: AsyncFnOnce(Arc<dyn ObjectStorage>),
    F: AsyncFnOnce() -> S,
    S: Fixture<dyn ObjectStorage>,
{
    if let Some((storage, guard)) = factory().await.into_parts() {
        tracing::info!(case = name, "storage conformance");
        case(storage).await;
        drop(guard);
    }
}

/// Makes one test per case of the storage conformance suite, in a module `$module`:
/// `$module::create_only` and so on, each on a fresh storage from the factory, on a
/// multi-threaded tokio runtime with two workers.
///
/// The factory is an async closure without arguments that returns a
/// [`Fixture`]: `Arc<YourStorage>`, a pair `(Arc<YourStorage>, guard)` whose guard lives until
/// the case ends (a temporary directory, an in-process server), or `None` to skip the case (when
/// a service is not reachable, say; print why). It may use the items of the enclosing module.
/// Option, after the factory: `skip = [case, ...]`, cases left out (say which, and why, next to
/// the list); each must name a case.
///
/// ```test_harness
/// use diskless_storage::ObjectStoreStorage;
/// use std::sync::Arc;
///
/// diskless_testkit::storage_conformance!(in_memory, async || {
///     Arc::new(ObjectStoreStorage::in_memory())
/// });
///
/// // The guard (here a string; a temporary directory or a server in practice) lives as long as
/// // the case.
/// diskless_testkit::storage_conformance!(
///     in_memory_with_a_guard,
///     async || (Arc::new(ObjectStoreStorage::in_memory()), String::from("guard")),
///     skip = [large_object], // (a store that caps object sizes would say so here)
/// );
/// ```
#[macro_export]
macro_rules! storage_conformance {
    ($module:ident, $factory:expr $(, skip = [$($skip:ident),* $(,)?])? $(,)?) => {
        $crate::__storage_conformance_cases!($crate::__conformance_module {
            [$] $module [$($($skip)*)?] [$crate::storage::conformance]
            __storage_conformance_test { ($factory) }
        });
    };
}

/// One test of [`storage_conformance!`].
#[doc(hidden)]
#[macro_export]
macro_rules! __storage_conformance_test {
    ({ ($factory:expr) } $case:ident $([$tag:ident])?) => {
        #[test]
        fn $case() {
            $crate::fixture::__private::block_on(
                2,
                $crate::__storage_case_runner!($($tag)?)(
                    ::core::stringify!($case),
                    $crate::storage::conformance::$case,
                    $factory,
                ),
            );
        }
    };
}

/// A prefix no other case (or run) uses.
pub fn unique_prefix(case: &str) -> String {
    let uuid = KEYS.next_uuid(SystemClock.now_ms());
    format!("conformance/{}/{case}", uuid.simple())
}

/// The source of the suite's keys and prefixes: seeded from the operating system's entropy, so
/// that runs sharing a bucket draw other keys.
static KEYS: LazyLock<RandomKeys> = LazyLock::new(RandomKeys::new);

/// Deterministic test bytes: `len` bytes that differ from those of another `seed`.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ ((i >> 8) as u8))
        .collect()
}

fn chunks(data: &[u8], chunk: usize) -> Vec<Bytes> {
    data.chunks(chunk.max(1))
        .map(Bytes::copy_from_slice)
        .collect()
}

fn key(prefix: &str) -> ObjectKey {
    ObjectKey::generate(prefix, &*KEYS, &SystemClock).expect("valid prefix")
}

fn assert_invalid_range(result: Result<Bytes, StorageError>, what: &str) {
    match result {
        Err(StorageError::InvalidRange { .. }) => {}
        other => panic!("{what}: expected InvalidRange, got {other:?}"),
    }
}

/// Uploads an object in several chunks, then fetches the first byte, the last byte, the whole
/// object and ranges spanning chunk boundaries.
pub async fn upload_then_fetch_edges(storage: &dyn ObjectStorage) {
    let prefix = unique_prefix("edges");
    let data = pattern(1000, 1);
    let k = key(&prefix);
    storage
        .upload(&k, &chunks(&data, 300))
        .await
        .expect("upload");
    let fetch = |start: u64, end: u64| {
        let k = k.clone();
        async move { storage.fetch(&k, start..end).await }
    };
    assert_eq!(fetch(0, 1).await.expect("first byte"), data[..1]);
    assert_eq!(fetch(999, 1000).await.expect("last byte"), data[999..]);
    assert_eq!(fetch(0, 1000).await.expect("whole object"), data[..]);
    assert_eq!(
        fetch(299, 301).await.expect("across chunks"),
        data[299..301]
    );
    assert_eq!(fetch(123, 987).await.expect("middle"), data[123..987]);
}

/// Ranges past the end, empty or inverted ranges are [`StorageError::InvalidRange`], never a
/// short read; a missing object is [`StorageError::NotFound`].
pub async fn fetch_invalid_ranges(storage: &dyn ObjectStorage) {
    let prefix = unique_prefix("invalid-ranges");
    let data = pattern(100, 2);
    let k = key(&prefix);
    storage
        .upload(&k, &[Bytes::from(data)])
        .await
        .expect("upload");
    assert_invalid_range(storage.fetch(&k, 0..101).await, "one byte past the end");
    assert_invalid_range(storage.fetch(&k, 50..1000).await, "far past the end");
    assert_invalid_range(storage.fetch(&k, 100..101).await, "starting at the end");
    assert_invalid_range(storage.fetch(&k, 500..600).await, "starting past the end");
    assert_invalid_range(storage.fetch(&k, 10..10).await, "empty range");
    #[allow(clippy::reversed_empty_ranges)]
    let inverted = 20..10;
    assert_invalid_range(storage.fetch(&k, inverted).await, "inverted range");
    let missing = key(&prefix);
    match storage.fetch(&missing, 0..1).await {
        Err(e) if e.is_not_found() => {}
        other => panic!("fetch of a missing object: expected NotFound, got {other:?}"),
    }
}

/// A zero-byte object can be uploaded and listed; every range of it is invalid.
pub async fn empty_object(storage: &dyn ObjectStorage) {
    let prefix = unique_prefix("empty");
    let k = key(&prefix);
    storage.upload(&k, &[]).await.expect("upload empty");
    assert_invalid_range(storage.fetch(&k, 0..1).await, "range of an empty object");
    let listed: Vec<ObjectMeta> = storage.list(&prefix).try_collect().await.expect("list");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].size, 0);
    // Retrying the empty upload is fine, other content is not.
    storage.upload(&k, &[]).await.expect("retry empty");
    assert!(matches!(
        storage.upload(&k, &[Bytes::from_static(b"x")]).await,
        Err(StorageError::AlreadyExists { .. })
    ));
}

/// An upload never replaces an object with other content.
pub async fn create_only(storage: &dyn ObjectStorage) {
    let prefix = unique_prefix("create-only");
    let k = key(&prefix);
    let first = pattern(64, 3);
    storage
        .upload(&k, &[Bytes::from(first.clone())])
        .await
        .expect("first upload");
    for other in [pattern(64, 4), pattern(65, 3), pattern(63, 3), vec![]] {
        match storage.upload(&k, &[Bytes::from(other.clone())]).await {
            Err(StorageError::AlreadyExists { .. }) => {}
            r => panic!(
                "upload over an object ({} bytes): expected AlreadyExists, got {r:?}",
                other.len()
            ),
        }
    }
    assert_eq!(storage.fetch(&k, 0..64).await.expect("fetch"), first);
}

/// A retried upload (same key, same content, even chunked differently) succeeds; different
/// content fails with [`StorageError::AlreadyExists`] and leaves the first content.
pub async fn retry_after_ambiguous_upload(storage: &dyn ObjectStorage) {
    let prefix = unique_prefix("retry");
    let k = key(&prefix);
    let data = pattern(5000, 5);
    storage
        .upload(&k, &chunks(&data, 1000))
        .await
        .expect("first upload");
    storage
        .upload(&k, &chunks(&data, 1000))
        .await
        .expect("retry with the same content");
    storage
        .upload(&k, &chunks(&data, 777))
        .await
        .expect("retry with the same content in other chunks");
    let mut different = data.clone();
    different[4999] ^= 0xff;
    match storage.upload(&k, &chunks(&different, 1000)).await {
        Err(StorageError::AlreadyExists { .. }) => {}
        r => panic!("retry with one byte changed: expected AlreadyExists, got {r:?}"),
    }
    assert_eq!(storage.fetch(&k, 0..5000).await.expect("fetch"), data);
}

/// Deleting is idempotent: missing keys count as deleted, and every confirmed key is returned.
pub async fn idempotent_delete(storage: &dyn ObjectStorage) {
    let prefix = unique_prefix("delete");
    let present: Vec<ObjectKey> = (0..3).map(|_| key(&prefix)).collect();
    for (i, k) in present.iter().enumerate() {
        storage
            .upload(k, &[Bytes::from(pattern(10 + i, 6))])
            .await
            .expect("upload");
    }
    let missing = key(&prefix);
    let mut all = present.clone();
    all.push(missing.clone());
    let mut confirmed = storage.delete(&all).await.expect("delete");
    confirmed.sort();
    all.sort();
    assert_eq!(
        confirmed, all,
        "every key, present or missing, is confirmed"
    );
    for k in &present {
        match storage.fetch(k, 0..1).await {
            Err(e) if e.is_not_found() => {}
            r => panic!("fetch after delete: expected NotFound, got {r:?}"),
        }
    }
    let again = storage.delete(&present).await.expect("delete again");
    assert_eq!(again.len(), present.len());
    assert!(storage.delete(&[]).await.expect("empty delete").is_empty());
    let listed: Vec<ObjectMeta> = storage.list(&prefix).try_collect().await.expect("list");
    assert!(
        listed.is_empty(),
        "deleted objects still listed: {listed:?}"
    );
}

/// Listing by prefix returns exactly the objects under it (whole segments), with their sizes
/// and a plausible modification time.
pub async fn list_by_prefix(storage: &dyn ObjectStorage) {
    let prefix = unique_prefix("list");
    let inside = format!("{prefix}/a");
    let nested = format!("{prefix}/a/deeper");
    let sibling = format!("{prefix}/ab");
    let other = format!("{prefix}/b");
    let mut expected = vec![];
    for (i, p) in [&inside, &inside, &nested].into_iter().enumerate() {
        let k = key(p);
        storage
            .upload(&k, &[Bytes::from(pattern(100 + i, 7))])
            .await
            .expect("upload");
        expected.push((k, 100 + i as u64));
    }
    for p in [&sibling, &other] {
        storage
            .upload(&key(p), &[Bytes::from_static(b"elsewhere")])
            .await
            .expect("upload");
    }
    let mut listed: Vec<ObjectMeta> = storage.list(&inside).try_collect().await.expect("list");
    listed.sort_by(|a, b| a.key.cmp(&b.key));
    expected.sort();
    let got: Vec<(ObjectKey, u64)> = listed.iter().map(|m| (m.key.clone(), m.size)).collect();
    assert_eq!(got, expected, "list of {inside:?}");
    let now = UNIX_EPOCH + Duration::from_millis(SystemClock.now_ms().unsigned_abs());
    for m in &listed {
        assert!(
            m.last_modified > now - Duration::from_secs(24 * 3600)
                && m.last_modified < now + Duration::from_secs(3600),
            "implausible last_modified {:?}",
            m.last_modified
        );
    }
    let all: Vec<ObjectMeta> = storage.list(&prefix).try_collect().await.expect("list all");
    assert_eq!(all.len(), 5);
    let none: Vec<ObjectMeta> = storage
        .list(&format!("{prefix}/nothing"))
        .try_collect()
        .await
        .expect("list nothing");
    assert!(none.is_empty());
}

/// [`ObjectStorage::list_with_offset`] returns exactly the objects under the prefix whose key is
/// strictly greater than the offset (in any order): not the offset's own object, none below it,
/// none outside the prefix (also those greater than the offset), whether the offset is an
/// existing key, a key between two others, below or above every key under the prefix, or
/// outside the prefix altogether.
pub async fn list_with_offset(storage: &dyn ObjectStorage) {
    let prefix = unique_prefix("list-offset");
    let inside = format!("{prefix}/a");
    // Fixed names, so that the order is known: `a/k0` < ... < `a/k2` < `a/k3/deeper` < `a/k4`.
    // (No key is also the prefix of another: a filesystem cannot hold both.)
    let names: Vec<String> = ["k0", "k1", "k2", "k3/deeper", "k4"]
        .iter()
        .map(|n| format!("{inside}/{n}"))
        .collect();
    for (i, name) in names.iter().enumerate() {
        let k = ObjectKey::parse(name).expect("valid key");
        storage
            .upload(&k, &[Bytes::from(pattern(10 + i, 9))])
            .await
            .expect("upload");
    }
    // Outside the prefix, and greater than every offset below: must never be listed.
    for outside in [format!("{prefix}/ab/k9"), format!("{prefix}/b/k9")] {
        let k = ObjectKey::parse(&outside).expect("valid key");
        storage
            .upload(&k, &[Bytes::from_static(b"elsewhere")])
            .await
            .expect("upload");
    }
    let listed = |offset: String| {
        let inside = inside.clone();
        async move {
            let mut got: Vec<(String, u64)> = storage
                .list_with_offset(&inside, &offset)
                .map_ok(|m| (m.key.into_string(), m.size))
                .try_collect()
                .await
                .unwrap_or_else(|e| panic!("list_with_offset({inside:?}, {offset:?}): {e}"));
            got.sort();
            got
        }
    };
    let expected = |from: usize| -> Vec<(String, u64)> {
        names
            .iter()
            .enumerate()
            .skip(from)
            .map(|(i, n)| (n.clone(), 10 + i as u64))
            .collect()
    };
    let cases = [
        (String::new(), 0, "empty offset"),
        (format!("{prefix}/"), 0, "offset below every key"),
        (format!("{inside}/k0"), 1, "offset an existing key"),
        (format!("{inside}/k1x"), 2, "offset between two keys"),
        (
            format!("{inside}/k3"),
            3,
            "offset a segment prefixing a nested key",
        ),
        (format!("{inside}/k3/deeper"), 4, "offset a nested key"),
        (format!("{inside}/k4"), 5, "offset the greatest key"),
        (format!("{inside}/z"), 5, "offset above every key"),
        (
            format!("{prefix}/b"),
            5,
            "offset outside the prefix, above it",
        ),
        ("0".to_string(), 0, "offset outside the prefix, below it"),
        ("~".to_string(), 5, "offset above every key of the store"),
        (
            "/zzz".to_string(),
            0,
            "offset with a leading slash, below every key",
        ),
        (format!("{inside}/k1/"), 2, "offset with a trailing slash"),
        (
            format!("{inside}//k1"),
            0,
            "offset with an empty segment, below every key",
        ),
    ];
    for (offset, from, what) in cases {
        assert_eq!(
            listed(offset.clone()).await,
            expected(from),
            "list_with_offset({inside:?}, {offset:?}): {what}"
        );
    }
    // `list_with_offset` agrees with filtering `list`.
    let mut all: Vec<String> = storage
        .list(&inside)
        .map_ok(|m| m.key.into_string())
        .try_collect()
        .await
        .expect("list");
    all.sort();
    assert_eq!(all, names, "list of {inside:?}");
    // A prefix without objects lists nothing, whatever the offset.
    let none: Vec<ObjectMeta> = storage
        .list_with_offset(&format!("{prefix}/nothing"), "")
        .try_collect()
        .await
        .expect("list nothing");
    assert!(none.is_empty(), "{none:?}");
}

/// Invalid keys cannot be built, and invalid list prefixes fail with
/// [`StorageError::InvalidKey`] before anything reaches the backend.
pub async fn invalid_keys_rejected(storage: &dyn ObjectStorage) {
    for bad in [
        "../etc/passwd",
        "/abs",
        "a//b",
        "a/./b",
        "trailing/",
        "a\\b",
        "nul\0",
    ] {
        assert!(
            matches!(ObjectKey::parse(bad), Err(StorageError::InvalidKey { .. })),
            "{bad:?} parsed"
        );
        let result: Result<Vec<ObjectMeta>, StorageError> = storage.list(bad).try_collect().await;
        assert!(
            matches!(result, Err(StorageError::InvalidKey { .. })),
            "list({bad:?}): expected InvalidKey, got {result:?}"
        );
    }
}

/// An object of [`LARGE_OBJECT_SIZE`] bytes uploaded in many chunks reads back intact.
pub async fn large_object(storage: &dyn ObjectStorage) {
    let prefix = unique_prefix("large");
    let data = pattern(LARGE_OBJECT_SIZE, 8);
    let payload = chunks(&data, 64 * 1024 + 3);
    assert!(payload.len() > 200);
    let k = key(&prefix);
    storage.upload(&k, &payload).await.expect("upload large");
    let size = LARGE_OBJECT_SIZE as u64;
    let whole = storage.fetch(&k, 0..size).await.expect("fetch whole");
    assert!(whole == data[..], "large object content differs");
    let tail = storage.fetch(&k, size - 10..size).await.expect("tail");
    assert_eq!(tail, data[LARGE_OBJECT_SIZE - 10..]);
    let mid = storage
        .fetch(&k, 8 * 1024 * 1024 - 5..8 * 1024 * 1024 + 5)
        .await
        .expect("middle");
    assert_eq!(mid, data[8 * 1024 * 1024 - 5..8 * 1024 * 1024 + 5]);
    assert_invalid_range(
        storage.fetch(&k, 0..size + 1).await,
        "past the end of a large object",
    );
    storage.delete(&[k]).await.expect("delete large");
}

/// The chunks of `data` (of `chunk` bytes, the last shorter) as the stream of an
/// [`ObjectStorage::upload_stream`].
pub fn chunk_stream(data: &Bytes, chunk: usize) -> BoxStream<'static, Result<Bytes, StorageError>> {
    let chunks: Vec<Result<Bytes, StorageError>> = (0..data.len())
        .step_by(chunk.max(1))
        .map(|start| Ok(data.slice(start..data.len().min(start + chunk.max(1)))))
        .collect();
    futures::stream::iter(chunks).boxed()
}

/// Objects streamed with [`ObjectStorage::upload_stream`] read back intact, whatever their size
/// against the part size (below, at, above one part; three parts) and however they are chunked
/// (many small chunks, chunks bigger than a part; a part size below the stores' minimum, which
/// they raise): the size returned and listed is the bytes streamed, and ranges across part
/// boundaries read back.
pub async fn upload_stream_round_trip(storage: &dyn ObjectStorage) {
    let prefix = unique_prefix("stream");
    let part = MIN_PART_SIZE;
    let data = Bytes::from(pattern(2 * part + 12_345, 11));
    let cases = [
        (1000, 300, part, "below one part"),
        (part, 64 * 1024 + 3, part, "exactly one part"),
        (
            part + 1,
            1024,
            1,
            "one byte above a part, 1 KiB chunks, part size raised from 1",
        ),
        (2 * part + 12_345, 64 * 1024 + 3, part, "three parts"),
        (
            2 * part + 12_345,
            part + part / 2 + 7,
            part,
            "chunks bigger than a part",
        ),
    ];
    let mut expected = vec![];
    for (len, chunk, part_size, what) in cases {
        let k = key(&prefix);
        let object = data.slice(..len);
        let size = storage
            .upload_stream(&k, chunk_stream(&object, chunk), part_size)
            .await
            .unwrap_or_else(|e| panic!("upload_stream ({what}): {e}"));
        assert_eq!(size, len as u64, "size returned ({what})");
        let whole = storage
            .fetch(&k, 0..len as u64)
            .await
            .unwrap_or_else(|e| panic!("fetch whole ({what}): {e}"));
        assert!(whole == object, "content differs ({what})");
        for boundary in [part, 2 * part] {
            if boundary + 3 <= len {
                let range = (boundary - 3) as u64..(boundary + 3) as u64;
                let got = storage
                    .fetch(&k, range.clone())
                    .await
                    .unwrap_or_else(|e| panic!("fetch {range:?} ({what}): {e}"));
                assert_eq!(
                    got,
                    object[boundary - 3..boundary + 3],
                    "{range:?} ({what})"
                );
            }
        }
        let last = len as u64 - 1..len as u64;
        assert_eq!(
            storage.fetch(&k, last).await.expect("last byte"),
            object[len - 1..],
            "last byte ({what})"
        );
        assert_invalid_range(
            storage.fetch(&k, 0..len as u64 + 1).await,
            "past the end of a streamed object",
        );
        expected.push((k, len as u64));
    }
    let mut listed: Vec<(ObjectKey, u64)> = storage
        .list(&prefix)
        .map_ok(|m| (m.key, m.size))
        .try_collect()
        .await
        .expect("list");
    listed.sort();
    expected.sort();
    assert_eq!(listed, expected, "streamed objects listed with their sizes");
    let keys: Vec<ObjectKey> = expected.into_iter().map(|(k, _)| k).collect();
    storage
        .delete(&keys)
        .await
        .expect("delete streamed objects");
}

/// An empty stream uploads an empty object (as `upload(key, &[])`): size 0 returned and listed.
pub async fn upload_stream_empty(storage: &dyn ObjectStorage) {
    let prefix = unique_prefix("stream-empty");
    let k = key(&prefix);
    let empty = futures::stream::empty().boxed();
    let size = storage
        .upload_stream(&k, empty, MIN_PART_SIZE)
        .await
        .expect("upload_stream of an empty stream");
    assert_eq!(size, 0);
    let listed: Vec<ObjectMeta> = storage.list(&prefix).try_collect().await.expect("list");
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!((&listed[0].key, listed[0].size), (&k, 0));
    assert_invalid_range(storage.fetch(&k, 0..1).await, "range of an empty object");
}

/// The error of [`upload_stream_failure_leaves_nothing`]'s failing streams.
#[derive(Debug, thiserror::Error)]
#[error("the producer of the chunks failed (conformance)")]
struct ProducerFailed;

/// A stream that fails (with its own error, returned by the call) before its first chunk,
/// below one part, or after two parts (a multipart upload under way) leaves no object under
/// the key: nothing listed, the key not found.
pub async fn upload_stream_failure_leaves_nothing(storage: &dyn ObjectStorage) {
    let prefix = unique_prefix("stream-failure");
    let data = Bytes::from(pattern(2 * MIN_PART_SIZE + 1000, 12));
    for (after, what) in [
        (0, "before the first chunk"),
        (1000, "below one part"),
        (2 * MIN_PART_SIZE + 500, "after two parts"),
    ] {
        let k = key(&prefix);
        let failing = chunk_stream(&data.slice(..after), 64 * 1024)
            .chain(futures::stream::once(async {
                Err(StorageError::Permanent {
                    source: Box::new(ProducerFailed),
                })
            }))
            .chain(chunk_stream(&data.slice(after..), 64 * 1024))
            .boxed();
        match storage.upload_stream(&k, failing, MIN_PART_SIZE).await {
            Err(StorageError::Permanent { source }) if source.is::<ProducerFailed>() => {}
            other => panic!("stream failing {what}: expected the stream's error, got {other:?}"),
        }
        match storage.fetch(&k, 0..1).await {
            Err(e) if e.is_not_found() => {}
            other => {
                panic!("fetch after a stream failing {what}: expected NotFound, got {other:?}")
            }
        }
    }
    let listed: Vec<ObjectMeta> = storage.list(&prefix).try_collect().await.expect("list");
    assert!(
        listed.is_empty(),
        "failed streamed uploads left objects: {listed:?}"
    );
}

/// [`CONCURRENT_UPLOADS`] uploads at once, each in its own tokio task, all land with their own
/// content.
pub async fn concurrent_uploads(storage: Arc<dyn ObjectStorage>) {
    let prefix = unique_prefix("concurrent");
    let keys: Vec<ObjectKey> = (0..CONCURRENT_UPLOADS).map(|_| key(&prefix)).collect();
    let tasks: Vec<_> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| {
            let (storage, k) = (storage.clone(), k.clone());
            tokio::spawn(async move {
                storage
                    .upload(&k, &chunks(&pattern(4096 + i, i as u8), 1000))
                    .await
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("upload task").expect("concurrent upload");
    }
    let storage = &*storage;
    let fetches = keys
        .iter()
        .enumerate()
        .map(|(i, k)| async move { (i, storage.fetch(k, 0..(4096 + i) as u64).await) });
    for (i, result) in futures::future::join_all(fetches).await {
        assert_eq!(result.expect("fetch"), pattern(4096 + i, i as u8));
    }
    let listed: Vec<ObjectMeta> = storage.list(&prefix).try_collect().await.expect("list");
    assert_eq!(listed.len(), CONCURRENT_UPLOADS);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The case list names every case of this file once, so that a new case cannot be left out of
    /// [`run_all`] and the macro's tests.
    #[test]
    fn the_case_list_names_every_case() {
        crate::fixture::assert_lists_every_case(
            CASES,
            include_str!("conformance.rs"),
            &[
                "(storage: &dyn ObjectStorage) {",
                "(storage: Arc<dyn ObjectStorage>) {",
            ],
        );
    }
}
