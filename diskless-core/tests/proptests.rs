//! Property tests: built batches and segments round-trip; arbitrary or mutated bytes never panic.
#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests: a failed step is a failed test.

use bytes::Bytes;
use diskless_coordinator::{TopicConfig, TopicIdPartition};
use diskless_core::batch::update_crc;
use diskless_core::fuzzing::{fuzz_batch_validator, fuzz_segment_reader};
use diskless_core::{
    Compression, NewRecord, RecordBatch, RecordBatchBuilder, RecordIter, SegmentBuilder,
    SegmentReader, split_batches, validate_batch,
};
use proptest::prelude::*;

const NOW: i64 = 1_700_000_000_000;

type Header = (Vec<u8>, Option<Vec<u8>>);

fn arb_record() -> impl Strategy<Value = NewRecord> {
    (
        -3_600_000i64..3_600_000,
        proptest::option::of(proptest::collection::vec(any::<u8>(), 0..20)),
        proptest::option::of(proptest::collection::vec(any::<u8>(), 0..200)),
        proptest::collection::vec(
            (
                proptest::collection::vec(any::<u8>(), 0..8),
                proptest::option::of(proptest::collection::vec(any::<u8>(), 0..8)),
            ),
            0..3,
        ),
    )
        .prop_map(
            |(dt, key, value, headers): (i64, _, _, Vec<Header>)| NewRecord {
                timestamp: NOW + dt,
                key: key.map(Bytes::from),
                value: value.map(Bytes::from),
                headers: headers
                    .into_iter()
                    .map(|(k, v)| (Bytes::from(k), v.map(Bytes::from)))
                    .collect(),
            },
        )
}

fn arb_codec() -> impl Strategy<Value = Compression> {
    prop::sample::select(Compression::ALL.to_vec())
}

fn arb_batch() -> impl Strategy<Value = (Vec<NewRecord>, Compression, i64, i16, i32)> {
    (
        proptest::collection::vec(arb_record(), 1..8),
        arb_codec(),
        -1i64..1_000,
        0i16..10,
        0i32..=i32::MAX,
    )
}

fn build(records: &[NewRecord], codec: Compression, pid: i64, epoch: i16, seq: i32) -> RecordBatch {
    let mut b = RecordBatchBuilder::new().compression(codec);
    if pid >= 0 {
        b = b.producer(pid, epoch, seq);
    }
    for r in records {
        b = b.push(r.clone());
    }
    b.build().unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn built_batches_round_trip((records, codec, pid, epoch, seq) in arb_batch()) {
        let batch = build(&records, codec, pid, epoch, seq);
        let reparsed = split_batches(batch.as_bytes().clone()).unwrap();
        prop_assert_eq!(reparsed.len(), 1);
        let v = validate_batch(&reparsed[0], &TopicConfig::default(), NOW).unwrap();
        prop_assert_eq!(v.record_count as usize, records.len());
        prop_assert_eq!(v.max_record_timestamp, records.iter().map(|r| r.timestamp).max().unwrap());
        prop_assert_eq!(v.compression, codec);
        if pid >= 0 {
            prop_assert_eq!(v.last_sequence, diskless_core::increment_sequence(seq, records.len() as i32 - 1));
        }
        let mut raw = Vec::new();
        diskless_core::compression::decompress(codec, &batch.records_bytes(), 1 << 24, &mut raw).unwrap();
        let parsed: Vec<_> = RecordIter::new(&raw, records.len()).collect::<Result<_, _>>().unwrap();
        for (p, r) in parsed.iter().zip(&records) {
            prop_assert_eq!(p.timestamp(batch.base_timestamp()), r.timestamp);
            prop_assert_eq!(p.key, r.key.as_deref());
            prop_assert_eq!(p.value, r.value.as_deref());
            let hs: Vec<_> = p.headers().collect();
            let want: Vec<_> = r.headers.iter().map(|(k, v)| (&k[..], v.as_deref())).collect();
            prop_assert_eq!(hs, want);
        }
    }

    #[test]
    fn segments_round_trip(
        items in proptest::collection::vec((0i32..4, arb_batch()), 0..12),
    ) {
        let topic = uuid::Uuid::from_u128(42);
        let mut builder = SegmentBuilder::new();
        let mut added = Vec::new();
        for (p, (records, codec, pid, epoch, seq)) in &items {
            let b = build(records, *codec, *pid, *epoch, *seq);
            let tp = TopicIdPartition::new(topic, *p);
            builder.add(tp, b.clone());
            added.push((tp, b));
        }
        let expected_size = builder.size();
        let seg = builder.finish();
        prop_assert_eq!(seg.size, expected_size);
        prop_assert_eq!(seg.batches.len(), added.len());
        let bytes = seg.to_bytes();
        prop_assert_eq!(bytes.len() as u64, seg.size);
        let reader = SegmentReader::new(bytes.clone()).unwrap();
        let mut seen_partitions: Vec<TopicIdPartition> = Vec::new();
        let mut last_insertion: std::collections::HashMap<TopicIdPartition, usize> = Default::default();
        for sb in &seg.batches {
            let (tp, b) = &added[sb.insertion_index];
            prop_assert_eq!(&sb.partition, tp);
            prop_assert_eq!(&reader.read_batch(sb.byte_offset, sb.byte_size).unwrap(), b);
            // Ranged read of exactly this batch.
            let s = sb.byte_offset as usize;
            let e = s + sb.byte_size as usize;
            let ranged = SegmentReader::from_range(bytes.slice(s..e), sb.byte_offset, Some(seg.size)).unwrap();
            prop_assert_eq!(&ranged.read_batch(sb.byte_offset, sb.byte_size).unwrap(), b);
            // Contiguous runs per partition, insertion order inside a run.
            if seen_partitions.last() != Some(&sb.partition) {
                prop_assert!(!seen_partitions.contains(&sb.partition));
                seen_partitions.push(sb.partition);
            }
            if let Some(prev) = last_insertion.insert(sb.partition, sb.insertion_index) {
                prop_assert!(prev < sb.insertion_index);
            }
        }
        let walked = reader.batches().collect::<Result<Vec<_>, _>>().unwrap();
        prop_assert_eq!(walked.len(), added.len());
    }

    #[test]
    fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..400)) {
        fuzz_batch_validator(&data);
        fuzz_segment_reader(&data);
        let _ = RecordBatch::parse(Bytes::from(data.clone()));
        let _ = RecordIter::new(&data, 5).count();
    }

    #[test]
    fn mutated_batches_with_fixed_crc_never_panic(
        (records, codec, pid, epoch, seq) in arb_batch(),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
    ) {
        let batch = build(&records, codec, pid, epoch, seq);
        let mut v = batch.as_bytes().to_vec();
        for (i, x) in flips {
            // Leave the framing fields alone so the mutation reaches the deeper checks.
            let at = 21 + i.index(v.len() - 21);
            v[at] ^= x;
        }
        update_crc(&mut v);
        fuzz_batch_validator(&v);
        let mut seg = vec![0u8; 12];
        seg[0] = 1;
        seg[8..12].copy_from_slice(&(v.len() as u32).to_le_bytes());
        seg.push(0);
        seg.extend_from_slice(&v);
        fuzz_segment_reader(&seg);
    }
}
