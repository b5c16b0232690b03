//! Compaction's record rules (`diskless_core::compaction`) against a plain model of Kafka's log
//! cleaner: which records survive a round, what a rebuilt batch holds, and the tombstone's two
//! rounds (KIP-534).
#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests: a failed step is a failed test.

use std::collections::BTreeMap;

use bytes::Bytes;
use diskless_coordinator::TimestampType;
use diskless_core::compaction::{
    BatchVerdict, CompactionRound, MAP_ENTRY_OVERHEAD, MapOutcome, OffsetMap, compact_batch,
};
use diskless_core::{Compression, NewRecord, RecordBatch, RecordBatchBuilder, RecordIter};
use proptest::prelude::*;

const NOW: i64 = 1_700_000_000_000;
const LIMIT: usize = 64 << 20;
const DAY: i64 = 86_400_000;

/// One record as a consumer reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Read {
    offset: i64,
    timestamp: i64,
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    headers: Vec<(Vec<u8>, Option<Vec<u8>>)>,
}

fn read(batch: &RecordBatch) -> Vec<Read> {
    let mut scratch = Vec::new();
    let codec = batch.attributes().compression().unwrap();
    let raw = batch.records_bytes();
    let records: &[u8] = if codec == Compression::None {
        &raw
    } else {
        diskless_core::compression::decompress(codec, &raw, LIMIT, &mut scratch).unwrap();
        &scratch
    };
    let log_append = batch.attributes().timestamp_type() == TimestampType::LogAppendTime;
    RecordIter::new(records, batch.records_count() as usize)
        .map(|r| {
            let r = r.unwrap();
            Read {
                offset: batch.base_offset() + i64::from(r.offset_delta),
                timestamp: if log_append {
                    batch.max_timestamp()
                } else {
                    r.timestamp(batch.base_timestamp())
                },
                key: r.key.map(<[u8]>::to_vec),
                value: r.value.map(<[u8]>::to_vec),
                headers: r
                    .headers()
                    .map(|(k, v)| (k.to_vec(), v.map(<[u8]>::to_vec)))
                    .collect(),
            }
        })
        .collect()
}

fn round(now_ms: i64) -> CompactionRound {
    CompactionRound {
        now_ms,
        delete_retention_ms: DAY,
        decompression_limit: LIMIT,
    }
}

/// One compaction round over `log` (every batch mapped, then every batch filtered): the
/// compacted log.
fn compact(log: &[RecordBatch], now_ms: i64) -> Vec<RecordBatch> {
    let mut map = OffsetMap::new(usize::MAX);
    let mut scratch = Vec::new();
    for batch in log {
        assert_eq!(
            map.add_batch(batch, false, &mut scratch, LIMIT).unwrap(),
            MapOutcome::Mapped
        );
    }
    log.iter()
        .filter_map(|batch| {
            match compact_batch(batch, false, &map, &round(now_ms), &mut scratch).unwrap() {
                BatchVerdict::Unchanged => Some(batch.clone()),
                BatchVerdict::Rewritten(b) => Some(b),
                BatchVerdict::Removed => None,
            }
        })
        .collect()
}

/// A record to produce: key index (None: no key), value (None: tombstone).
type Spec = (Option<u8>, Option<u8>);

fn build_log(batches: &[(Compression, bool, Vec<Spec>)]) -> Vec<RecordBatch> {
    let mut offset = 0i64;
    let mut ts = NOW - 10_000;
    batches
        .iter()
        .enumerate()
        .map(|(i, (codec, idempotent, records))| {
            let mut b = RecordBatchBuilder::new()
                .base_offset(offset)
                .compression(*codec)
                .partition_leader_epoch(0);
            if *idempotent {
                b = b.producer(7, 1, offset as i32);
            }
            for (key, value) in records {
                ts += 1;
                b = b.push(NewRecord {
                    timestamp: ts,
                    key: key.map(|k| Bytes::from(vec![b'k', k])),
                    value: value.map(|v| Bytes::from(vec![b'v', v, i as u8])),
                    headers: vec![(Bytes::from_static(b"h"), Some(Bytes::from(vec![i as u8])))],
                });
            }
            offset += records.len() as i64;
            b.build().unwrap()
        })
        .collect()
}

