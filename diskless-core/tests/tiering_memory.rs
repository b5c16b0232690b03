//! The tiering worker builds a 256 MiB segment in bounded memory: the `.log` is streamed to
//! storage in parts while its WAL batches are read in windows, so a pass's heap growth stays under
//! two parts, a read window and the indexes — not the segment. A segment whose plan is at most
//! `inline_upload_max / 2` goes up in one create-only PUT (one part of `inline_upload_max`), so
//! its build holds up to `inline_upload_max` instead of `part_size` (the documented bound
//! `read_window + max(part_size, inline_upload_max)`); a 64 MiB one is multipart as before.
//!
//! Heap is measured by a counting global allocator, per thread (as `orphans_memory.rs`): the pass
//! runs on a current-thread runtime. The store keeps WAL objects as shared `Bytes` (a read returns
//! a fresh copy, as a GET response is, so what the worker keeps of its reads counts) and, for a
//! streamed upload, only its length and CRC (an object store's memory is not the worker's): it
//! takes parts of `part_size` as a multipart upload does.
#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests: a failed step is a failed test.
#![allow(clippy::print_stderr)] // It reports the heap growth it measured.
#![allow(unsafe_code)]

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use diskless_coordinator::{
    BatchCoordinator, CommitBatch, CommitFileRequest, CreateTopicRequest, ErrorCode,
    FindBatchesRequest, IsolationLevel, ManualClock, NO_PRODUCER_EPOCH, NO_PRODUCER_ID,
    NO_SEQUENCE, TimestampType, TopicConfig, TopicIdPartition,
};
use diskless_core::lifecycle::{TieringConfig, TieringWorker};
use diskless_core::{Fetcher, RecordBatchBuilder};
use diskless_storage::{
    CountingStorage, ObjectKey, ObjectMeta, ObjectRemoteStorage, ObjectStorage, SeededKeys,
    StorageError,
};
use diskless_testkit::coordinator::InMemoryCoordinator;
use futures::StreamExt;
use futures::stream::BoxStream;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

// ---------------------------------------------------------------------------------------------
// Counting allocator (shared with orphans_memory.rs)

#[path = "support/counting_alloc.rs"]
mod counting_alloc;
use counting_alloc::peak_growth;

// ---------------------------------------------------------------------------------------------
// A store that keeps WAL objects and only the size and CRC of streamed ones

#[derive(Debug, Default)]
struct Store {
    objects: Mutex<HashMap<String, Bytes>>,
    /// Streamed objects: (size, CRC-32C, parts).
    streamed: Mutex<HashMap<String, (u64, u32, u64)>>,
}

#[async_trait]
impl ObjectStorage for Store {
    async fn upload(&self, key: &ObjectKey, payload: &[Bytes]) -> Result<(), StorageError> {
        let whole: Vec<u8> = payload.concat();
        self.objects
            .lock()
            .insert(key.as_str().to_string(), whole.into());
        Ok(())
    }

    async fn upload_stream(
        &self,
        key: &ObjectKey,
        mut chunks: BoxStream<'_, Result<Bytes, StorageError>>,
        part_size: usize,
    ) -> Result<u64, StorageError> {
        // A multipart upload: a part buffer of `part_size`, sent (here: checksummed) when full.
        let mut part = BytesMut::with_capacity(part_size);
        let (mut size, mut crc, mut parts) = (0u64, 0u32, 0u64);
        let mut send = |part: &mut BytesMut| {
            crc = crc32c::crc32c_append(crc, part);
            size += part.len() as u64;
            parts += 1;
            part.clear();
        };
        while let Some(chunk) = chunks.next().await {
            let mut chunk = chunk?;
            while !chunk.is_empty() {
                let take = chunk.len().min(part_size - part.len());
                part.extend_from_slice(&chunk.split_to(take));
                if part.len() == part_size {
                    send(&mut part);
                }
            }
        }
        if !part.is_empty() {
            send(&mut part);
        }
        self.streamed
            .lock()
            .insert(key.as_str().to_string(), (size, crc, parts));
        Ok(size)
    }

