//! Fetch-path rewrites of a stored batch: the offsets the coordinator assigned, the partition leader
//! epoch, LogAppendTime, and Kafka's `maxTimestamp`, without copying the records.
//!
//! `baseOffset` and `partitionLeaderEpoch` lie before the CRC-covered range (bytes 21..end), so setting
//! them leaves the CRC valid. LogAppendTime changes the attributes (bit 3) and `maxTimestamp`, both
//! covered, so the CRC is recomputed: CRC-32C of the new header bytes 21..61, then continued over the
//! unchanged records with `crc32c_append` — the payload is read once and never copied.
//!
//! On a CreateTime topic Kafka's `LogValidator` sets a batch's `maxTimestamp` to the largest record
//! timestamp (`DefaultRecordBatch.setMaxTimestamp`, which leaves the batch alone when it already
//! holds that value); the writer stores the batch as sent and the coordinator keeps the records'
//! maximum, so the fetch path applies the same correction, recomputing the CRC only for a batch whose
//! producer wrote another value.

use bytes::{Buf, Bytes};
use diskless_coordinator::{BatchCoordinate, TimestampType};

use crate::batch::{
    ATTRIBUTES_OFFSET, BASE_OFFSET_OFFSET, CRC_OFFSET, HEADER_LEN, MAX_TIMESTAMP_OFFSET,
    PARTITION_LEADER_EPOCH_OFFSET, RecordBatch,
};

/// The rewrite to apply to a stored batch before serving it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchRewrite {
    /// The offset the coordinator assigned to the batch's first record.
    pub base_offset: i64,
    /// The partition leader epoch to report (diskless partitions: whatever the host broker uses).
    pub partition_leader_epoch: i32,
    /// For LogAppendTime partitions, the commit time: sets attribute bit 3 and `maxTimestamp`.
    pub log_append_time: Option<i64>,
    /// For CreateTime partitions, the batch's largest record timestamp: `maxTimestamp` is set to it
    /// when the stored header holds another value (as Kafka's validator does). Ignored with
    /// `log_append_time`.
    pub max_timestamp: Option<i64>,
}

impl BatchRewrite {
    /// The rewrite that serves a batch the coordinator placed at `coordinate`: its assigned base
    /// offset, its commit time as LogAppendTime when the partition uses LogAppendTime, else its
    /// records' largest timestamp as `maxTimestamp`.
    pub fn for_coordinate(coordinate: &BatchCoordinate, partition_leader_epoch: i32) -> Self {
        let log_append_time = coordinate.timestamp_type == TimestampType::LogAppendTime;
        BatchRewrite {
            base_offset: coordinate.base_offset,
            partition_leader_epoch,
            log_append_time: log_append_time.then_some(coordinate.log_append_time),
            max_timestamp: (!log_append_time).then_some(coordinate.max_timestamp),
        }
    }
}

/// A rewritten batch as two chunks: a fresh 61-byte header and the original records (shared, not
/// copied).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RewrittenBatch {
    header: Bytes,
    body: Bytes,
}

impl RewrittenBatch {
    /// The new header (61 bytes).
    pub fn header(&self) -> &Bytes {
        &self.header
    }

    /// The records, shared with the original batch.
    pub fn body(&self) -> &Bytes {
        &self.body
    }

    /// Total size in bytes.
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> usize {
        self.header.len() + self.body.len()
    }

    /// The two chunks, in order.
    pub fn chunks(&self) -> [Bytes; 2] {
        [self.header.clone(), self.body.clone()]
    }

    /// The two chunks, in order.
    pub fn into_chunks(self) -> [Bytes; 2] {
        [self.header, self.body]
    }

    /// The batch as one [`bytes::Buf`], without copying.
    pub fn into_buf(self) -> bytes::buf::Chain<Bytes, Bytes> {
        self.header.chain(self.body)
    }

    /// The batch as contiguous bytes (copies; for tests and small batches).
    pub fn to_bytes(&self) -> Bytes {
        let mut v = Vec::with_capacity(self.len());
        v.extend_from_slice(&self.header);
        v.extend_from_slice(&self.body);
        Bytes::from(v)
    }

    /// The rewritten batch as a [`RecordBatch`] (copies).
    pub fn to_record_batch(&self) -> RecordBatch {
        match RecordBatch::parse(self.to_bytes()) {
            Ok(b) => b,
            // The header comes from a parsed batch with only fixed-size fields changed.
            Err(e) => unreachable!("rewritten batch lost its framing: {e}"),
        }
    }
}

