//! Bodies of the cargo-fuzz targets in `fuzz/`, as plain functions so that the committed corpus is
//! replayed by an ordinary test (`tests/fuzz_corpus.rs`). Not a stable API.
//!
//! A fuzz target reports a broken invariant by panicking, so these bodies assert and `expect`.
#![allow(clippy::expect_used)]

use bytes::Bytes;
use diskless_coordinator::{TopicCompression, TopicConfig};

use crate::batch::split_batches;
use crate::rewrite::BatchRewrite;
use crate::segment::SegmentReader;
use crate::validate::{ValidationOptions, Validator, stored_codec, verify_stored_batch};

/// A fixed broker clock for the fuzz targets (2023-11-14).
pub const FUZZ_NOW_MS: i64 = 1_700_000_000_000;

/// Target `batch_validator`: split the input into batches, validate each; for every valid batch, check
/// that the rewrites keep it valid. Panics only on a broken invariant.
pub fn fuzz_batch_validator(data: &[u8]) {
    let config = TopicConfig::default();
    let mut validator =
        Validator::new(ValidationOptions::default().with_max_decompressed_bytes(Some(1 << 20)))
            .expect("a 1 MiB decompression limit is valid");
    // The produce path's entry point: one partition's records, exactly one batch.
    if let Ok((batch, v)) =
        validator.validate_produce_records(&Bytes::copy_from_slice(data), &config, FUZZ_NOW_MS)
    {
        assert_eq!(v.byte_size as usize, batch.len());
    }
    // The same records on a topic with a compression.type (picked by the input's length): a
    // batch that passes is stored re-encoded, and what is stored verifies with the same records.
    let topic = TopicCompression::ALL[data.len() % TopicCompression::ALL.len()];
    let compressed = config.clone().with_compression_type(topic);
    let input = Bytes::copy_from_slice(data);
    if let Ok((stored, v)) = validator.validate_produce_records(&input, &compressed, FUZZ_NOW_MS) {
        assert_eq!(v.byte_size as usize, stored.len());
        if let Some(codec) = stored_codec(&compressed) {
            assert_eq!(stored.attributes().compression(), Some(codec));
        }
        match verify_stored_batch(&stored) {
            Ok(again) => {
                assert_eq!(again.record_count, v.record_count);
                assert_eq!(again.max_record_timestamp, v.max_record_timestamp);
            }
            Err(e) => assert!(
                matches!(
                    e.kind,
                    crate::ValidationErrorKind::DecompressedTooLarge { .. }
                ),
                "a re-encoded batch does not verify: {e}"
            ),
        }
    }
    let batches = match split_batches(Bytes::copy_from_slice(data)) {
        Ok(b) => b,
        Err(e) => {
            let _ = e.error_code();
            return;
        }
    };
    for batch in batches {
        match validator.validate(&batch, &config, FUZZ_NOW_MS) {
            Ok(v) => {
                assert_eq!(v.byte_size as usize, batch.len());
                assert_eq!(v.record_count, batch.last_offset_delta() + 1);
                // Kafka's maxTimestamp correction (CreateTime): a valid batch stays valid.
                let corrected = batch
                    .rewrite(&BatchRewrite {
                        base_offset: 1000,
                        partition_leader_epoch: 5,
                        log_append_time: None,
                        max_timestamp: Some(FUZZ_NOW_MS),
                    })
                    .to_record_batch();
                assert!(
                    corrected.crc_is_valid(),
                    "maxTimestamp rewrite broke the CRC"
                );
                assert_eq!(corrected.max_timestamp(), FUZZ_NOW_MS);
                let out = batch
                    .rewrite(&BatchRewrite {
                        base_offset: 1000,
                        partition_leader_epoch: 5,
                        log_append_time: Some(FUZZ_NOW_MS),
                        max_timestamp: None,
                    })
                    .to_record_batch();
                assert!(out.crc_is_valid(), "rewrite broke the CRC");
                if let Err(e) = verify_stored_batch(&out) {
                    // Only the decompression bound may differ between the two validators.
                    assert!(
                        matches!(
                            e.kind,
                            crate::ValidationErrorKind::DecompressedTooLarge { .. }
                        ),
                        "rewritten batch does not verify: {e}"
                    );
                }
            }
            Err(e) => {
                let _ = e.error_code();
            }
        }
    }
}

