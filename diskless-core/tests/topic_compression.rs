//! A topic's `compression.type` (issue #29): a batch whose codec is not the topic's is stored
//! re-encoded with the topic's codec at the topic's level, every record as sent (Kafka's
//! `LogValidator.buildRecordsAndAssignOffsets`); `producer` stores each batch as sent.
#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests: a failed step is a failed test.

use bytes::Bytes;
use diskless_coordinator::{ErrorCode, TopicCompression, TopicConfig};
use diskless_core::batch::HEADER_LEN;
use diskless_core::compression::{compress_with_level, decompress};
use diskless_core::validate::{stored_codec, validate_produce_records};
use diskless_core::{
    Compression, NewRecord, RecordBatch, RecordBatchBuilder, RecordIter, ValidationErrorKind,
    verify_stored_batch,
};
use proptest::prelude::*;

const NOW: i64 = 1_700_000_000_000;

/// A record as a consumer sees it: timestamp, offset delta, key, value, headers.
type Seen = (
    i64,
    i32,
    Option<Vec<u8>>,
    Option<Vec<u8>>,
    Vec<(Vec<u8>, Option<Vec<u8>>)>,
);

fn seen(batch: &RecordBatch) -> Vec<Seen> {
    let codec = batch.attributes().compression().unwrap();
    let mut plain = Vec::new();
    decompress(codec, &batch.as_bytes()[HEADER_LEN..], 1 << 30, &mut plain).unwrap();
    RecordIter::new(&plain, batch.records_count() as usize)
        .map(|r| {
            let r = r.unwrap();
            (
                r.timestamp(batch.base_timestamp()),
                r.offset_delta,
                r.key.map(<[u8]>::to_vec),
                r.value.map(<[u8]>::to_vec),
                r.headers()
                    .map(|(k, v)| (k.to_vec(), v.map(<[u8]>::to_vec)))
                    .collect(),
            )
        })
        .collect()
}

fn topic(compression: TopicCompression) -> TopicConfig {
    TopicConfig::default().with_compression_type(compression)
}

fn sample(codec: Compression) -> RecordBatchBuilder {
    RecordBatchBuilder::new()
        .compression(codec)
        .producer(7, 2, 40)
        .transactional(true)
        .push(NewRecord {
            timestamp: NOW - 5,
            key: Some(Bytes::from_static(b"k1")),
            value: Some(Bytes::from(b"v".repeat(300))),
            headers: vec![(Bytes::from_static(b"h"), Some(Bytes::from_static(b"x")))],
        })
        .record(NOW, None, None)
        .record(
            NOW - 9,
            Some(b"k3"),
            Some(b"the third record, the third record"),
        )
}

const TOPIC_VALUES: [TopicCompression; 6] = TopicCompression::ALL;

#[test]
fn every_codec_pair_stores_the_topics_codec_with_the_records_as_sent() {
    for sent in Compression::ALL {
        let batch = sample(sent).build().unwrap();
        for value in TOPIC_VALUES {
            let config = topic(value);
            let (stored, meta) = validate_produce_records(batch.as_bytes(), &config, NOW)
                .unwrap_or_else(|e| panic!("{sent:?} into {value}: {e}"));
            let want = stored_codec(&config).unwrap_or(sent);
            assert_eq!(
                stored.attributes().compression(),
                Some(want),
                "{sent:?} into {value}"
            );
            assert_eq!(meta.compression, want);
            assert_eq!(meta.byte_size as usize, stored.len());
            if want == sent {
                assert_eq!(
                    stored.as_bytes(),
                    batch.as_bytes(),
                    "kept as sent: {sent:?}, {value}"
                );
            }
            // The stored batch is a valid batch (CRC, framing, counts) ...
            let again = verify_stored_batch(&stored).unwrap();
            assert_eq!(again.compression, want);
            // ... with the same records, producer fields and attributes but the codec.
            assert_eq!(seen(&stored), seen(&batch), "{sent:?} into {value}");
            assert_eq!(stored.producer_id(), 7);
            assert_eq!(stored.producer_epoch(), 2);
            assert_eq!(stored.base_sequence(), 40);
            assert_eq!(stored.records_count(), 3);
            assert_eq!(stored.last_offset_delta(), 2);
            assert_eq!(stored.base_timestamp(), batch.base_timestamp());
            assert_eq!(stored.max_timestamp(), batch.max_timestamp());
            assert!(stored.attributes().is_transactional());
            assert_eq!(
                stored.attributes().0 & !0x07,
                batch.attributes().0 & !0x07,
                "only the codec bits change"
            );
            assert_eq!(
                (
                    meta.record_count,
                    meta.max_record_timestamp,
                    meta.last_sequence
                ),
                (3, NOW, 42)
            );
        }
    }
}