/// Apply `rewrite` to `batch`. The original bytes are not modified.
///
/// ```
/// use diskless_core::{rewrite_batch, BatchRewrite, RecordBatchBuilder};
///
/// let batch = RecordBatchBuilder::new().record(5, None, Some(b"v")).build().unwrap();
/// let out = rewrite_batch(&batch, &BatchRewrite {
///     base_offset: 100,
///     partition_leader_epoch: 3,
///     log_append_time: Some(9),
///     max_timestamp: None,
/// });
/// let served = out.to_record_batch();
/// assert_eq!((served.base_offset(), served.max_timestamp()), (100, 9));
/// assert!(served.crc_is_valid());
/// ```
pub fn rewrite_batch(batch: &RecordBatch, rewrite: &BatchRewrite) -> RewrittenBatch {
    rewrite_inner(batch, rewrite, false).0
}

/// The stored CRC of a batch did not match its bytes; serving it with a recomputed CRC would hide
/// the corruption from the consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("stored batch fails its CRC check (stored {stored:#010x}, computed {computed:#010x})")]
pub struct StoredCrcMismatch {
    /// The CRC in the stored header.
    pub stored: u32,
    /// The CRC of the stored bytes.
    pub computed: u32,
}

/// Like [`rewrite_batch`], but when the rewrite recomputes the CRC (LogAppendTime, or a corrected
/// `maxTimestamp`) it first checks the stored CRC, in the same single pass over the records: a
/// corrupted stored batch is refused instead of being served with a fresh, valid CRC. Otherwise the
/// stored CRC is kept, so the consumer's own check still sees any corruption, and nothing is
/// computed.
pub fn rewrite_batch_verified(
    batch: &RecordBatch,
    rewrite: &BatchRewrite,
) -> Result<RewrittenBatch, StoredCrcMismatch> {
    match rewrite_inner(batch, rewrite, true) {
        (out, None) => Ok(out),
        (_, Some(mismatch)) => Err(mismatch),
    }
}

/// The rewrite, and with `verify` whether the stored CRC failed (checked only when recomputed).
fn rewrite_inner(
    batch: &RecordBatch,
    rewrite: &BatchRewrite,
    verify: bool,
) -> (RewrittenBatch, Option<StoredCrcMismatch>) {
    let mut header = [0u8; HEADER_LEN];
    header.copy_from_slice(batch.header_bytes());
    header[BASE_OFFSET_OFFSET..BASE_OFFSET_OFFSET + 8]
        .copy_from_slice(&rewrite.base_offset.to_be_bytes());
    header[PARTITION_LEADER_EPOCH_OFFSET..PARTITION_LEADER_EPOCH_OFFSET + 4]
        .copy_from_slice(&rewrite.partition_leader_epoch.to_be_bytes());
    let body = batch.records_bytes();
    let mut mismatch = None;
    // The header fields to change inside the CRC-covered range, if any: LogAppendTime (bit 3 and
    // maxTimestamp), or a CreateTime maxTimestamp other than the stored one.
    let covered_change = match (rewrite.log_append_time, rewrite.max_timestamp) {
        (Some(t), _) => Some((
            batch
                .attributes()
                .with_timestamp_type(TimestampType::LogAppendTime),
            t,
        )),
        (None, Some(max)) if max != batch.max_timestamp() => Some((batch.attributes(), max)),
        _ => None,
    };
    if let Some((attrs, max)) = covered_change {
        // One pass over the records; the header parts are combined in (crc32c_combine).
        let body_crc = crc32c::crc32c(&body);
        if verify {
            let stored = crc32c::crc32c_combine(
                crc32c::crc32c(&batch.header_bytes()[ATTRIBUTES_OFFSET..]),
                body_crc,
                body.len(),
            );
            if stored != batch.crc() {
                mismatch = Some(StoredCrcMismatch {
                    stored: batch.crc(),
                    computed: stored,
                });
            }
        }
        header[ATTRIBUTES_OFFSET..ATTRIBUTES_OFFSET + 2].copy_from_slice(&attrs.0.to_be_bytes());
        header[MAX_TIMESTAMP_OFFSET..MAX_TIMESTAMP_OFFSET + 8].copy_from_slice(&max.to_be_bytes());
        let crc = crc32c::crc32c_combine(
            crc32c::crc32c(&header[ATTRIBUTES_OFFSET..]),
            body_crc,
            body.len(),
        );
        header[CRC_OFFSET..CRC_OFFSET + 4].copy_from_slice(&crc.to_be_bytes());
    }
    let out = RewrittenBatch {
        header: Bytes::copy_from_slice(&header),
        body,
    };
    (out, mismatch)
}

impl RecordBatch {
    /// Same as [`rewrite_batch`].
    pub fn rewrite(&self, rewrite: &BatchRewrite) -> RewrittenBatch {
        rewrite_batch(self, rewrite)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Compression, RecordBatchBuilder, verify_stored_batch};