/// Target `segment_reader`: the first 12 bytes are coordinates (u64 byte offset, u32 size), the rest a
/// segment. Reads at the coordinates, at every batch the walk finds, and from a ranged slice.
pub fn fuzz_segment_reader(data: &[u8]) {
    if data.len() < 12 {
        return;
    }
    let mut off = [0u8; 8];
    off.copy_from_slice(&data[..8]);
    let byte_offset = u64::from_le_bytes(off) % (data.len() as u64 + 16);
    let byte_size = u32::from_le_bytes([data[8], data[9], data[10], data[11]]);
    let object = Bytes::copy_from_slice(&data[12..]);
    let Ok(reader) = SegmentReader::new(object.clone()) else {
        return;
    };
    let _ = reader.read_batch(byte_offset, byte_size);
    for item in reader.batches() {
        match item {
            Ok((at, batch)) => {
                let again = reader
                    .read_batch(at, batch.len() as u32)
                    .expect("a walked batch reads back");
                assert_eq!(again, batch);
                // The same batch from a ranged read that starts at it.
                let end = at as usize + batch.len();
                let ranged = SegmentReader::from_range(
                    object.slice(at as usize..end),
                    at,
                    Some(object.len() as u64),
                )
                .expect("ranged reader");
                assert_eq!(
                    ranged
                        .read_batch(at, batch.len() as u32)
                        .expect("ranged read"),
                    batch
                );
                let _ = verify_stored_batch(&batch);
            }
            Err(e) => {
                let _ = e.error_code();
            }
        }
    }
}

/// Target `txn_marker`: parse the input as a transaction marker batch; an accepted input must be
/// exactly what [`crate::control::end_txn_marker`] builds from the parsed fields.
pub fn fuzz_txn_marker(data: &[u8]) {
    if let Ok(parsed) = crate::control::parse_end_txn_marker(data) {
        let rebuilt = crate::control::end_txn_marker(&parsed.to_batch());
        assert_eq!(
            &rebuilt[..],
            data,
            "a parsed marker rebuilds to other bytes"
        );
    }
}

/// Target `compaction`: the input's batches (as a stored log holds them, one after another) are
/// mapped, then compacted, under two rounds (before and after a delete horizon); an answer is
/// never a panic, and a rebuilt batch frames, has a valid CRC, keeps its base and last offsets
/// and producer fields, and holds no more records than the original.
pub fn fuzz_compaction(data: &[u8]) {
    use crate::compaction::{BatchVerdict, CompactionRound, OffsetMap, compact_batch};
    let Ok(batches) = crate::batch::split_batches(bytes::Bytes::copy_from_slice(data)) else {
        return;
    };
    let mut scratch = Vec::new();
    let limit = 1 << 20;
    let mut map = OffsetMap::new(64 << 10);
    for (i, batch) in batches.iter().enumerate() {
        // Every third batch is read as aborted transactional data.
        let _ = map.add_batch(batch, i % 3 == 2, &mut scratch, limit);
    }
    for now_ms in [FUZZ_NOW_MS, i64::MAX] {
        let round = CompactionRound {
            now_ms,
            delete_retention_ms: 86_400_000,
            decompression_limit: limit,
        };
        for (i, batch) in batches.iter().enumerate() {
            if let Ok(BatchVerdict::Rewritten(out)) =
                compact_batch(batch, i % 3 == 2, &map, &round, &mut scratch)
            {
                assert!(out.crc_is_valid(), "a rebuilt batch has a bad CRC");
                assert_eq!(out.base_offset(), batch.base_offset());
                assert_eq!(out.last_offset(), batch.last_offset());
                assert_eq!(out.producer_id(), batch.producer_id());
                assert_eq!(out.base_sequence(), batch.base_sequence());
                assert!(out.records_count() <= batch.records_count());
            }
        }
    }
}

/// Target `produce_request`: read the input as a Produce request frame; an accepted one has every
/// partition's records inside the input, and its answer (one per partition) encodes with the size
/// it says.
pub fn fuzz_produce_request(data: &[u8]) {
    use crate::produce_request::{PartitionAnswer, ProduceRequest, encode_produce_response};
    let frame = bytes::Bytes::copy_from_slice(data);
    if let Ok(request) = ProduceRequest::parse(frame) {
        let mut topics = Vec::new();
        for t in &request.topics {
            let mut answers = Vec::new();
            for p in &t.partitions {
                if let Some(records) = &p.records {
                    assert!(records.len() <= data.len(), "records beyond the input");
                }
                let mut answer = PartitionAnswer::new(p.index, 0).base_offset(7);
                answer.record_errors.push((0, Some(t.name.clone())));
                answer.error_message = t.name.get(..1).map(str::to_string);
                answers.push(answer);
            }
            topics.push((t.name.clone(), answers));
        }
        let response = encode_produce_response(&request, &topics);
        let size = i32::from_be_bytes([response[0], response[1], response[2], response[3]]);
        assert_eq!(
            usize::try_from(size).ok(),
            Some(response.len() - 4),
            "the response's size field"
        );
    }
}

