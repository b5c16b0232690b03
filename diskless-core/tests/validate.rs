//! Every validation rule of the produce path, including the cases of Kafka's own LogValidatorTest.
#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests: a failed step is a failed test.

use bytes::Bytes;
use diskless_coordinator::{ErrorCode, TimestampType, TopicConfig, TopicIdPartition};
use diskless_core::batch::{CONTROL_MASK, HEADER_LEN, MAGIC_OFFSET, update_crc};
use diskless_core::validate::validate_produce_records;
use diskless_core::{
    Attributes, BatchError, BatchRewrite, Compression, NewRecord, RecordBatch, RecordBatchBuilder,
    RecordErrorKind, ValidationErrorKind as K, ValidationOptions, Validator, split_batches,
    validate_batch, verify_stored_batch,
};

const NOW: i64 = 1_700_000_000_000;

/// Kafka's `createRecords`: three records "hello", "there", "beautiful".
fn kafka_like(codec: Compression) -> RecordBatchBuilder {
    RecordBatchBuilder::new()
        .compression(codec)
        .record(NOW, None, Some(b"hello"))
        .record(NOW, None, Some(b"there"))
        .record(NOW, None, Some(b"beautiful"))
}

fn cfg() -> TopicConfig {
    TopicConfig::default()
}

fn check(
    batch: &RecordBatch,
) -> Result<diskless_core::ValidatedBatch, diskless_core::ValidationError> {
    validate_batch(batch, &cfg(), NOW)
}

fn patched(batch: &RecordBatch, f: impl FnOnce(&mut Vec<u8>)) -> RecordBatch {
    let mut v = batch.as_bytes().to_vec();
    f(&mut v);
    update_crc(&mut v);
    RecordBatch::parse(Bytes::from(v)).unwrap()
}

#[test]
fn valid_batches_of_every_codec_pass() {
    for codec in Compression::ALL {
        let b = kafka_like(codec)
            .producer(42, 3, 7)
            .transactional(true)
            .build()
            .unwrap();
        let v = check(&b).unwrap();
        assert_eq!(v.record_count, 3, "{codec:?}");
        assert_eq!(v.base_timestamp, NOW);
        assert_eq!(v.max_timestamp, NOW);
        assert_eq!(v.max_record_timestamp, NOW);
        assert_eq!(v.timestamp_type, TimestampType::CreateTime);
        assert_eq!((v.producer_id, v.producer_epoch), (42, 3));
        assert_eq!((v.base_sequence, v.last_sequence), (7, 9));
        assert!(v.transactional);
        assert_eq!(v.compression, codec);
        assert_eq!(v.byte_size as usize, b.len());
        assert!(v.uncompressed_records_size > 0);
    }
}

#[test]
fn inconsistent_count_and_offset() {
    // Kafka: testInvalidCountAndOffset / validateRecordBatchWithCountOverrides.
    for codec in Compression::ALL {
        for (delta, count, kind) in [
            (0, 3, K::InconsistentCount),
            (15, 3, K::InconsistentCount),
            (-3, 3, K::InvalidOffsetRange),
        ] {
            let b = kafka_like(codec)
                .last_offset_delta(delta)
                .records_count(count)
                .build()
                .unwrap();
            let e = check(&b).unwrap_err();
            assert_eq!(
                e.error_code(),
                ErrorCode::InvalidRecord,
                "{codec:?} {delta},{count}"
            );
            assert_eq!(e.kind, kind);
            assert_eq!(e.record_index, None);
        }
    }
}

#[test]
fn unmatched_number_of_records() {
    // Kafka: testUnmatchedNumberOfRecordsInBatch — the header is consistent, the records are not.
    for codec in Compression::ALL {
        for (delta, count, kind) in [
            (5, 6, RecordErrorKind::Truncated),
            (1, 2, RecordErrorKind::TrailingBytes),
        ] {
            let b = kafka_like(codec)
                .last_offset_delta(delta)
                .records_count(count)
                .build()
                .unwrap();
            let e = check(&b).unwrap_err();
            assert_eq!(e.error_code(), ErrorCode::InvalidRecord);
            assert_eq!(e.kind, K::Record(kind), "{codec:?} {delta},{count}");
        }
    }
    // Too many declared: the first missing record is named.
    let b = kafka_like(Compression::None)
        .last_offset_delta(5)
        .records_count(6)
        .build()
        .unwrap();
    assert_eq!(check(&b).unwrap_err().record_index, Some(3));
}

