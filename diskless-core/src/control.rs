//! Transaction markers: the COMMIT / ABORT control batches of KIP-98, byte for byte as a Kafka
//! partition leader appends them.
//!
//! A diskless partition stores no marker bytes: a marker is a coordinator row (one offset, no
//! object), and the fetch path builds its batch from that row with [`end_txn_marker`] — no PUT per
//! marker, and the bytes are a pure function of the row, so every fetch serves the same CRC.
//! Kafka writes the same batch (`MemoryRecords.withEndTransactionMarker`): magic 2, no compression,
//! CreateTime (LogAppendTime on a LogAppendTime topic, stamped like any batch), transactional and
//! control bits, base sequence -1, one record whose key is the control record type
//! (`ControlRecordType`: version 0, type ABORT=0 / COMMIT=1) and whose value is the
//! `EndTransactionMarker` (version 0, coordinator epoch).
//!
//! [`parse_end_txn_marker`] reads a marker back (tests, checkers, a host's tooling); it accepts only
//! what [`end_txn_marker`] can produce and never panics on other bytes.
//!
//! ```
//! use diskless_core::control::{end_txn_marker, parse_end_txn_marker, MarkerBatch};
//!
//! let bytes = end_txn_marker(&MarkerBatch {
//!     base_offset: 42,
//!     partition_leader_epoch: 0,
//!     producer_id: 7,
//!     producer_epoch: 3,
//!     commit: true,
//!     coordinator_epoch: 5,
//!     timestamp: 1_700_000_000_000,
//!     log_append_time: false,
//! });
//! assert_eq!(bytes.len(), diskless_core::control::MARKER_BATCH_LEN);
//! let marker = parse_end_txn_marker(&bytes).unwrap();
//! assert!(marker.commit);
//! assert_eq!((marker.producer_id, marker.producer_epoch, marker.coordinator_epoch), (7, 3, 5));
//! ```

use bytes::{BufMut, Bytes, BytesMut};

use crate::batch::{
    ATTRIBUTES_OFFSET, CONTROL_MASK, CRC_OFFSET, HEADER_LEN, LOG_OVERHEAD, MAGIC_V2, RecordBatch,
    TIMESTAMP_TYPE_MASK, TRANSACTIONAL_MASK,
};

/// The size of a marker batch: the 61-byte header and its one 17-byte record.
pub const MARKER_BATCH_LEN: usize = HEADER_LEN + MARKER_RECORD_LEN;

/// The marker's record: length varint (1), attributes (1), timestamp and offset deltas (1 + 1),
/// key length (1) + key (4), value length (1) + value (6), header count (1).
const MARKER_RECORD_LEN: usize = 17;

/// `ControlRecordType.ABORT`.
pub const CONTROL_TYPE_ABORT: i16 = 0;
/// `ControlRecordType.COMMIT`.
pub const CONTROL_TYPE_COMMIT: i16 = 1;

/// What a marker batch is built from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MarkerBatch {
    /// The marker's offset (it takes one offset of the partition).
    pub base_offset: i64,
    /// The partition leader epoch to report.
    pub partition_leader_epoch: i32,
    /// The producer whose transaction the marker ends.
    pub producer_id: i64,
    /// Its epoch.
    pub producer_epoch: i16,
    /// COMMIT (`true`) or ABORT.
    pub commit: bool,
    /// The transaction coordinator's epoch (`EndTransactionMarker.coordinatorEpoch`).
    pub coordinator_epoch: i32,
    /// The batch's base and max timestamp: when the coordinator appended the marker.
    pub timestamp: i64,
    /// The topic uses LogAppendTime: attribute bit 3 is set, as Kafka's validator sets it on every
    /// batch of such a topic.
    pub log_append_time: bool,
}