/// The coordinate a commit would give `batch` at `base_offset` (tiered segment tests and the
/// `tiered_segment_reader` target; the one place they construct a
/// [`diskless_coordinator::BatchCoordinate`]). `max_timestamp` is the records' largest timestamp;
/// `log_append_time` makes it a LogAppendTime partition's batch.
pub fn tiered_coordinate(
    batch: &crate::batch::RecordBatch,
    base_offset: i64,
    max_timestamp: i64,
    log_append_time: Option<i64>,
) -> diskless_coordinator::BatchCoordinate {
    use diskless_coordinator::TimestampType;
    diskless_coordinator::BatchCoordinate {
        object_key: "wal/object".into(),
        object_size: batch.len() as u64,
        byte_offset: 0,
        byte_size: batch.len() as u32,
        base_offset,
        last_offset: base_offset + i64::from(batch.last_offset_delta()),
        base_timestamp: batch.base_timestamp(),
        max_timestamp,
        timestamp_type: if log_append_time.is_some() {
            TimestampType::LogAppendTime
        } else {
            TimestampType::CreateTime
        },
        log_append_time: log_append_time.unwrap_or(diskless_coordinator::NO_TIMESTAMP),
        producer_id: batch.producer_id(),
        producer_epoch: batch.producer_epoch(),
        base_sequence: batch.base_sequence(),
        last_sequence: batch.last_sequence(),
        control: None,
    }
}

/// Target `tiered_segment_reader`: the first 16 bytes are a target offset and a target timestamp
/// (i64 LE each), the rest a tiered segment object. Every section parser also sees the rest as its
/// own section; whatever a parser accepts must encode back to the same bytes, and the lookups must
/// keep Kafka's contracts. Panics only on a broken invariant.
pub fn fuzz_tiered_segment_reader(data: &[u8]) {
    use crate::tiered::format::{
        OffsetIndex, SegmentObject, SegmentTrailer, TimeIndex, encode_leader_epoch_checkpoint,
        encode_producer_snapshot, encode_txn_index, log_batches, parse_leader_epoch_checkpoint,
        parse_producer_snapshot, parse_txn_index, search_for_offset, search_for_timestamp,
    };
    if data.len() < 16 {
        return;
    }
    let mut word = [0u8; 8];
    word.copy_from_slice(&data[..8]);
    let target = i64::from_le_bytes(word);
    word.copy_from_slice(&data[8..16]);
    let target_ts = i64::from_le_bytes(word);
    let rest = &data[16..];

    // Each parser on the raw bytes: accepted input is canonical.
    if let Ok(entries) = parse_txn_index(rest) {
        assert_eq!(
            &encode_txn_index(&entries)[..],
            rest,
            "txn index round trip"
        );
    }
    if let Ok(entries) = parse_producer_snapshot(rest)
        && !rest.is_empty()
    {
        assert_eq!(
            &encode_producer_snapshot(&entries)[..],
            rest,
            "snapshot round trip"
        );
    }
    if let Ok(entries) = parse_leader_epoch_checkpoint(rest) {
        assert_eq!(
            &encode_leader_epoch_checkpoint(&entries)[..],
            rest,
            "epoch checkpoint round trip"
        );
    }
    if let Ok(t) = SegmentTrailer::parse(rest) {
        assert_eq!(&t.encode().expect("a parsed trailer encodes")[..], rest);
    }
    let raw = Bytes::copy_from_slice(rest);
    check_offset_index(OffsetIndex::parse(0, raw.clone()).ok(), target);
    if let Ok(ti) = TimeIndex::parse(0, raw.clone()) {
        let e = ti.lookup(target_ts);
        assert!(e.timestamp <= target_ts || (e.timestamp == -1 && e.offset == 0));
    }
    for h in log_batches(rest).flatten() {
        assert!(h.last_offset >= h.base_offset);
    }

    // The whole object.
    let Ok(object) = SegmentObject::parse(raw) else {
        return;
    };
    let base = object.trailer.base_offset;
    let _ = parse_txn_index(&object.txn_index);
    let _ = parse_producer_snapshot(&object.producer_snapshot);
    let _ = parse_leader_epoch_checkpoint(&object.leader_epochs);
    let oi = OffsetIndex::parse(base, object.offset_index.clone()).ok();
    check_offset_index(oi.clone(), target);
    if let Some(oi) = oi {
        let at = oi.lookup(target);
        if let Ok(Some(h)) = search_for_offset(&object.log, at.position, target) {
            assert!(h.last_offset >= target);
            assert!(h.position >= u64::from(at.position));
        }
        if let Ok(ti) = TimeIndex::parse(base, object.time_index.clone()) {
            let t = ti.lookup(target_ts);
            let from = oi.lookup(t.offset.max(target));
            if let Ok(Some(h)) = search_for_timestamp(&object.log, from.position, target_ts, target)
            {
                assert!(h.max_timestamp >= target_ts && h.last_offset >= target);
            }
        }
    }
}

