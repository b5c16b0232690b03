//! [`RecordBatchBuilder`]: builds v2 record batches, for tests, the demo, benchmarks and property
//! tests.

use bytes::Bytes;
use diskless_coordinator::{NO_PRODUCER_EPOCH, NO_PRODUCER_ID, NO_SEQUENCE, TimestampType};

use crate::batch::{
    Attributes, Compression, HEADER_LEN, LOG_OVERHEAD, MAGIC_OFFSET, MAGIC_V2, RecordBatch,
    update_crc,
};
use crate::compression::{CompressionError, compress};
use crate::records::{write_varint, write_varlong};

/// One record to put in a batch.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct NewRecord {
    /// The record's timestamp (ms); the batch stores it as a delta from the first record's.
    pub timestamp: i64,
    /// The key, or `None` for null.
    pub key: Option<Bytes>,
    /// The value, or `None` for null.
    pub value: Option<Bytes>,
    /// Headers: key and optional value.
    pub headers: Vec<(Bytes, Option<Bytes>)>,
}

/// Builds valid v2 record batches (and, with the override setters, deliberately invalid ones).
///
/// Defaults: base offset 0, partition leader epoch -1, no compression, CreateTime, no producer id
/// (-1/-1/-1), not transactional, not control.
///
/// ```
/// use diskless_core::{Compression, RecordBatchBuilder};
///
/// let batch = RecordBatchBuilder::new()
///     .compression(Compression::Zstd)
///     .producer(42, 0, 0)
///     .record(1_700_000_000_000, Some(b"key"), Some(b"value"))
///     .record(1_700_000_000_001, None, Some(b"value 2"))
///     .build()
///     .unwrap();
/// assert_eq!(batch.records_count(), 2);
/// assert_eq!(batch.last_sequence(), 1);
/// assert!(batch.crc_is_valid());
/// ```
#[derive(Clone, Debug)]
pub struct RecordBatchBuilder {
    base_offset: i64,
    partition_leader_epoch: i32,
    attributes: Attributes,
    producer_id: i64,
    producer_epoch: i16,
    base_sequence: i32,
    base_timestamp: Option<i64>,
    max_timestamp: Option<i64>,
    last_offset_delta: Option<i32>,
    records_count: Option<i32>,
    offset_deltas: Option<Vec<i32>>,
    records: Vec<NewRecord>,
}

impl Default for RecordBatchBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl RecordBatchBuilder {
    /// A builder with the defaults above and no records.
    pub fn new() -> Self {
        RecordBatchBuilder {
            base_offset: 0,
            partition_leader_epoch: -1,
            attributes: Attributes(0),
            producer_id: NO_PRODUCER_ID,
            producer_epoch: NO_PRODUCER_EPOCH,
            base_sequence: NO_SEQUENCE,
            base_timestamp: None,
            max_timestamp: None,
            last_offset_delta: None,
            records_count: None,
            offset_deltas: None,
            records: Vec::new(),
        }
    }

    /// Set `baseOffset` (clients send 0).
    pub fn base_offset(mut self, v: i64) -> Self {
        self.base_offset = v;
        self
    }

    /// Set `partitionLeaderEpoch`.
    pub fn partition_leader_epoch(mut self, v: i32) -> Self {
        self.partition_leader_epoch = v;
        self
    }

    /// Set the compression codec.
    pub fn compression(mut self, c: Compression) -> Self {
        self.attributes = self.attributes.with_compression(c);
        self
    }

    /// Set the timestamp type bit.
    pub fn timestamp_type(mut self, t: TimestampType) -> Self {
        self.attributes = self.attributes.with_timestamp_type(t);
        self
    }

    /// Set the transactional bit.
    pub fn transactional(mut self, on: bool) -> Self {
        self.attributes = self.attributes.with_transactional(on);
        self
    }

    /// Set the control bit.
    pub fn control(mut self, on: bool) -> Self {
        self.attributes = self.attributes.with_control(on);
        self
    }

    /// Set raw attributes (overrides codec and flags set so far).
    pub fn attributes(mut self, a: Attributes) -> Self {
        self.attributes = a;
        self
    }

    /// Set `producerId`, `producerEpoch` and `baseSequence`.
    pub fn producer(mut self, id: i64, epoch: i16, base_sequence: i32) -> Self {
        self.producer_id = id;
        self.producer_epoch = epoch;
        self.base_sequence = base_sequence;
        self
    }

    /// Override `baseTimestamp` (default: the first record's timestamp, or -1 without records). Record
    /// timestamp deltas are computed from it.
    pub fn base_timestamp(mut self, v: i64) -> Self {
        self.base_timestamp = Some(v);
        self
    }

