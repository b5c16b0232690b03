//! Record-level parsing of the (decompressed) records section of a v2 batch.
//!
//! Each record is:
//!
//! ```text
//! length: varint            (bytes that follow)
//! attributes: int8
//! timestampDelta: varlong
//! offsetDelta: varint
//! keyLength: varint         (-1 = null)
//! key: byte[keyLength]
//! valueLength: varint       (-1 = null)
//! value: byte[valueLength]
//! headerCount: varint
//! headers: [headerKeyLength: varint, headerKey, headerValueLength: varint (-1 = null), headerValue]
//! ```
//!
//! Varints are zigzag-encoded as in protobuf. The parser never panics and never allocates: it hands
//! out [`Record`] views borrowing the input.

/// Why a record could not be parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RecordErrorKind {
    /// The bytes end inside a record (or inside its length).
    #[error("record is truncated")]
    Truncated,
    /// A varint has more than 5 bytes or a varlong more than 10.
    #[error("varint is too long")]
    VarintTooLong,
    /// A record length below the minimum or a negative header count / header key length.
    #[error("invalid length or count field")]
    InvalidLength,
    /// The fields of a record do not fill exactly the declared record length.
    #[error("record length does not match its fields")]
    SizeMismatch,
    /// Bytes are left after `recordsCount` records.
    #[error("bytes left over after the declared number of records")]
    TrailingBytes,
}

/// A record that failed to parse, and its index in the batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("invalid record {index}: {kind}")]
pub struct RecordError {
    /// Index of the record in the batch (0-based); for [`RecordErrorKind::TrailingBytes`] the count.
    pub index: usize,
    /// What went wrong.
    pub kind: RecordErrorKind,
}

/// Decode a zigzag varint (i32) at `*pos`, advancing it.
#[inline]
pub fn read_varint(buf: &[u8], pos: &mut usize) -> Result<i32, RecordErrorKind> {
    // Most fields of a record (attributes aside: offset delta, key length, header count, small
    // timestamp deltas) fit in one byte: decode those without the loop.
    if let Some(&b) = buf.get(*pos)
        && b & 0x80 == 0
    {
        *pos += 1;
        let raw = u32::from(b);
        return Ok(((raw >> 1) as i32) ^ -((raw & 1) as i32));
    }
    read_varint_long(buf, pos)
}

/// [`read_varint`] of a varint longer than one byte (or of no byte at all).
fn read_varint_long(buf: &[u8], pos: &mut usize) -> Result<i32, RecordErrorKind> {
    let mut raw: u32 = 0;
    let mut shift = 0u32;
    loop {
        let Some(&b) = buf.get(*pos) else {
            return Err(RecordErrorKind::Truncated);
        };
        *pos += 1;
        raw |= u32::from(b & 0x7f).wrapping_shl(shift);
        if b & 0x80 == 0 {
            break;
        }
        shift += 7;
        if shift > 28 {
            return Err(RecordErrorKind::VarintTooLong);
        }
    }
    Ok(((raw >> 1) as i32) ^ -((raw & 1) as i32))
}

/// Decode a zigzag varlong (i64) at `*pos`, advancing it.
#[inline]
pub fn read_varlong(buf: &[u8], pos: &mut usize) -> Result<i64, RecordErrorKind> {
    // One byte: timestamp deltas below 64 ms (every record of a batch stamped within it).
    if let Some(&b) = buf.get(*pos)
        && b & 0x80 == 0
    {
        *pos += 1;
        let raw = u64::from(b);
        return Ok(((raw >> 1) as i64) ^ -((raw & 1) as i64));
    }
    read_varlong_long(buf, pos)
}

/// [`read_varlong`] of a varlong longer than one byte (or of no byte at all).
fn read_varlong_long(buf: &[u8], pos: &mut usize) -> Result<i64, RecordErrorKind> {
    let mut raw: u64 = 0;
    let mut shift = 0u32;
    loop {
        let Some(&b) = buf.get(*pos) else {
            return Err(RecordErrorKind::Truncated);
        };
        *pos += 1;
        raw |= u64::from(b & 0x7f).wrapping_shl(shift);
        if b & 0x80 == 0 {
            break;
        }
        shift += 7;
        if shift > 63 {
            return Err(RecordErrorKind::VarintTooLong);
        }
    }
    Ok(((raw >> 1) as i64) ^ -((raw & 1) as i64))
}