fn log_strategy() -> impl Strategy<Value = Vec<(Compression, bool, Vec<Spec>)>> {
    let codec = prop::sample::select(Compression::ALL.to_vec());
    let record = (
        prop::option::weighted(0.9, 0u8..6),
        prop::option::weighted(0.8, any::<u8>()),
    );
    prop::collection::vec(
        (codec, any::<bool>(), prop::collection::vec(record, 1..6)),
        1..12,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// After a round: each key's latest record, tombstones included, is read exactly as produced
    /// (offset, timestamp, key, value, headers); no other keyed record and no keyless record is
    /// left; batches keep their base and last offsets and producer fields and have a valid CRC.
    /// A second round before the horizon changes nothing; one after it removes the tombstones,
    /// and nothing else.
    #[test]
    fn a_round_keeps_exactly_each_keys_latest_record(spec in log_strategy()) {
        let log = build_log(&spec);
        let produced: Vec<Read> = log.iter().flat_map(read).collect();
        let mut latest: BTreeMap<Vec<u8>, Read> = BTreeMap::new();
        for r in &produced {
            if let Some(k) = &r.key {
                latest.insert(k.clone(), r.clone());
            }
        }
        let expected: Vec<Read> = {
            let mut v: Vec<Read> = latest.values().cloned().collect();
            v.sort_by_key(|r| r.offset);
            v
        };

        let once = compact(&log, NOW);
        let originals: BTreeMap<i64, &RecordBatch> = log.iter().map(|b| (b.base_offset(), b)).collect();
        for b in &once {
            prop_assert!(b.crc_is_valid());
            let original = originals[&b.base_offset()];
            prop_assert_eq!(b.last_offset(), original.last_offset());
            prop_assert_eq!(b.producer_id(), original.producer_id());
            prop_assert_eq!(b.producer_epoch(), original.producer_epoch());
            prop_assert_eq!(b.base_sequence(), original.base_sequence());
            prop_assert_eq!(b.last_sequence(), original.last_sequence());
            prop_assert_eq!(b.attributes().compression(), original.attributes().compression());
            prop_assert_eq!(b.partition_leader_epoch(), original.partition_leader_epoch());
            let tombstones = read(b).iter().any(|r| r.value.is_none());
            // A kept tombstone's batch carries the horizon: now + delete.retention.ms.
            prop_assert_eq!(b.attributes().has_delete_horizon(), tombstones);
            if tombstones {
                prop_assert_eq!(b.base_timestamp(), NOW + DAY);
            }
            prop_assert_eq!(
                b.max_timestamp(),
                read(b).iter().map(|r| r.timestamp).max().unwrap_or(-1)
            );
        }
        let after: Vec<Read> = once.iter().flat_map(read).collect();
        prop_assert_eq!(&after, &expected);

        // Before the horizon a second round keeps every byte.
        let twice = compact(&once, NOW + DAY - 1);
        prop_assert_eq!(&twice, &once);
        // At the horizon the tombstones go.
        let past = compact(&once, NOW + DAY);
        let without: Vec<Read> = expected.iter().filter(|r| r.value.is_some()).cloned().collect();
        prop_assert_eq!(past.iter().flat_map(read).collect::<Vec<_>>(), without);
    }

    /// Records after the mapped range are kept whatever they are (keyless ones too): such a
    /// batch is kept byte for byte, or, holding a tombstone without a horizon, rebuilt with the
    /// same records and the horizon (Kafka's `filterTo` stamps every kept tombstone).
    #[test]
    fn records_after_the_mapped_range_are_kept(spec in log_strategy(), mapped in 0usize..12) {
        let log = build_log(&spec);
        let mapped = mapped.min(log.len());
        let mut map = OffsetMap::new(usize::MAX);
        let mut scratch = Vec::new();
        for batch in &log[..mapped] {
            map.add_batch(batch, false, &mut scratch, LIMIT).unwrap();
        }
        for batch in &log[mapped..] {
            let verdict = compact_batch(batch, false, &map, &round(NOW), &mut scratch).unwrap();
            let tombstones = read(batch).iter().any(|r| r.value.is_none());
            match verdict {
                BatchVerdict::Unchanged => prop_assert!(!tombstones),
                BatchVerdict::Rewritten(out) => {
                    prop_assert!(tombstones);
                    prop_assert!(out.attributes().has_delete_horizon());
                    prop_assert_eq!(read(&out), read(batch));
                }
                BatchVerdict::Removed => prop_assert!(false, "a batch past the map was removed"),
            }
        }
    }
}

#[test]
fn aborted_data_is_removed_and_markers_and_later_records_are_kept() {
    let mut scratch = Vec::new();
    let aborted = RecordBatchBuilder::new()
        .base_offset(0)
        .transactional(true)
        .producer(3, 0, 0)
        .record(NOW, Some(b"a"), Some(b"aborted"))
        .build()
        .unwrap();
    let marker = RecordBatchBuilder::new()
        .base_offset(1)
        .control(true)
        .transactional(true)
        .producer(3, 0, -1)
        .record(NOW, Some(&[0, 0, 0, 0]), Some(&[0, 0, 0, 0, 0, 0]))
        .build()
        .unwrap();
    let mut map = OffsetMap::new(usize::MAX);
    map.add_batch(&aborted, true, &mut scratch, LIMIT).unwrap();
    map.add_batch(&marker, false, &mut scratch, LIMIT).unwrap();
    // Neither adds a key, both move the mapped range.
    assert!(map.is_empty());
    assert_eq!(map.latest_offset(), 1);
    assert_eq!(
        compact_batch(&aborted, true, &map, &round(NOW), &mut scratch).unwrap(),
        BatchVerdict::Removed
    );
    assert_eq!(
        compact_batch(&marker, false, &map, &round(NOW), &mut scratch).unwrap(),
        BatchVerdict::Unchanged
    );
}

/// A partly kept batch, byte by byte as Kafka's `buildRetainedRecordsInto` writes it.
#[test]
fn a_rebuilt_batch_keeps_its_offsets_sequence_and_timestamps() {
    let mut scratch = Vec::new();
    let batch = RecordBatchBuilder::new()
        .base_offset(100)
        .partition_leader_epoch(4)
        .compression(Compression::Lz4)
        .producer(9, 2, 50)
        .record(NOW, Some(b"x"), Some(b"old"))
        .record(NOW + 5, None, Some(b"no key"))
        .record(NOW + 3, Some(b"y"), Some(b"kept"))
        .record(NOW + 9, Some(b"x"), Some(b"superseded later"))
        .build()
        .unwrap();
    let later = RecordBatchBuilder::new()
        .base_offset(104)
        .record(NOW + 20, Some(b"x"), Some(b"new"))
        .build()
        .unwrap();
    let mut map = OffsetMap::new(usize::MAX);
    map.add_batch(&batch, false, &mut scratch, LIMIT).unwrap();
    map.add_batch(&later, false, &mut scratch, LIMIT).unwrap();
    assert_eq!(map.get(b"x"), Some(104));
    let BatchVerdict::Rewritten(out) =
        compact_batch(&batch, false, &map, &round(NOW + 1_000), &mut scratch).unwrap()
    else {
        panic!("expected a rewrite");
    };
    assert_eq!((out.base_offset(), out.last_offset()), (100, 103));
    assert_eq!(out.records_count(), 1);
    assert_eq!(out.last_sequence(), 53, "the last sequence survives");
    assert_eq!(out.partition_leader_epoch(), 4);
    assert_eq!(out.attributes().compression(), Some(Compression::Lz4));
    assert!(!out.attributes().has_delete_horizon());
    assert_eq!(
        (out.base_timestamp(), out.max_timestamp()),
        (NOW + 3, NOW + 3)
    );
    let records = read(&out);
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].offset, 102);
    assert_eq!(records[0].value.as_deref(), Some(&b"kept"[..]));
    assert_eq!(
        compact_batch(&later, false, &map, &round(NOW + 1_000), &mut scratch).unwrap(),
        BatchVerdict::Unchanged
    );
}

