//! [`ObjectRemoteStorage`] (tiered segments as one object each) against every backend: in memory,
//! the local filesystem (a temp dir) and S3 over HTTP (an in-process s3s server). One test per
//! case and backend (`s3_over_http::round_trip_of_every_section`, ...).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use bytes::Bytes;
use diskless_storage::{
    ObjectKey, ObjectRemoteStorage, ObjectStorage, ObjectStoreStorage, RemoteStorage, Section,
    SegmentData, SegmentLayout, SegmentTail, StorageError,
};
use diskless_testkit::storage::S3TestServer;
use futures::{FutureExt, StreamExt, TryStreamExt};
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

/// A segment held whole, to copy (as a stream) and to compare with.
#[derive(Clone)]
struct Segment {
    log: Vec<Bytes>,
    tail: SegmentTail,
}

impl Segment {
    /// What `copy_segment` takes: the `.log` streamed chunk by chunk, then the tail.
    fn data(&self) -> SegmentData {
        SegmentData::in_memory(self.log.clone(), self.tail.clone())
    }
}

/// A segment whose sections all differ; the `.log` in uneven chunks.
fn segment(seed: u8, txn_index_len: usize) -> Segment {
    let log = pattern(10_000, seed);
    Segment {
        log: vec![log.slice(..1), log.slice(1..4_097), log.slice(4_097..)],
        tail: SegmentTail {
            offset_index: pattern(8 * 37, seed.wrapping_add(1)),
            time_index: pattern(12 * 29, seed.wrapping_add(2)),
            txn_index: pattern(txn_index_len, seed.wrapping_add(3)),
            producer_snapshot: pattern(123, seed.wrapping_add(4)),
            leader_epochs: Bytes::from_static(b"0\n1\n0 42\n"),
            trailer: pattern(80, seed.wrapping_add(5)),
        },
    }
}

fn section_bytes(data: &Segment, section: Section) -> Bytes {
    let tail = &data.tail;
    match section {
        Section::Log => data.log.concat().into(),
        Section::OffsetIndex => tail.offset_index.clone(),
        Section::TimeIndex => tail.time_index.clone(),
        Section::TxnIndex => tail.txn_index.clone(),
        Section::ProducerSnapshot => tail.producer_snapshot.clone(),
        Section::LeaderEpochs => tail.leader_epochs.clone(),
        Section::Trailer => tail.trailer.clone(),
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
        let layout = remote.copy_segment(&key, data.data()).await.unwrap();
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
    let layout = remote
        .copy_segment(&key, segment(1, 24).data())
        .await
        .unwrap();
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
    let layout = remote.copy_segment(&key, first.data()).await.unwrap();
    let err = remote
        .copy_segment(&key, segment(2, 24).data())
        .await
        .unwrap_err();
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
    assert_eq!(
        remote.copy_segment(&key, first.data()).await.unwrap(),
        layout
    );
}

async fn delete_is_idempotent(storage: Arc<dyn ObjectStorage>) {
    let remote = ObjectRemoteStorage::new(storage);
    let (a, b, never) = (key("del-a"), key("del-b"), key("never-stored"));
    let layout = remote.copy_segment(&a, segment(1, 0).data()).await.unwrap();
    remote.copy_segment(&b, segment(2, 0).data()).await.unwrap();
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
        let mut data = segment(1, 24);
        data.tail.trailer = pattern(len, 9);
        let err = remote.copy_segment(&key, data.data()).await.unwrap_err();
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
    let data = Segment {
        log: vec![Bytes::from_static(&MIB); 2048],
        ..segment(1, 0)
    };
    assert_eq!(
        data.log.iter().map(|c| c.len() as u64).sum::<u64>(),
        SegmentLayout::MAX_LOG_LEN + 1
    );
    // The tail is never reached: the copy fails as the stream passes the limit.
    let data = SegmentData {
        tail: async { panic!("the tail of a too large .log is never awaited") }.boxed(),
        ..data.data()
    };
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
                .copy_segment(&key(name), segment(3, 0).data())
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

async fn failed_log_stream_stores_nothing(storage: Arc<dyn ObjectStorage>) {
    let remote = ObjectRemoteStorage::new(storage.clone());
    // 12 MiB in 64 KiB chunks (more than one part), then an error before the end of the `.log`.
    let chunk = pattern(64 << 10, 3);
    let key = key("log-fails");
    let log = futures::stream::iter((0..192).map(move |_| Ok(chunk.clone())))
        .chain(futures::stream::iter([Err(StorageError::Transient {
            source: "the WAL read failed".into(),
        })]))
        .boxed();
    let data = SegmentData {
        log,
        tail: async { panic!("the tail of a failed .log is never awaited") }.boxed(),
        part_size: 5 << 20,
    };
    let err = remote.copy_segment(&key, data).await.unwrap_err();
    assert!(matches!(err, StorageError::Transient { .. }), "{err}");
    let err = storage.fetch(&key, 0..1).await.unwrap_err();
    assert!(err.is_not_found(), "nothing stored: {err}");
    // A tail that fails (the builder's last step) stores nothing either.
    let key = self::key("tail-fails");
    let data = SegmentData {
        tail: async {
            Err(StorageError::Permanent {
                source: "the segment could not be finished".into(),
            })
        }
        .boxed(),
        ..segment(4, 0).data()
    };
    let err = remote.copy_segment(&key, data).await.unwrap_err();
    assert!(matches!(err, StorageError::Permanent { .. }), "{err}");
    let err = storage.fetch(&key, 0..1).await.unwrap_err();
    assert!(err.is_not_found(), "nothing stored: {err}");
}

async fn streamed_log_in_parts_round_trips(storage: Arc<dyn ObjectStorage>) {
    let remote = ObjectRemoteStorage::new(storage.clone());
    // 11 MiB + 7 bytes of `.log` in uneven chunks, uploaded in 5 MiB parts: three parts and the
    // tail, whatever the store does with parts.
    let log = pattern((11 << 20) + 7, 5);
    let mut chunks = Vec::new();
    let mut at = 0;
    for len in (0..).map(|i: usize| 1 + (i * 7919) % (300 << 10)) {
        let end = (at + len).min(log.len());
        chunks.push(log.slice(at..end));
        at = end;
        if at == log.len() {
            break;
        }
    }
    let seg = Segment {
        log: chunks,
        ..segment(6, 34)
    };
    let key = key("in-parts");
    let layout = remote
        .copy_segment(&key, seg.data().with_part_size(5 << 20))
        .await
        .unwrap();
    assert_eq!(layout.log, log.len() as u64);
    for section in Section::ALL {
        let got = remote
            .fetch(&key, &layout, layout.range(section))
            .await
            .unwrap();
        assert_eq!(got, section_bytes(&seg, section), "{section:?}");
    }
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
                failed_log_stream_stores_nothing,
                streamed_log_in_parts_round_trips,
            );
        )*
    };
}

every_backend!(in_memory, local_filesystem, s3_over_http);