/// Append a zigzag varint.
pub fn write_varint(out: &mut Vec<u8>, v: i32) {
    write_unsigned(out, ((v << 1) ^ (v >> 31)) as u32 as u64);
}

/// Append a zigzag varlong.
pub fn write_varlong(out: &mut Vec<u8>, v: i64) {
    write_unsigned(out, ((v << 1) ^ (v >> 63)) as u64);
}

fn write_unsigned(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// The encoded size of a zigzag varint.
pub fn varint_len(v: i32) -> usize {
    let mut z = ((v << 1) ^ (v >> 31)) as u32;
    let mut n = 1;
    while z >= 0x80 {
        z >>= 7;
        n += 1;
    }
    n
}

/// Read a length-prefixed optional byte field (negative length = null, as Kafka reads it).
#[inline]
fn read_nullable<'a>(buf: &'a [u8], pos: &mut usize) -> Result<Option<&'a [u8]>, RecordErrorKind> {
    let len = read_varint(buf, pos)?;
    if len < 0 {
        return Ok(None);
    }
    let end = pos
        .checked_add(len as usize)
        .filter(|&e| e <= buf.len())
        .ok_or(RecordErrorKind::Truncated)?;
    let s = &buf[*pos..end];
    *pos = end;
    Ok(Some(s))
}

/// One record, borrowing the records bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record<'a> {
    /// The record attributes (unused by v2, kept as sent).
    pub attributes: i8,
    /// Delta from the batch's `baseTimestamp`.
    pub timestamp_delta: i64,
    /// Delta from the batch's `baseOffset`.
    pub offset_delta: i32,
    /// The key, or `None` for null.
    pub key: Option<&'a [u8]>,
    /// The value, or `None` for null.
    pub value: Option<&'a [u8]>,
    header_count: usize,
    headers: &'a [u8],
    /// The record's encoded size, length prefix included.
    pub size_in_bytes: usize,
}

impl<'a> Record<'a> {
    /// The number of headers.
    pub fn header_count(&self) -> usize {
        self.header_count
    }

    /// The headers as `(key, value)` pairs (a `None` value is null). Already validated by the parser.
    pub fn headers(&self) -> HeaderIter<'a> {
        HeaderIter {
            buf: self.headers,
            pos: 0,
            left: self.header_count,
        }
    }

    /// The record's timestamp for a batch with the given `baseTimestamp` (CreateTime).
    pub fn timestamp(&self, base_timestamp: i64) -> i64 {
        base_timestamp.wrapping_add(self.timestamp_delta)
    }
}

/// Iterator over the headers of a [`Record`].
#[derive(Debug, Clone)]
pub struct HeaderIter<'a> {
    buf: &'a [u8],
    pos: usize,
    left: usize,
}

impl<'a> Iterator for HeaderIter<'a> {
    type Item = (&'a [u8], Option<&'a [u8]>);

    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        // The parser validated these bytes; on anything unexpected stop instead of panicking.
        let key = read_nullable(self.buf, &mut self.pos).ok()??;
        let value = read_nullable(self.buf, &mut self.pos).ok()?;
        Some((key, value))
    }
}

/// Parse one record at the start of `buf`, returning it and the bytes it used.
pub fn parse_record(buf: &[u8]) -> Result<Record<'_>, RecordErrorKind> {
    let mut pos = 0usize;
    let len = read_varint(buf, &mut pos)?;
    if len < 0 {
        return Err(RecordErrorKind::InvalidLength);
    }
    let start = pos;
    let end = start
        .checked_add(len as usize)
        .filter(|&e| e <= buf.len())
        .ok_or(RecordErrorKind::Truncated)?;
    // Parse inside the declared body only, as Kafka does.
    let body = &buf[..end];
    let attributes = *body.get(pos).ok_or(RecordErrorKind::SizeMismatch)? as i8;
    pos += 1;
    let timestamp_delta = read_varlong(body, &mut pos).map_err(in_body)?;
    let offset_delta = read_varint(body, &mut pos).map_err(in_body)?;
    let key = read_nullable(body, &mut pos).map_err(in_body)?;
    let value = read_nullable(body, &mut pos).map_err(in_body)?;
    let header_count = read_varint(body, &mut pos).map_err(in_body)?;
    if header_count < 0 {
        return Err(RecordErrorKind::InvalidLength);
    }
    let headers_start = pos;
    for _ in 0..header_count {
        let klen = read_varint(body, &mut pos).map_err(in_body)?;
        if klen < 0 {
            return Err(RecordErrorKind::InvalidLength);
        }
        pos = pos
            .checked_add(klen as usize)
            .filter(|&e| e <= body.len())
            .ok_or(RecordErrorKind::SizeMismatch)?;
        read_nullable(body, &mut pos).map_err(in_body)?;
    }
    if pos != end {
        return Err(RecordErrorKind::SizeMismatch);
    }
    Ok(Record {
        attributes,
        timestamp_delta,
        offset_delta,
        key,
        value,
        header_count: header_count as usize,
        headers: &body[headers_start..end],
        size_in_bytes: end,
    })
}

