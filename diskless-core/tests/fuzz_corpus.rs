//! Replays the committed cargo-fuzz corpus (`fuzz/corpus/<target>/`) through the fuzz target bodies,
//! so every run of the test suite covers the seeds and every crash found so far.
//!
//! `DISKLESS_REGEN_CORPUS=1 cargo test -p diskless-core --test fuzz_corpus` rewrites the seed files.
#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests: a failed step is a failed test.

use std::path::{Path, PathBuf};

use bytes::Bytes;
use diskless_coordinator::{TimestampType, TopicIdPartition};
use diskless_core::fuzzing::{
    FuzzSegmentRow, TieredFetchInput, TieredFetchOutcome, fuzz_batch_validator,
    fuzz_produce_request, fuzz_segment_reader, fuzz_tiered_fetch, fuzz_txn_marker,
    tiered_coordinate,
};
use diskless_core::tiered::{
    AbortedTxnEntry, BuiltSegment, FinishInputs, ProducerSnapshotEntry, PushOutcome,
    TieredSegmentBuilder, TieredSegmentConfig,
};
use diskless_core::{
    Compression, HEADER_LEN, NewRecord, RecordBatch, RecordBatchBuilder, SegmentBuilder,
};

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

    let dir = corpus_dir("tiered_fetch");
    std::fs::create_dir_all(&dir).unwrap();
    for (name, data) in tiered_fetch_seeds() {
        std::fs::write(dir.join(name), data).unwrap();
    }

    let dir = corpus_dir("produce_request");
    std::fs::create_dir_all(&dir).unwrap();
    for (name, data) in produce_request_seeds() {
        std::fs::write(dir.join(name), data).unwrap();
    }

    let dir = corpus_dir("compaction");
    std::fs::create_dir_all(&dir).unwrap();
    for (name, data) in compaction_seeds() {
        std::fs::write(dir.join(name), data).unwrap();
    }
}

/// Stored logs for the `compaction` target: keyed updates, tombstones and keyless records in
/// every codec, one batch with a delete horizon, and one cut short.
fn compaction_seeds() -> Vec<(String, Vec<u8>)> {
    let mut seeds = Vec::new();
    for codec in Compression::ALL {
        let mut log = Vec::new();
        for (base, records) in [
            (
                0i64,
                vec![(Some(&b"a"[..]), Some(&b"1"[..])), (Some(b"b"), Some(b"2"))],
            ),
            (2, vec![(Some(b"a"), None), (None, Some(b"x"))]),
            (4, vec![(Some(b"b"), Some(b"3"))]),
        ] {
            let mut b = RecordBatchBuilder::new()
                .base_offset(base)
                .compression(codec)
                .producer(1, 0, base as i32);
            for (k, v) in records {
                b = b.record(NOW, k, v);
            }
            log.extend_from_slice(b.build().unwrap().as_bytes());
        }
        seeds.push((format!("{codec:?}").to_lowercase(), log.clone()));
        // A transaction's data (read as aborted: the third batch) after a LogAppendTime batch.
        let mut txn = Vec::new();
        for (base, transactional) in [(0i64, false), (1, false), (2, true)] {
            let b = RecordBatchBuilder::new()
                .base_offset(base)
                .compression(codec)
                .timestamp_type(diskless_coordinator::TimestampType::LogAppendTime)
                .transactional(transactional)
                .producer(2, 0, base as i32)
                .record(NOW, Some(b"t"), Some(b"v"))
                .build()
                .unwrap();
            txn.extend_from_slice(b.as_bytes());
        }
        seeds.push((format!("{codec:?}-txn").to_lowercase(), txn));
        if codec == Compression::None {
            let horizon = RecordBatchBuilder::new()
                .base_offset(5)
                .attributes(diskless_core::Attributes(0x40))
                .base_timestamp(NOW)
                .record(NOW - 5, Some(b"c"), None)
                .build()
                .unwrap();
            let mut with_horizon = log.clone();
            with_horizon.extend_from_slice(horizon.as_bytes());
            seeds.push(("horizon".into(), with_horizon));
            seeds.push(("cut".into(), log[..log.len() - 3].to_vec()));
        }
    }
    seeds
}