/// LogAppendTime batches keep their append time as max timestamp.
#[test]
fn a_log_append_time_batch_keeps_its_append_time() {
    let mut scratch = Vec::new();
    let batch = RecordBatchBuilder::new()
        .timestamp_type(TimestampType::LogAppendTime)
        .record(5, Some(b"a"), Some(b"1"))
        .record(6, Some(b"b"), Some(b"2"))
        .max_timestamp(NOW)
        .build()
        .unwrap();
    let later = RecordBatchBuilder::new()
        .base_offset(2)
        .record(7, Some(b"a"), Some(b"3"))
        .build()
        .unwrap();
    let mut map = OffsetMap::new(usize::MAX);
    map.add_batch(&batch, false, &mut scratch, LIMIT).unwrap();
    map.add_batch(&later, false, &mut scratch, LIMIT).unwrap();
    let BatchVerdict::Rewritten(out) =
        compact_batch(&batch, false, &map, &round(NOW), &mut scratch).unwrap()
    else {
        panic!("expected a rewrite");
    };
    assert_eq!(out.max_timestamp(), NOW);
    assert_eq!(out.timestamp_type(), TimestampType::LogAppendTime);
    assert_eq!(read(&out)[0].key.as_deref(), Some(&b"b"[..]));
}

/// The map refuses a whole batch whose new keys pass its bound, and counts a key once.
#[test]
fn a_full_map_refuses_the_whole_batch() {
    let mut scratch = Vec::new();
    let batch = |base: i64, keys: &[&[u8]]| {
        let mut b = RecordBatchBuilder::new().base_offset(base);
        for k in keys {
            b = b.record(NOW, Some(k), Some(b"v"));
        }
        b.build().unwrap()
    };
    let mut map = OffsetMap::new(2 * (1 + MAP_ENTRY_OVERHEAD));
    let first = batch(0, &[b"a", b"b", b"a"]);
    assert_eq!(
        map.add_batch(&first, false, &mut scratch, LIMIT).unwrap(),
        MapOutcome::Mapped
    );
    assert_eq!(
        (map.len(), map.latest_offset(), map.get(b"a")),
        (2, 2, Some(2))
    );
    // Known keys cost nothing.
    let again = batch(3, &[b"b"]);
    assert_eq!(
        map.add_batch(&again, false, &mut scratch, LIMIT).unwrap(),
        MapOutcome::Mapped
    );
    let new = batch(4, &[b"a", b"c"]);
    assert_eq!(
        map.add_batch(&new, false, &mut scratch, LIMIT).unwrap(),
        MapOutcome::Full
    );
    assert_eq!((map.latest_offset(), map.get(b"a")), (3, Some(2)));
}

/// Corrupt records are errors, never panics.
#[test]
fn corrupt_records_are_errors() {
    let mut scratch = Vec::new();
    let good = RecordBatchBuilder::new()
        .record(NOW, Some(b"a"), Some(b"v"))
        .build()
        .unwrap();
    let mut bytes = good.as_bytes().to_vec();
    let last = bytes.len() - 1;
    bytes.truncate(last);
    let len = (bytes.len() - 12) as i32;
    bytes[8..12].copy_from_slice(&len.to_be_bytes());
    let bad = RecordBatch::parse(Bytes::from(bytes)).unwrap();
    let mut map = OffsetMap::new(usize::MAX);
    assert!(map.add_batch(&bad, false, &mut scratch, LIMIT).is_err());
    let map = OffsetMap::new(usize::MAX);
    assert!(compact_batch(&bad, false, &map, &round(NOW), &mut scratch).is_err());
    let mut map = OffsetMap::new(usize::MAX);
    map.add_batch(&good, false, &mut scratch, LIMIT).unwrap();
    assert!(compact_batch(&bad, false, &map, &round(NOW), &mut scratch).is_err());
}
