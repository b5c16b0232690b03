//! Compression codecs of Kafka record batches, with a bound on the decompressed size.
//!
//! Formats are Kafka's: gzip (any number of members), Snappy in the xerial-java framing Kafka writes
//! (and raw Snappy, which Kafka's reader accepts too), LZ4 frames, Zstandard frames. The codecs are
//! behind the default `compression` cargo feature; without it only [`Compression::None`] works.
//!
//! Decompression stops with [`CompressionError::TooLarge`] as soon as the output would exceed the
//! caller's limit, so a small "decompression bomb" cannot exhaust memory.

use crate::batch::Compression;

/// A compression or decompression failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CompressionError {
    /// The decompressed data would exceed the limit.
    #[error("decompressed size exceeds the limit of {limit} bytes")]
    TooLarge {
        /// The limit.
        limit: usize,
    },
    /// The compressed data is invalid.
    #[error("invalid {codec:?} data: {message}")]
    Invalid {
        /// The codec.
        codec: Compression,
        /// What the decoder said.
        message: String,
    },
    /// The codec is not compiled in (the `compression` feature is off).
    #[error("compression codec {0:?} is not supported by this build")]
    Unsupported(Compression),
}

/// The xerial-java Snappy stream header magic Kafka writes (first 8 bytes of the 16-byte header).
pub const XERIAL_MAGIC: &[u8; 8] = b"\x82SNAPPY\x00";
/// The full 16-byte xerial header Kafka writes: magic, version 1, compatible version 1.
pub const XERIAL_HEADER: &[u8; 16] = b"\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01";
/// The block size of xerial-java's `SnappyOutputStream` (Kafka's default).
#[cfg(feature = "compression")]
const XERIAL_BLOCK_SIZE: usize = 32 * 1024;

/// Decompress `input`, compressed with `codec`, appending to `out` (which is cleared first). Fails with
/// [`CompressionError::TooLarge`] if the result would be larger than `limit` bytes.
///
/// ```
/// use diskless_core::{compression, Compression};
///
/// let packed = compression::compress(Compression::Gzip, b"hello hello hello").unwrap();
/// let mut out = Vec::new();
/// compression::decompress(Compression::Gzip, &packed, 1024, &mut out).unwrap();
/// assert_eq!(out, b"hello hello hello");
/// assert!(compression::decompress(Compression::Gzip, &packed, 4, &mut out).is_err());
/// ```
pub fn decompress(
    codec: Compression,
    input: &[u8],
    limit: usize,
    out: &mut Vec<u8>,
) -> Result<(), CompressionError> {
    out.clear();
    match codec {
        Compression::None => {
            if input.len() > limit {
                return Err(CompressionError::TooLarge { limit });
            }
            out.extend_from_slice(input);
            Ok(())
        }
        #[cfg(feature = "compression")]
        Compression::Gzip => {
            read_bounded(codec, flate2::read::MultiGzDecoder::new(input), limit, out)
        }
        #[cfg(feature = "compression")]
        Compression::Snappy => snappy_decompress(input, limit, out),
        #[cfg(feature = "compression")]
        Compression::Lz4 => {
            read_bounded(codec, lz4_flex::frame::FrameDecoder::new(input), limit, out)
        }
        #[cfg(feature = "compression")]
        Compression::Zstd => {
            let dec =
                zstd::stream::read::Decoder::with_buffer(input).map_err(|e| invalid(codec, e))?;
            read_bounded(codec, dec, limit, out)
        }
        #[cfg(not(feature = "compression"))]
        other => Err(CompressionError::Unsupported(other)),
    }
}

/// Compress `input` with `codec` the way Kafka's Java producer frames it, at the codec's default
/// level.
pub fn compress(codec: Compression, input: &[u8]) -> Result<Vec<u8>, CompressionError> {
    compress_with_level(codec, None, input)
}