/// The 78 bytes of a marker batch, CRC included.
pub fn end_txn_marker(m: &MarkerBatch) -> Bytes {
    let mut b = BytesMut::with_capacity(MARKER_BATCH_LEN);
    b.put_i64(m.base_offset);
    // batchLength: everything after the length field.
    b.put_i32((MARKER_BATCH_LEN - LOG_OVERHEAD) as i32);
    b.put_i32(m.partition_leader_epoch);
    b.put_i8(MAGIC_V2);
    b.put_u32(0); // CRC, below
    let mut attributes = TRANSACTIONAL_MASK | CONTROL_MASK;
    if m.log_append_time {
        attributes |= TIMESTAMP_TYPE_MASK;
    }
    b.put_i16(attributes);
    b.put_i32(0); // lastOffsetDelta
    b.put_i64(m.timestamp); // baseTimestamp
    b.put_i64(m.timestamp); // maxTimestamp
    b.put_i64(m.producer_id);
    b.put_i16(m.producer_epoch);
    b.put_i32(-1); // baseSequence: NO_SEQUENCE
    b.put_i32(1); // recordsCount
    // The record (zigzag varints; every value here fits one byte).
    b.put_u8(zigzag_byte((MARKER_RECORD_LEN - 1) as i8)); // length of what follows
    b.put_u8(0); // attributes
    b.put_u8(0); // timestampDelta
    b.put_u8(0); // offsetDelta
    b.put_u8(zigzag_byte(4)); // key length
    b.put_i16(0); // ControlRecordType version
    b.put_i16(if m.commit {
        CONTROL_TYPE_COMMIT
    } else {
        CONTROL_TYPE_ABORT
    });
    b.put_u8(zigzag_byte(6)); // value length
    b.put_i16(0); // EndTransactionMarker version
    b.put_i32(m.coordinator_epoch);
    b.put_u8(0); // header count
    debug_assert_eq!(b.len(), MARKER_BATCH_LEN);
    let crc = crc32c::crc32c(&b[ATTRIBUTES_OFFSET..]);
    b[CRC_OFFSET..CRC_OFFSET + 4].copy_from_slice(&crc.to_be_bytes());
    b.freeze()
}

/// A one-byte zigzag varint of a small value (−64..=63).
fn zigzag_byte(v: i8) -> u8 {
    ((v << 1) ^ (v >> 7)) as u8
}

impl ParsedMarker {
    /// What [`end_txn_marker`] builds this marker from (it rebuilds the same bytes).
    pub fn to_batch(&self) -> MarkerBatch {
        MarkerBatch {
            base_offset: self.base_offset,
            partition_leader_epoch: self.partition_leader_epoch,
            producer_id: self.producer_id,
            producer_epoch: self.producer_epoch,
            commit: self.commit,
            coordinator_epoch: self.coordinator_epoch,
            timestamp: self.timestamp,
            log_append_time: self.log_append_time,
        }
    }
}

/// A marker read back by [`parse_end_txn_marker`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParsedMarker {
    /// The batch's base offset.
    pub base_offset: i64,
    /// The partition leader epoch.
    pub partition_leader_epoch: i32,
    /// The LogAppendTime attribute bit.
    pub log_append_time: bool,
    /// COMMIT (`true`) or ABORT.
    pub commit: bool,
    /// The producer.
    pub producer_id: i64,
    /// Its epoch.
    pub producer_epoch: i16,
    /// The transaction coordinator's epoch.
    pub coordinator_epoch: i32,
    /// The batch timestamp.
    pub timestamp: i64,
}

/// Why bytes are not a marker batch as [`end_txn_marker`] writes it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MarkerError {
    /// Not exactly one marker batch long.
    #[error("a marker batch is {MARKER_BATCH_LEN} bytes, got {0}")]
    Length(usize),
    /// The header or the record differs from a marker's.
    #[error("not a transaction marker: {0}")]
    NotAMarker(&'static str),
    /// The CRC does not match.
    #[error("marker CRC mismatch")]
    Crc,
}

