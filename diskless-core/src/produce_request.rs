//! Produce requests (API key 0, versions 3 to 12) read straight from their frame, and their
//! answers encoded, for hosts whose own decoder copies record batches.
//!
//! A host's Kafka codec may copy every batch of a Produce request into a buffer of its own and
//! check its CRC before the library sees it; the library then validates the batch (CRC included)
//! and copies it into a WAL segment. Measured through Nisshi (tansu 0.6.0): ~35% more CPU per GB
//! produced than the example broker, whose decoder slices the request's buffer, and 0.89x-0.96x
//! its produce throughput on 2 cores (BENCHMARKS.md, "Nisshi: throughput"). [`ProduceRequest::parse`]
//! reads the request header and body and gives each partition's `records` as a slice of the frame
//! (no copy, no check: [`crate::WalWriter::append`] validates); [`encode_produce_response`] writes
//! the answer for the request's version. Versions 0 to 2 carry message sets of magic 0 and 1,
//! which diskless topics refuse, and version 13 names topics by id: a host passes those to its own
//! codec.
//!
//! Formats are Kafka's `ProduceRequest.json` / `ProduceResponse.json` and the request/response
//! headers (v1/v0 up to Produce v8, v2/v1 from v9, the flexible versions: compact strings, arrays
//! and bytes, tagged fields). Tagged fields of the request are skipped; the response carries none.
//! `diskless-core/tests/kafka_protocol.rs` checks both directions against the `kafka-protocol`
//! crate for every version; `fuzz/fuzz_targets/produce_request.rs` feeds arbitrary bytes.
//!
//! ```
//! use diskless_core::produce_request::{encode_produce_response, PartitionAnswer, ProduceRequest};
//!
//! // Produce v3, correlation id 9, client id "c", no transactional id, acks -1, timeout 30 s,
//! // topic "t", partition 0 with 3 bytes of records.
//! let mut frame = vec![0, 0, 0, 0];
//! frame.extend_from_slice(&[0, 0, 0, 3, 0, 0, 0, 9, 0, 1, b'c']);
//! frame.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0, 0, 0x75, 0x30]);
//! frame.extend_from_slice(&[0, 0, 0, 1, 0, 1, b't', 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 3, 1, 2, 3]);
//! let size = (frame.len() - 4) as u32;
//! frame[..4].copy_from_slice(&size.to_be_bytes());
//! let request = ProduceRequest::parse(bytes::Bytes::from(frame)).unwrap();
//! assert_eq!((request.api_version, request.correlation_id, request.acks), (3, 9, -1));
//! assert_eq!(request.topics[0].partitions[0].records.as_deref(), Some(&[1u8, 2, 3][..]));
//!
//! let answer = PartitionAnswer::new(0, 0).base_offset(42);
//! let response = encode_produce_response(&request, &[("t".to_string(), vec![answer])]);
//! assert_eq!(&response[4..8], &9i32.to_be_bytes()); // the correlation id, after the size
//! ```

use bytes::{BufMut, Bytes, BytesMut};

/// Produce's API key.
pub const PRODUCE_KEY: i16 = 0;
/// The oldest version [`ProduceRequest::parse`] reads.
pub const MIN_VERSION: i16 = 3;
/// The newest version [`ProduceRequest::parse`] reads.
pub const MAX_VERSION: i16 = 12;
/// The first flexible version (compact encodings, tagged fields).
const FIRST_FLEXIBLE: i16 = 9;

/// Why a frame is not a Produce request this module reads.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProduceRequestError {
    /// Not Produce, or a version outside [`MIN_VERSION`]..=[`MAX_VERSION`]: the host's own codec
    /// handles it.
    #[error(
        "not a Produce request of versions {MIN_VERSION} to {MAX_VERSION} (key {api_key}, version {api_version})"
    )]
    Unsupported {
        /// The request's API key.
        api_key: i16,
        /// Its version.
        api_version: i16,
    },
    /// The bytes end early, a length is negative where it may not be, or a string is not UTF-8.
    #[error("malformed Produce request: {0}")]
    Malformed(&'static str),
}

/// One partition's data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionData {
    /// The partition index.
    pub index: i32,
    /// Its records (a slice of the request's frame), or `None` when the request sent null.
    pub records: Option<Bytes>,
}

/// One topic's partitions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicData {
    /// The topic's name.
    pub name: String,
    /// Its partitions, in request order.
    pub partitions: Vec<PartitionData>,
}