/// [`compress`] at a level as a topic's KIP-390 configs give it (`None`: the codec's default):
/// gzip 1..=9 or -1 (zlib's default, 6, as Java's `Deflater.DEFAULT_COMPRESSION`), zstd
/// -131072..=22 (default 3). Snappy has no level. LZ4's level is not applied: `lz4_flex` has one
/// compressor, the fast one, where Kafka's default level 9 is LZ4-HC; the frame holds the same
/// bytes and every LZ4 reader decodes it, it is only larger than Kafka's. A level out of range
/// is [`CompressionError::Invalid`].
///
/// ```
/// use diskless_core::{compression, Compression};
///
/// let text = b"diskless diskless diskless diskless diskless diskless".repeat(20);
/// let fast = compression::compress_with_level(Compression::Gzip, Some(1), &text).unwrap();
/// let best = compression::compress_with_level(Compression::Zstd, Some(19), &text).unwrap();
/// let mut out = Vec::new();
/// compression::decompress(Compression::Gzip, &fast, 1 << 20, &mut out).unwrap();
/// assert_eq!(out, text);
/// compression::decompress(Compression::Zstd, &best, 1 << 20, &mut out).unwrap();
/// assert_eq!(out, text);
/// assert!(compression::compress_with_level(Compression::Gzip, Some(10), &text).is_err());
/// ```
pub fn compress_with_level(
    codec: Compression,
    level: Option<i32>,
    input: &[u8],
) -> Result<Vec<u8>, CompressionError> {
    #[cfg(not(feature = "compression"))]
    let _ = level;
    match codec {
        Compression::None => Ok(input.to_vec()),
        #[cfg(feature = "compression")]
        Compression::Gzip => {
            use std::io::Write;
            let level = match level {
                None | Some(-1) => flate2::Compression::default(),
                Some(l @ 1..=9) => flate2::Compression::new(l.unsigned_abs()),
                Some(l) => {
                    return Err(invalid(
                        codec,
                        format!("gzip level {l} is not in 1..=9 or -1"),
                    ));
                }
            };
            let mut enc = flate2::write::GzEncoder::new(Vec::new(), level);
            enc.write_all(input).map_err(|e| invalid(codec, e))?;
            enc.finish().map_err(|e| invalid(codec, e))
        }
        #[cfg(feature = "compression")]
        Compression::Snappy => {
            let mut out = Vec::with_capacity(XERIAL_HEADER.len() + input.len() / 2 + 64);
            out.extend_from_slice(XERIAL_HEADER);
            let mut enc = snap::raw::Encoder::new();
            for chunk in input.chunks(XERIAL_BLOCK_SIZE) {
                let block = enc.compress_vec(chunk).map_err(|e| invalid(codec, e))?;
                let len = u32::try_from(block.len()).map_err(|e| invalid(codec, e))?;
                out.extend_from_slice(&len.to_be_bytes());
                out.extend_from_slice(&block);
            }
            Ok(out)
        }
        #[cfg(feature = "compression")]
        Compression::Lz4 => {
            use std::io::Write;
            let info = lz4_flex::frame::FrameInfo::new()
                .block_size(lz4_flex::frame::BlockSize::Max64KB)
                .block_mode(lz4_flex::frame::BlockMode::Independent);
            let mut enc = lz4_flex::frame::FrameEncoder::with_frame_info(info, Vec::new());
            enc.write_all(input).map_err(|e| invalid(codec, e))?;
            enc.finish().map_err(|e| invalid(codec, e))
        }
        #[cfg(feature = "compression")]
        Compression::Zstd => {
            let level = level.unwrap_or(3);
            if !(-131072..=22).contains(&level) {
                return Err(invalid(
                    codec,
                    format!("zstd level {level} is not in -131072..=22"),
                ));
            }
            zstd::bulk::compress(input, level).map_err(|e| invalid(codec, e))
        }
        #[cfg(not(feature = "compression"))]
        other => Err(CompressionError::Unsupported(other)),
    }
}

#[cfg(feature = "compression")]
fn invalid(codec: Compression, e: impl std::fmt::Display) -> CompressionError {
    CompressionError::Invalid {
        codec,
        message: e.to_string(),
    }
}

/// Read all of `r` into `out`, failing once more than `limit` bytes come out.
#[cfg(feature = "compression")]
fn read_bounded(
    codec: Compression,
    r: impl std::io::Read,
    limit: usize,
    out: &mut Vec<u8>,
) -> Result<(), CompressionError> {
    use std::io::Read;
    let cap = (limit as u64).saturating_add(1);
    r.take(cap)
        .read_to_end(out)
        .map_err(|e| invalid(codec, e))?;
    if out.len() > limit {
        out.clear();
        return Err(CompressionError::TooLarge { limit });
    }
    Ok(())
}

