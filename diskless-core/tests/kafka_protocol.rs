//! Cross-check against an independent implementation: the `kafka-protocol` crate's encoder and
//! decoder.
#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests: a failed step is a failed test.

use bytes::{Bytes, BytesMut};
use diskless_coordinator::{ErrorCode, TimestampType, TopicConfig};
use diskless_core::validate::validate_produce_records;
use diskless_core::{
    BatchRewrite, Compression, NewRecord, RecordBatch, RecordBatchBuilder, RecordIter,
    split_batches, validate_batch, verify_stored_batch,
};
use kafka_protocol::indexmap::IndexMap;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{
    Compression as KCompression, Record as KRecord, RecordBatchDecoder, RecordBatchEncoder,
    RecordEncodeOptions, TimestampType as KTimestampType,
};

const NOW: i64 = 1_700_000_000_000;

fn kcodec(c: Compression) -> KCompression {
    match c {
        Compression::None => KCompression::None,
        Compression::Gzip => KCompression::Gzip,
        Compression::Snappy => KCompression::Snappy,
        Compression::Lz4 => KCompression::Lz4,
        Compression::Zstd => KCompression::Zstd,
    }
}

fn krecords(n: usize, producer_id: i64, base_sequence: i32) -> Vec<KRecord> {
    (0..n)
        .map(|i| {
            let mut headers = IndexMap::new();
            if i % 2 == 0 {
                headers.insert(
                    StrBytes::from_static_str("trace"),
                    Some(Bytes::from(format!("t{i}"))),
                );
                headers.insert(StrBytes::from_static_str("empty"), None);
            }
            KRecord {
                transactional: false,
                control: false,
                delete_horizon: false,
                partition_leader_epoch: 0,
                producer_id,
                producer_epoch: if producer_id >= 0 { 2 } else { -1 },
                timestamp_type: KTimestampType::Creation,
                offset: i as i64,
                sequence: base_sequence.wrapping_add(i as i32),
                timestamp: NOW + i as i64,
                key: (i % 3 != 0).then(|| Bytes::from(format!("key-{i}"))),
                value: (i % 5 != 4).then(|| Bytes::from(format!("value-{i}-").repeat(i + 1))),
                headers,
            }
        })
        .collect()
}

fn kencode(records: &[KRecord], c: Compression) -> Bytes {
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut buf,
        records,
        &RecordEncodeOptions {
            version: 2,
            compression: kcodec(c),
        },
    )
    .unwrap();
    buf.freeze()
}

#[test]
fn their_batches_parse_and_validate_with_every_codec() {
    for codec in Compression::ALL {
        for (pid, seq) in [(-1i64, -1i32), (77, 10)] {
            let records = krecords(12, pid, seq);
            let bytes = kencode(&records, codec);
            let batches = split_batches(bytes).unwrap();
            assert_eq!(batches.len(), 1, "{codec:?}");
            let b = &batches[0];
            assert!(b.crc_is_valid());
            assert_eq!(b.attributes().compression(), Some(codec));
            let v = validate_batch(b, &TopicConfig::default(), NOW).unwrap();
            assert_eq!(v.record_count, 12);
            assert_eq!(v.base_timestamp, NOW);
            assert_eq!(v.max_timestamp, NOW + 11);
            assert_eq!(v.max_record_timestamp, NOW + 11);
            assert_eq!(v.producer_id, pid);
            assert_eq!(v.base_sequence, seq);
            if pid >= 0 {
                assert_eq!(v.last_sequence, seq + 11);
            }
            // Record contents through our record parser (uncompressed batches only: no public
            // decompression step here, the validator covers the compressed ones).
            if codec == Compression::None {
                let body = b.records_bytes();
                let ours: Vec<_> = RecordIter::new(&body, 12)
                    .collect::<Result<_, _>>()
                    .unwrap();
                for (r, k) in ours.iter().zip(&records) {
                    assert_eq!(r.key, k.key.as_deref());
                    assert_eq!(r.value, k.value.as_deref());
                    assert_eq!(r.timestamp(b.base_timestamp()), k.timestamp);
                    let hs: Vec<_> = r.headers().collect();
                    assert_eq!(hs.len(), k.headers.len());
                    for ((hk, hv), (kk, kv)) in hs.iter().zip(k.headers.iter()) {
                        assert_eq!(*hk, kk.as_bytes());
                        assert_eq!(*hv, kv.as_deref());
                    }
                }
            }
        }
    }
}

