//! Bodies of the cargo-fuzz targets in `fuzz/`, as plain functions so that the committed corpus is
//! replayed by an ordinary test (`tests/fuzz_corpus.rs`). Not a stable API.
//!
//! A fuzz target reports a broken invariant by panicking, so these bodies assert and `expect`.
#![allow(clippy::expect_used)]

use bytes::Bytes;
use diskless_coordinator::TopicConfig;

use crate::batch::split_batches;
use crate::rewrite::BatchRewrite;
use crate::segment::SegmentReader;
use crate::validate::{ValidationOptions, Validator, verify_stored_batch};

/// A fixed broker clock for the fuzz targets (2023-11-14).
pub const FUZZ_NOW_MS: i64 = 1_700_000_000_000;

/// Target `batch_validator`: split the input into batches, validate each; for every valid batch, check
/// that the rewrites keep it valid. Panics only on a broken invariant.
pub fn fuzz_batch_validator(data: &[u8]) {
    let config = TopicConfig::default();
    let mut validator =
        Validator::new(ValidationOptions::default().with_max_decompressed_bytes(Some(1 << 20)))
            .expect("a 1 MiB decompression limit is valid");
    // The produce path's entry point: one partition's records, exactly one batch.
    if let Ok((batch, v)) =
        validator.validate_produce_records(&Bytes::copy_from_slice(data), &config, FUZZ_NOW_MS)
    {
        assert_eq!(v.byte_size as usize, batch.len());
    }
    let batches = match split_batches(Bytes::copy_from_slice(data)) {
        Ok(b) => b,
        Err(e) => {
            let _ = e.error_code();
            return;
        }
    };
    for batch in batches {
        match validator.validate(&batch, &config, FUZZ_NOW_MS) {
            Ok(v) => {
                assert_eq!(v.byte_size as usize, batch.len());
                assert_eq!(v.record_count, batch.last_offset_delta() + 1);
                // Kafka's maxTimestamp correction (CreateTime): a valid batch stays valid.
                let corrected = batch
                    .rewrite(&BatchRewrite {
                        base_offset: 1000,
                        partition_leader_epoch: 5,
                        log_append_time: None,
                        max_timestamp: Some(FUZZ_NOW_MS),
                    })
                    .to_record_batch();
                assert!(
                    corrected.crc_is_valid(),
                    "maxTimestamp rewrite broke the CRC"
                );
                assert_eq!(corrected.max_timestamp(), FUZZ_NOW_MS);
                let out = batch
                    .rewrite(&BatchRewrite {
                        base_offset: 1000,
                        partition_leader_epoch: 5,
                        log_append_time: Some(FUZZ_NOW_MS),
                        max_timestamp: None,
                    })
                    .to_record_batch();
                assert!(out.crc_is_valid(), "rewrite broke the CRC");
                if let Err(e) = verify_stored_batch(&out) {
                    // Only the decompression bound may differ between the two validators.
                    assert!(
                        matches!(
                            e.kind,
                            crate::ValidationErrorKind::DecompressedTooLarge { .. }
                        ),
                        "rewritten batch does not verify: {e}"
                    );
                }
            }
            Err(e) => {
                let _ = e.error_code();
            }
        }
    }
}

/// Target `segment_reader`: the first 12 bytes are coordinates (u64 byte offset, u32 size), the rest a
/// segment. Reads at the coordinates, at every batch the walk finds, and from a ranged slice.
pub fn fuzz_segment_reader(data: &[u8]) {
    if data.len() < 12 {
        return;
    }
    let mut off = [0u8; 8];
    off.copy_from_slice(&data[..8]);
    let byte_offset = u64::from_le_bytes(off) % (data.len() as u64 + 16);
    let byte_size = u32::from_le_bytes([data[8], data[9], data[10], data[11]]);
    let object = Bytes::copy_from_slice(&data[12..]);
    let Ok(reader) = SegmentReader::new(object.clone()) else {
        return;
    };
    let _ = reader.read_batch(byte_offset, byte_size);
    for item in reader.batches() {
        match item {
            Ok((at, batch)) => {
                let again = reader
                    .read_batch(at, batch.len() as u32)
                    .expect("a walked batch reads back");
                assert_eq!(again, batch);
                // The same batch from a ranged read that starts at it.
                let end = at as usize + batch.len();
                let ranged = SegmentReader::from_range(
                    object.slice(at as usize..end),
                    at,
                    Some(object.len() as u64),
                )
                .expect("ranged reader");
                assert_eq!(
                    ranged
                        .read_batch(at, batch.len() as u32)
                        .expect("ranged read"),
                    batch
                );
                let _ = verify_stored_batch(&batch);
            }
            Err(e) => {
                let _ = e.error_code();
            }
        }
    }
}

/// Target `txn_marker`: parse the input as a transaction marker batch; an accepted input must be
/// exactly what [`crate::control::end_txn_marker`] builds from the parsed fields.
pub fn fuzz_txn_marker(data: &[u8]) {
    if let Ok(parsed) = crate::control::parse_end_txn_marker(data) {
        let rebuilt = crate::control::end_txn_marker(&parsed.to_batch());
        assert_eq!(
            &rebuilt[..],
            data,
            "a parsed marker rebuilds to other bytes"
        );
    }
}