fn check_offset_index(oi: Option<crate::tiered::format::OffsetIndex>, target: i64) {
    let Some(oi) = oi else { return };
    let e = oi.lookup(target);
    assert!(
        e.offset <= target || (e.offset == oi.base_offset() && e.position == 0),
        "lookup past the target"
    );
    let start = (target as u64 % 1_000) as u32;
    if let Some(u) = oi.fetch_upper_bound_offset(start, 100) {
        assert!(u64::from(u.position) >= u64::from(start) + 100);
    }
}

/// The coordinator row of one segment of a [`TieredFetchInput`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FuzzSegmentRow {
    /// The row's section sizes (`log` is encoded as a `u32`).
    pub layout: diskless_coordinator::SegmentLayoutSizes,
    /// The row's base offset (encoded in 40 bits).
    pub base_offset: i64,
    /// `end_offset - base_offset` (negative: an impossible row).
    pub end_delta: i32,
    /// The row's max timestamp.
    pub max_timestamp: i64,
    /// `max_timestamp_offset - base_offset`.
    pub max_timestamp_offset_delta: u16,
    /// `object_size - ` the object's length.
    pub object_size_delta: i8,
}

impl FuzzSegmentRow {
    /// Encoded size.
    const LEN: usize = 6 * 4 + 8 + 4 + 8 + 2 + 1;

    /// The row of a segment stored in an object of `object_len` bytes under `key`.
    fn row(&self, key: &str, object_len: usize) -> diskless_coordinator::TieredSegment {
        let end_offset = self.base_offset + i64::from(self.end_delta);
        diskless_coordinator::TieredSegment {
            object_key: key.to_string(),
            object_size: (object_len as u64)
                .saturating_add_signed(i64::from(self.object_size_delta)),
            layout: self.layout,
            base_offset: self.base_offset,
            end_offset,
            max_timestamp: self.max_timestamp,
            max_timestamp_offset: self.base_offset + i64::from(self.max_timestamp_offset_delta),
            retention_ts: self.max_timestamp,
            batch_count: 1,
            registered_at: FUZZ_NOW_MS,
            compacted: false,
        }
    }
}

/// The input of target `tiered_fetch`: a fixed-size header ([`TieredFetchInput::LEN`] bytes, all
/// little-endian; missing bytes read as zeros) then the segment objects' bytes (the first `split`
/// bytes are the first object when there are two segments, the rest the second).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TieredFetchInput {
    /// Bit 0: two segments; bit 1: read through a cache; bit 2: recompute the CRC of every batch
    /// framed in each `.log` before storing (so that mutated records reach the record search);
    /// bit 3: the high watermark lies 10 offsets past the last segment (no WAL batch there).
    pub flags: u8,
    /// The cache block size is `1 << (4 + cache_block_shift % 12)`.
    pub cache_block_shift: u8,
    /// Each fetch's `partition_max_bytes`.
    pub partition_max_bytes: u16,
    /// Each fetch's `fetch_max_bytes`.
    pub fetch_max_bytes: u16,
    /// `log_start_offset - ` the first segment's base offset.
    pub log_start_delta: i8,
    /// `high_watermark - last_stable_offset` (mod 4).
    pub lso_delta: u8,
    /// The ListOffsets target timestamp (also asked: MAX_TIMESTAMP).
    pub timestamp: i64,
    /// The fetches' leader epoch.
    pub leader_epoch: i32,
    /// The fetch offsets, relative to the first segment's base offset.
    pub fetch_offset_deltas: [i16; 3],
    /// Bytes of the first object when there are two segments.
    pub split: u32,
    /// The coordinator rows (the second only with flag bit 0).
    pub segments: [FuzzSegmentRow; 2],
}

/// A little-endian reader that yields zeros past the end.
struct LeReader<'a>(&'a [u8]);

impl LeReader<'_> {
    fn take<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        let n = N.min(self.0.len());
        out[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        out
    }
    fn u8(&mut self) -> u8 {
        self.take::<1>()[0]
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.take())
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take())
    }
    fn i64(&mut self) -> i64 {
        i64::from_le_bytes(self.take())
    }
}

impl TieredFetchInput {
    /// The header's size.
    pub const LEN: usize = 1 + 1 + 2 + 2 + 1 + 1 + 8 + 4 + 6 + 4 + 2 * FuzzSegmentRow::LEN;
    /// Flag: two segments.
    pub const TWO_SEGMENTS: u8 = 1;
    /// Flag: read through a cache.
    pub const CACHE: u8 = 2;
    /// Flag: recompute the CRCs of the batches in each `.log`.
    pub const FIX_CRCS: u8 = 4;
    /// Flag: the high watermark lies past the last segment.
    pub const HW_PAST_SEGMENTS: u8 = 8;