#[test]
fn empty_batch_is_rejected() {
    let b = RecordBatchBuilder::new().build().unwrap();
    assert_eq!((b.records_count(), b.last_offset_delta()), (0, -1));
    let e = check(&b).unwrap_err();
    assert_eq!(e.error_code(), ErrorCode::InvalidRecord);
    assert_eq!(e.kind, K::InvalidOffsetRange);
    let b = RecordBatchBuilder::new()
        .last_offset_delta(0)
        .records_count(0)
        .build()
        .unwrap();
    assert_eq!(check(&b).unwrap_err().kind, K::InvalidRecordCount);
    let b = RecordBatchBuilder::new()
        .last_offset_delta(0)
        .records_count(-1)
        .build()
        .unwrap();
    assert_eq!(check(&b).unwrap_err().kind, K::InvalidRecordCount);
}

#[test]
fn client_control_batch_is_rejected() {
    let b = kafka_like(Compression::None).control(true).build().unwrap();
    let e = check(&b).unwrap_err();
    assert_eq!(e.error_code(), ErrorCode::InvalidRecord);
    assert_eq!(e.kind, K::ControlBatch);
    // A stored control batch (e.g. a transaction marker) is fine for the fetch-path check.
    verify_stored_batch(&b).unwrap();
    assert_ne!(b.attributes().0 & CONTROL_MASK, 0);
}

/// A transactional batch needs a producer id (a transaction is the producer's): refused with
/// INVALID_RECORD; with one it passes and says it is transactional.
#[test]
fn transactional_without_producer_id_is_rejected() {
    let b = kafka_like(Compression::None)
        .transactional(true)
        .build()
        .unwrap();
    let e = check(&b).unwrap_err();
    assert_eq!(e.error_code(), ErrorCode::InvalidRecord);
    assert_eq!(e.kind, K::TransactionalWithoutProducerId);
    let b = kafka_like(Compression::None)
        .producer(3, 0, 0)
        .transactional(true)
        .build()
        .unwrap();
    let v = check(&b).unwrap();
    assert!(v.transactional);
    assert!(
        v.commit_batch(TopicIdPartition::new(uuid::Uuid::from_u128(1), 0), 1)
            .transactional
    );
}

#[test]
fn invalid_sequence() {
    let b = kafka_like(Compression::Gzip)
        .producer(1, 0, -2)
        .build()
        .unwrap();
    let e = check(&b).unwrap_err();
    assert_eq!(e.error_code(), ErrorCode::InvalidRecord);
    assert_eq!(e.kind, K::InvalidSequence);
    // Without a producer id, the sequence is not checked (Kafka's hasProducerId).
    let b = kafka_like(Compression::None)
        .producer(-1, -1, -2)
        .build()
        .unwrap();
    check(&b).unwrap();
}

#[test]
fn sequence_wraps_from_max_to_zero() {
    let b = kafka_like(Compression::None)
        .producer(9, 0, i32::MAX - 1)
        .build()
        .unwrap();
    let v = check(&b).unwrap();
    assert_eq!(v.base_sequence, i32::MAX - 1);
    // MAX - 1, MAX, 0.
    assert_eq!(v.last_sequence, 0);
    let b = RecordBatchBuilder::new()
        .producer(9, 0, i32::MAX)
        .record(NOW, None, Some(b"a"))
        .record(NOW, None, Some(b"b"))
        .build()
        .unwrap();
    assert_eq!(check(&b).unwrap().last_sequence, 0);
}

#[test]
fn non_sequential_inner_offsets() {
    for codec in Compression::ALL {
        let b = kafka_like(codec)
            .offset_deltas(vec![0, 2, 3])
            .build()
            .unwrap();
        let e = check(&b).unwrap_err();
        assert_eq!(e.error_code(), ErrorCode::InvalidRecord, "{codec:?}");
        assert_eq!(
            e.kind,
            K::NonSequentialOffset {
                expected: 1,
                actual: 2
            }
        );
        assert_eq!(e.record_index, Some(1));
        // The fetch-path check rejects it too.
        assert!(verify_stored_batch(&b).is_err());
    }
}

#[test]
fn non_zero_base_offset_from_client() {
    for codec in [Compression::None, Compression::Lz4] {
        let b = kafka_like(codec).base_offset(15).build().unwrap();
        let e = check(&b).unwrap_err();
        assert_eq!(e.error_code(), ErrorCode::InvalidRecord);
        assert_eq!(e.kind, K::NonZeroBaseOffset);
        verify_stored_batch(&b).unwrap();
    }
}

#[test]
fn crc_mismatch_is_corrupt_message() {
    for codec in Compression::ALL {
        let b = kafka_like(codec).build().unwrap();
        let mut v = b.as_bytes().to_vec();
        let last = v.len() - 1;
        v[last] ^= 1;
        let bad = RecordBatch::parse(Bytes::from(v)).unwrap();
        let e = check(&bad).unwrap_err();
        assert_eq!(e.error_code(), ErrorCode::CorruptMessage);
        assert!(matches!(e.kind, K::CrcMismatch { .. }));
        // Attributes are covered by the CRC as well.
        let mut v = b.as_bytes().to_vec();
        v[22] ^= 0x10;
        let e = check(&RecordBatch::parse(Bytes::from(v)).unwrap()).unwrap_err();
        assert_eq!(e.error_code(), ErrorCode::CorruptMessage);
    }
}