#[test]
fn their_batches_decompress_with_our_codecs() {
    for codec in Compression::ALL {
        let bytes = kencode(&krecords(40, -1, -1), codec);
        let b = RecordBatch::parse(bytes).unwrap();
        let mut out = Vec::new();
        diskless_core::compression::decompress(codec, &b.records_bytes(), 1 << 20, &mut out)
            .unwrap();
        let n = RecordIter::new(&out, 40).filter(|r| r.is_ok()).count();
        assert_eq!(n, 40, "{codec:?}");
    }
}

fn our_batch(codec: Compression) -> RecordBatch {
    let mut b = RecordBatchBuilder::new()
        .compression(codec)
        .producer(5, 1, 100);
    for i in 0..9 {
        b = b.push(NewRecord {
            timestamp: NOW + 3 * i,
            key: (i % 2 == 0).then(|| Bytes::from(format!("k{i}"))),
            value: Some(Bytes::from(vec![i as u8; 50 * i as usize])),
            headers: vec![(Bytes::from_static(b"h"), Some(Bytes::from(format!("{i}"))))],
        });
    }
    b.build().unwrap()
}

#[test]
fn our_batches_decode_with_their_decoder() {
    for codec in Compression::ALL {
        let b = our_batch(codec);
        let mut buf = b.as_bytes().clone();
        let set = RecordBatchDecoder::decode(&mut buf).unwrap();
        assert_eq!(set.compression, kcodec(codec));
        assert_eq!(set.records.len(), 9);
        for (i, r) in set.records.iter().enumerate() {
            assert_eq!(r.offset, i as i64);
            assert_eq!(r.timestamp, NOW + 3 * i as i64);
            assert_eq!(r.sequence, 100 + i as i32);
            assert_eq!(r.producer_id, 5);
            assert_eq!(r.producer_epoch, 1);
            assert_eq!(r.key, (i % 2 == 0).then(|| Bytes::from(format!("k{i}"))));
            assert_eq!(r.value.as_deref(), Some(&vec![i as u8; 50 * i][..]));
            assert_eq!(r.headers.len(), 1);
            assert_eq!(r.timestamp_type, KTimestampType::Creation);
        }
    }
}

#[test]
fn our_rewrites_round_trip_through_their_decoder() {
    for codec in Compression::ALL {
        let b = our_batch(codec);
        for lat in [None, Some(NOW + 1_000)] {
            let out = b.rewrite(&BatchRewrite {
                base_offset: 1_000_000,
                partition_leader_epoch: 12,
                log_append_time: lat,
                max_timestamp: None,
            });
            let mut buf = out.to_bytes();
            // Their decoder checks the CRC, so this also proves the CRC is right.
            let set = RecordBatchDecoder::decode(&mut buf).unwrap();
            assert_eq!(set.records.len(), 9);
            for (i, r) in set.records.iter().enumerate() {
                assert_eq!(r.offset, 1_000_000 + i as i64, "{codec:?}");
                assert_eq!(r.partition_leader_epoch, 12);
                assert_eq!(r.sequence, 100 + i as i32);
                let want = if lat.is_some() {
                    KTimestampType::LogAppend
                } else {
                    KTimestampType::Creation
                };
                assert_eq!(r.timestamp_type, want);
                // Record timestamps are untouched; the batch max timestamp carries LogAppendTime.
                assert_eq!(r.timestamp, NOW + 3 * i as i64);
            }
            let ours = out.to_record_batch();
            assert_eq!(ours.max_timestamp(), lat.unwrap_or(NOW + 24));
            assert_eq!(
                ours.timestamp_type(),
                if lat.is_some() {
                    TimestampType::LogAppendTime
                } else {
                    TimestampType::CreateTime
                }
            );
            verify_stored_batch(&ours).unwrap();
        }
    }
}