/// Snappy as Kafka reads it: the xerial-java stream (16-byte header, then blocks of a 4-byte big-endian
/// length and a raw Snappy block), or, when the magic is absent, the whole input as one raw block.
#[cfg(feature = "compression")]
fn snappy_decompress(
    input: &[u8],
    limit: usize,
    out: &mut Vec<u8>,
) -> Result<(), CompressionError> {
    let codec = Compression::Snappy;
    let mut dec = snap::raw::Decoder::new();
    let mut raw_block = |block: &[u8], out: &mut Vec<u8>| -> Result<(), CompressionError> {
        let n = snap::raw::decompress_len(block).map_err(|e| invalid(codec, e))?;
        let start = out.len();
        if n > limit - start {
            out.clear();
            return Err(CompressionError::TooLarge { limit });
        }
        out.resize(start + n, 0);
        let written = dec
            .decompress(block, &mut out[start..])
            .map_err(|e| invalid(codec, e))?;
        out.truncate(start + written);
        Ok(())
    };
    if !input.starts_with(XERIAL_MAGIC) {
        return raw_block(input, out);
    }
    if input.len() < XERIAL_HEADER.len() {
        return Err(invalid(codec, "truncated xerial snappy header"));
    }
    let mut pos = XERIAL_HEADER.len();
    while pos < input.len() {
        let Some(len_bytes) = input.get(pos..pos + 4) else {
            return Err(invalid(codec, "truncated xerial block length"));
        };
        if *len_bytes == XERIAL_MAGIC[..4] {
            // Concatenated xerial streams: xerial-java's reader skips the next stream's header.
            if !input[pos..].starts_with(XERIAL_MAGIC) || input.len() - pos < XERIAL_HEADER.len() {
                return Err(invalid(
                    codec,
                    "truncated xerial header in concatenated stream",
                ));
            }
            pos += XERIAL_HEADER.len();
            continue;
        }
        let len =
            u32::from_be_bytes([len_bytes[0], len_bytes[1], len_bytes[2], len_bytes[3]]) as usize;
        pos += 4;
        let Some(block) = input.get(pos..pos.saturating_add(len)) else {
            return Err(invalid(codec, "truncated xerial block"));
        };
        pos += len;
        raw_block(block, out)?;
    }
    Ok(())
}

#[cfg(all(test, feature = "compression"))]
mod tests {
    use super::*;

    fn sample() -> Vec<u8> {
        (0..100_000u32)
            .flat_map(|i| (i % 251).to_le_bytes())
            .collect()
    }

    #[test]
    fn every_codec_round_trips() {
        let data = sample();
        for codec in Compression::ALL {
            let packed = compress(codec, &data).unwrap();
            let mut out = Vec::new();
            decompress(codec, &packed, data.len(), &mut out).unwrap();
            assert_eq!(out, data, "{codec:?}");
            let e = decompress(codec, &packed, data.len() - 1, &mut out).unwrap_err();
            assert_eq!(
                e,
                CompressionError::TooLarge {
                    limit: data.len() - 1
                },
                "{codec:?}"
            );
        }
    }

    #[test]
    fn snappy_raw_fallback_and_xerial_framing() {
        let data = sample();
        let raw = snap::raw::Encoder::new().compress_vec(&data).unwrap();
        let mut out = Vec::new();
        decompress(Compression::Snappy, &raw, usize::MAX, &mut out).unwrap();
        assert_eq!(out, data);
        let framed = compress(Compression::Snappy, b"sdfdsf").unwrap();
        assert!(framed.starts_with(XERIAL_HEADER));
        // Two concatenated xerial streams decode as one.
        let mut two = compress(Compression::Snappy, b"first ").unwrap();
        two.extend(compress(Compression::Snappy, b"second").unwrap());
        decompress(Compression::Snappy, &two, 1 << 20, &mut out).unwrap();
        assert_eq!(out, b"first second");
        // Truncated framing is an error, not a panic.
        for cut in 0..framed.len() {
            let _ = decompress(Compression::Snappy, &framed[..cut], 1 << 20, &mut out);
        }
    }

    #[test]
    fn garbage_is_an_error() {
        let mut out = Vec::new();
        for codec in [
            Compression::Gzip,
            Compression::Snappy,
            Compression::Lz4,
            Compression::Zstd,
        ] {
            let e = decompress(codec, b"\x01\x02garbage garbage", 1 << 20, &mut out);
            assert!(
                matches!(e, Err(CompressionError::Invalid { .. })),
                "{codec:?}: {e:?}"
            );
        }
    }

    #[test]
    fn bomb_is_stopped_at_the_limit() {
        let zeros = vec![0u8; 8 << 20];
        for codec in Compression::ALL {
            let packed = compress(codec, &zeros).unwrap();
            let mut out = Vec::new();
            let e = decompress(codec, &packed, 1 << 20, &mut out).unwrap_err();
            assert_eq!(e, CompressionError::TooLarge { limit: 1 << 20 });
            assert!(
                out.capacity() <= 4 << 20,
                "{codec:?} buffered {}",
                out.capacity()
            );
        }
    }
}