/// Inside a record body, running out of bytes means the declared length was too small.
fn in_body(k: RecordErrorKind) -> RecordErrorKind {
    match k {
        RecordErrorKind::Truncated => RecordErrorKind::SizeMismatch,
        other => other,
    }
}

/// Iterator over exactly `count` records of a records section; yields an error (and then stops) on
/// the first bad record, on missing records, or on bytes left over after the last one.
///
/// ```
/// use diskless_core::{RecordBatchBuilder, records::RecordIter};
///
/// let batch = RecordBatchBuilder::new()
///     .record(5, Some(b"k"), Some(b"v"))
///     .build()
///     .unwrap();
/// let records = batch.records_bytes();
/// let all: Vec<_> = RecordIter::new(&records, 1).collect::<Result<_, _>>().unwrap();
/// assert_eq!(all[0].key, Some(&b"k"[..]));
/// ```
#[derive(Debug, Clone)]
pub struct RecordIter<'a> {
    buf: &'a [u8],
    pos: usize,
    index: usize,
    count: usize,
    done: bool,
}

impl<'a> RecordIter<'a> {
    /// Iterate over `count` records in `buf`.
    pub fn new(buf: &'a [u8], count: usize) -> Self {
        RecordIter {
            buf,
            pos: 0,
            index: 0,
            count,
            done: false,
        }
    }
}