    /// The header of `data` and the bytes after it.
    pub fn parse(data: &[u8]) -> (TieredFetchInput, &[u8]) {
        let mut r = LeReader(data);
        let mut input = TieredFetchInput {
            flags: r.u8(),
            cache_block_shift: r.u8(),
            partition_max_bytes: r.u16(),
            fetch_max_bytes: r.u16(),
            log_start_delta: r.u8() as i8,
            lso_delta: r.u8(),
            timestamp: r.i64(),
            leader_epoch: r.u32() as i32,
            fetch_offset_deltas: [r.u16() as i16, r.u16() as i16, r.u16() as i16],
            split: r.u32(),
            segments: Default::default(),
        };
        for s in &mut input.segments {
            s.layout = diskless_coordinator::SegmentLayoutSizes {
                log: u64::from(r.u32()),
                offset_index: r.u32(),
                time_index: r.u32(),
                txn_index: r.u32(),
                producer_snapshot: r.u32(),
                leader_epochs: r.u32(),
            };
            s.base_offset = (r.i64() as u64 & ((1 << 40) - 1)) as i64;
            s.end_delta = r.u32() as i32;
            s.max_timestamp = r.i64();
            s.max_timestamp_offset_delta = r.u16();
            s.object_size_delta = r.u8() as i8;
        }
        (input, r.0)
    }

    /// The header's bytes (what [`Self::parse`] reads back; `log` sizes above `u32::MAX` and base
    /// offsets outside 40 bits do not round-trip).
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(Self::LEN);
        v.push(self.flags);
        v.push(self.cache_block_shift);
        v.extend_from_slice(&self.partition_max_bytes.to_le_bytes());
        v.extend_from_slice(&self.fetch_max_bytes.to_le_bytes());
        v.push(self.log_start_delta as u8);
        v.push(self.lso_delta);
        v.extend_from_slice(&self.timestamp.to_le_bytes());
        v.extend_from_slice(&self.leader_epoch.to_le_bytes());
        for d in self.fetch_offset_deltas {
            v.extend_from_slice(&d.to_le_bytes());
        }
        v.extend_from_slice(&self.split.to_le_bytes());
        for s in &self.segments {
            let l = &s.layout;
            v.extend_from_slice(&(l.log as u32).to_le_bytes());
            for size in [
                l.offset_index,
                l.time_index,
                l.txn_index,
                l.producer_snapshot,
                l.leader_epochs,
            ] {
                v.extend_from_slice(&size.to_le_bytes());
            }
            v.extend_from_slice(&s.base_offset.to_le_bytes());
            v.extend_from_slice(&s.end_delta.to_le_bytes());
            v.extend_from_slice(&s.max_timestamp.to_le_bytes());
            v.extend_from_slice(&s.max_timestamp_offset_delta.to_le_bytes());
            v.push(s.object_size_delta as u8);
        }
        debug_assert_eq!(v.len(), Self::LEN);
        v
    }
}

/// The partition every `tiered_fetch` input is about.
fn fuzz_partition() -> diskless_coordinator::TopicIdPartition {
    diskless_coordinator::TopicIdPartition::new(uuid::Uuid::from_u128(0xf0f0), 3)
}

/// A coordinator that knows one partition made of tiered segments only (no WAL batch): it
/// answers `find_batches`, `list_offsets` and `list_tiered_segments` from its rows, every other
/// method with `InvalidRequest`.
#[derive(Debug)]
struct SegmentsOnlyCoordinator {
    partition: diskless_coordinator::TopicIdPartition,
    segments: Vec<diskless_coordinator::TieredSegment>,
    log_start_offset: i64,
    high_watermark: i64,
    last_stable_offset: i64,
}

fn refused<T>(method: &str) -> Result<T, diskless_coordinator::CoordinatorError> {
    Err(diskless_coordinator::CoordinatorError::InvalidRequest(
        format!("{method} is not part of the tiered_fetch fuzz target"),
    ))
}

mod stub {
    //! [`SegmentsOnlyCoordinator`]'s [`BatchCoordinator`] impl.
    use async_trait::async_trait;
    use diskless_coordinator::*;

    use super::{SegmentsOnlyCoordinator, refused};

