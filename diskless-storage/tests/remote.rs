//! [`ObjectRemoteStorage`] (tiered segments as one object each) against every backend: in memory,
//! the local filesystem (a temp dir) and S3 over HTTP (an in-process s3s server). One test per
//! case and backend (`s3_over_http::round_trip_of_every_section`, ...).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use bytes::Bytes;
use diskless_storage::{
    ObjectKey, ObjectRemoteStorage, ObjectStorage, ObjectStoreStorage, RemoteStorage, Section,
    SegmentData, SegmentLayout, StorageError,
};
use diskless_testkit::storage::S3TestServer;
use futures::TryStreamExt;
use std::any::Any;
use std::sync::Arc;

/// A storage and what must live as long as it (a temp dir, a server).
type Backend = (Arc<dyn ObjectStorage>, Box<dyn Any + Send>);

async fn in_memory() -> Backend {
    (Arc::new(ObjectStoreStorage::in_memory()), Box::new(()))
}

async fn local_filesystem() -> Backend {
    let dir = tempfile::tempdir().unwrap();
    let storage = ObjectStoreStorage::local_fs(dir.path()).unwrap();
    (Arc::new(storage), Box::new(dir))
}

async fn s3_over_http() -> Backend {
    let server = S3TestServer::start().await.unwrap();
    let storage = server.storage("").unwrap();
    (Arc::new(storage), Box::new(server))
}

/// Deterministic bytes that differ with `seed`.
fn pattern(len: usize, seed: u8) -> Bytes {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ ((i >> 8) as u8))
        .collect::<Vec<u8>>()
        .into()
}

/// A segment whose sections all differ; the `.log` in uneven chunks.
fn segment(seed: u8, txn_index_len: usize) -> SegmentData {
    let log = pattern(10_000, seed);
    SegmentData {
        log: vec![log.slice(..1), log.slice(1..4_097), log.slice(4_097..)],
        offset_index: pattern(8 * 37, seed.wrapping_add(1)),
        time_index: pattern(12 * 29, seed.wrapping_add(2)),
        txn_index: pattern(txn_index_len, seed.wrapping_add(3)),
        producer_snapshot: pattern(123, seed.wrapping_add(4)),
        leader_epochs: Bytes::from_static(b"0\n1\n0 42\n"),
        trailer: pattern(80, seed.wrapping_add(5)),
    }
}

fn section_bytes(data: &SegmentData, section: Section) -> Bytes {
    match section {
        Section::Log => data.log.concat().into(),
        Section::OffsetIndex => data.offset_index.clone(),
        Section::TimeIndex => data.time_index.clone(),
        Section::TxnIndex => data.txn_index.clone(),
        Section::ProducerSnapshot => data.producer_snapshot.clone(),
        Section::LeaderEpochs => data.leader_epochs.clone(),
        Section::Trailer => data.trailer.clone(),
    }
}

fn key(name: &str) -> ObjectKey {
    ObjectKey::parse(&format!("tiered/{name}")).unwrap()
}

async fn round_trip_of_every_section(storage: Arc<dyn ObjectStorage>) {
    let remote = ObjectRemoteStorage::new(storage.clone());
    // With and without aborted transactions (an empty `.txnindex`).
    for (name, txn_index_len) in [("with-txn", 24), ("no-txn", 0)] {
        let data = segment(7, txn_index_len);
        let key = key(name);
        let layout = remote.copy_segment(&key, data.clone()).await.unwrap();
        assert_eq!(
            layout,
            SegmentLayout {
                log: 10_000,
                offset_index: 8 * 37,
                time_index: 12 * 29,
                txn_index: txn_index_len as u32,
                producer_snapshot: 123,
                leader_epochs: 9,
            }
        );
        for section in Section::ALL {
            let got = remote
                .fetch(&key, &layout, layout.range(section))
                .await
                .unwrap();
            assert_eq!(got, section_bytes(&data, section), "{name}: {section:?}");
        }
        // The object is the sections in order, nothing else.
        let whole: Vec<u8> = Section::ALL
            .iter()
            .flat_map(|s| section_bytes(&data, *s).to_vec())
            .collect();
        assert_eq!(whole.len() as u64, layout.object_size());
        let stored = storage.fetch(&key, 0..layout.object_size()).await.unwrap();
        assert_eq!(&stored[..], &whole[..], "{name}");
        // A range across sections.
        let across = 9_990..10_010;
        let got = remote.fetch(&key, &layout, across.clone()).await.unwrap();
        assert_eq!(&got[..], &whole[9_990..10_010]);
    }
}

async fn fetch_outside_the_object_is_refused(storage: Arc<dyn ObjectStorage>) {
    let remote = ObjectRemoteStorage::new(storage);
    let key = key("bounds");
    let layout = remote.copy_segment(&key, segment(1, 24)).await.unwrap();
    let size = layout.object_size();
    for range in [0..size + 1, size - 1..size + 1, size + 1..size + 2] {
        let err = remote
            .fetch(&key, &layout, range.clone())
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                StorageError::InvalidRange { start, end, size: Some(s), .. }
                    if start == range.start && end == range.end && s == size
            ),
            "{range:?}: {err}"
        );
    }
    #[allow(clippy::reversed_empty_ranges)]
    let inverted = 10..5;
    let err = remote.fetch(&key, &layout, inverted).await.unwrap_err();
    assert!(
        matches!(err, StorageError::InvalidRange { .. }),
        "inverted: {err}"
    );
    // The last byte and an empty range at the end are inside.
    let last = remote.fetch(&key, &layout, size - 1..size).await.unwrap();
    assert_eq!(last.len(), 1);
    assert!(
        remote
            .fetch(&key, &layout, size..size)
            .await
            .unwrap()
            .is_empty()
    );
    // A layout larger than the stored object does not turn into a short read.
    let lying = SegmentLayout {
        log: layout.log + 1,
        ..layout
    };
    assert!(
        remote
            .fetch(&key, &lying, 0..lying.object_size())
            .await
            .is_err()
    );
}

