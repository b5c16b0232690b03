//! Tiered segments built by `diskless_core::tiered` against the independent reader
//! `diskless_testkit::kafka_segment` (written from Kafka's sources, sharing no code with the
//! writer): random batch sequences must produce objects the reader accepts byte for byte, whose
//! indexes are what Kafka's `LogSegment.recover` rebuilds, and whose every offset is found by
//! lookup + scan. Also replays the `tiered_segment_reader` fuzz corpus.
//!
//! `DISKLESS_REGEN_CORPUS=1 cargo test -p diskless-core --test tiered_segment` rewrites the seeds.
#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests: a failed step is a failed test.

use std::path::{Path, PathBuf};

use diskless_coordinator::TopicIdPartition;
use diskless_core::control::{MarkerBatch, end_txn_marker};
use diskless_core::fuzzing::{fuzz_tiered_segment_reader, tiered_coordinate};
use diskless_core::tiered::format::{
    OffsetIndex, TimeIndex, search_for_offset, search_for_timestamp,
};
use diskless_core::tiered::{
    AbortedTxnEntry, BuiltSegment, FinishInputs, ProducerSnapshotEntry, PushOutcome,
    TieredSegmentBuilder, TieredSegmentConfig,
};
use diskless_core::{Compression, RecordBatch, RecordBatchBuilder};
use diskless_testkit::kafka_segment::{
    KafkaSegment, SnapshotEntry, encode_snapshot, fold_producer_state,
};
use proptest::prelude::*;

const T0: i64 = 1_700_000_000_000;

/// One batch to generate.
#[derive(Debug, Clone)]
enum Spec {
    Data {
        records: Vec<(i64, usize)>,
        codec: Compression,
        producer: Option<(i64, i16)>,
        lying_max: bool,
    },
    /// A transaction of producer 77: `commit` ends it with a marker after `records` batches.
    Txn { batches: usize, commit: bool },
}

fn spec() -> impl Strategy<Value = Spec> {
    let record = (
        prop_oneof![4 => (0i64..5_000).prop_map(|d| T0 + d), 1 => Just(-1i64)],
        0usize..200,
    );
    prop_oneof![
        6 => (
            prop::collection::vec(record, 1..5),
            prop::sample::select(Compression::ALL.to_vec()),
            prop::option::of((1i64..4, 0i16..2)),
            any::<bool>(),
        )
            .prop_map(|(records, codec, producer, lying_max)| Spec::Data {
                records,
                codec,
                producer,
                lying_max,
            }),
        1 => (1usize..3, any::<bool>()).prop_map(|(batches, commit)| Spec::Txn { batches, commit }),
    ]
}

/// A stored batch, its coordinate-to-be (max timestamp) and, for an ABORT marker, the aborted row.
struct Input {
    batch: RecordBatch,
    max_timestamp: i64,
    aborted: Option<(i64, i64)>,
}

/// Expand specs into stored batches with offsets assigned from `base`.
fn inputs(specs: &[Spec], base: i64) -> Vec<(Input, i64)> {
    let mut out = Vec::new();
    let mut next = base;
    let mut seqs = std::collections::HashMap::<(i64, i16), i32>::new();
    for s in specs {
        match s {
            Spec::Data {
                records,
                codec,
                producer,
                lying_max,
            } => {
                let mut b = RecordBatchBuilder::new().compression(*codec);
                if let Some((id, epoch)) = producer {
                    let seq = seqs.entry((*id, *epoch)).or_default();
                    b = b.producer(*id, *epoch, *seq);
                    *seq += records.len() as i32;
                }
                for (ts, len) in records {
                    b = b.record(*ts, None, Some(&vec![b'x'; *len]));
                }
                let max = records.iter().map(|r| r.0).max().unwrap();
                if *lying_max {
                    b = b.max_timestamp(max + 12_345);
                }
                let batch = b.build().unwrap();
                let n = i64::from(batch.last_offset_delta()) + 1;
                out.push((
                    Input {
                        batch,
                        max_timestamp: max,
                        aborted: None,
                    },
                    next,
                ));
                next += n;
            }
            Spec::Txn { batches, commit } => {
                let first = next;
                for i in 0..*batches {
                    let batch = RecordBatchBuilder::new()
                        .producer(77, 0, i as i32)
                        .transactional(true)
                        .record(T0 + i as i64, None, Some(b"t"))
                        .build()
                        .unwrap();
                    out.push((
                        Input {
                            batch,
                            max_timestamp: T0 + i as i64,
                            aborted: None,
                        },
                        next,
                    ));
                    next += 1;
                }
                let marker = RecordBatch::parse(end_txn_marker(&MarkerBatch {
                    base_offset: 0,
                    partition_leader_epoch: -1,
                    producer_id: 77,
                    producer_epoch: 0,
                    commit: *commit,
                    coordinator_epoch: 4,
                    timestamp: T0 + 50,
                    log_append_time: false,
                }))
                .unwrap();
                out.push((
                    Input {
                        batch: marker,
                        max_timestamp: T0 + 50,
                        aborted: (!commit).then_some((first, next)),
                    },
                    next,
                ));
                next += 1;
            }
        }
    }
    out
}