#[test]
fn batch_larger_than_max_message_bytes() {
    let b = kafka_like(Compression::None).build().unwrap();
    let mut config = cfg();
    config.max_message_bytes = b.len() as i32;
    validate_batch(&b, &config, NOW).unwrap();
    config.max_message_bytes = b.len() as i32 - 1;
    let e = validate_batch(&b, &config, NOW).unwrap_err();
    assert_eq!(e.error_code(), ErrorCode::MessageTooLarge);
    // Size is checked before the CRC, as Kafka does.
    let mut v = b.as_bytes().to_vec();
    v[HEADER_LEN + 2] ^= 0xff;
    let bad = RecordBatch::parse(Bytes::from(v)).unwrap();
    assert_eq!(
        validate_batch(&bad, &config, NOW).unwrap_err().error_code(),
        ErrorCode::MessageTooLarge
    );
}

#[test]
fn past_and_future_timestamps() {
    let config = TopicConfig {
        message_timestamp_before_max_ms: 1_000,
        message_timestamp_after_max_ms: 2_000,
        ..cfg()
    };
    for codec in Compression::ALL {
        let ok = RecordBatchBuilder::new()
            .compression(codec)
            .record(NOW - 1_000, None, Some(b"a"))
            .record(NOW + 2_000, None, Some(b"b"))
            .record(-1, None, Some(b"no timestamp"))
            .build()
            .unwrap();
        let v = validate_batch(&ok, &config, NOW).unwrap();
        assert_eq!(v.max_record_timestamp, NOW + 2_000);

        let past = RecordBatchBuilder::new()
            .compression(codec)
            .record(NOW, None, Some(b"a"))
            .record(NOW - 1_001, None, Some(b"b"))
            .build()
            .unwrap();
        let e = validate_batch(&past, &config, NOW).unwrap_err();
        assert_eq!(e.error_code(), ErrorCode::InvalidTimestamp, "{codec:?}");
        assert_eq!(e.record_index, Some(1));
        assert_eq!(
            e.kind,
            K::TimestampOutOfRange {
                timestamp: NOW - 1_001
            }
        );

        let future = RecordBatchBuilder::new()
            .compression(codec)
            .record(NOW + 2_001, None, Some(b"a"))
            .build()
            .unwrap();
        let e = validate_batch(&future, &config, NOW).unwrap_err();
        assert_eq!(e.error_code(), ErrorCode::InvalidTimestamp);
        assert_eq!(e.record_index, Some(0));

        // LogAppendTime topics ignore the producer's timestamps.
        let lat = TopicConfig {
            timestamp_type: TimestampType::LogAppendTime,
            ..config.clone()
        };
        validate_batch(&past, &lat, NOW).unwrap();
        validate_batch(&future, &lat, NOW).unwrap();
    }
    // Defaults: unlimited in the past (up to what `now - timestamp` can express, as in Kafka), one
    // hour in the future; extreme values do not overflow.
    let ancient = RecordBatchBuilder::new()
        .record(-5_000, None, Some(b"a"))
        .record(0, None, Some(b"b"))
        .build()
        .unwrap();
    check(&ancient).unwrap();
    let absurd = RecordBatchBuilder::new()
        .record(i64::MIN + 5, None, Some(b"a"))
        .build()
        .unwrap();
    assert_eq!(
        check(&absurd).unwrap_err().error_code(),
        ErrorCode::InvalidTimestamp
    );
    let far = RecordBatchBuilder::new()
        .record(i64::MAX, None, Some(b"a"))
        .build()
        .unwrap();
    assert_eq!(
        check(&far).unwrap_err().error_code(),
        ErrorCode::InvalidTimestamp
    );
}

#[test]
fn producer_setting_log_append_time_is_rejected() {
    let b = kafka_like(Compression::Snappy)
        .timestamp_type(TimestampType::LogAppendTime)
        .build()
        .unwrap();
    for topic_type in [TimestampType::LogAppendTime, TimestampType::CreateTime] {
        let config = TopicConfig {
            timestamp_type: topic_type,
            ..cfg()
        };
        let e = validate_batch(&b, &config, NOW).unwrap_err();
        assert_eq!(e.error_code(), ErrorCode::InvalidTimestamp);
        assert_eq!(e.kind, K::LogAppendTimeFromProducer);
        assert_eq!(e.record_index, Some(0));
    }
}