    async fn fetch(&self, key: &ObjectKey, range: Range<u64>) -> Result<Bytes, StorageError> {
        let object = self.objects.lock().get(key.as_str()).cloned();
        match object {
            Some(o) if range.start < range.end && range.end <= o.len() as u64 => {
                // A copy, as a GET response is: what the worker holds of it counts.
                Ok(Bytes::copy_from_slice(
                    &o[range.start as usize..range.end as usize],
                ))
            }
            Some(o) => Err(StorageError::InvalidRange {
                key: key.to_string(),
                start: range.start,
                end: range.end,
                size: Some(o.len() as u64),
            }),
            None => Err(StorageError::NotFound {
                key: key.to_string(),
                source: None,
            }),
        }
    }

    async fn delete(&self, keys: &[ObjectKey]) -> Result<Vec<ObjectKey>, StorageError> {
        for k in keys {
            self.objects.lock().remove(k.as_str());
        }
        Ok(keys.to_vec())
    }

    fn list<'a>(&'a self, _prefix: &'a str) -> BoxStream<'a, Result<ObjectMeta, StorageError>> {
        futures::stream::empty().boxed()
    }
}

const T0: i64 = 1_700_000_000_000;
const MIB: usize = 1 << 20;
/// Batches of 256 KiB (4 per MiB), in WAL objects of 16 batches.
const BATCH_VALUE: usize = 256 * 1024 - 100;
const PER_OBJECT: usize = 16;
const PER_MIB: usize = 4;

fn block_on(f: impl std::future::Future<Output = ()>) {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
        .block_on(f);
}

#[test]
fn a_256_mib_segment_is_built_in_bounded_memory() {
    block_on(run(256));
}

#[test]
fn a_12_mib_segment_goes_up_in_one_put() {
    block_on(run(12));
}

#[test]
fn a_64_mib_segment_is_multipart() {
    block_on(run(64));
}