fn to_reader(e: &ProducerSnapshotEntry) -> SnapshotEntry {
    SnapshotEntry {
        producer_id: e.producer_id,
        epoch: e.producer_epoch,
        last_sequence: e.last_sequence,
        last_offset: e.last_offset,
        offset_delta: e.offset_delta,
        timestamp: e.timestamp,
        coordinator_epoch: e.coordinator_epoch,
        current_txn_first_offset: e.current_txn_first_offset,
    }
}

/// Build segments from `inputs` until all are placed; each segment resumes where the last rolled.
fn build_all(
    inputs: &[(Input, i64)],
    config: TieredSegmentConfig,
    log_append_time: Option<i64>,
) -> Vec<BuiltSegment> {
    let partition = TopicIdPartition::new(uuid::Uuid::from_u128(0xabc), 4);
    let aborted: Vec<AbortedTxnEntry> = inputs
        .iter()
        .filter_map(|(i, _)| i.aborted)
        .map(|(first, marker)| AbortedTxnEntry {
            producer_id: 77,
            first_offset: first,
            last_offset: marker,
            last_stable_offset: marker + 1,
        })
        .collect();
    let mut segments: Vec<BuiltSegment> = Vec::new();
    let mut i = 0;
    while i < inputs.len() {
        let previous = segments
            .last()
            .map(|s| s.producer_state.clone())
            .unwrap_or_default();
        let mut b = TieredSegmentBuilder::new(partition, config)
            .unwrap()
            .expect_base_offset(inputs[i].1)
            .with_previous_snapshot(&previous);
        // The `.log` is drained as a streaming caller does (every third batch), and put back in
        // front of what is left at the end: the object must be the same.
        let mut drained = Vec::new();
        let mut pushed = 0;
        while i < inputs.len() {
            let (input, base) = &inputs[i];
            let lat = log_append_time.map(|t| t + *base);
            let c = tiered_coordinate(&input.batch, *base, input.max_timestamp, lat);
            match b.push(&c, input.batch.as_bytes().clone()).unwrap() {
                PushOutcome::Appended(_) => i += 1,
                PushOutcome::Rolled(_) => break,
            }
            pushed += 1;
            if pushed % 3 == 0 {
                let before = b.undrained_log_bytes();
                let chunks = b.drain_log();
                assert_eq!(chunks.iter().map(|c| c.len() as u64).sum::<u64>(), before);
                assert_eq!(b.undrained_log_bytes(), 0);
                drained.extend(chunks);
            }
        }
        assert!(!b.is_empty(), "a fresh segment takes at least one batch");
        let mut seg = b
            .finish(FinishInputs {
                aborted: aborted.clone(),
                log_start_offset: 0,
                first_tiered_base: segments.first().map(|s| s.base_offset),
                ..Default::default()
            })
            .unwrap();
        drained.append(&mut seg.log);
        seg.log = drained;
        segments.push(seg);
    }
    segments
}