/// A Produce request (header and body).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProduceRequest {
    /// The request's version ([`MIN_VERSION`]..=[`MAX_VERSION`]).
    pub api_version: i16,
    /// The correlation id the answer repeats.
    pub correlation_id: i32,
    /// The client id of the header.
    pub client_id: Option<String>,
    /// The transactional id, for a transactional producer.
    pub transactional_id: Option<String>,
    /// `acks` as sent (Kafka accepts -1, 0 and 1).
    pub acks: i16,
    /// The timeout in milliseconds.
    pub timeout_ms: i32,
    /// The topics, in request order.
    pub topics: Vec<TopicData>,
}

/// A cursor over the frame.
struct Reader {
    buf: Bytes,
    at: usize,
}

type Parsed<T> = Result<T, ProduceRequestError>;

fn short() -> ProduceRequestError {
    ProduceRequestError::Malformed("the request ends early")
}

impl Reader {
    fn take(&mut self, n: usize) -> Parsed<Bytes> {
        let end = self.at.checked_add(n).ok_or_else(short)?;
        if end > self.buf.len() {
            return Err(short());
        }
        let out = self.buf.slice(self.at..end);
        self.at = end;
        Ok(out)
    }

    fn array<const N: usize>(&mut self) -> Parsed<[u8; N]> {
        let b = self.take(N)?;
        let mut out = [0u8; N];
        out.copy_from_slice(&b);
        Ok(out)
    }

    fn i16(&mut self) -> Parsed<i16> {
        Ok(i16::from_be_bytes(self.array()?))
    }

    fn i32(&mut self) -> Parsed<i32> {
        Ok(i32::from_be_bytes(self.array()?))
    }

    fn uvarint(&mut self) -> Parsed<u32> {
        let mut value: u32 = 0;
        for shift in (0..35).step_by(7) {
            let [byte] = self.array::<1>()?;
            let bits = u32::from(byte & 0x7f);
            if shift == 28 && bits > 0x0f {
                return Err(ProduceRequestError::Malformed(
                    "an unsigned varint overflows",
                ));
            }
            value |= bits << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(ProduceRequestError::Malformed(
            "an unsigned varint is longer than 5 bytes",
        ))
    }

    /// A length: `i16`/`i32` as sent (non-flexible) or a compact length (`uvarint - 1`); `None`
    /// for null (-1).
    fn length(&mut self, compact: bool, wide: bool) -> Parsed<Option<usize>> {
        let n: i64 = if compact {
            i64::from(self.uvarint()?) - 1
        } else if wide {
            i64::from(self.i32()?)
        } else {
            i64::from(self.i16()?)
        };
        match n {
            -1 => Ok(None),
            n if n < 0 => Err(ProduceRequestError::Malformed("a negative length")),
            n => usize::try_from(n)
                .map(Some)
                .map_err(|_| ProduceRequestError::Malformed("a length too large")),
        }
    }

    fn nullable_string(&mut self, compact: bool) -> Parsed<Option<String>> {
        match self.length(compact, false)? {
            None => Ok(None),
            Some(n) => {
                let bytes = self.take(n)?;
                String::from_utf8(bytes.to_vec())
                    .map(Some)
                    .map_err(|_| ProduceRequestError::Malformed("a string is not UTF-8"))
            }
        }
    }

    fn string(&mut self, compact: bool) -> Parsed<String> {
        self.nullable_string(compact)?
            .ok_or(ProduceRequestError::Malformed(
                "a null string where one is required",
            ))
    }

    fn nullable_bytes(&mut self, compact: bool) -> Parsed<Option<Bytes>> {
        match self.length(compact, true)? {
            None => Ok(None),
            Some(n) => self.take(n).map(Some),
        }
    }

    /// An array's element count (null counts as empty, as Kafka reads a null array here).
    fn count(&mut self, compact: bool) -> Parsed<usize> {
        let n = self.length(compact, true)?.unwrap_or(0);
        // Each element takes at least one byte: a count above what is left is malformed, and
        // refusing it here bounds the allocation below.
        if n > self.buf.len().saturating_sub(self.at) {
            return Err(short());
        }
        Ok(n)
    }

    fn skip_tagged_fields(&mut self) -> Parsed<()> {
        let fields = self.uvarint()?;
        for _ in 0..fields {
            let _tag = self.uvarint()?;
            let size = self.uvarint()?;
            self.take(usize::try_from(size).map_err(|_| short())?)?;
        }
        Ok(())
    }
}

impl ProduceRequest {
    /// Reads a Produce request from its frame (the 4-byte size first, as
    /// `connection::RequestFrame::sized` gives it, feature `connection`). Bytes after the body are
    /// ignored, as Kafka ignores them.
    pub fn parse(frame: Bytes) -> Result<ProduceRequest, ProduceRequestError> {
        let mut r = Reader { buf: frame, at: 0 };
        let _size = r.i32()?;
        let api_key = r.i16()?;
        let api_version = r.i16()?;
        if api_key != PRODUCE_KEY || !(MIN_VERSION..=MAX_VERSION).contains(&api_version) {
            return Err(ProduceRequestError::Unsupported {
                api_key,
                api_version,
            });
        }
        let flexible = api_version >= FIRST_FLEXIBLE;
        let correlation_id = r.i32()?;
        // The header's client id is a non-compact nullable string in both header versions.
        let client_id = r.nullable_string(false)?;
        if flexible {
            r.skip_tagged_fields()?;
        }
        let transactional_id = r.nullable_string(flexible)?;
        let acks = r.i16()?;
        let timeout_ms = r.i32()?;
        let topic_count = r.count(flexible)?;
        let mut topics = Vec::with_capacity(topic_count);
        for _ in 0..topic_count {
            let name = r.string(flexible)?;
            let partition_count = r.count(flexible)?;
            let mut partitions = Vec::with_capacity(partition_count);
            for _ in 0..partition_count {
                let index = r.i32()?;
                let records = r.nullable_bytes(flexible)?;
                if flexible {
                    r.skip_tagged_fields()?;
                }
                partitions.push(PartitionData { index, records });
            }
            if flexible {
                r.skip_tagged_fields()?;
            }
            topics.push(TopicData { name, partitions });
        }
        if flexible {
            r.skip_tagged_fields()?;
        }
        Ok(ProduceRequest {
            api_version,
            correlation_id,
            client_id,
            transactional_id,
            acks,
            timeout_ms,
            topics,
        })
    }
}

/// One partition's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionAnswer {
    /// The partition index.
    pub index: i32,
    /// Kafka's error code (0: none).
    pub error_code: i16,
    /// The first offset given to the records, else -1.
    pub base_offset: i64,
    /// The log append time for a LogAppendTime topic, else -1.
    pub log_append_time_ms: i64,
    /// The partition's log start offset, else -1 (versions 5+).
    pub log_start_offset: i64,
    /// The records refused, by index in the batch, with a message (versions 8+).
    pub record_errors: Vec<(i32, Option<String>)>,
    /// A message for the error (versions 8+).
    pub error_message: Option<String>,
}