/// The coordinate a commit would give `batch` at `base_offset` (tiered segment tests and the
/// `tiered_segment_reader` target; the one place they construct a
/// [`diskless_coordinator::BatchCoordinate`]). `max_timestamp` is the records' largest timestamp;
/// `log_append_time` makes it a LogAppendTime partition's batch.
pub fn tiered_coordinate(
    batch: &crate::batch::RecordBatch,
    base_offset: i64,
    max_timestamp: i64,
    log_append_time: Option<i64>,
) -> diskless_coordinator::BatchCoordinate {
    use diskless_coordinator::TimestampType;
    diskless_coordinator::BatchCoordinate {
        object_key: "wal/object".into(),
        object_size: batch.len() as u64,
        byte_offset: 0,
        byte_size: batch.len() as u32,
        base_offset,
        last_offset: base_offset + i64::from(batch.last_offset_delta()),
        base_timestamp: batch.base_timestamp(),
        max_timestamp,
        timestamp_type: if log_append_time.is_some() {
            TimestampType::LogAppendTime
        } else {
            TimestampType::CreateTime
        },
        log_append_time: log_append_time.unwrap_or(diskless_coordinator::NO_TIMESTAMP),
        producer_id: batch.producer_id(),
        producer_epoch: batch.producer_epoch(),
        base_sequence: batch.base_sequence(),
        last_sequence: batch.last_sequence(),
        control: None,
    }
}

/// Target `tiered_segment_reader`: the first 16 bytes are a target offset and a target timestamp
/// (i64 LE each), the rest a tiered segment object. Every section parser also sees the rest as its
/// own section; whatever a parser accepts must encode back to the same bytes, and the lookups must
/// keep Kafka's contracts. Panics only on a broken invariant.
pub fn fuzz_tiered_segment_reader(data: &[u8]) {
    use crate::tiered::format::{
        OffsetIndex, SegmentObject, SegmentTrailer, TimeIndex, encode_leader_epoch_checkpoint,
        encode_producer_snapshot, encode_txn_index, log_batches, parse_leader_epoch_checkpoint,
        parse_producer_snapshot, parse_txn_index, search_for_offset, search_for_timestamp,
    };
    if data.len() < 16 {
        return;
    }
    let mut word = [0u8; 8];
    word.copy_from_slice(&data[..8]);
    let target = i64::from_le_bytes(word);
    word.copy_from_slice(&data[8..16]);
    let target_ts = i64::from_le_bytes(word);
    let rest = &data[16..];

    // Each parser on the raw bytes: accepted input is canonical.
    if let Ok(entries) = parse_txn_index(rest) {
        assert_eq!(
            &encode_txn_index(&entries)[..],
            rest,
            "txn index round trip"
        );
    }
    if let Ok(entries) = parse_producer_snapshot(rest)
        && !rest.is_empty()
    {
        assert_eq!(
            &encode_producer_snapshot(&entries)[..],
            rest,
            "snapshot round trip"
        );
    }
    if let Ok(entries) = parse_leader_epoch_checkpoint(rest) {
        assert_eq!(
            &encode_leader_epoch_checkpoint(&entries)[..],
            rest,
            "epoch checkpoint round trip"
        );
    }
    if let Ok(t) = SegmentTrailer::parse(rest) {
        assert_eq!(&t.encode().expect("a parsed trailer encodes")[..], rest);
    }
    let raw = Bytes::copy_from_slice(rest);
    check_offset_index(OffsetIndex::parse(0, raw.clone()).ok(), target);
    if let Ok(ti) = TimeIndex::parse(0, raw.clone()) {
        let e = ti.lookup(target_ts);
        assert!(e.timestamp <= target_ts || (e.timestamp == -1 && e.offset == 0));
    }
    for h in log_batches(rest).flatten() {
        assert!(h.last_offset >= h.base_offset);
    }

    // The whole object.
    let Ok(object) = SegmentObject::parse(raw) else {
        return;
    };
    let base = object.trailer.base_offset;
    let _ = parse_txn_index(&object.txn_index);
    let _ = parse_producer_snapshot(&object.producer_snapshot);
    let _ = parse_leader_epoch_checkpoint(&object.leader_epochs);
    let oi = OffsetIndex::parse(base, object.offset_index.clone()).ok();
    check_offset_index(oi.clone(), target);
    if let Some(oi) = oi {
        let at = oi.lookup(target);
        if let Ok(Some(h)) = search_for_offset(&object.log, at.position, target) {
            assert!(h.last_offset >= target);
            assert!(h.position >= u64::from(at.position));
        }
        if let Ok(ti) = TimeIndex::parse(base, object.time_index.clone()) {
            let t = ti.lookup(target_ts);
            let from = oi.lookup(t.offset.max(target));
            if let Ok(Some(h)) = search_for_timestamp(&object.log, from.position, target_ts, target)
            {
                assert!(h.max_timestamp >= target_ts && h.last_offset >= target);
            }
        }
    }
}

fn check_offset_index(oi: Option<crate::tiered::format::OffsetIndex>, target: i64) {
    let Some(oi) = oi else { return };
    let e = oi.lookup(target);
    assert!(
        e.offset <= target || (e.offset == oi.base_offset() && e.position == 0),
        "lookup past the target"
    );
    let start = (target as u64 % 1_000) as u32;
    if let Some(u) = oi.fetch_upper_bound_offset(start, 100) {
        assert!(u64::from(u.position) >= u64::from(start) + 100);
    }
}