/// Their encoder starts a new batch when the producer changes: records of two producers for one
/// partition are two batches, which Produce v3+ refuses (INVALID_RECORD, Kafka's
/// ProduceRequest.validateRecords); each batch alone passes, and a cut-off second batch is ignored.
#[test]
fn their_two_batch_encoding_is_refused_and_a_cut_second_batch_is_ignored() {
    let mut records = krecords(4, 77, 0);
    records.extend(krecords(3, 78, 0).into_iter().map(|mut r| {
        r.offset += 4;
        r
    }));
    let bytes = kencode(&records, Compression::Lz4);
    let batches = split_batches(bytes.clone()).unwrap();
    assert_eq!(batches.len(), 2);
    let config = TopicConfig::default();
    let e = validate_produce_records(&bytes, &config, NOW).unwrap_err();
    assert_eq!(e.error_code(), ErrorCode::InvalidRecord);
    let first = batches[0].as_bytes().clone();
    let (batch, v) = validate_produce_records(&first, &config, NOW).unwrap();
    assert_eq!((batch.producer_id(), v.record_count), (77, 4));
    // The second batch (base offset 4) is refused alone, as Kafka refuses a client's non-zero
    // base offset.
    let e = validate_produce_records(batches[1].as_bytes(), &config, NOW).unwrap_err();
    assert_eq!(e.error_code(), ErrorCode::InvalidRecord);
    // The first batch followed by part of the second: trimmed to the first.
    let cut = bytes.slice(..first.len() + batches[1].len() - 1);
    let (batch, _) = validate_produce_records(&cut, &config, NOW).unwrap();
    assert_eq!(batch.as_bytes(), &first);
}

/// Producer fields as their encoder writes them: epoch -1 with a producer id passes, below -1 is
/// INVALID_PRODUCER_EPOCH (Kafka's ProducerAppendInfo against a new producer's epoch -1).
#[test]
fn their_producer_epochs_are_judged_as_kafka_does() {
    let config = TopicConfig::default();
    for (epoch, want) in [
        (0i16, ErrorCode::None),
        (-1, ErrorCode::None),
        (-2, ErrorCode::InvalidProducerEpoch),
    ] {
        let records: Vec<KRecord> = krecords(5, 77, 10)
            .into_iter()
            .map(|mut r| {
                r.producer_epoch = epoch;
                r
            })
            .collect();
        let bytes = kencode(&records, Compression::Zstd);
        let got = validate_produce_records(&bytes, &config, NOW)
            .map(|_| ErrorCode::None)
            .unwrap_or_else(|e| e.error_code());
        assert_eq!(got, want, "epoch {epoch}");
    }
}

/// Transaction markers (`diskless_core::control`) decode with kafka-protocol's decoder (which
/// checks the CRC) as Kafka's control batches: transactional + control, the ControlRecordType key
/// and the EndTransactionMarker value.
#[test]
fn transaction_markers_decode_with_their_decoder() {
    use diskless_core::control::{MarkerBatch, end_txn_marker};
    for (commit, lat) in [(true, false), (false, false), (false, true)] {
        let mut buf = end_txn_marker(&MarkerBatch {
            base_offset: 77,
            partition_leader_epoch: 3,
            producer_id: 4_242,
            producer_epoch: 6,
            commit,
            coordinator_epoch: 11,
            timestamp: NOW,
            log_append_time: lat,
        });
        let set = RecordBatchDecoder::decode(&mut buf).unwrap();
        assert_eq!(set.records.len(), 1);
        let r = &set.records[0];
        assert!(r.transactional && r.control, "{r:?}");
        assert_eq!(r.offset, 77);
        assert_eq!(r.partition_leader_epoch, 3);
        assert_eq!(
            (r.producer_id, r.producer_epoch, r.sequence),
            (4_242, 6, -1)
        );
        assert_eq!(r.timestamp, NOW);
        let want = if lat {
            KTimestampType::LogAppend
        } else {
            KTimestampType::Creation
        };
        assert_eq!(r.timestamp_type, want);
        let kind: &[u8] = if commit { &[0, 0, 0, 1] } else { &[0, 0, 0, 0] };
        assert_eq!(r.key.as_deref(), Some(kind));
        assert_eq!(r.value.as_deref(), Some(&[0u8, 0, 0, 0, 0, 11][..]));
        assert!(r.headers.is_empty());
    }
}