impl PartitionAnswer {
    /// An answer with `error_code` and nothing else known.
    pub fn new(index: i32, error_code: i16) -> Self {
        PartitionAnswer {
            index,
            error_code,
            base_offset: -1,
            log_append_time_ms: -1,
            log_start_offset: -1,
            record_errors: Vec::new(),
            error_message: None,
        }
    }

    /// With the base offset.
    pub fn base_offset(mut self, offset: i64) -> Self {
        self.base_offset = offset;
        self
    }

    /// An error answer with a message.
    pub fn error(index: i32, error_code: i16, message: impl Into<String>) -> Self {
        PartitionAnswer {
            error_message: Some(message.into()),
            ..PartitionAnswer::new(index, error_code)
        }
    }

    /// The answer the writer gave for partition `index` ([`crate::WalWriter::append`]): on
    /// success its offsets, on failure Kafka's code, message and the records refused (offsets
    /// -1, as Kafka answers a failed partition).
    pub fn from_response(index: i32, r: &crate::PartitionResponse) -> Self {
        let record_errors = r
            .record_errors
            .iter()
            .map(|e| (e.batch_index, Some(e.message.clone())))
            .collect();
        if !r.error.is_ok() {
            return PartitionAnswer {
                record_errors,
                ..PartitionAnswer::error(
                    index,
                    r.error.code(),
                    r.error_message.clone().unwrap_or_default(),
                )
            };
        }
        PartitionAnswer {
            index,
            error_code: 0,
            base_offset: r.base_offset,
            log_append_time_ms: r.log_append_time,
            log_start_offset: r.log_start_offset,
            record_errors,
            error_message: None,
        }
    }
}

/// A response writer for one version.
struct Writer {
    buf: BytesMut,
    flexible: bool,
}

impl Writer {
    fn uvarint(&mut self, mut v: u32) {
        while v >= 0x80 {
            // Truncation intended: the low 7 bits, with the continuation bit.
            self.buf.put_u8((v as u8 & 0x7f) | 0x80);
            v >>= 7;
        }
        self.buf.put_u8(v as u8);
    }