    /// Override `maxTimestamp` (default: the largest record timestamp, or -1 without records).
    pub fn max_timestamp(mut self, v: i64) -> Self {
        self.max_timestamp = Some(v);
        self
    }

    /// Override `lastOffsetDelta` (default: record count - 1). For negative tests.
    pub fn last_offset_delta(mut self, v: i32) -> Self {
        self.last_offset_delta = Some(v);
        self
    }

    /// Override `recordsCount` (default: the number of records). For negative tests.
    pub fn records_count(mut self, v: i32) -> Self {
        self.records_count = Some(v);
        self
    }

    /// Override the records' offset deltas (default `0, 1, 2, ...`). For negative tests.
    pub fn offset_deltas(mut self, v: Vec<i32>) -> Self {
        self.offset_deltas = Some(v);
        self
    }

    /// Append a record with the given timestamp, key and value and no headers.
    pub fn record(self, timestamp: i64, key: Option<&[u8]>, value: Option<&[u8]>) -> Self {
        self.push(NewRecord {
            timestamp,
            key: key.map(Bytes::copy_from_slice),
            value: value.map(Bytes::copy_from_slice),
            headers: Vec::new(),
        })
    }

    /// Append a record.
    pub fn push(mut self, r: NewRecord) -> Self {
        self.records.push(r);
        self
    }

    /// The encoded, uncompressed records section.
    fn encode_records(&self, base_timestamp: i64) -> Vec<u8> {
        let mut out = Vec::new();
        let mut body = Vec::new();
        for (i, r) in self.records.iter().enumerate() {
            body.clear();
            body.push(0); // record attributes
            write_varlong(&mut body, r.timestamp.wrapping_sub(base_timestamp));
            let delta = self
                .offset_deltas
                .as_ref()
                .and_then(|d| d.get(i).copied())
                .unwrap_or(i as i32);
            write_varint(&mut body, delta);
            write_bytes(&mut body, r.key.as_deref());
            write_bytes(&mut body, r.value.as_deref());
            write_varint(&mut body, r.headers.len() as i32);
            for (k, v) in &r.headers {
                write_bytes(&mut body, Some(k));
                write_bytes(&mut body, v.as_deref());
            }
            write_varint(&mut out, body.len() as i32);
            out.extend_from_slice(&body);
        }
        out
    }

    /// Build the batch. Fails only if compression fails.
    pub fn build(&self) -> Result<RecordBatch, CompressionError> {
        let first_ts = self.records.first().map_or(-1, |r| r.timestamp);
        let base_timestamp = self.base_timestamp.unwrap_or(first_ts);
        let max_timestamp = self
            .max_timestamp
            .unwrap_or_else(|| self.records.iter().map(|r| r.timestamp).max().unwrap_or(-1));
        let n = self.records.len() as i32;
        let raw = self.encode_records(base_timestamp);
        let codec = self.attributes.compression().unwrap_or(Compression::None);
        let body = compress(codec, &raw)?;

        let mut buf = Vec::with_capacity(HEADER_LEN + body.len());
        buf.extend_from_slice(&self.base_offset.to_be_bytes());
        let batch_length = (HEADER_LEN - LOG_OVERHEAD + body.len()) as i32;
        buf.extend_from_slice(&batch_length.to_be_bytes());
        buf.extend_from_slice(&self.partition_leader_epoch.to_be_bytes());
        buf.push(MAGIC_V2 as u8);
        buf.extend_from_slice(&[0; 4]); // crc
        buf.extend_from_slice(&self.attributes.0.to_be_bytes());
        buf.extend_from_slice(&self.last_offset_delta.unwrap_or(n - 1).to_be_bytes());
        buf.extend_from_slice(&base_timestamp.to_be_bytes());
        buf.extend_from_slice(&max_timestamp.to_be_bytes());
        buf.extend_from_slice(&self.producer_id.to_be_bytes());
        buf.extend_from_slice(&self.producer_epoch.to_be_bytes());
        buf.extend_from_slice(&self.base_sequence.to_be_bytes());
        buf.extend_from_slice(&self.records_count.unwrap_or(n).to_be_bytes());
        debug_assert_eq!(buf.len(), HEADER_LEN);
        debug_assert_eq!(buf[MAGIC_OFFSET], 2);
        buf.extend_from_slice(&body);
        update_crc(&mut buf);
        RecordBatch::parse(Bytes::from(buf)).map_err(|e| CompressionError::Invalid {
            codec,
            message: format!("built batch does not frame: {e}"),
        })
    }
}

fn write_bytes(out: &mut Vec<u8>, b: Option<&[u8]>) {
    match b {
        Some(b) => {
            write_varint(out, b.len() as i32);
            out.extend_from_slice(b);
        }
        None => write_varint(out, -1),
    }
}