#[test]
fn error_precedence_matches_kafka() {
    // A timestamp error wins over an offset error (both per-record errors in Kafka).
    let config = TopicConfig {
        message_timestamp_before_max_ms: 10,
        ..cfg()
    };
    let b = RecordBatchBuilder::new()
        .offset_deltas(vec![0, 5, 2])
        .record(NOW, None, Some(b"a"))
        .record(NOW, None, Some(b"b"))
        .record(NOW - 100, None, Some(b"c"))
        .build()
        .unwrap();
    let e = validate_batch(&b, &config, NOW).unwrap_err();
    assert_eq!(e.error_code(), ErrorCode::InvalidTimestamp);
    assert_eq!(e.record_index, Some(2));
    // A structural error wins over both.
    let b = RecordBatchBuilder::new()
        .records_count(4)
        .last_offset_delta(3)
        .record(NOW - 100, None, Some(b"a"))
        .record(NOW, None, Some(b"b"))
        .record(NOW, None, Some(b"c"))
        .build()
        .unwrap();
    let e = validate_batch(&b, &config, NOW).unwrap_err();
    assert_eq!(e.error_code(), ErrorCode::InvalidRecord);
    assert_eq!(e.kind, K::Record(RecordErrorKind::Truncated));
}

#[test]
fn malformed_records_are_invalid_record() {
    let b = RecordBatchBuilder::new()
        .push(NewRecord {
            timestamp: NOW,
            key: Some(Bytes::from_static(b"key")),
            value: Some(Bytes::from_static(b"value")),
            headers: vec![(Bytes::from_static(b"h"), None)],
        })
        .record(NOW, None, Some(b"second"))
        .build()
        .unwrap();
    check(&b).unwrap();
    // Record 0: length 1 + attributes 1 + tsDelta 1 + offsetDelta 1 + keyLen (zigzag 3 = 6) at 4.
    let at = HEADER_LEN + 4;
    assert_eq!(b.as_bytes()[at], 6);
    // Key length larger than the record.
    let bad = patched(&b, |v| v[at] = 100);
    let e = check(&bad).unwrap_err();
    assert_eq!(e.error_code(), ErrorCode::InvalidRecord);
    assert_eq!(e.record_index, Some(0));
    assert!(matches!(e.kind, K::Record(_)));
    // Record length of the first record one too small.
    let bad = patched(&b, |v| v[HEADER_LEN] -= 2);
    let e = check(&bad).unwrap_err();
    assert_eq!(e.error_code(), ErrorCode::InvalidRecord);
    // A negative header key length.
    let hdr_key_at = HEADER_LEN + 1 + 1 + 1 + 1 + 1 + 3 + 1 + 5 + 1;
    assert_eq!(b.as_bytes()[hdr_key_at], 2);
    let bad = patched(&b, |v| v[hdr_key_at] = 1); // zigzag 1 = -1
    assert_eq!(
        check(&bad).unwrap_err().kind,
        K::Record(RecordErrorKind::InvalidLength)
    );
    // Records truncated by a shorter batch (framing still consistent).
    let mut v = b.as_bytes().to_vec();
    v.truncate(v.len() - 3);
    let len = (v.len() - 12) as i32;
    v[8..12].copy_from_slice(&len.to_be_bytes());
    update_crc(&mut v);
    let bad = RecordBatch::parse(Bytes::from(v)).unwrap();
    let e = check(&bad).unwrap_err();
    assert_eq!(e.error_code(), ErrorCode::InvalidRecord);
    assert_eq!(e.record_index, Some(1));
}

#[test]
fn unknown_codec_and_undecompressable_payload() {
    let b = kafka_like(Compression::None)
        .attributes(Attributes(5))
        .build()
        .unwrap();
    let e = check(&b).unwrap_err();
    assert_eq!(e.kind, K::UnknownCompression(5));
    assert_eq!(e.error_code(), ErrorCode::InvalidRecord);
    for codec in [
        Compression::Gzip,
        Compression::Snappy,
        Compression::Lz4,
        Compression::Zstd,
    ] {
        let b = kafka_like(Compression::None).build().unwrap();
        // Claim a codec the (uncompressed) records are not in.
        let bad = patched(&b, |v| v[22] = codec.id());
        let e = check(&bad).unwrap_err();
        assert_eq!(e.error_code(), ErrorCode::InvalidRecord, "{codec:?}: {e}");
    }
}

#[test]
fn decompression_bomb_is_message_too_large() {
    let big = vec![0u8; 256 << 10];
    for codec in [
        Compression::Gzip,
        Compression::Snappy,
        Compression::Lz4,
        Compression::Zstd,
    ] {
        let b = RecordBatchBuilder::new()
            .compression(codec)
            .record(NOW, None, Some(&big))
            .build()
            .unwrap();
        assert!(b.len() < big.len() / 4, "{codec:?} compresses zeros");
        // A zero bound is refused when the validator is made, not adjusted.
        assert!(
            Validator::new(ValidationOptions::default().with_max_decompressed_bytes(Some(0)))
                .is_err()
        );
        let mut v = Validator::new(
            ValidationOptions::default().with_max_decompressed_bytes(Some(64 << 10)),
        )
        .unwrap();
        let e = v.validate(&b, &cfg(), NOW).unwrap_err();
        assert_eq!(e.error_code(), ErrorCode::MessageTooLarge);
        assert!(matches!(e.kind, K::DecompressedTooLarge { limit } if limit == 64 << 10));
        // The same validator accepts it with the default bound.
        let mut v = Validator::default();
        v.validate(&b, &cfg(), NOW).unwrap();
    }
}