/// Tiers one segment of `mib` MiB of 256 KiB batches with the default `inline_upload_max` and
/// 8 MiB parts and read windows; checks its PUTs and the heap growth of the pass.
async fn run(mib: usize) {
    let batches = mib * PER_MIB;
    let clock = ManualClock::new(T0);
    let store = Arc::new(CountingStorage::new(Store::default()));
    let coordinator: Arc<dyn BatchCoordinator> = Arc::new(InMemoryCoordinator::new(clock.clone()));
    let topic_id = uuid::Uuid::from_u128(0x3e3);
    let partition = TopicIdPartition::new(topic_id, 0);
    coordinator
        .create_topic(CreateTopicRequest {
            topic_id,
            name: "big".into(),
            partitions: 1,
            config: TopicConfig {
                retention_ms: -1,
                segment_ms: 60_000,
                ..TopicConfig::default()
            },
        })
        .await
        .unwrap();
    // One batch, stored 16 times per object, one object shared by every key (the store's memory
    // is set up before the measure).
    let batch = RecordBatchBuilder::new()
        .record(T0, None, Some(&vec![b'v'; BATCH_VALUE]))
        .build()
        .unwrap();
    let size = batch.len();
    let object: Bytes = std::iter::repeat_n(&batch.as_bytes()[..], PER_OBJECT)
        .collect::<Vec<_>>()
        .concat()
        .into();
    let keys = SeededKeys::new(3);
    for o in 0..batches / PER_OBJECT {
        let key = ObjectKey::generate("wal", &keys, clock.as_ref()).unwrap();
        store
            .inner()
            .objects
            .lock()
            .insert(key.as_str().to_string(), object.clone());
        let results = coordinator
            .commit_file(CommitFileRequest {
                object_key: key.into_string(),
                uploader_broker_id: 1,
                object_size: object.len() as u64,
                owners: vec![0],
                batches: (0..PER_OBJECT)
                    .map(|i| CommitBatch {
                        partition,
                        byte_offset: (i * size) as u64,
                        byte_size: size as u32,
                        record_count: 1,
                        base_timestamp: T0,
                        max_timestamp: T0,
                        timestamp_type: TimestampType::CreateTime,
                        producer_id: NO_PRODUCER_ID,
                        producer_epoch: NO_PRODUCER_EPOCH,
                        base_sequence: NO_SEQUENCE,
                        last_sequence: NO_SEQUENCE,
                        transactional: false,
                        txn_seq: None,
                    })
                    .collect(),
            })
            .await
            .unwrap();
        assert!(results.iter().all(|r| r.error == ErrorCode::None), "{o}");
    }
    clock.advance(10 * 60 * 1000);

    let part_size = 8 * MIB;
    let read_window = 8 * MIB as u64;
    let fetcher = Fetcher::builder(store.clone(), coordinator.clone())
        .build()
        .unwrap();
    let worker = TieringWorker::new(
        coordinator.clone(),
        Arc::new(ObjectRemoteStorage::new(store.clone())),
        fetcher,
        clock.clone(),
        Arc::new(SeededKeys::new(9)),
        1,
        TieringConfig::default()
            .with_part_size(part_size)
            .with_read_window(read_window),
    )
    .unwrap();
    let (report, growth) = peak_growth(worker.run_pass()).await;
    let report = report.unwrap();
    assert_eq!(report.segments, 1, "{report:?}");
    assert_eq!(report.batches_tiered, batches as u64);
    assert_eq!(report.bytes, (batches * size) as u64);
    let config = TieringConfig::default();
    let inline = config.inline_upload_max;
    let puts = store.counters().snapshot();
    let streamed = store.inner().streamed.lock().clone();
    let (object_size, _, parts) = *streamed.values().next().unwrap();
    assert!(object_size > (batches * size) as u64);
    // Up to `inline_upload_max / 2` of plan, one create-only PUT of the whole object (parts of
    // `inline_upload_max`); else a multipart upload in parts of `part_size`: create, the parts,
    // complete.
    let inline_plan = (batches * size) as u64 <= inline as u64 / 2;
    let part = if inline_plan { inline } else { part_size };
    if inline_plan {
        assert_eq!((puts.put_requests, puts.put_parts), (1, 0), "{puts:?}");
        assert_eq!(parts, 1);
    } else {
        let expected = object_size.div_ceil(part_size as u64);
        assert!(expected > 1);
        assert_eq!(parts, expected);
        assert_eq!(
            (puts.put_requests, puts.put_parts),
            (expected + 2, expected),
            "{puts:?}"
        );
    }
    assert_eq!(puts.put_bytes, object_size);
    // Two parts (the store's part buffer and the worker's, of the part size the worker passed:
    // `inline_upload_max` for an inline segment, so `read_window + max(part_size,
    // inline_upload_max)` as the docs say), a read window and 1 MiB for the indexes and the
    // plan's coordinates.
    let bound = (2 * part + read_window as usize + MIB) as isize;
    eprintln!(
        "building a {} MiB segment grew the heap by at most {:.1} MiB (bound {} MiB)",
        object_size >> 20,
        growth as f64 / MIB as f64,
        bound >> 20
    );
    assert!(growth < bound, "grew by {growth} bytes, bound {bound}");
    // The batches moved tier.
    let found = coordinator
        .find_batches(
            &[FindBatchesRequest {
                partition,
                offset: 0,
                max_bytes: 1 << 20,
                isolation: IsolationLevel::ReadUncommitted,
            }],
            1 << 20,
        )
        .await
        .unwrap()
        .remove(0);
    assert_eq!(found.segments.len(), 1);
    assert_eq!(found.segments[0].end_offset, batches as i64 - 1);
    assert!(found.batches.is_empty());
}