#[test]
fn replay_compaction_corpus() {
    regen_if_asked();
    replay("compaction", diskless_core::fuzzing::fuzz_compaction);
}

/// Produce request frames as kafka-protocol encodes them (versions 3, 5, 8, 9, 11, 12; a
/// transactional request with a real batch and a null-records partition), and each cut in half.
fn produce_request_seeds() -> Vec<(String, Vec<u8>)> {
    use bytes::BufMut;
    use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
    use kafka_protocol::messages::{
        ApiKey, ProduceRequest as KRequest, RequestHeader, TopicName, TransactionalId,
    };
    use kafka_protocol::protocol::{Encodable, StrBytes};

    let mut seeds = Vec::new();
    for version in [3i16, 5, 8, 9, 11, 12] {
        let mut header = RequestHeader::default();
        header.request_api_key = ApiKey::Produce as i16;
        header.request_api_version = version;
        header.correlation_id = i32::from(version);
        header.client_id = Some(StrBytes::from_static_str("seed"));
        let mut request = KRequest::default();
        request.transactional_id =
            (version % 2 == 1).then(|| TransactionalId(StrBytes::from_static_str("tx")));
        request.acks = -1;
        request.timeout_ms = 30_000;
        let mut topic = TopicProduceData::default();
        topic.name = TopicName(StrBytes::from_static_str("t"));
        let mut p0 = PartitionProduceData::default();
        p0.index = 0;
        p0.records = Some(Bytes::copy_from_slice(sample(Compression::None).as_bytes()));
        let mut p1 = PartitionProduceData::default();
        p1.index = 1;
        topic.partition_data = vec![p0, p1];
        request.topic_data = vec![topic];
        let mut body = bytes::BytesMut::new();
        header
            .encode(&mut body, ApiKey::Produce.request_header_version(version))
            .unwrap();
        request.encode(&mut body, version).unwrap();
        let mut frame = bytes::BytesMut::new();
        frame.put_i32(i32::try_from(body.len()).unwrap());
        frame.put_slice(&body);
        seeds.push((format!("v{version}"), frame.to_vec()));
        seeds.push((format!("v{version}-cut"), frame[..frame.len() / 2].to_vec()));
    }
    seeds
}

#[test]
fn replay_produce_request_corpus() {
    regen_if_asked();
    replay("produce_request", fuzz_produce_request);
}

#[test]
fn replay_txn_marker_corpus() {
    regen_if_asked();
    replay("txn_marker", fuzz_txn_marker);
}

#[test]
fn replay_tiered_fetch_corpus() {
    regen_if_asked();
    replay("tiered_fetch", |data| {
        let _ = fuzz_tiered_fetch(data);
    });
}

/// The valid seeds reach records (fetched batches and offsets found inside the segments), and
/// the broken ones fail partitions without failing the target: the target checks something.
#[test]
fn tiered_fetch_seeds_reach_records() {
    regen_if_asked();
    let dir = corpus_dir("tiered_fetch");
    let run = |name: &str| -> TieredFetchOutcome {
        fuzz_tiered_fetch(&std::fs::read(dir.join(name)).unwrap())
    };
    for name in [
        "one-segment",
        "one-segment-cache-small-limits",
        "log-append-time",
        "two-segments",
        "two-segments-cache",
        "txn-aborted",
        "txn-open-across-segments",
        "flipped-record-fixed-crc",
    ] {
        let o = run(name);
        assert!(o.batches_served > 0 && o.fetched_ok > 0, "{name}: {o:?}");
        assert!(o.offsets_found > 0, "{name}: {o:?}");
    }
    // Every fetch of the first seed is served (its fetch offsets all lie in the segment).
    let o = run("one-segment");
    assert_eq!((o.fetch_errors, o.list_errors), (0, 0), "{o:?}");
    assert_eq!(o.fetched_ok, 2 * 5);
    for name in [
        "flipped-index",
        "layout-off-by-one",
        "object-size-short",
        "truncated-object",
        "base-offset-late",
    ] {
        let o = run(name);
        assert!(o.fetch_errors > 0, "{name}: {o:?}");
    }
    let o = run("flipped-record");
    assert!(o.batches_served > 0 && o.list_errors > 0, "{o:?}");
    assert_eq!(run("header-short"), TieredFetchOutcome::default());
}