#[test]
fn framing_errors_map_to_kafka_codes() {
    let b = kafka_like(Compression::None).build().unwrap();
    let mut v = b.as_bytes().to_vec();
    v[MAGIC_OFFSET] = 1;
    let e = RecordBatch::parse(Bytes::from(v.clone())).unwrap_err();
    let ve: diskless_core::ValidationError = e.into();
    assert_eq!(ve.error_code(), ErrorCode::InvalidRecord);
    v[MAGIC_OFFSET] = 7;
    let e = split_batches(Bytes::from(v)).unwrap_err();
    assert_eq!(e.error_code(), ErrorCode::CorruptMessage);
    let e = split_batches(b.as_bytes().slice(..30)).unwrap_err();
    assert_eq!(e.error_code(), ErrorCode::CorruptMessage);
}

#[test]
fn log_append_time_rewrite_keeps_batch_valid() {
    for codec in Compression::ALL {
        let b = kafka_like(codec).producer(4, 0, 0).build().unwrap();
        check(&b).unwrap();
        let out = b
            .rewrite(&BatchRewrite {
                base_offset: 77,
                partition_leader_epoch: 2,
                log_append_time: Some(NOW + 5),
                max_timestamp: None,
            })
            .to_record_batch();
        assert!(out.crc_is_valid());
        assert_eq!(out.timestamp_type(), TimestampType::LogAppendTime);
        let v = verify_stored_batch(&out).unwrap();
        assert_eq!(v.record_count, 3);
        assert_eq!(v.max_timestamp, NOW + 5);
        assert_eq!(out.last_offset(), 79);
    }
}

#[test]
fn validator_reuse_does_not_leak_state() {
    let mut v = Validator::default();
    let good = kafka_like(Compression::Zstd).build().unwrap();
    let bad = kafka_like(Compression::Zstd)
        .offset_deltas(vec![0, 0, 0])
        .build()
        .unwrap();
    for _ in 0..3 {
        v.validate(&good, &cfg(), NOW).unwrap();
        v.validate(&bad, &cfg(), NOW).unwrap_err();
    }
}

/// Issue #12 item 4: Kafka checks `baseOffset != 0` (UnifiedLog.analyzeAndValidateRecords, since
/// 0.11.0) before the size and the CRC.
#[test]
fn base_offset_is_checked_before_size_and_crc() {
    let b = kafka_like(Compression::None)
        .base_offset(15)
        .build()
        .unwrap();
    let mut v = b.as_bytes().to_vec();
    let last = v.len() - 1;
    v[last] ^= 0xff;
    let bad_crc = RecordBatch::parse(Bytes::from(v)).unwrap();
    let e = check(&bad_crc).unwrap_err();
    assert_eq!(e.kind, K::NonZeroBaseOffset);
    assert_eq!(e.error_code(), ErrorCode::InvalidRecord);
    let small = TopicConfig {
        max_message_bytes: 10,
        ..cfg()
    };
    let e = validate_batch(&bad_crc, &small, NOW).unwrap_err();
    assert_eq!(e.kind, K::NonZeroBaseOffset);
    // The fetch-path check of stored batches does not look at the base offset.
    assert!(matches!(
        verify_stored_batch(&bad_crc).unwrap_err().kind,
        K::CrcMismatch { .. }
    ));
}

