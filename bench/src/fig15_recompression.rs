//! Figure 15: what a topic's `compression.type` costs on produce (issue 29). A batch whose codec
//! is not the topic's is re-encoded by validation (`Validator::validate_produce_records`:
//! validate, decompress, compress at the topic's level, CRC). Measured per pair (codec sent →
//! topic's), on one core, over 16 KiB batches of text-like records; baselines in the same run:
//! validation of the same batches on a `producer` topic (nothing re-encoded), and the codec work
//! alone (decompress the sent codec, compress with the topic's, on the same bytes).

use std::hint::black_box;
use std::time::{Duration, Instant};

use bytes::Bytes;
use diskless_coordinator::{TopicCompression, TopicConfig};
use diskless_core::compression::{compress_with_level, decompress};
use diskless_core::validate::{codec_level, stored_codec};
use diskless_core::{Compression, HEADER_LEN, RecordBatchBuilder, Validator};

use crate::report::{Row, rate};
use crate::util::now_ms;

/// Records per batch and bytes per record value: 32 × ~512 bytes ≈ 16 KiB, as figure 1's rows.
const RECORDS: usize = 32;
const VALUE_BYTES: usize = 512;
/// Distinct batches per codec (cycled), so the codecs do not see the same bytes every time.
const DISTINCT: usize = 64;

/// Words drawn by a fixed LCG: text that compresses about as log lines do (zstd ~4x), not as
/// zeros or random bytes do.
fn text_value(seed: u64) -> Vec<u8> {
    const WORDS: [&str; 12] = [
        "order",
        "created",
        "customer",
        "status",
        "shipped",
        "payment",
        "id",
        "amount",
        "EUR",
        "warehouse",
        "eu-west-1",
        "retry",
    ];
    let mut x = seed
        .wrapping_mul(2862933555777941757)
        .wrapping_add(3037000493);
    let mut out = Vec::with_capacity(VALUE_BYTES + 16);
    while out.len() < VALUE_BYTES {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        out.extend_from_slice(WORDS[(x >> 60) as usize % WORDS.len()].as_bytes());
        out.push(b'=');
        out.extend_from_slice(((x >> 33) % 100_000).to_string().as_bytes());
        out.push(b' ');
    }
    out.truncate(VALUE_BYTES);
    out
}

fn batches(codec: Compression, now: i64) -> Vec<Bytes> {
    (0..DISTINCT as u64)
        .map(|b| {
            let mut builder = RecordBatchBuilder::new().compression(codec).producer(
                1,
                0,
                (b * RECORDS as u64) as i32,
            );
            for r in 0..RECORDS as u64 {
                let value = text_value(b * 1000 + r);
                builder = builder.record(now, Some(format!("key-{r}").as_bytes()), Some(&value));
            }
            match builder.build() {
                Ok(batch) => batch.into_bytes(),
                Err(e) => panic!("building a {codec:?} batch: {e}"),
            }
        })
        .collect()
}

/// Runs figure 15.
pub(crate) fn run(quick: bool) -> Vec<Row> {
    // Uncompressed records bytes validated per pair.
    let total: usize = if quick { 1 << 20 } else { 96 << 20 };
    let now = now_ms();
    let pairs = [
        (Compression::None, TopicCompression::Zstd),
        (Compression::None, TopicCompression::Lz4),
        (Compression::None, TopicCompression::Snappy),
        (Compression::None, TopicCompression::Gzip),
        (Compression::Lz4, TopicCompression::Zstd),
        (Compression::Snappy, TopicCompression::Lz4),
        (Compression::Zstd, TopicCompression::Uncompressed),
        (Compression::Gzip, TopicCompression::Zstd),
    ];
    let mut rows = Vec::new();
    for (sent, topic) in pairs {
        let input = batches(sent, now);
        let plain: Vec<Vec<u8>> = input
            .iter()
            .map(|b| {
                let mut out = Vec::new();
                if let Err(e) = decompress(sent, &b[HEADER_LEN..], 1 << 30, &mut out) {
                    panic!("{sent:?}: {e}");
                }
                out
            })
            .collect();
        let per_batch = plain[0].len();
        let rounds = total.div_ceil(per_batch);
        let config = TopicConfig::default().with_compression_type(topic);
        let as_sent = TopicConfig::default();
        let Some(target) = stored_codec(&config) else {
            continue;
        };
        let mut validator = Validator::default();
        let mut stored_bytes = 0usize;
        let mut measure = |config: &TopicConfig, stored: &mut usize| -> Duration {
            let start = Instant::now();
            for i in 0..rounds {
                match validator.validate_produce_records(&input[i % DISTINCT], config, now) {
                    Ok((batch, _)) => *stored += batch.len(),
                    Err(e) => panic!("{sent:?} into {topic}: {e}"),
                }
            }
            start.elapsed()
        };
        let mut ignored = 0;
        let baseline = measure(&as_sent, &mut ignored);
        let reencode = measure(&config, &mut stored_bytes);
        // The codec work alone: the same decompress and compress, without the batch around it.
        let start = Instant::now();
        let mut scratch = Vec::new();
        for i in 0..rounds {
            let b = &input[i % DISTINCT];
            if sent != Compression::None
                && let Err(e) = decompress(sent, &b[HEADER_LEN..], 1 << 30, &mut scratch)
            {
                panic!("{sent:?}: {e}");
            }
            match compress_with_level(target, codec_level(&config, target), &plain[i % DISTINCT]) {
                Ok(out) => {
                    black_box(out);
                }
                Err(e) => panic!("{target:?}: {e}"),
            }
        }
        let codec_alone = start.elapsed();
        let bytes = (rounds * per_batch) as f64;
        let mib = bytes / f64::from(1u32 << 20);
        let ms_per_mib = reencode.as_secs_f64() * 1000.0 / mib;
        let ratio = reencode.as_secs_f64() / codec_alone.as_secs_f64();
        let shrink = bytes / stored_bytes as f64;
        rows.push(
            Row::new(
                15,
                format!(
                    "re-encode on produce, {sent:?} sent to a compression.type={topic} topic \
                     (default level), 16 KiB batches, one core; stored {shrink:.1}x smaller \
                     than the records"
                ),
                format!(
                    "{} ({ms_per_mib:.2} ms CPU per MiB)",
                    rate(bytes / reencode.as_secs_f64())
                ),
            )
            .baseline(format!(
                "codec work alone {}; validation as sent (producer) {}",
                rate(bytes / codec_alone.as_secs_f64()),
                rate(bytes / baseline.as_secs_f64())
            ))
            .ratio(format!("{ratio:.2}x the codec work"))
            .numbers(&[ms_per_mib, ratio, shrink]),
        );
    }
    rows
}