    /// The log capability alone (seven methods and `capabilities`): the fetch path needs
    /// `find_batches` and `list_offsets`, the others are refused; every operation of another
    /// capability answers `Unsupported` by the trait's defaults.
    #[async_trait]
    impl BatchCoordinator for SegmentsOnlyCoordinator {
        fn capabilities(&self) -> Capabilities {
            Capabilities::LOG
        }
        async fn create_topic(&self, _request: CreateTopicRequest) -> Result<(), CoordinatorError> {
            refused("create_topic")
        }
        async fn delete_topic(&self, _topic_id: uuid::Uuid) -> Result<(), CoordinatorError> {
            refused("delete_topic")
        }
        async fn list_topics(&self) -> Result<Vec<TopicInfo>, CoordinatorError> {
            refused("list_topics")
        }
        async fn commit_file(
            &self,
            _request: CommitFileRequest,
        ) -> Result<Vec<CommitBatchResult>, CoordinatorError> {
            refused("commit_file")
        }
        async fn find_batches(
            &self,
            requests: &[FindBatchesRequest],
            _fetch_max_bytes: u32,
        ) -> Result<Vec<FindBatchesResponse>, CoordinatorError> {
            Ok(requests.iter().map(|r| self.find(r)).collect())
        }
        async fn list_offsets(
            &self,
            requests: &[ListOffsetsRequest],
        ) -> Result<Vec<ListOffsetsResponse>, CoordinatorError> {
            Ok(requests.iter().map(|r| self.list(r)).collect())
        }
        async fn producer_state(
            &self,
            _partition: TopicIdPartition,
            _producer_id: i64,
        ) -> Result<Option<ProducerState>, CoordinatorError> {
            refused("producer_state")
        }
    }
}

impl SegmentsOnlyCoordinator {
    /// The segments from the one holding `offset` on (the coordinator counts none against the
    /// limits here: the fetcher applies its own).
    fn find(
        &self,
        r: &diskless_coordinator::FindBatchesRequest,
    ) -> diskless_coordinator::FindBatchesResponse {
        use diskless_coordinator::{ErrorCode, FindBatchesResponse, IsolationLevel};
        if r.partition != self.partition {
            return FindBatchesResponse::error(ErrorCode::UnknownTopicOrPartition);
        }
        if r.offset < self.log_start_offset || r.offset > self.high_watermark {
            return FindBatchesResponse::error(ErrorCode::OffsetOutOfRange);
        }
        FindBatchesResponse {
            error: ErrorCode::None,
            segments: self
                .segments
                .iter()
                .filter(|s| s.end_offset >= r.offset)
                .cloned()
                .collect(),
            batches: Vec::new(),
            log_start_offset: self.log_start_offset,
            high_watermark: self.high_watermark,
            last_stable_offset: self.last_stable_offset,
            aborted: (r.isolation == IsolationLevel::ReadCommitted).then(Vec::new),
        }
    }

    /// The first segment whose max timestamp reaches the target (the largest for
    /// MAX_TIMESTAMP), answered with its base offset raised to the log start, as the coordinators
    /// answer for tiered offsets.
    fn list(
        &self,
        r: &diskless_coordinator::ListOffsetsRequest,
    ) -> diskless_coordinator::ListOffsetsResponse {
        use diskless_coordinator::{
            ErrorCode, IsolationLevel, ListOffsetsResponse, MAX_TIMESTAMP, NO_TIMESTAMP,
        };
        if r.partition != self.partition {
            return ListOffsetsResponse::error(ErrorCode::UnknownTopicOrPartition);
        }
        let fetchable = match r.isolation {
            IsolationLevel::ReadCommitted => self.last_stable_offset,
            IsolationLevel::ReadUncommitted => self.high_watermark,
        };
        let found = match r.timestamp {
            MAX_TIMESTAMP => {
                let mut best: Option<&diskless_coordinator::TieredSegment> = None;
                for s in &self.segments {
                    if best.is_none_or(|b| s.max_timestamp > b.max_timestamp) {
                        best = Some(s);
                    }
                }
                best
            }
            t if t < 0 => return ListOffsetsResponse::error(ErrorCode::InvalidRequest),
            t => self.segments.iter().find(|s| s.max_timestamp >= t),
        };
        let none = ListOffsetsResponse {
            error: ErrorCode::None,
            offset: -1,
            timestamp: NO_TIMESTAMP,
        };
        match found {
            Some(s) if s.base_offset.max(self.log_start_offset) < fetchable => {
                ListOffsetsResponse {
                    error: ErrorCode::None,
                    offset: s.base_offset.max(self.log_start_offset),
                    timestamp: s.max_timestamp,
                }
            }
            _ => none,
        }
    }
}