/// Issue #12 item 2: Kafka's rules for the producer fields, so that no batch that passes is refused
/// by a coordinator for its fields alone (which failed every request of the segment).
#[test]
fn producer_epoch_below_minus_one_is_invalid_producer_epoch() {
    for epoch in [-2i16, -100, i16::MIN] {
        let b = kafka_like(Compression::Lz4)
            .producer(5, epoch, 0)
            .build()
            .unwrap();
        let e = check(&b).unwrap_err();
        assert_eq!(e.kind, K::InvalidProducerEpoch { epoch });
        assert_eq!(e.error_code(), ErrorCode::InvalidProducerEpoch);
        assert_eq!(e.error_code().code(), 47);
        assert_eq!(e.record_index, None);
        // Stored batches are not judged on it.
        verify_stored_batch(&b).unwrap();
    }
    // Epoch -1 with a producer id passes (a new producer's entry has epoch -1 in Kafka); the
    // coordinator judges it against the producer's state.
    let b = kafka_like(Compression::None)
        .producer(5, -1, 0)
        .build()
        .unwrap();
    let v = check(&b).unwrap();
    let c = v.commit_batch(diskless_coordinator::TopicIdPartition::new(uuid(), 0), 1);
    assert_eq!(
        (
            c.producer_id,
            c.producer_epoch,
            c.base_sequence,
            c.last_sequence
        ),
        (5, -1, 0, 2)
    );
    // Any producer id below 0 is "no producer" (Kafka's hasProducerId is producerId > -1): epoch
    // and sequence are not checked, and the commit carries a non-idempotent batch.
    for (pid, epoch, seq) in [(-1i64, -5i16, -9i32), (-2, -7, 3), (i64::MIN, 4, -1)] {
        let b = kafka_like(Compression::None)
            .producer(pid, epoch, seq)
            .build()
            .unwrap();
        let v = check(&b).unwrap();
        assert_eq!((v.producer_id, v.producer_epoch), (pid, epoch));
        let c = v.commit_batch(diskless_coordinator::TopicIdPartition::new(uuid(), 0), 1);
        assert_eq!(
            (
                c.producer_id,
                c.producer_epoch,
                c.base_sequence,
                c.last_sequence
            ),
            (-1, -1, -1, -1),
            "{pid} {epoch} {seq}"
        );
    }
}

/// Kafka checks the epoch in ProducerAppendInfo, after LogValidator: every batch and record error
/// wins over it.
#[test]
fn producer_epoch_error_comes_after_every_batch_and_record_error() {
    let config = TopicConfig {
        message_timestamp_before_max_ms: 10,
        ..cfg()
    };
    // A negative sequence (LogValidator.validateBatch).
    let b = kafka_like(Compression::None)
        .producer(5, -2, -1)
        .build()
        .unwrap();
    assert_eq!(check(&b).unwrap_err().kind, K::InvalidSequence);
    // A timestamp out of range.
    let b = RecordBatchBuilder::new()
        .producer(5, -2, 0)
        .record(NOW - 100, None, Some(b"old"))
        .build()
        .unwrap();
    let e = validate_batch(&b, &config, NOW).unwrap_err();
    assert_eq!(e.error_code(), ErrorCode::InvalidTimestamp);
    // Non-sequential inner offsets.
    let b = kafka_like(Compression::Zstd)
        .producer(5, -2, 0)
        .offset_deltas(vec![0, 0, 2])
        .build()
        .unwrap();
    assert!(matches!(
        check(&b).unwrap_err().kind,
        K::NonSequentialOffset { .. }
    ));
    // A bad CRC.
    let b = kafka_like(Compression::None)
        .producer(5, -2, 0)
        .build()
        .unwrap();
    let mut v = b.as_bytes().to_vec();
    v[HEADER_LEN] ^= 1;
    let bad = RecordBatch::parse(Bytes::from(v)).unwrap();
    assert_eq!(
        check(&bad).unwrap_err().error_code(),
        ErrorCode::CorruptMessage
    );
}

/// Kafka ranks the LogAppendTime bit from a producer as a per-record error: a record that does not
/// parse wins over it.
#[test]
fn a_structural_error_wins_over_log_append_time_from_the_producer() {
    let b = kafka_like(Compression::None)
        .timestamp_type(TimestampType::LogAppendTime)
        .records_count(4)
        .last_offset_delta(3)
        .build()
        .unwrap();
    let e = check(&b).unwrap_err();
    assert_eq!(e.kind, K::Record(RecordErrorKind::Truncated));
    assert_eq!(e.error_code(), ErrorCode::InvalidRecord);
}

/// Kafka reads the codec right after the CRC check (analyzeAndValidateRecords), before
/// LogValidator's batch checks.
#[test]
fn unknown_codec_is_judged_right_after_the_crc() {
    let b = kafka_like(Compression::None)
        .attributes(Attributes(6))
        .control(true)
        .build()
        .unwrap();
    assert_eq!(check(&b).unwrap_err().kind, K::UnknownCompression(6));
}

fn uuid() -> uuid::Uuid {
    uuid::Uuid::from_u128(0x1234)
}

fn produce_records(
    records: &[u8],
) -> Result<(RecordBatch, diskless_core::ValidatedBatch), diskless_core::ValidationError> {
    validate_produce_records(&Bytes::copy_from_slice(records), &cfg(), NOW)
}

fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