fn data_batch(codec: Compression, ts: i64, records: usize) -> RecordBatch {
    let mut b = RecordBatchBuilder::new().compression(codec);
    for i in 0..records {
        b = b.record(
            ts + i as i64,
            Some(format!("k{i}").as_bytes()),
            Some(&[b'v'; 40]),
        );
    }
    b.build().unwrap()
}

fn txn_batch(producer_id: i64, sequence: i32, ts: i64) -> RecordBatch {
    RecordBatchBuilder::new()
        .producer(producer_id, 0, sequence)
        .transactional(true)
        .record(ts, None, Some(b"in a transaction"))
        .build()
        .unwrap()
}

fn end_marker(producer_id: i64, commit: bool, ts: i64) -> RecordBatch {
    RecordBatch::parse(diskless_core::control::end_txn_marker(
        &diskless_core::control::MarkerBatch {
            base_offset: 0,
            partition_leader_epoch: -1,
            producer_id,
            producer_epoch: 0,
            commit,
            coordinator_epoch: 4,
            timestamp: ts,
            log_append_time: false,
        },
    ))
    .unwrap()
}

/// One tiered segment of `batches` from `base` (index entries every 100 bytes).
fn build_segment(
    batches: &[RecordBatch],
    base: i64,
    log_append_time: Option<i64>,
    previous: &[ProducerSnapshotEntry],
    aborted: &[AbortedTxnEntry],
) -> BuiltSegment {
    let partition = TopicIdPartition::new(uuid::Uuid::from_u128(0xf0f0), 3);
    let config = TieredSegmentConfig {
        index_interval_bytes: 100,
        ..Default::default()
    };
    let mut b = TieredSegmentBuilder::new(partition, config)
        .unwrap()
        .expect_base_offset(base)
        .with_previous_snapshot(previous);
    let mut next = base;
    for batch in batches {
        let c = tiered_coordinate(batch, next, batch.max_timestamp(), log_append_time);
        let pushed = b.push(&c, batch.as_bytes().clone()).unwrap();
        assert!(matches!(pushed, PushOutcome::Appended(_)));
        next += i64::from(batch.last_offset_delta()) + 1;
    }
    b.finish(FinishInputs {
        aborted: aborted.to_vec(),
        ..Default::default()
    })
    .unwrap()
}

/// The coordinator row of `seg` as a `tiered_fetch` input encodes it.
fn row(seg: &BuiltSegment) -> FuzzSegmentRow {
    let l = seg.layout;
    FuzzSegmentRow {
        layout: diskless_coordinator::SegmentLayoutSizes {
            log: l.log,
            offset_index: l.offset_index,
            time_index: l.time_index,
            txn_index: l.txn_index,
            producer_snapshot: l.producer_snapshot,
            leader_epochs: l.leader_epochs,
        },
        base_offset: seg.base_offset,
        end_delta: (seg.end_offset - seg.base_offset) as i32,
        max_timestamp: seg.max_timestamp,
        max_timestamp_offset_delta: (seg.max_timestamp_offset - seg.base_offset) as u16,
        object_size_delta: 0,
    }
}

/// `input` without [`TieredFetchInput::FIX_CRCS`].
fn fixed_off(input: &TieredFetchInput) -> TieredFetchInput {
    TieredFetchInput {
        flags: input.flags & !TieredFetchInput::FIX_CRCS,
        ..*input
    }
}

fn encode(input: &TieredFetchInput, objects: &[&[u8]]) -> Vec<u8> {
    let mut input = *input;
    input.split = objects[0].len() as u32;
    let mut v = input.encode();
    for o in objects {
        v.extend_from_slice(o);
    }
    v
}