/// Recomputes the CRC of every batch framed from the start of `log` (stops at the first that
/// does not frame).
fn fix_crcs(log: &mut [u8]) {
    use crate::batch::{BATCH_LENGTH_OFFSET, HEADER_LEN, LOG_OVERHEAD};
    let mut at = 0usize;
    while at + HEADER_LEN <= log.len() {
        let mut len = [0u8; 4];
        len.copy_from_slice(&log[at + BATCH_LENGTH_OFFSET..at + BATCH_LENGTH_OFFSET + 4]);
        let size = i64::from(i32::from_be_bytes(len)) + LOG_OVERHEAD as i64;
        if size < HEADER_LEN as i64 || at as i64 + size > log.len() as i64 {
            return;
        }
        let end = at + size as usize;
        crate::batch::update_crc(&mut log[at..end]);
        at = end;
    }
}

thread_local! {
    static FUZZ_RUNTIME: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a current-thread runtime");
}

/// Target `tiered_fetch`: the real [`crate::Fetcher`] over tiered segment objects of arbitrary
/// bytes and coordinator rows of bounded arbitrary values (see [`TieredFetchInput`]). Runs
/// `Fetcher::fetch` at both isolation levels from three fetch offsets (and once for the
/// partition twice in one request) and `Fetcher::list_offsets` for a timestamp and
/// MAX_TIMESTAMP. Panics on a broken invariant: an answer with records and an error; served
/// records that do not frame, whose batches are not contiguous within a segment, leave the segments' range, start
/// past the fetch offset's batch, reach the last stable offset for `read_committed`, carry another
/// leader epoch, or break KIP-74's byte limits.
pub fn fuzz_tiered_fetch(data: &[u8]) -> TieredFetchOutcome {
    if data.len() < TieredFetchInput::LEN {
        return TieredFetchOutcome::default();
    }
    let (input, rest) = TieredFetchInput::parse(data);
    FUZZ_RUNTIME.with(|rt| rt.block_on(tiered_fetch(input, rest)))
}

/// What [`fuzz_tiered_fetch`] saw (the corpus replay checks that the valid seeds reach records).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TieredFetchOutcome {
    /// Fetch answers without an error.
    pub fetched_ok: usize,
    /// Fetch answers with an error (none of them has records).
    pub fetch_errors: usize,
    /// Batches served, over every fetch.
    pub batches_served: usize,
    /// ListOffsets answers with an offset.
    pub offsets_found: usize,
    /// ListOffsets answers with an error.
    pub list_errors: usize,
}