/// Issue #12 item 4: Produce v3+ carries exactly one batch per partition (Kafka's
/// ProduceRequest.validateRecords); decided by the library, in validate_produce_records.
#[test]
fn produce_records_hold_exactly_one_batch() {
    let a = kafka_like(Compression::None).build().unwrap();
    let b = kafka_like(Compression::Gzip).build().unwrap();
    let (batch, v) = produce_records(a.as_bytes()).unwrap();
    assert_eq!((batch, v.record_count), (a.clone(), 3));
    for two in [
        cat(&[a.as_bytes(), b.as_bytes()]),
        cat(&[a.as_bytes(), a.as_bytes(), a.as_bytes()]),
        // A second complete "batch" is refused as such, whatever it holds (here a v0 message).
        cat(&[a.as_bytes(), &legacy(0, 26)]),
    ] {
        let e = produce_records(&two).unwrap_err();
        assert_eq!(e.kind, K::MoreThanOneBatch);
        assert_eq!(e.error_code(), ErrorCode::InvalidRecord);
    }
    // No complete batch at all: Kafka's "at least one record batch", INVALID_RECORD.
    for none in [
        &[][..],
        &a.as_bytes()[..11],
        &a.as_bytes()[..16],
        &a.as_bytes()[..60],
    ] {
        let e = produce_records(none).unwrap_err();
        assert_eq!(e.kind, K::NoRecordBatch, "{} bytes", none.len());
        assert_eq!(e.error_code(), ErrorCode::InvalidRecord);
    }
}

/// Issue #12 item 4: Kafka's batch iteration stops at bytes too few to hold the next batch, and
/// UnifiedLog.trimInvalidBytes drops them; the batch alone is stored.
#[test]
fn produce_records_trim_a_partial_trailing_batch_as_kafka_does() {
    let a = kafka_like(Compression::Snappy)
        .producer(3, 0, 0)
        .build()
        .unwrap();
    let next = kafka_like(Compression::None).build().unwrap();
    for cut in [1, 11, 12, 16, 17, 40, next.len() - 1] {
        let (batch, _) = produce_records(&cat(&[a.as_bytes(), &next.as_bytes()[..cut]]))
            .unwrap_or_else(|e| panic!("cut {cut}: {e}"));
        assert_eq!(batch, a, "cut {cut}");
        assert_eq!(batch.as_bytes().len(), a.len());
    }
    // But what Kafka's iteration refuses is refused: a batchLength below 14 (from 12 bytes on)...
    for len in [12usize, 16, 30] {
        let mut tail = vec![0u8; len];
        tail[8..12].copy_from_slice(&13i32.to_be_bytes());
        let e = produce_records(&cat(&[a.as_bytes(), &tail])).unwrap_err();
        assert_eq!(e.kind, K::BatchLengthBelowMinimum { batch_length: 13 });
        assert_eq!(e.error_code(), ErrorCode::CorruptMessage);
    }
    // ...and a magic outside 0..=2 (from 17 bytes on).
    let mut tail = next.as_bytes()[..17].to_vec();
    tail[MAGIC_OFFSET] = 3;
    let e = produce_records(&cat(&[a.as_bytes(), &tail])).unwrap_err();
    assert_eq!(e.error_code(), ErrorCode::CorruptMessage);
}

/// Issue #12 item 4: a complete magic 0/1 message is INVALID_RECORD whatever its size (Kafka's
/// ProduceRequest.validateRecords); what Kafka's iteration refuses first is CORRUPT_MESSAGE.
#[test]
fn produce_records_of_old_formats_and_short_batches() {
    for (magic, len) in [(0u8, 26usize), (1, 34), (0, 60), (1, 61), (1, 200)] {
        let e = produce_records(&legacy(magic, len)).unwrap_err();
        assert_eq!(e.error_code(), ErrorCode::InvalidRecord, "{magic} {len}");
        assert_eq!(
            e.kind,
            K::Framing(BatchError::UnsupportedMagic(magic as i8))
        );
    }
    // batchLength 13: corrupt, whatever the magic.
    let mut v = legacy(0, 26);
    v[8..12].copy_from_slice(&13i32.to_be_bytes());
    assert_eq!(
        produce_records(&v).unwrap_err().error_code(),
        ErrorCode::CorruptMessage
    );
    // An unknown magic: corrupt.
    for magic in [3u8, 0x80, 0xff] {
        let mut v = kafka_like(Compression::None)
            .build()
            .unwrap()
            .as_bytes()
            .to_vec();
        v[MAGIC_OFFSET] = magic;
        let e = produce_records(&v).unwrap_err();
        assert_eq!(e.error_code(), ErrorCode::CorruptMessage, "{magic}");
    }
    // A v2 batch shorter than its header: corrupt, but the base offset is judged first.
    let mut v = legacy(2, 40);
    assert_eq!(
        produce_records(&v).unwrap_err().kind,
        K::Framing(BatchError::TooShort { size: 40 })
    );
    v[..8].copy_from_slice(&9i64.to_be_bytes());
    assert_eq!(produce_records(&v).unwrap_err().kind, K::NonZeroBaseOffset);
    // The batch itself then goes through every batch check.
    let b = kafka_like(Compression::None)
        .producer(1, -3, 0)
        .build()
        .unwrap();
    assert_eq!(
        produce_records(b.as_bytes()).unwrap_err().error_code(),
        ErrorCode::InvalidProducerEpoch
    );
}