    /// An array or string length (`None`: null).
    fn length(&mut self, n: Option<usize>, wide: bool) {
        match (self.flexible, n) {
            (true, None) => self.uvarint(0),
            (true, Some(n)) => self.uvarint(u32::try_from(n).unwrap_or(u32::MAX - 1) + 1),
            (false, None) if wide => self.buf.put_i32(-1),
            (false, None) => self.buf.put_i16(-1),
            (false, Some(n)) if wide => self.buf.put_i32(i32::try_from(n).unwrap_or(i32::MAX)),
            (false, Some(n)) => self.buf.put_i16(i16::try_from(n).unwrap_or(i16::MAX)),
        }
    }

    fn nullable_string(&mut self, s: Option<&str>) {
        // Strings longer than a length can say are cut (never the case for Kafka's names).
        let s = s.map(|s| &s.as_bytes()[..s.len().min(i16::MAX as usize)]);
        self.length(s.map(<[u8]>::len), false);
        if let Some(s) = s {
            self.buf.put_slice(s);
        }
    }

    fn tagged_fields(&mut self) {
        if self.flexible {
            self.uvarint(0);
        }
    }
}

/// Encodes the answer to `request`: `topics` in the order given (each with its partitions'
/// answers), the size first, ready to write to the connection. Fields a version lacks are left
/// out; the answer carries no tagged fields (no leader hints) and a throttle time of 0.
pub fn encode_produce_response(
    request: &ProduceRequest,
    topics: &[(String, Vec<PartitionAnswer>)],
) -> Bytes {
    let version = request.api_version;
    let mut w = Writer {
        buf: BytesMut::with_capacity(64 + topics.len() * 64),
        flexible: version >= FIRST_FLEXIBLE,
    };
    w.buf.put_i32(0); // the size, set below
    w.buf.put_i32(request.correlation_id);
    w.tagged_fields(); // response header v1
    w.length(Some(topics.len()), true);
    for (name, partitions) in topics {
        w.nullable_string(Some(name));
        w.length(Some(partitions.len()), true);
        for p in partitions {
            w.buf.put_i32(p.index);
            w.buf.put_i16(p.error_code);
            w.buf.put_i64(p.base_offset);
            w.buf.put_i64(p.log_append_time_ms);
            if version >= 5 {
                w.buf.put_i64(p.log_start_offset);
            }
            if version >= 8 {
                w.length(Some(p.record_errors.len()), true);
                for (batch_index, message) in &p.record_errors {
                    w.buf.put_i32(*batch_index);
                    w.nullable_string(message.as_deref());
                    w.tagged_fields();
                }
                w.nullable_string(p.error_message.as_deref());
            }
            w.tagged_fields();
        }
        w.tagged_fields();
    }
    w.buf.put_i32(0); // throttle_time_ms
    w.tagged_fields();
    let size = i32::try_from(w.buf.len() - 4).unwrap_or(i32::MAX);
    w.buf[..4].copy_from_slice(&size.to_be_bytes());
    w.buf.freeze()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn other_requests_and_versions_are_left_to_the_host() {
        // ApiVersions v0.
        let frame = Bytes::from_static(&[0, 0, 0, 10, 0, 18, 0, 0, 0, 0, 0, 7, 0xff, 0xff]);
        assert_eq!(
            ProduceRequest::parse(frame),
            Err(ProduceRequestError::Unsupported {
                api_key: 18,
                api_version: 0
            })
        );
        for version in [0i16, 1, 2, 13] {
            let mut frame = vec![0, 0, 0, 10, 0, 0];
            frame.extend_from_slice(&version.to_be_bytes());
            frame.extend_from_slice(&[0, 0, 0, 7, 0xff, 0xff]);
            assert!(matches!(
                ProduceRequest::parse(Bytes::from(frame)),
                Err(ProduceRequestError::Unsupported { .. })
            ));
        }
    }

    #[test]
    fn truncated_and_hostile_lengths_are_malformed_not_panics() {
        // v9 header, then a topic count of 2^28 with nothing after it.
        let frame = Bytes::from_static(&[
            0, 0, 0, 20, 0, 0, 0, 9, 0, 0, 0, 1, 0xff, 0xff, 0, 0, 0, 1, 0, 0, 0, 0, 0x80, 0x80,
            0x80, 0x80, 0x01,
        ]);
        assert!(matches!(
            ProduceRequest::parse(frame.clone()),
            Err(ProduceRequestError::Malformed(_))
        ));
        for end in 0..frame.len() {
            assert!(ProduceRequest::parse(frame.slice(..end)).is_err());
        }
    }
}