async fn second_copy_to_the_same_key_is_refused(storage: Arc<dyn ObjectStorage>) {
    let remote = ObjectRemoteStorage::new(storage);
    let key = key("create-only");
    let first = segment(1, 24);
    let layout = remote.copy_segment(&key, first.clone()).await.unwrap();
    let err = remote.copy_segment(&key, segment(2, 24)).await.unwrap_err();
    assert!(
        matches!(err, StorageError::AlreadyExists { .. }),
        "second copy: {err}"
    );
    // The first segment is intact.
    let log = remote
        .fetch(&key, &layout, layout.range(Section::Log))
        .await
        .unwrap();
    assert_eq!(log, section_bytes(&first, Section::Log));
    // Retrying the very same copy (an outcome that was unknown) succeeds, as ObjectStorage::upload.
    assert_eq!(remote.copy_segment(&key, first).await.unwrap(), layout);
}

async fn delete_is_idempotent(storage: Arc<dyn ObjectStorage>) {
    let remote = ObjectRemoteStorage::new(storage);
    let (a, b, never) = (key("del-a"), key("del-b"), key("never-stored"));
    let layout = remote.copy_segment(&a, segment(1, 0)).await.unwrap();
    remote.copy_segment(&b, segment(2, 0)).await.unwrap();
    let mut deleted = remote.delete(&[a.clone(), never.clone()]).await.unwrap();
    deleted.sort();
    assert_eq!(deleted, [a.clone(), never.clone()]);
    let err = remote
        .fetch(&a, &layout, layout.range(Section::Log))
        .await
        .unwrap_err();
    assert!(err.is_not_found(), "{err}");
    // Again: still confirmed.
    let mut deleted = remote.delete(&[a.clone(), never.clone()]).await.unwrap();
    deleted.sort();
    assert_eq!(deleted, [a, never]);
    // The other segment is untouched.
    assert!(
        remote
            .fetch(&b, &layout, layout.range(Section::Trailer))
            .await
            .is_ok()
    );
}

async fn wrong_trailer_size_is_refused(storage: Arc<dyn ObjectStorage>) {
    let remote = ObjectRemoteStorage::new(storage.clone());
    for len in [0, 79, 81] {
        let key = key(&format!("trailer-{len}"));
        let data = SegmentData {
            trailer: pattern(len, 9),
            ..segment(1, 24)
        };
        let err = remote.copy_segment(&key, data).await.unwrap_err();
        assert!(
            matches!(err, StorageError::Permanent { .. }),
            "trailer of {len} bytes: {err}"
        );
        let err = storage.fetch(&key, 0..1).await.unwrap_err();
        assert!(err.is_not_found(), "nothing stored: {err}");
    }
}

async fn too_large_log_is_refused(storage: Arc<dyn ObjectStorage>) {
    static MIB: [u8; 1 << 20] = [0; 1 << 20];
    let remote = ObjectRemoteStorage::new(storage.clone());
    let key = key("too-large");
    // 2 GiB of `.log` (i32::MAX + 1 bytes) without allocating it: one static MiB, 2048 times.
    let data = SegmentData {
        log: vec![Bytes::from_static(&MIB); 2048],
        ..segment(1, 0)
    };
    assert_eq!(
        data.log.iter().map(|c| c.len() as u64).sum::<u64>(),
        SegmentLayout::MAX_LOG_LEN + 1
    );
    let err = remote.copy_segment(&key, data).await.unwrap_err();
    assert!(matches!(err, StorageError::Permanent { .. }), "{err}");
    let err = storage.fetch(&key, 0..1).await.unwrap_err();
    assert!(err.is_not_found(), "nothing stored: {err}");
}

async fn list_with_offset_lists_segments(storage: Arc<dyn ObjectStorage>) {
    let remote = ObjectRemoteStorage::new(storage);
    let mut layouts = Vec::new();
    for name in ["list/a", "list/b", "list/c"] {
        layouts.push(
            remote
                .copy_segment(&key(name), segment(3, 0))
                .await
                .unwrap(),
        );
    }
    let mut listed: Vec<(String, u64)> = remote
        .list_with_offset("tiered/list", "tiered/list/a")
        .map_ok(|meta| (meta.key.into_string(), meta.size))
        .try_collect()
        .await
        .unwrap();
    listed.sort();
    let size = layouts[0].object_size();
    assert_eq!(
        listed,
        [
            ("tiered/list/b".to_string(), size),
            ("tiered/list/c".to_string(), size)
        ]
    );
}

macro_rules! backend {
    ($backend:ident: $($case:ident),* $(,)?) => {
        mod $backend {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let (storage, _guard) = super::$backend().await;
                    super::$case(storage).await;
                }
            )*
        }
    };
}

macro_rules! every_backend {
    ($($backend:ident),*) => {
        $(
            backend!($backend:
                round_trip_of_every_section,
                fetch_outside_the_object_is_refused,
                second_copy_to_the_same_key_is_refused,
                delete_is_idempotent,
                wrong_trailer_size_is_refused,
                too_large_log_is_refused,
                list_with_offset_lists_segments,
            );
        )*
    };
}

every_backend!(in_memory, local_filesystem, s3_over_http);
