//! Replays the committed cargo-fuzz corpus (`fuzz/corpus/<target>/`) through the fuzz target bodies,
//! so every run of the test suite covers the seeds and every crash found so far.
//!
//! `DISKLESS_REGEN_CORPUS=1 cargo test -p diskless-core --test fuzz_corpus` rewrites the seed files.
#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests: a failed step is a failed test.

use std::path::{Path, PathBuf};

use bytes::Bytes;
use diskless_coordinator::{TimestampType, TopicIdPartition};
use diskless_core::fuzzing::{fuzz_batch_validator, fuzz_segment_reader, fuzz_txn_marker};
use diskless_core::{Compression, NewRecord, RecordBatch, RecordBatchBuilder, SegmentBuilder};

const NOW: i64 = diskless_core::fuzzing::FUZZ_NOW_MS;

fn corpus_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("fuzz")
        .join("corpus")
        .join(target)
}

fn replay(target: &str, f: fn(&[u8])) {
    let dir = corpus_dir(target);
    let mut n = 0;
    let mut entries: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("corpus {} missing: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .collect();
    entries.sort();
    for path in entries {
        let data = std::fs::read(&path).unwrap();
        f(&data);
        n += 1;
    }
    assert!(n >= 10, "corpus {} has only {n} files", dir.display());
}

#[test]
fn replay_batch_validator_corpus() {
    regen_if_asked();
    replay("batch_validator", fuzz_batch_validator);
}

#[test]
fn valid_seeds_validate_and_broken_seeds_do_not() {
    regen_if_asked();
    let dir = corpus_dir("batch_validator");
    let config = diskless_coordinator::TopicConfig::default();
    let mut checked = 0;
    for codec in Compression::ALL {
        let name = format!("{codec:?}").to_lowercase();
        let read = |prefix: &str| {
            let data = std::fs::read(dir.join(format!("{prefix}-{name}"))).unwrap();
            diskless_core::split_batches(Bytes::from(data))
        };
        let valid = read("valid").unwrap();
        diskless_core::validate_batch(&valid[0], &config, NOW).unwrap();
        assert!(read("truncated").is_err());
        let bad_crc = read("bad-crc").unwrap();
        let e = diskless_core::validate_batch(&bad_crc[0], &config, NOW).unwrap_err();
        assert_eq!(
            e.error_code(),
            diskless_coordinator::ErrorCode::CorruptMessage
        );
        let bad = read("bad-records-fixed-crc").unwrap();
        assert!(diskless_core::validate_batch(&bad[0], &config, NOW).is_err());
        checked += 1;
    }
    assert_eq!(checked, 5);
}

#[test]
fn replay_segment_reader_corpus() {
    regen_if_asked();
    replay("segment_reader", fuzz_segment_reader);
}

fn sample(codec: Compression) -> RecordBatch {
    RecordBatchBuilder::new()
        .compression(codec)
        .producer(3, 0, 5)
        .push(NewRecord {
            timestamp: NOW,
            key: Some(Bytes::from_static(b"key")),
            value: Some(Bytes::from_static(b"value value value")),
            headers: vec![(Bytes::from_static(b"h"), Some(Bytes::from_static(b"x")))],
        })
        .record(NOW + 1, None, Some(b"second"))
        .record(NOW + 2, Some(b"k3"), None)
        .build()
        .unwrap()
}

/// Writes the seed corpus; only with DISKLESS_REGEN_CORPUS=1.
fn regen_if_asked() {
    if std::env::var("DISKLESS_REGEN_CORPUS").as_deref() != Ok("1") {
        return;
    }
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(write_seeds);
}

fn write_seeds() {
    let mut batches: Vec<(String, Vec<u8>)> = Vec::new();
    for codec in Compression::ALL {
        let name = format!("{codec:?}").to_lowercase();
        let b = sample(codec);
        let bytes = b.as_bytes().to_vec();
        batches.push((format!("valid-{name}"), bytes.clone()));
        batches.push((
            format!("truncated-{name}"),
            bytes[..bytes.len() - 5].to_vec(),
        ));
        let mut corrupt = bytes.clone();
        let last = corrupt.len() - 1;
        corrupt[last] ^= 0x55;
        batches.push((format!("bad-crc-{name}"), corrupt));
        let mut bad_records = bytes.clone();
        bad_records[65] ^= 0x7f;
        diskless_core::batch::update_crc(&mut bad_records);
        batches.push((format!("flipped-fixed-crc-{name}"), bad_records));
        let miscounted = RecordBatchBuilder::new()
            .compression(codec)
            .records_count(4)
            .last_offset_delta(3)
            .record(NOW, Some(b"k"), Some(b"v"))
            .record(NOW, None, Some(b"w"))
            .build()
            .unwrap();
        batches.push((
            format!("bad-records-fixed-crc-{name}"),
            miscounted.as_bytes().to_vec(),
        ));
    }
    let two = [sample(Compression::None), sample(Compression::Zstd)]
        .iter()
        .flat_map(|b| b.as_bytes().to_vec())
        .collect::<Vec<u8>>();
    batches.push(("two-batches".into(), two));
    for (name, b) in [
        (
            "control",
            RecordBatchBuilder::new()
                .control(true)
                .record(NOW, None, Some(b"c")),
        ),
        (
            "log-append-time",
            RecordBatchBuilder::new()
                .timestamp_type(TimestampType::LogAppendTime)
                .record(NOW, None, Some(b"c")),
        ),
        (
            "count-mismatch",
            RecordBatchBuilder::new()
                .records_count(5)
                .last_offset_delta(4)
                .record(NOW, None, None),
        ),
        ("empty", RecordBatchBuilder::new()),
        (
            "non-sequential",
            RecordBatchBuilder::new()
                .compression(Compression::Gzip)
                .offset_deltas(vec![0, 7])
                .record(NOW, None, None)
                .record(NOW, None, None),
        ),
    ] {
        batches.push((name.into(), b.build().unwrap().as_bytes().to_vec()));
    }
    batches.push(("garbage".into(), b"\x00\x01\x02garbage\xff\xfe".to_vec()));
    batches.push(("zero-length".into(), Vec::new()));
    let dir = corpus_dir("batch_validator");
    std::fs::create_dir_all(&dir).unwrap();
    for (name, data) in &batches {
        std::fs::write(dir.join(name), data).unwrap();
    }

    // Segment reader seeds: 8-byte LE offset + 4-byte LE size + segment.
    let topic = uuid::Uuid::from_u128(9);
    let mut builder = SegmentBuilder::new();
    for (i, codec) in Compression::ALL.iter().enumerate() {
        builder.add(TopicIdPartition::new(topic, (i % 2) as i32), sample(*codec));
    }
    let seg = builder.finish();
    let object = seg.to_bytes().to_vec();
    let with = |off: u64, size: u32, obj: &[u8]| {
        let mut v = off.to_le_bytes().to_vec();
        v.extend_from_slice(&size.to_le_bytes());
        v.extend_from_slice(obj);
        v
    };
    let mut segs: Vec<(String, Vec<u8>)> = Vec::new();
    for (i, sb) in seg.batches.iter().enumerate() {
        segs.push((
            format!("batch-{i}"),
            with(sb.byte_offset, sb.byte_size, &object),
        ));
    }
    let first = &seg.batches[0];
    segs.push((
        "off-by-one".into(),
        with(first.byte_offset + 1, first.byte_size, &object),
    ));
    segs.push(("in-header".into(), with(0, first.byte_size, &object)));
    segs.push(("past-end".into(), with(seg.size - 3, 100, &object)));
    let mut bad_version = object.clone();
    bad_version[0] = 1;
    segs.push(("bad-version".into(), with(1, first.byte_size, &bad_version)));
    segs.push((
        "truncated".into(),
        with(1, first.byte_size, &object[..object.len() - 7]),
    ));
    let mut flipped = object.clone();
    flipped[40] ^= 0xff;
    segs.push(("flipped".into(), with(1, first.byte_size, &flipped)));
    segs.push(("empty-segment".into(), with(1, 61, &[0])));
    segs.push((
        "garbage".into(),
        b"\x05\x00\x00\x00\x00\x00\x00\x00\x3d\x00\x00\x00\x00garbage".to_vec(),
    ));
    let dir = corpus_dir("segment_reader");
    std::fs::create_dir_all(&dir).unwrap();
    for (name, data) in &segs {
        std::fs::write(dir.join(name), data).unwrap();
    }

    // Transaction marker seeds: markers of both kinds and time types, and broken variants.
    let marker = |commit: bool, log_append_time: bool| {
        diskless_core::control::end_txn_marker(&diskless_core::control::MarkerBatch {
            base_offset: 5,
            partition_leader_epoch: 2,
            producer_id: 1_000,
            producer_epoch: 3,
            commit,
            coordinator_epoch: 7,
            timestamp: NOW,
            log_append_time,
        })
        .to_vec()
    };
    let mut markers: Vec<(String, Vec<u8>)> = vec![
        ("commit".into(), marker(true, false)),
        ("abort".into(), marker(false, false)),
        ("commit-log-append-time".into(), marker(true, true)),
        ("truncated".into(), marker(true, false)[..70].to_vec()),
        ("empty".into(), Vec::new()),
    ];
    let mut bad_type = marker(true, false);
    bad_type[69] = 2;
    diskless_core::batch::update_crc(&mut bad_type);
    markers.push(("bad-type-fixed-crc".into(), bad_type));
    let mut bad_crc = marker(false, false);
    bad_crc[77] ^= 1;
    markers.push(("bad-crc".into(), bad_crc));
    let mut data_batch = marker(true, false);
    data_batch[22] = 0x10; // transactional, not control
    diskless_core::batch::update_crc(&mut data_batch);
    markers.push(("not-control-fixed-crc".into(), data_batch));
    let mut long = marker(true, false);
    long.push(0);
    markers.push(("trailing-byte".into(), long));
    markers.push((
        "sample-batch".into(),
        sample(Compression::None).as_bytes().to_vec(),
    ));
    let dir = corpus_dir("txn_marker");
    std::fs::create_dir_all(&dir).unwrap();
    for (name, data) in &markers {
        std::fs::write(dir.join(name), data).unwrap();
    }
}

#[test]
fn replay_txn_marker_corpus() {
    regen_if_asked();
    replay("txn_marker", fuzz_txn_marker);
}