/// Any prefix of two batches, with a framing byte overwritten: no panic, and what is accepted is
/// the first batch exactly, taken from the front of the input.
#[test]
fn produce_records_never_panic_and_accept_only_the_leading_batch() {
    let a = kafka_like(Compression::None).build().unwrap();
    let two = cat(&[a.as_bytes(), a.as_bytes()]);
    let n = a.len();
    for end in 0..=two.len() {
        for at in [0, 7, 8, 11, 16, n, n + 8, n + 11, n + 16] {
            for x in [0x00u8, 0x01, 0x7f, 0x80, 0xff] {
                let mut v = two[..end].to_vec();
                if let Some(b) = v.get_mut(at) {
                    *b = x;
                }
                if let Ok((batch, _)) = produce_records(&v) {
                    assert_eq!(
                        batch.as_bytes().as_ref(),
                        &v[..n],
                        "end {end} at {at} x {x}"
                    );
                }
            }
        }
    }
}

/// A complete v0/v1 message of `len` bytes (batchLength = len - 12; the rest zeros).
fn legacy(magic: u8, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    v[8..12].copy_from_slice(&((len - 12) as i32).to_be_bytes());
    v[MAGIC_OFFSET] = magic;
    v
}

/// Kafka's `LogValidatorTest.testCompactedTopicWithoutKey` and its ordering: on a topic whose
/// `cleanup.policy` compacts (`compact` or `compact,delete`) a record without a key fails its
/// batch with `INVALID_RECORD`, naming the first such record, in every codec; a tombstone (null
/// value) with a key passes; `delete` topics take keyless records. A keyless record's timestamp is
/// not checked (its key error is its error), and another record's timestamp error still wins, as
/// in Kafka's `processRecordErrors`.
#[test]
fn keyless_records_are_refused_on_compacted_topics() {
    use diskless_coordinator::CleanupPolicy;
    let config = |policy| {
        TopicConfig::default()
            .with_cleanup_policy(policy)
            .with_message_timestamp_before_max_ms(1_000)
    };
    for codec in Compression::ALL {
        let mixed = RecordBatchBuilder::new()
            .compression(codec)
            .record(NOW, Some(b"k"), Some(b"v"))
            .record(NOW, Some(b"k"), None)
            .record(NOW, None, Some(b"no key"))
            .record(NOW, None, Some(b"no key either"))
            .build()
            .unwrap();
        validate_batch(&mixed, &config(CleanupPolicy::Delete), NOW).unwrap();
        for policy in [CleanupPolicy::Compact, CleanupPolicy::CompactDelete] {
            let e = validate_batch(&mixed, &config(policy), NOW).unwrap_err();
            assert_eq!(
                e.error_code(),
                ErrorCode::InvalidRecord,
                "{codec:?} {policy}"
            );
            assert_eq!(e.kind, K::KeylessRecordInCompactedTopic);
            assert_eq!(e.record_index, Some(2));
            // Kafka's record_errors: every keyless record, in order.
            assert_eq!(
                e.record_errors.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
                vec![2, 3]
            );
            assert!(
                e.message
                    .starts_with("One or more records have been rejected due to 2")
            );
            assert!(
                e.message
                    .contains("Compacted topic cannot accept message without key")
            );
        }
        let keyed = RecordBatchBuilder::new()
            .compression(codec)
            .record(NOW, Some(b"a"), Some(b"1"))
            .record(NOW, Some(b""), None)
            .build()
            .unwrap();
        validate_batch(&keyed, &config(CleanupPolicy::Compact), NOW).unwrap();

        // The keyless record's own stale timestamp is not judged: INVALID_RECORD.
        let keyless_and_stale = RecordBatchBuilder::new()
            .compression(codec)
            .record(NOW - 5_000, None, Some(b"v"))
            .build()
            .unwrap();
        let e =
            validate_batch(&keyless_and_stale, &config(CleanupPolicy::Compact), NOW).unwrap_err();
        assert_eq!(e.kind, K::KeylessRecordInCompactedTopic);
        // Another record's timestamp error wins over the key error.
        let keyless_then_stale = RecordBatchBuilder::new()
            .compression(codec)
            .record(NOW, None, Some(b"v"))
            .record(NOW - 5_000, Some(b"k"), Some(b"v"))
            .build()
            .unwrap();
        let e =
            validate_batch(&keyless_then_stale, &config(CleanupPolicy::Compact), NOW).unwrap_err();
        assert_eq!(e.error_code(), ErrorCode::InvalidTimestamp);
        assert_eq!(e.record_index, Some(1));
        assert_eq!(
            e.record_errors.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
            vec![0, 1],
            "both records' errors, as Kafka lists them"
        );
    }
}