/// Reads a marker batch (exactly [`MARKER_BATCH_LEN`] bytes); any other input is an error.
pub fn parse_end_txn_marker(b: &[u8]) -> Result<ParsedMarker, MarkerError> {
    if b.len() != MARKER_BATCH_LEN {
        return Err(MarkerError::Length(b.len()));
    }
    // The header through the batch view every parser here uses (framing: batch length and magic).
    let batch = RecordBatch::parse(Bytes::copy_from_slice(b))
        .map_err(|_| MarkerError::NotAMarker("batch length or magic"))?;
    if !batch.crc_is_valid() {
        return Err(MarkerError::Crc);
    }
    let attributes = batch.attributes().0;
    if attributes & !TIMESTAMP_TYPE_MASK != TRANSACTIONAL_MASK | CONTROL_MASK {
        return Err(MarkerError::NotAMarker("attributes"));
    }
    if batch.last_offset_delta() != 0
        || batch.base_sequence() != -1
        || batch.records_count() != 1
        || batch.base_timestamp() != batch.max_timestamp()
    {
        return Err(MarkerError::NotAMarker("header fields"));
    }
    let record = &b[HEADER_LEN..];
    let expected_prefix = [
        zigzag_byte((MARKER_RECORD_LEN - 1) as i8),
        0,
        0,
        0,
        zigzag_byte(4),
        0,
        0,
    ];
    if record[..7] != expected_prefix
        || record[9] != zigzag_byte(6)
        || record[10..12] != [0, 0]
        || record[16] != 0
    {
        return Err(MarkerError::NotAMarker("control record"));
    }
    let commit = match i16::from_be_bytes([record[7], record[8]]) {
        CONTROL_TYPE_COMMIT => true,
        CONTROL_TYPE_ABORT => false,
        _ => return Err(MarkerError::NotAMarker("control record type")),
    };
    Ok(ParsedMarker {
        base_offset: batch.base_offset(),
        partition_leader_epoch: batch.partition_leader_epoch(),
        log_append_time: attributes & TIMESTAMP_TYPE_MASK != 0,
        commit,
        producer_id: batch.producer_id(),
        producer_epoch: batch.producer_epoch(),
        coordinator_epoch: i32::from_be_bytes([record[12], record[13], record[14], record[15]]),
        timestamp: batch.base_timestamp(),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn marker(commit: bool, log_append_time: bool) -> MarkerBatch {
        MarkerBatch {
            base_offset: 1_000,
            partition_leader_epoch: 4,
            producer_id: 123_456,
            producer_epoch: 9,
            commit,
            coordinator_epoch: 17,
            timestamp: 1_700_000_000_123,
            log_append_time,
        }
    }

    #[test]
    fn the_layout_is_kafkas() {
        let b = end_txn_marker(&marker(true, false));
        assert_eq!(b.len(), 78);
        assert_eq!(&b[8..12], &66i32.to_be_bytes(), "batchLength");
        assert_eq!(&b[21..23], &[0x00, 0x30], "transactional + control");
        assert_eq!(&b[53..57], &(-1i32).to_be_bytes(), "baseSequence");
        assert_eq!(
            &b[61..],
            &[0x20, 0, 0, 0, 0x08, 0, 0, 0, 1, 0x0c, 0, 0, 0, 0, 0, 17, 0][..],
            "the control record: COMMIT key, EndTransactionMarker value"
        );
        let abort = end_txn_marker(&marker(false, true));
        assert_eq!(&abort[21..23], &[0x00, 0x38], "LogAppendTime bit");
        assert_eq!(&abort[66..70], &[0, 0, 0, 0], "ABORT key");
    }

    #[test]
    fn our_own_batch_parser_accepts_it_with_a_valid_crc() {
        for (commit, lat) in [(true, false), (false, false), (true, true)] {
            let b = end_txn_marker(&marker(commit, lat));
            let batch = RecordBatch::parse(b.clone()).unwrap();
            assert!(batch.crc_is_valid());
            assert_eq!(batch.base_offset(), 1_000);
            assert_eq!(batch.last_offset(), 1_000);
            assert_eq!(batch.records_count(), 1);
            assert!(batch.attributes().is_control() && batch.attributes().is_transactional());
            let parsed = parse_end_txn_marker(&b).unwrap();
            assert_eq!(parsed.commit, commit);
            assert_eq!(parsed.coordinator_epoch, 17);
            assert_eq!(parsed.producer_id, 123_456);
            assert_eq!(parsed.producer_epoch, 9);
            assert_eq!(parsed.timestamp, 1_700_000_000_123);
        }
    }

    #[test]
    fn the_parser_refuses_anything_else() {
        let good = end_txn_marker(&marker(true, false)).to_vec();
        assert!(parse_end_txn_marker(&good[..77]).is_err());
        assert!(parse_end_txn_marker(&[good.clone(), vec![0]].concat()).is_err());
        for at in 0..good.len() {
            let mut bad = good.clone();
            bad[at] ^= 0x01;
            // Outside the CRC only the offset and the leader epoch may change; inside it every
            // flip fails the CRC.
            let free = (0..8).contains(&at) || (12..16).contains(&at);
            assert_eq!(
                parse_end_txn_marker(&bad).is_ok(),
                free,
                "flip at byte {at}"
            );
            // With the CRC recomputed, only the producer fields, the control type's low byte
            // (COMMIT <-> ABORT) and the coordinator epoch may change.
            if at >= ATTRIBUTES_OFFSET {
                crate::batch::update_crc(&mut bad);
                let free = (43..53).contains(&at) || at == 69 || (73..77).contains(&at);
                assert_eq!(
                    parse_end_txn_marker(&bad).is_ok(),
                    free,
                    "flip at byte {at} (CRC fixed)"
                );
            }
        }
    }
}