/// The `tiered_fetch` seeds: valid segments (mixed codecs, LogAppendTime, two segments, an
/// aborted transaction, a transaction open across two segments) under several limits, cache
/// block sizes and isolation-relevant LSOs, and broken variants (a flipped record with its CRC
/// fixed, a flipped index entry, a wrong layout, a short object, rows that do not match).
fn tiered_fetch_seeds() -> Vec<(String, Vec<u8>)> {
    let base = 100;
    let batches: Vec<RecordBatch> = (0..8)
        .map(|i| data_batch(Compression::ALL[i % 5], NOW + 10 * i as i64, 1 + i % 3))
        .collect();
    let seg = build_segment(&batches, base, None, &[], &[]);
    let object = seg.to_bytes().to_vec();
    let span = (seg.end_offset - base) as i16;
    let one = TieredFetchInput {
        flags: 0,
        cache_block_shift: 8,
        partition_max_bytes: u16::MAX,
        fetch_max_bytes: u16::MAX,
        log_start_delta: 0,
        lso_delta: 0,
        timestamp: NOW + 31,
        leader_epoch: 7,
        fetch_offset_deltas: [0, span / 2, span],
        split: 0,
        segments: [row(&seg), FuzzSegmentRow::default()],
    };
    let mut seeds: Vec<(String, Vec<u8>)> = vec![("one-segment".into(), encode(&one, &[&object]))];
    let small = TieredFetchInput {
        flags: TieredFetchInput::CACHE,
        cache_block_shift: 2,
        partition_max_bytes: 300,
        fetch_max_bytes: 500,
        log_start_delta: 2,
        ..one
    };
    seeds.push((
        "one-segment-cache-small-limits".into(),
        encode(&small, &[&object]),
    ));
    let lat_seg = build_segment(&batches[..4], base, Some(NOW + 500), &[], &[]);
    let lat = TieredFetchInput {
        timestamp: NOW + 400,
        fetch_offset_deltas: [0, 1, 2],
        segments: [row(&lat_seg), FuzzSegmentRow::default()],
        ..one
    };
    seeds.push((
        "log-append-time".into(),
        encode(&lat, &[&lat_seg.to_bytes()]),
    ));

    // Two contiguous segments.
    let first = build_segment(&batches[..5], base, None, &[], &[]);
    let second = build_segment(&batches[5..], first.end_offset + 1, None, &[], &[]);
    let (a, b) = (first.to_bytes(), second.to_bytes());
    let two = TieredFetchInput {
        flags: TieredFetchInput::TWO_SEGMENTS,
        partition_max_bytes: 2_000,
        timestamp: NOW + 65,
        fetch_offset_deltas: [0, (first.end_offset - base) as i16, span],
        segments: [row(&first), row(&second)],
        ..one
    };
    seeds.push(("two-segments".into(), encode(&two, &[&a, &b])));
    let two_cached = TieredFetchInput {
        flags: TieredFetchInput::TWO_SEGMENTS | TieredFetchInput::CACHE,
        cache_block_shift: 5,
        fetch_max_bytes: 1_200,
        ..two
    };
    seeds.push(("two-segments-cache".into(), encode(&two_cached, &[&a, &b])));
    let mut gap = two;
    gap.segments[1].base_offset += 1;
    seeds.push(("gap-between-segments".into(), encode(&gap, &[&a, &b])));
    let hw = TieredFetchInput {
        flags: TieredFetchInput::TWO_SEGMENTS | TieredFetchInput::HW_PAST_SEGMENTS,
        ..two
    };
    seeds.push(("hw-past-segments".into(), encode(&hw, &[&a, &b])));

    // An aborted transaction: its .txnindex answers read_committed fetches.
    let txn = vec![
        data_batch(Compression::None, NOW, 2),
        txn_batch(77, 0, NOW + 1),
        txn_batch(77, 1, NOW + 2),
        end_marker(77, false, NOW + 3),
        data_batch(Compression::Lz4, NOW + 4, 2),
    ];
    let aborted = [AbortedTxnEntry {
        producer_id: 77,
        first_offset: base + 2,
        last_offset: base + 4,
        last_stable_offset: base + 5,
    }];
    let txn_seg = build_segment(&txn, base, None, &[], &aborted);
    let txn_input = TieredFetchInput {
        lso_delta: 1,
        timestamp: NOW + 2,
        fetch_offset_deltas: [0, 2, 5],
        segments: [row(&txn_seg), FuzzSegmentRow::default()],
        ..one
    };
    seeds.push((
        "txn-aborted".into(),
        encode(&txn_input, &[&txn_seg.to_bytes()]),
    ));

    // A transaction open at the first segment's end, aborted in the second.
    let open = vec![
        data_batch(Compression::Zstd, NOW, 3),
        txn_batch(88, 0, NOW + 5),
    ];
    let open_seg = build_segment(&open, base, None, &[], &[]);
    let after = open_seg.end_offset + 1;
    let closing = vec![
        data_batch(Compression::Snappy, NOW + 6, 1),
        end_marker(88, false, NOW + 7),
    ];
    let aborted = [AbortedTxnEntry {
        producer_id: 88,
        first_offset: open_seg.end_offset,
        last_offset: after + 1,
        last_stable_offset: after + 2,
    }];
    let closing_seg = build_segment(&closing, after, None, &open_seg.producer_state, &aborted);
    let across = TieredFetchInput {
        flags: TieredFetchInput::TWO_SEGMENTS,
        partition_max_bytes: 200,
        timestamp: NOW + 6,
        fetch_offset_deltas: [0, 3, 4],
        segments: [row(&open_seg), row(&closing_seg)],
        ..one
    };
    seeds.push((
        "txn-open-across-segments".into(),
        encode(&across, &[&open_seg.to_bytes(), &closing_seg.to_bytes()]),
    ));

    // Broken variants of the first seed.
    let mut flipped = object.clone();
    flipped[HEADER_LEN + 10] ^= 0x01;
    let fixed = TieredFetchInput {
        flags: TieredFetchInput::FIX_CRCS,
        timestamp: NOW,
        ..one
    };
    seeds.push((
        "flipped-record-fixed-crc".into(),
        encode(&fixed, &[&flipped]),
    ));
    // Unfixed, the CRC fails the timestamp search in the first batch (fetches serve it: they
    // do no CRC work).
    seeds.push((
        "flipped-record".into(),
        encode(&fixed_off(&fixed), &[&flipped]),
    ));
    // The first record's offsetDelta, CRC fixed.
    let mut delta = object.clone();
    delta[HEADER_LEN + 3] ^= 0x10;
    seeds.push(("offset-delta-fixed-crc".into(), encode(&fixed, &[&delta])));
    let mut flipped_index = object.clone();
    flipped_index[seg.layout.log as usize + 4] ^= 0x08;
    seeds.push(("flipped-index".into(), encode(&one, &[&flipped_index])));
    let mut off = one;
    off.segments[0].layout.offset_index += 1;
    seeds.push(("layout-off-by-one".into(), encode(&off, &[&object])));
    let mut short = one;
    short.segments[0].object_size_delta = -1;
    seeds.push(("object-size-short".into(), encode(&short, &[&object])));
    seeds.push((
        "truncated-object".into(),
        encode(&one, &[&object[..object.len() - 10]]),
    ));
    let mut late = one;
    late.segments[0].base_offset += 1;
    seeds.push(("base-offset-late".into(), encode(&late, &[&object])));
    let mut early_end = one;
    early_end.segments[0].end_delta -= 1;
    seeds.push(("end-offset-short".into(), encode(&early_end, &[&object])));
    seeds.push((
        "header-short".into(),
        one.encode()[..TieredFetchInput::LEN - 1].to_vec(),
    ));
    seeds.push(("header-only".into(), TieredFetchInput::default().encode()));
    seeds
}