#[test]
fn the_topics_level_is_the_one_used() {
    // Words drawn by a fixed LCG: compressible, but not so trivially that levels tie.
    let words: [&[u8]; 8] = [
        b"wal ",
        b"segment ",
        b"object ",
        b"offset ",
        b"batch ",
        b"commit ",
        b"fetch ",
        b"coordinator ",
    ];
    let mut x: u64 = 42;
    let mut text = Vec::new();
    while text.len() < 64 * 1024 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        text.extend_from_slice(words[(x >> 61) as usize]);
        text.extend_from_slice(format!("{} ", (x >> 40) % 1000).as_bytes());
    }
    let batch = RecordBatchBuilder::new()
        .record(NOW, None, Some(&text))
        .build()
        .unwrap();
    let plain = &batch.as_bytes()[HEADER_LEN..];
    for (codec, value, set_level, levels) in [
        (
            Compression::Gzip,
            TopicCompression::Gzip,
            TopicConfig::with_compression_gzip_level as fn(TopicConfig, i32) -> TopicConfig,
            [1, 9, -1],
        ),
        (
            Compression::Zstd,
            TopicCompression::Zstd,
            TopicConfig::with_compression_zstd_level,
            [-5, 19, 3],
        ),
    ] {
        let mut sizes = Vec::new();
        for level in levels {
            let config = set_level(topic(value), level);
            let (stored, _) = validate_produce_records(batch.as_bytes(), &config, NOW).unwrap();
            let expected = compress_with_level(codec, Some(level), plain).unwrap();
            assert_eq!(
                &stored.as_bytes()[HEADER_LEN..],
                &expected[..],
                "{codec:?} {level}"
            );
            sizes.push(stored.len());
        }
        // [low, high, default]: the higher level packs tighter.
        assert!(sizes[1] < sizes[0], "{codec:?}: {sizes:?}");
    }
}

#[test]
fn a_batch_too_large_once_re_encoded_is_message_too_large() {
    // 200 KiB of zeros gzip to a few hundred bytes; stored uncompressed they exceed the topic's
    // max.message.bytes: Kafka's UnifiedLog.append checks the size again after re-compression.
    let batch = RecordBatchBuilder::new()
        .compression(Compression::Gzip)
        .record(NOW, None, Some(&[0u8; 200 * 1024]))
        .build()
        .unwrap();
    let config = topic(TopicCompression::Uncompressed).with_max_message_bytes(100_000);
    assert!(batch.len() < 100_000);
    let err = validate_produce_records(batch.as_bytes(), &config, NOW).unwrap_err();
    assert_eq!(err.error_code(), ErrorCode::MessageTooLarge);
    assert!(matches!(
        err.kind,
        ValidationErrorKind::TooLarge { max: 100_000, .. }
    ));
    // As sent (producer), it fits.
    let config = config.with_compression_type(TopicCompression::Producer);
    assert!(validate_produce_records(batch.as_bytes(), &config, NOW).is_ok());
}

#[test]
fn an_invalid_batch_is_refused_before_any_re_encoding() {
    // A timestamp out of range fails the same way on every topic compression.
    let batch = RecordBatchBuilder::new()
        .record(NOW + 10 * 3_600_000, None, Some(b"late"))
        .build()
        .unwrap();
    for value in TOPIC_VALUES {
        let err = validate_produce_records(batch.as_bytes(), &topic(value), NOW).unwrap_err();
        assert_eq!(err.error_code(), ErrorCode::InvalidTimestamp, "{value}");
    }
}

fn any_record() -> impl Strategy<Value = NewRecord> {
    (
        -1_000_000i64..1_000_000,
        proptest::option::of(proptest::collection::vec(any::<u8>(), 0..40)),
        proptest::option::of(proptest::collection::vec(0u8..4, 0..3000)),
        proptest::collection::vec(
            (
                proptest::collection::vec(any::<u8>(), 0..8),
                proptest::option::of(proptest::collection::vec(any::<u8>(), 0..8)),
            ),
            0..3,
        ),
    )
        .prop_map(|(dt, key, value, headers)| NewRecord {
            timestamp: NOW + dt,
            key: key.map(Bytes::from),
            value: value.map(Bytes::from),
            headers: headers
                .into_iter()
                .map(|(k, v)| (Bytes::from(k), v.map(Bytes::from)))
                .collect(),
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Any batch, any codec it was sent with, any topic compression: the stored batch passes
    /// verification, has the topic's codec (or the producer's), and reads back the same records.
    #[test]
    fn re_encoding_keeps_every_record(
        records in proptest::collection::vec(any_record(), 1..20),
        sent in proptest::sample::select(Compression::ALL.to_vec()),
        value in proptest::sample::select(TOPIC_VALUES.to_vec()),
        producer in proptest::option::of((0i64..1000, 0i16..5, 0i32..1000)),
    ) {
        let mut builder = RecordBatchBuilder::new().compression(sent);
        if let Some((id, epoch, seq)) = producer {
            builder = builder.producer(id, epoch, seq);
        }
        for r in records {
            builder = builder.push(r);
        }
        let batch = builder.build().unwrap();
        let config = topic(value).with_message_timestamp_after_max_ms(i64::MAX)
            .with_max_message_bytes(i32::MAX);
        let (stored, meta) = validate_produce_records(batch.as_bytes(), &config, NOW).unwrap();
        let want = stored_codec(&config).unwrap_or(sent);
        prop_assert_eq!(stored.attributes().compression(), Some(want));
        prop_assert_eq!(meta.byte_size as usize, stored.len());
        let verified = verify_stored_batch(&stored).unwrap();
        prop_assert_eq!(verified.record_count, meta.record_count);
        prop_assert_eq!(verified.max_record_timestamp, meta.max_record_timestamp);
        prop_assert_eq!(seen(&stored), seen(&batch));
        prop_assert_eq!(
            (stored.producer_id(), stored.producer_epoch(), stored.base_sequence()),
            (batch.producer_id(), batch.producer_epoch(), batch.base_sequence())
        );
    }
}