async fn tiered_fetch(input: TieredFetchInput, rest: &[u8]) -> TieredFetchOutcome {
    use std::sync::Arc;

    use diskless_coordinator::{BatchCoordinator, ErrorCode, IsolationLevel, MAX_TIMESTAMP};
    use diskless_storage::{ObjectKey, ObjectStorage, ObjectStoreStorage};

    use crate::{FetchPartition, Fetcher, FetcherConfig, ListOffsetsPartition};

    let two = input.flags & TieredFetchInput::TWO_SEGMENTS != 0;
    let objects: Vec<Vec<u8>> = if two {
        let split = (input.split as usize).min(rest.len());
        vec![rest[..split].to_vec(), rest[split..].to_vec()]
    } else {
        vec![rest.to_vec()]
    };
    let storage = ObjectStoreStorage::in_memory();
    let mut segments = Vec::new();
    for (i, (mut object, row)) in objects.into_iter().zip(input.segments).enumerate() {
        if input.flags & TieredFetchInput::FIX_CRCS != 0 {
            let log = (row.layout.log as usize).min(object.len());
            fix_crcs(&mut object[..log]);
        }
        let key = format!("tiered/fuzz/{i}");
        segments.push(row.row(&key, object.len()));
        if !object.is_empty() {
            let key = ObjectKey::parse(&key).expect("a valid key");
            storage
                .upload(&key, &[Bytes::from(object)])
                .await
                .expect("an in-memory upload");
        }
    }
    // A coordinator lists a partition's segments in offset order.
    segments.sort_by_key(|s| s.base_offset);
    let first_base = segments[0].base_offset;
    let last_end = segments
        .iter()
        .map(|s| s.end_offset)
        .max()
        .unwrap_or(first_base);
    let log_start_offset = (first_base + i64::from(input.log_start_delta)).max(0);
    let mut high_watermark = last_end.max(first_base) + 1;
    if input.flags & TieredFetchInput::HW_PAST_SEGMENTS != 0 {
        high_watermark += 10;
    }
    let high_watermark = high_watermark.max(log_start_offset);
    let last_stable_offset =
        (high_watermark - i64::from(input.lso_delta % 4)).max(log_start_offset);
    let partition = fuzz_partition();
    let coordinator: Arc<dyn BatchCoordinator> = Arc::new(SegmentsOnlyCoordinator {
        partition,
        segments: segments.clone(),
        log_start_offset,
        high_watermark,
        last_stable_offset,
    });
    let config = FetcherConfig::default()
        .with_cache_block_size(1 << (4 + input.cache_block_shift % 12))
        .with_max_decompressed_bytes(1 << 20);
    let mut builder = Fetcher::builder(Arc::new(storage), coordinator).with_config(config);
    if input.flags & TieredFetchInput::CACHE != 0 {
        let cache = diskless_cache::MokaCache::new(
            diskless_cache::MokaCacheConfig::default().with_max_bytes(8 << 20),
        )
        .expect("a valid cache config");
        builder = builder.with_cache(Arc::new(cache));
    }
    let fetcher = builder.build().expect("a valid fetcher config");
    let mut outcome = TieredFetchOutcome::default();

    let in_a_segment = |base: i64, last: i64| {
        segments
            .iter()
            .any(|s| s.base_offset <= base && last <= s.end_offset)
    };
    let partition_max = u32::from(input.partition_max_bytes);
    let fetch_max = u32::from(input.fetch_max_bytes);
    for isolation in [
        IsolationLevel::ReadUncommitted,
        IsolationLevel::ReadCommitted,
    ] {
        let request = |fetch_offset: i64| FetchPartition {
            partition,
            fetch_offset,
            partition_max_bytes: partition_max,
            leader_epoch: input.leader_epoch,
            isolation,
        };
        let offsets = input.fetch_offset_deltas.map(|d| first_base + i64::from(d));
        let requests: Vec<Vec<FetchPartition>> = offsets
            .iter()
            .map(|&o| vec![request(o)])
            .chain([vec![request(offsets[0]), request(offsets[1])]])
            .collect();
        for requests in requests {
            let Ok(answers) = fetcher.fetch(&requests, fetch_max).await else {
                continue;
            };
            assert_eq!(answers.len(), requests.len(), "one answer per partition");
            let mut total = 0usize;
            let mut batches_served = 0usize;
            for (request, answer) in requests.iter().zip(&answers) {
                if answer.error != ErrorCode::None {
                    assert!(answer.records.is_empty(), "records with an error");
                    outcome.fetch_errors += 1;
                    continue;
                }
                outcome.fetched_ok += 1;
                assert_eq!(answer.high_watermark, high_watermark);
                assert_eq!(
                    answer.aborted_transactions.is_some(),
                    isolation == IsolationLevel::ReadCommitted
                );
                let records = answer.records_bytes();
                let batches =
                    crate::split_batches(records.clone()).expect("served records frame as batches");
                let mut expected_base: Option<i64> = None;
                for (i, b) in batches.iter().enumerate() {
                    let (base, last) = (b.base_offset(), b.last_offset());
                    assert!(
                        in_a_segment(base, last),
                        "batch {base}..={last} outside the segments {segments:?}"
                    );
                    if i == 0 {
                        assert!(
                            last >= request.fetch_offset,
                            "batch before the fetch offset"
                        );
                    }
                    if let Some(e) = expected_base {
                        // Contiguous within a segment; between two segments the offsets
                        // compaction removed may be skipped, never more.
                        assert!(base >= e, "served batches out of order");
                        if base > e {
                            assert!(
                                segments.iter().any(|s| s.end_offset == e - 1),
                                "served batches skip offsets inside a segment"
                            );
                        }
                    }
                    expected_base = Some(last + 1);
                    if isolation == IsolationLevel::ReadCommitted {
                        assert!(base < last_stable_offset, "batch at or past the LSO served");
                    }
                    assert_eq!(b.partition_leader_epoch(), input.leader_epoch);
                }
                assert!(
                    records.len() <= partition_max as usize || batches.len() == 1,
                    "partition_max_bytes exceeded by more than one batch"
                );
                total += records.len();
                batches_served += batches.len();
                outcome.batches_served += batches.len();
            }
            assert!(
                total <= fetch_max as usize || batches_served == 1,
                "fetch_max_bytes exceeded by more than one batch"
            );
        }
    }

    for isolation in [
        IsolationLevel::ReadUncommitted,
        IsolationLevel::ReadCommitted,
    ] {
        let requests: Vec<ListOffsetsPartition> = [input.timestamp & i64::MAX, MAX_TIMESTAMP]
            .iter()
            .map(|&timestamp| ListOffsetsPartition {
                partition,
                timestamp,
                leader_epoch: input.leader_epoch,
                isolation,
            })
            .collect();
        if let Ok(answers) = fetcher.list_offsets(&requests).await {
            assert_eq!(answers.len(), requests.len(), "one answer per partition");
            for a in answers {
                if a.error != ErrorCode::None {
                    assert_eq!(
                        (a.offset, a.leader_epoch),
                        (-1, -1),
                        "an offset with an error"
                    );
                    outcome.list_errors += 1;
                } else if a.offset >= 0 {
                    outcome.offsets_found += 1;
                }
            }
        }
    }
    outcome
}