    #[test]
    fn offsets_keep_crc_and_share_payload() {
        let b = RecordBatchBuilder::new()
            .compression(Compression::Gzip)
            .record(10, Some(b"k"), Some(b"v"))
            .record(11, None, Some(b"w"))
            .build()
            .unwrap();
        let out = b.rewrite(&BatchRewrite {
            base_offset: 1234,
            partition_leader_epoch: 7,
            log_append_time: None,
            max_timestamp: None,
        });
        assert_eq!(out.len(), b.len());
        // The body is a slice of the original allocation, not a copy.
        assert_eq!(out.body().as_ptr(), b.as_bytes()[HEADER_LEN..].as_ptr());
        let r = out.to_record_batch();
        assert_eq!(r.base_offset(), 1234);
        assert_eq!(r.last_offset(), 1235);
        assert_eq!(r.partition_leader_epoch(), 7);
        assert_eq!(r.crc(), b.crc());
        assert!(r.crc_is_valid());
        verify_stored_batch(&r).unwrap();
        assert_eq!(out.clone().into_buf().remaining(), b.len());
        let [h, body] = out.chunks();
        assert_eq!(h.len() + body.len(), b.len());
    }

    #[test]
    fn rewrite_for_coordinate() {
        let mut c = BatchCoordinate {
            object_key: "k".into(),
            object_size: 100,
            byte_offset: 1,
            byte_size: 99,
            base_offset: 40,
            last_offset: 41,
            base_timestamp: 1,
            max_timestamp: 2,
            timestamp_type: TimestampType::CreateTime,
            log_append_time: -1,
            producer_id: -1,
            producer_epoch: -1,
            base_sequence: -1,
            last_sequence: -1,
            control: None,
        };
        let r = BatchRewrite::for_coordinate(&c, 3);
        assert_eq!(
            (
                r.base_offset,
                r.partition_leader_epoch,
                r.log_append_time,
                r.max_timestamp
            ),
            (40, 3, None, Some(2))
        );
        c.timestamp_type = TimestampType::LogAppendTime;
        c.log_append_time = 77;
        let r = BatchRewrite::for_coordinate(&c, 3);
        assert_eq!((r.log_append_time, r.max_timestamp), (Some(77), None));
    }

    /// Kafka's `setMaxTimestamp`: a CreateTime batch's header gets the records' max timestamp; the
    /// CRC is recomputed only when the value changes, and a corrupted batch is refused then.
    #[test]
    fn create_time_max_timestamp_is_corrected_as_kafka_does() {
        let fix = BatchRewrite {
            base_offset: 5,
            partition_leader_epoch: 0,
            log_append_time: None,
            max_timestamp: Some(12),
        };
        for codec in Compression::ALL {
            let honest = RecordBatchBuilder::new()
                .compression(codec)
                .record(10, None, Some(b"v"))
                .record(12, None, Some(b"w"))
                .build()
                .unwrap();
            let same = rewrite_batch_verified(&honest, &fix)
                .unwrap()
                .to_record_batch();
            assert_eq!(same.crc(), honest.crc(), "{codec:?}: nothing to correct");
            let lying = RecordBatchBuilder::new()
                .compression(codec)
                .record(10, None, Some(b"v"))
                .record(12, None, Some(b"w"))
                .max_timestamp(i64::MAX)
                .build()
                .unwrap();
            let fixed = rewrite_batch_verified(&lying, &fix)
                .unwrap()
                .to_record_batch();
            assert!(fixed.crc_is_valid(), "{codec:?}");
            assert_eq!(fixed.max_timestamp(), 12);
            assert_eq!(fixed.timestamp_type(), TimestampType::CreateTime);
            assert_eq!(fixed.records_bytes(), lying.records_bytes());
            let mut corrupt = lying.as_bytes().to_vec();
            let last = corrupt.len() - 1;
            corrupt[last] ^= 0x40;
            let corrupt = RecordBatch::parse(Bytes::from(corrupt)).unwrap();
            assert!(
                rewrite_batch_verified(&corrupt, &fix).is_err(),
                "{codec:?}: a corrupt batch must not get a fresh CRC"
            );
        }
    }

    #[test]
    fn log_append_time_recomputes_crc() {
        for codec in Compression::ALL {
            let b = RecordBatchBuilder::new()
                .compression(codec)
                .producer(3, 1, 10)
                .record(10, Some(b"k"), Some(b"v"))
                .build()
                .unwrap();
            let out = b.rewrite(&BatchRewrite {
                base_offset: 99,
                partition_leader_epoch: 0,
                log_append_time: Some(555),
                max_timestamp: None,
            });
            let r = out.to_record_batch();
            assert!(r.crc_is_valid(), "{codec:?}");
            assert_ne!(r.crc(), b.crc());
            assert_eq!(r.timestamp_type(), TimestampType::LogAppendTime);
            assert_eq!(r.max_timestamp(), 555);
            assert_eq!(r.base_timestamp(), 10);
            assert_eq!(r.attributes().compression(), Some(codec));
            assert_eq!(r.producer_id(), 3);
            let v = verify_stored_batch(&r).unwrap();
            assert_eq!(v.record_count, 1);
        }
    }
}