/// Everything the independent reader says about one built segment.
fn check_segment(
    seg: &BuiltSegment,
    previous: &[ProducerSnapshotEntry],
    interval: i32,
    expected: &[(Input, i64)],
    log_append_time: Option<i64>,
) {
    let object = seg.to_bytes();
    assert_eq!(object.len() as u64, seg.layout.object_size());
    let k = KafkaSegment::parse(&object).unwrap();
    k.check(interval).unwrap();
    assert_eq!(
        (k.base_offset, k.end_offset),
        (seg.base_offset, seg.end_offset)
    );
    assert_eq!(k.topic_id, seg.partition.topic_id);
    assert_eq!(k.partition, seg.partition.partition);
    assert_eq!(k.batches.len(), seg.batch_count as usize);
    // The batches: assigned offsets, records untouched, Kafka's maxTimestamp.
    for (kb, (input, base)) in k.batches.iter().zip(expected) {
        assert_eq!(kb.base_offset, *base);
        assert_eq!(kb.size as usize, input.batch.len());
        let start = kb.position as usize;
        assert_eq!(
            &k.log[start + 61..start + kb.size as usize],
            &input.batch.as_bytes()[61..],
            "records are the stored ones"
        );
        match log_append_time {
            Some(t) => {
                assert!(kb.is_log_append_time());
                assert_eq!(kb.max_timestamp, t + base);
            }
            None => assert_eq!(kb.max_timestamp, input.max_timestamp),
        }
    }
    // Byte for byte: indexes (check() compared them with recover()), snapshot, epochs, txn index.
    let prev: Vec<SnapshotEntry> = previous.iter().map(to_reader).collect();
    let folded = fold_producer_state(&prev, &k.batches);
    assert_eq!(encode_snapshot(&folded), k.snapshot, "producer snapshot");
    let first_base = k.leader_epoch_entries().unwrap();
    assert_eq!(first_base.len(), 1);
    assert_eq!(
        k.leader_epochs,
        format!("0\n1\n0 {}\n", first_base[0].1).into_bytes()
    );
    let aborted = k.aborted_txns().unwrap();
    let expected_aborted: Vec<i64> = expected
        .iter()
        .filter(|(i, _)| i.aborted.is_some())
        .map(|(_, b)| *b)
        .collect();
    assert_eq!(
        aborted.iter().map(|a| a.last_offset).collect::<Vec<_>>(),
        expected_aborted
    );
    // Max timestamp: the reader's fold over the headers.
    let max = k.batches.iter().map(|b| b.max_timestamp).max().unwrap();
    assert_eq!(seg.max_timestamp, max.max(-1));
    if max > -1 {
        let first = k.batches.iter().find(|b| b.max_timestamp == max).unwrap();
        assert_eq!(seg.max_timestamp_offset, first.last_offset);
    }
    // Lookups: the writer's parsers and Kafka's answer agree for every offset.
    let oi = OffsetIndex::parse(seg.base_offset, seg.tail.offset_index.clone()).unwrap();
    let ti = TimeIndex::parse(seg.base_offset, seg.tail.time_index.clone()).unwrap();
    let log = &object[..seg.layout.log as usize];
    for offset in seg.base_offset..=seg.end_offset {
        let at = oi.lookup(offset);
        assert_eq!((at.offset, at.position), k.lookup_offset(offset).unwrap());
        let ours = search_for_offset(log, at.position, offset)
            .unwrap()
            .unwrap();
        let theirs = k.translate_offset(offset).unwrap().unwrap();
        assert_eq!(ours.position, u64::from(theirs.position));
        assert!(ours.base_offset <= offset && offset <= ours.last_offset);
    }
    let mut targets: Vec<i64> = k.batches.iter().map(|b| b.max_timestamp).collect();
    targets.extend([-5, 0, T0, T0 + 2_500, T0 + 10_000, i64::MAX]);
    for t in targets {
        let e = ti.lookup(t);
        assert_eq!((e.timestamp, e.offset), k.lookup_timestamp(t).unwrap());
        let from = oi.lookup(e.offset.max(seg.base_offset));
        let ours = search_for_timestamp(log, from.position, t, seg.base_offset).unwrap();
        let theirs = k.find_batch_by_timestamp(t, seg.base_offset).unwrap();
        assert_eq!(
            ours.map(|h| h.position),
            theirs.map(|b| u64::from(b.position))
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn built_segments_agree_with_the_independent_reader(
        specs in prop::collection::vec(spec(), 1..24),
        base in 0i64..1_000_000,
        interval in prop::sample::select(vec![0, 1, 100, 500, 4096]),
        segment_bytes in prop::sample::select(vec![14, 600, 3_000, 1 << 30]),
        segment_index_bytes in prop::sample::select(vec![4, 12, 40, 100, 10 << 20]),
        log_append_time in prop::option::of(Just(T0 + 100_000)),
    ) {
        let inputs = inputs(&specs, base);
        let config = TieredSegmentConfig { segment_bytes, index_interval_bytes: interval, segment_index_bytes };
        let segments = build_all(&inputs, config, log_append_time);
        let mut used = 0;
        let mut previous: Vec<ProducerSnapshotEntry> = Vec::new();
        let mut next = base;
        for seg in &segments {
            prop_assert_eq!(seg.base_offset, next, "segments are contiguous");
            let n = seg.batch_count as usize;
            // Roll limits: a multi-batch segment stays within segment.bytes and its indexes within
            // their capacity (the time index's roll entry is written even without a slot).
            if n > 1 {
                prop_assert!(seg.layout.log <= segment_bytes as u64);
            }
            prop_assert!(seg.tail.offset_index.len() <= segment_index_bytes as usize / 8 * 8);
            prop_assert!(seg.tail.time_index.len() <= (segment_index_bytes as usize / 12 * 12).max(12));
            check_segment(seg, &previous, interval, &inputs[used..used + n], log_append_time);
            used += n;
            next = seg.end_offset + 1;
            previous = seg.producer_state.clone();
        }
        prop_assert_eq!(used, inputs.len());
    }
}

/// Kafka's rule on a hand-made sequence (the unit tests cover the rule itself): three batches of
/// known sizes with the default interval produce no offset entry, one time entry.
#[test]
fn a_small_segment_has_only_the_roll_entry() {
    let specs: Vec<Spec> = (0..3)
        .map(|i| Spec::Data {
            records: vec![(T0 + i, 10)],
            codec: Compression::None,
            producer: None,
            lying_max: false,
        })
        .collect();
    let inputs = inputs(&specs, 5);
    let segs = build_all(&inputs, TieredSegmentConfig::default(), None);
    assert_eq!(segs.len(), 1);
    assert!(segs[0].tail.offset_index.is_empty());
    assert_eq!(segs[0].tail.time_index.len(), 12);
    check_segment(&segs[0], &[], 4096, &inputs, None);
    // A flipped byte anywhere in the .log is caught by the reader (batch CRC or framing).
    let mut object = segs[0].to_bytes().to_vec();
    object[70] ^= 0x10;
    assert!(KafkaSegment::parse(&object).is_err());
}

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("fuzz")
        .join("corpus")
        .join("tiered_segment_reader")
}

#[test]
fn replay_tiered_segment_reader_corpus() {
    if std::env::var("DISKLESS_REGEN_CORPUS").as_deref() == Ok("1") {
        write_seeds();
    }
    let dir = corpus_dir();
    let mut entries: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("corpus {} missing: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .collect();
    entries.sort();
    for path in &entries {
        fuzz_tiered_segment_reader(&std::fs::read(path).unwrap());
    }
    assert!(
        entries.len() >= 10,
        "corpus has only {} files",
        entries.len()
    );
}

fn write_seeds() {
    let specs: Vec<Spec> = (0..6)
        .map(|i| Spec::Data {
            records: vec![(T0 + (i * 7) % 5, 300), (T0 + i, 5)],
            codec: Compression::ALL[i as usize % 5],
            producer: Some((1 + i % 2, 0)),
            lying_max: i == 2,
        })
        .chain([Spec::Txn {
            batches: 2,
            commit: false,
        }])
        .collect();
    let inputs = inputs(&specs, 100);
    let config = TieredSegmentConfig {
        index_interval_bytes: 100,
        ..Default::default()
    };
    let seg = build_all(&inputs, config, None).remove(0);
    let object = seg.to_bytes().to_vec();
    let with = |offset: i64, ts: i64, rest: &[u8]| {
        let mut v = offset.to_le_bytes().to_vec();
        v.extend_from_slice(&ts.to_le_bytes());
        v.extend_from_slice(rest);
        v
    };
    let mut seeds: Vec<(String, Vec<u8>)> = vec![
        ("object-first".into(), with(100, T0, &object)),
        ("object-last".into(), with(seg.end_offset, T0 + 4, &object)),
        (
            "object-past-end".into(),
            with(seg.end_offset + 9, i64::MAX, &object),
        ),
        ("object-before-base".into(), with(3, -1, &object)),
        ("offset-index".into(), with(103, T0, &seg.tail.offset_index)),
        ("time-index".into(), with(103, T0 + 2, &seg.tail.time_index)),
        ("txn-index".into(), with(0, 0, &seg.tail.txn_index)),
        ("snapshot".into(), with(0, 0, &seg.tail.producer_snapshot)),
        ("epochs".into(), with(0, 0, &seg.tail.leader_epochs)),
        ("trailer".into(), with(0, 0, &seg.tail.trailer)),
        ("empty".into(), with(0, 0, &[])),
    ];
    let mut flipped = object.clone();
    let at = seg.layout.log as usize + 3;
    flipped[at] ^= 0x40;
    seeds.push(("object-flipped-index".into(), with(101, T0, &flipped)));
    let mut truncated = object.clone();
    truncated.remove(10);
    seeds.push(("object-truncated".into(), with(101, T0, &truncated)));
    let dir = corpus_dir();
    std::fs::create_dir_all(&dir).unwrap();
    for (name, data) in &seeds {
        std::fs::write(dir.join(name), data).unwrap();
    }
}