impl<'a> Iterator for RecordIter<'a> {
    type Item = Result<Record<'a>, RecordError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        if self.index == self.count {
            self.done = true;
            if self.pos != self.buf.len() {
                return Some(Err(RecordError {
                    index: self.index,
                    kind: RecordErrorKind::TrailingBytes,
                }));
            }
            return None;
        }
        let rest = &self.buf[self.pos..];
        match parse_record(rest) {
            Ok(r) => {
                self.pos += r.size_in_bytes;
                self.index += 1;
                Some(Ok(r))
            }
            Err(kind) => {
                self.done = true;
                Some(Err(RecordError {
                    index: self.index,
                    kind,
                }))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_round_trip() {
        for v in [0, 1, -1, 63, -64, 64, 300, -300, i32::MAX, i32::MIN] {
            let mut out = Vec::new();
            write_varint(&mut out, v);
            assert_eq!(out.len(), varint_len(v));
            let mut pos = 0;
            assert_eq!(read_varint(&out, &mut pos), Ok(v));
            assert_eq!(pos, out.len());
        }
        for v in [0i64, -1, 1 << 40, i64::MAX, i64::MIN] {
            let mut out = Vec::new();
            write_varlong(&mut out, v);
            let mut pos = 0;
            assert_eq!(read_varlong(&out, &mut pos), Ok(v));
        }
        let mut pos = 0;
        assert_eq!(
            read_varint(&[0x80, 0x80, 0x80, 0x80, 0x80, 0x01], &mut pos),
            Err(RecordErrorKind::VarintTooLong)
        );
        let mut pos = 0;
        assert_eq!(
            read_varint(&[0x80, 0x80], &mut pos),
            Err(RecordErrorKind::Truncated)
        );
        let mut pos = 0;
        assert_eq!(
            read_varlong(&[0xff; 11], &mut pos),
            Err(RecordErrorKind::VarintTooLong)
        );
    }

    #[test]
    fn one_byte_fast_path_agrees_with_the_loop() {
        for b in 0u8..=0xff {
            // At a non-zero position, followed by a byte, so that only one byte may be taken.
            let buf = [0xaa, b, 0x01];
            let (mut fast, mut slow) = (1, 1);
            assert_eq!(
                read_varint(&buf, &mut fast),
                read_varint_long(&buf, &mut slow)
            );
            assert_eq!(fast, slow);
            let (mut fast, mut slow) = (1, 1);
            assert_eq!(
                read_varlong(&buf, &mut fast),
                read_varlong_long(&buf, &mut slow)
            );
            assert_eq!(fast, slow);
        }
        for v in [63i64, -64, 64, -65] {
            let mut out = Vec::new();
            write_varlong(&mut out, v);
            let mut pos = 0;
            assert_eq!(read_varlong(&out, &mut pos), Ok(v));
            assert_eq!(pos, out.len());
        }
        let mut pos = 0;
        assert_eq!(read_varint(&[], &mut pos), Err(RecordErrorKind::Truncated));
        assert_eq!(read_varlong(&[], &mut pos), Err(RecordErrorKind::Truncated));
        assert_eq!(pos, 0);
    }

    fn encode(
        ts: i64,
        off: i32,
        key: Option<&[u8]>,
        headers: &[(&[u8], Option<&[u8]>)],
    ) -> Vec<u8> {
        let mut body = vec![0u8];
        write_varlong(&mut body, ts);
        write_varint(&mut body, off);
        match key {
            Some(k) => {
                write_varint(&mut body, k.len() as i32);
                body.extend_from_slice(k);
            }
            None => write_varint(&mut body, -1),
        }
        write_varint(&mut body, 1);
        body.push(b'v');
        write_varint(&mut body, headers.len() as i32);
        for (k, v) in headers {
            write_varint(&mut body, k.len() as i32);
            body.extend_from_slice(k);
            match v {
                Some(v) => {
                    write_varint(&mut body, v.len() as i32);
                    body.extend_from_slice(v);
                }
                None => write_varint(&mut body, -1),
            }
        }
        let mut out = Vec::new();
        write_varint(&mut out, body.len() as i32);
        out.extend_from_slice(&body);
        out
    }

    #[test]
    fn parses_records_and_headers() {
        let mut buf = encode(3, 0, Some(b"key"), &[(b"h1", Some(b"x")), (b"h2", None)]);
        buf.extend(encode(-2, 1, None, &[]));
        let recs: Vec<_> = RecordIter::new(&buf, 2).collect::<Result<_, _>>().unwrap();
        assert_eq!(recs.len(), 2);
        assert_eq!(recs[0].timestamp_delta, 3);
        assert_eq!(recs[0].key, Some(&b"key"[..]));
        assert_eq!(recs[0].value, Some(&b"v"[..]));
        let hs: Vec<_> = recs[0].headers().collect();
        assert_eq!(hs, vec![(&b"h1"[..], Some(&b"x"[..])), (&b"h2"[..], None)]);
        assert_eq!(recs[1].offset_delta, 1);
        assert_eq!(recs[1].key, None);
        assert_eq!(recs[1].timestamp(100), 98);
    }

    #[test]
    fn count_mismatch_and_garbage() {
        let mut buf = encode(0, 0, None, &[]);
        buf.extend(encode(0, 1, None, &[]));
        // Too few declared: bytes left over.
        let r: Vec<_> = RecordIter::new(&buf, 1).collect();
        assert_eq!(
            r[1],
            Err(RecordError {
                index: 1,
                kind: RecordErrorKind::TrailingBytes
            })
        );
        // Too many declared: truncated.
        let r: Vec<_> = RecordIter::new(&buf, 3).collect();
        assert_eq!(
            r[2],
            Err(RecordError {
                index: 2,
                kind: RecordErrorKind::Truncated
            })
        );
        assert_eq!(r.len(), 3);
        // Length prefix too large for its fields.
        let mut bad = encode(0, 0, None, &[]);
        bad[0] += 2;
        bad.extend([0, 0]);
        assert_eq!(parse_record(&bad), Err(RecordErrorKind::SizeMismatch));
        // Negative header count.
        let mut body = vec![0u8, 0, 0, 1, 1];
        write_varint(&mut body, -1);
        let mut rec = Vec::new();
        write_varint(&mut rec, body.len() as i32);
        rec.extend(body);
        assert_eq!(parse_record(&rec), Err(RecordErrorKind::InvalidLength));
        // Negative record length.
        assert_eq!(parse_record(&[1]), Err(RecordErrorKind::InvalidLength));
    }
}
