//! The consume path of diskless topics: [`Fetcher`].
//!
//! A host broker hands a Fetch request's partitions to [`Fetcher::fetch`]. The fetcher
//!
//! 1. asks the coordinator for the coordinates of the batches from each fetch offset on;
//! 2. applies Kafka's byte limits (KIP-74): the first batch of the first partition with data is
//!    returned whatever its size, after that a batch is added only while the partition's and the
//!    request's byte limits hold;
//! 3. reads the bytes with as few requests as possible: through the cache in aligned blocks (a block
//!    already cached costs no request; the missing blocks of one object are read by one ranged GET),
//!    or, without a cache, one ranged GET per group of nearby ranges of each object;
//! 4. injects the offsets (and LogAppendTime) the coordinator assigned into each batch header without
//!    copying the records: each served batch is a fresh 61-byte header plus a slice of the stored bytes.
//!
//! The answer per partition carries the high watermark and log start offset, so a consumer sees
//! exactly what a classic topic returns.
//!
//! The fetcher also answers ListOffsets at record granularity ([`Fetcher::list_offsets`], in
//! [`crate::offsets`]), reading through the same cache and storage path the one batch it needs.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Range;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use diskless_cache::{BlockKey, LocalCache};
use diskless_coordinator::{
    BatchCoordinate, BatchCoordinator, CoordinatorError, ErrorCode, FindBatchesRequest,
    TimestampType, TopicConfig, TopicIdPartition,
};
use diskless_storage::{ObjectKey, ObjectStorage, RangeReadConfig, StorageError, fetch_ranges};
use futures::StreamExt;
use tracing::warn;

use crate::batch::RecordBatch;
use crate::rewrite::{BatchRewrite, RewrittenBatch, rewrite_batch_verified};
use crate::validate::default_decompression_limit;

/// The default block size of the object cache: 4 MiB (a WAL segment of the default 8 MiB is two
/// blocks).
pub const DEFAULT_CACHE_BLOCK_SIZE: u64 = 4 << 20;

/// Settings of a [`Fetcher`].
#[derive(Clone, Debug)]
pub struct FetcherConfig {
    /// Block size of the cache; must equal the writer's [`crate::WalWriterConfig::cache_block_size`]
    /// for freshly written segments to be found.
    pub cache_block_size: u64,
    /// How reads without a cache merge nearby ranges of one object.
    pub range_read: RangeReadConfig,
    /// Objects read at once for one fetch.
    pub max_concurrent_objects: usize,
    /// The largest decompressed records section [`Fetcher::list_offsets`] decompresses to find a
    /// record in a compressed batch (a larger one answers `KAFKA_STORAGE_ERROR`). Default
    /// [`default_decompression_limit`] of Kafka's default `max.message.bytes` (32 MiB); a host with
    /// topics whose `max.message.bytes` is larger than 1 MiB sets it to the limit of the largest.
    pub max_decompressed_bytes: usize,
}

impl Default for FetcherConfig {
    fn default() -> Self {
        FetcherConfig {
            cache_block_size: DEFAULT_CACHE_BLOCK_SIZE,
            range_read: RangeReadConfig::default(),
            max_concurrent_objects: 16,
            max_decompressed_bytes: default_decompression_limit(
                TopicConfig::default().max_message_bytes,
            ),
        }
    }
}

/// One partition of a Fetch request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FetchPartition {
    /// The partition.
    pub partition: TopicIdPartition,
    /// The offset to read from.
    pub fetch_offset: i64,
    /// The partition's byte limit (`partition_max_bytes`).
    pub partition_max_bytes: u32,
    /// Written into each served batch's `partitionLeaderEpoch`. A diskless partition has no leader
    /// epoch of its own: pass the epoch the host announces in Metadata for the partition (or 0).
    pub leader_epoch: i32,
}

/// The answer for one partition of a Fetch request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FetchedPartition {
    /// The partition.
    pub partition: TopicIdPartition,
    /// [`ErrorCode::None`], or why nothing could be read (`OFFSET_OUT_OF_RANGE`,
    /// `UNKNOWN_TOPIC_OR_PARTITION`, `KAFKA_STORAGE_ERROR` — the last retriable).
    pub error: ErrorCode,
    /// A human-readable reason on error.
    pub error_message: Option<String>,
    /// The partition's high watermark (`-1` on error).
    pub high_watermark: i64,
    /// The partition's log start offset (`-1` on error).
    pub log_start_offset: i64,
    /// The records, as chunks: their concatenation is the response's `records` field.
    pub records: Vec<Bytes>,
}

impl FetchedPartition {
    /// The total size of the records.
    pub fn records_len(&self) -> usize {
        self.records.iter().map(Bytes::len).sum()
    }

    /// The records as one buffer (copies when there is more than one chunk).
    pub fn records_bytes(&self) -> Bytes {
        match self.records.as_slice() {
            [] => Bytes::new(),
            [one] => one.clone(),
            many => {
                let mut out = BytesMut::with_capacity(self.records_len());
                for chunk in many {
                    out.extend_from_slice(chunk);
                }
                out.freeze()
            }
        }
    }
}

/// Why a fetch failed as a whole (per-partition failures are error codes in the answer).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FetchError {
    /// The coordinator could not be asked.
    #[error("coordinator error: {0}")]
    Coordinator(#[from] CoordinatorError),
    /// The coordinator's answer does not fit the request.
    #[error("inconsistent coordinator answer: {0}")]
    Inconsistent(String),
}

impl FetchError {
    /// The Kafka error code for every partition of the request.
    pub fn error_code(&self) -> ErrorCode {
        match self {
            FetchError::Coordinator(e) => e.error_code(),
            FetchError::Inconsistent(_) => ErrorCode::KafkaStorageError,
        }
    }
}

/// The consume path. See the [module documentation](self).
#[derive(Clone, Debug)]
pub struct Fetcher {
    storage: Arc<dyn ObjectStorage>,
    pub(crate) coordinator: Arc<dyn BatchCoordinator>,
    cache: Option<Arc<dyn LocalCache>>,
    pub(crate) config: FetcherConfig,
}

/// Where a batch to serve is: (partition index in the request, batch index in its selection).
type Slot = (usize, usize);

/// What one read of one object covers: its size, and the byte range of each wanted batch under its
/// slot.
type ObjectReads<K> = (u64, Vec<(K, Range<u64>)>);

impl Fetcher {
    /// A fetcher over the given components. With `cache = None` every fetch reads object storage.
    pub fn new(
        config: FetcherConfig,
        storage: Arc<dyn ObjectStorage>,
        coordinator: Arc<dyn BatchCoordinator>,
        cache: Option<Arc<dyn LocalCache>>,
    ) -> Fetcher {
        let mut config = config;
        config.cache_block_size = config.cache_block_size.max(1);
        config.max_concurrent_objects = config.max_concurrent_objects.max(1);
        Fetcher {
            storage,
            coordinator,
            cache,
            config,
        }
    }

    /// Serves a Fetch request: one answer per partition, in request order.
    pub async fn fetch(
        &self,
        requests: &[FetchPartition],
        fetch_max_bytes: u32,
    ) -> Result<Vec<FetchedPartition>, FetchError> {
        let find: Vec<FindBatchesRequest> = requests
            .iter()
            .map(|r| FindBatchesRequest {
                partition: r.partition,
                offset: r.fetch_offset,
                max_bytes: r.partition_max_bytes,
            })
            .collect();
        let found = self
            .coordinator
            .find_batches(&find, fetch_max_bytes)
            .await?;
        if found.len() != requests.len() {
            return Err(FetchError::Inconsistent(format!(
                "{} partitions asked, {} answered",
                requests.len(),
                found.len()
            )));
        }

        // KIP-74 limits.
        let mut selected: Vec<Vec<BatchCoordinate>> = Vec::with_capacity(requests.len());
        let mut total = 0u64;
        let mut min_one = true;
        for (request, response) in requests.iter().zip(&found) {
            let mut batches = Vec::new();
            if response.error.is_ok() {
                let mut bytes = 0u64;
                for batch in &response.batches {
                    if batch.last_offset < request.fetch_offset {
                        continue;
                    }
                    let size = u64::from(batch.byte_size);
                    let fits = bytes + size <= u64::from(request.partition_max_bytes)
                        && total + size <= u64::from(fetch_max_bytes);
                    if !(fits || (min_one && batches.is_empty())) {
                        break;
                    }
                    bytes += size;
                    total += size;
                    batches.push(batch.clone());
                }
            }
            if !batches.is_empty() {
                min_one = false;
            }
            selected.push(batches);
        }

        // Read every selected batch, grouped by object.
        let wanted: Vec<(Slot, &BatchCoordinate)> = selected
            .iter()
            .enumerate()
            .flat_map(|(pi, batches)| batches.iter().enumerate().map(move |(bi, b)| ((pi, bi), b)))
            .collect();
        let mut bytes_of = self.read_batches(wanted).await;

        // Inject offsets and build the answers.
        let mut out = Vec::with_capacity(requests.len());
        for (pi, ((request, response), batches)) in
            requests.iter().zip(found).zip(selected).enumerate()
        {
            let mut answer = FetchedPartition {
                partition: request.partition,
                error: response.error,
                error_message: None,
                high_watermark: response.high_watermark,
                log_start_offset: response.log_start_offset,
                records: Vec::with_capacity(batches.len() * 2),
            };
            if !response.error.is_ok() {
                answer.high_watermark = -1;
                answer.log_start_offset = -1;
                out.push(answer);
                continue;
            }
            for (bi, coordinate) in batches.iter().enumerate() {
                let served = match bytes_of.remove(&(pi, bi)) {
                    Some(Ok(bytes)) => serve_batch(bytes, coordinate, request.leader_epoch),
                    Some(Err(e)) => Err(e),
                    None => Err("batch bytes missing".to_string()),
                };
                match served {
                    Ok(chunks) => answer.records.extend(chunks),
                    Err(e) => {
                        // Serve what precedes the failure; fail the partition if nothing does.
                        if answer.records.is_empty() {
                            answer.error = ErrorCode::KafkaStorageError;
                            answer.error_message = Some(e);
                        }
                        break;
                    }
                }
            }
            out.push(answer);
        }
        Ok(out)
    }

    /// Reads the stored bytes of batches, grouped by object: one [`Self::read_object`] per object
    /// (at most `max_concurrent_objects` at once). Each batch's bytes, or why they could not be read,
    /// under its slot.
    pub(crate) async fn read_batches<K>(
        &self,
        wanted: Vec<(K, &BatchCoordinate)>,
    ) -> HashMap<K, Result<Bytes, String>>
    where
        K: Copy + Eq + std::hash::Hash + Send,
    {
        // Owned keys: a future holding `&str` keys across awaits is not `Send` for every lifetime
        // (a rustc limitation), and hosts spawn their fetch handlers.
        // Ordered by key, so reads start in the same order on every run (a simulation under a
        // paused clock is reproducible whatever `max_concurrent_objects` is).
        let mut by_object: BTreeMap<String, ObjectReads<K>> = BTreeMap::new();
        for (slot, b) in wanted {
            // An overflowing range (a corrupt row) becomes an empty one, refused by read_object.
            let end = b
                .byte_offset
                .checked_add(u64::from(b.byte_size))
                .unwrap_or(b.byte_offset);
            by_object
                .entry(b.object_key.clone())
                .or_insert_with(|| (b.object_size, Vec::new()))
                .1
                .push((slot, b.byte_offset..end));
        }
        let reads = futures::stream::iter(by_object.into_iter().map(
            |(object, (size, wanted))| async move {
                let ranges: Vec<Range<u64>> = wanted.iter().map(|(_, r)| r.clone()).collect();
                let result = self.read_object(&object, size, &ranges).await;
                (object, wanted, result)
            },
        ))
        .buffer_unordered(self.config.max_concurrent_objects)
        .collect::<Vec<_>>()
        .await;
        let mut bytes_of = HashMap::new();
        for (object, wanted, result) in reads {
            match result {
                Ok(parts) => {
                    for ((slot, _), part) in wanted.into_iter().zip(parts) {
                        bytes_of.insert(slot, Ok(part));
                    }
                }
                Err(e) => {
                    warn!(object = %object, error = %e, "reading a WAL segment failed");
                    for (slot, _) in wanted {
                        bytes_of.insert(slot, Err(format!("reading object {object}: {e}")));
                    }
                }
            }
        }
        bytes_of
    }

    /// Reads `ranges` of one object, through the cache when there is one.
    async fn read_object(
        &self,
        object: &str,
        object_size: u64,
        ranges: &[Range<u64>],
    ) -> Result<Vec<Bytes>, StorageError> {
        let key = ObjectKey::parse(object)?;
        if let Some(r) = ranges
            .iter()
            .find(|r| r.start >= r.end || r.end > object_size)
        {
            return Err(StorageError::InvalidRange {
                key: object.to_string(),
                start: r.start,
                end: r.end,
                size: Some(object_size),
            });
        }
        match &self.cache {
            None => {
                fetch_ranges(self.storage.as_ref(), &key, ranges, &self.config.range_read).await
            }
            Some(cache) => self.read_via_cache(cache, key, object_size, ranges).await,
        }
    }

    /// Reads `ranges` from cached blocks; the missing blocks of the object are read by one GET (shared
    /// with concurrent fetches of the same blocks) and cached.
    async fn read_via_cache(
        &self,
        cache: &Arc<dyn LocalCache>,
        key: ObjectKey,
        object_size: u64,
        ranges: &[Range<u64>],
    ) -> Result<Vec<Bytes>, StorageError> {
        let bs = self.config.cache_block_size;
        let object: Arc<str> = Arc::from(key.as_str());
        let needed: BTreeSet<u64> = ranges
            .iter()
            .flat_map(|r| (r.start / bs)..=((r.end - 1) / bs))
            .collect();
        let mut blocks: HashMap<u64, Bytes> = HashMap::new();
        let mut missing = Vec::new();
        for &index in &needed {
            match cache.get(&BlockKey::new(object.clone(), bs, index)).await {
                Some(block) => {
                    blocks.insert(index, block);
                }
                None => missing.push(index),
            }
        }
        if let (Some(&first), Some(&last)) = (missing.first(), missing.last()) {
            let span = first * bs..((last + 1) * bs).min(object_size);
            let loader = {
                let storage = self.storage.clone();
                let cache = cache.clone();
                let object = object.clone();
                let key = key.clone();
                async move {
                    let bytes = storage
                        .fetch(&key, span)
                        .await
                        .map_err(|e| Box::new(e) as diskless_cache::BoxError)?;
                    let len = bytes.len() as u64;
                    // A block that is a slice of a longer read would keep the whole read alive
                    // while weighing one block: blocks of a multi-block read are copied out.
                    let block = |start: u64, end: u64| {
                        if len > bs {
                            Bytes::copy_from_slice(&bytes[start as usize..end as usize])
                        } else {
                            bytes.slice(start as usize..end as usize)
                        }
                    };
                    // Every block of the span but the first goes into the cache here; the first is
                    // the loader's own result.
                    for index in first + 1..=last {
                        let start = (index - first) * bs;
                        if start >= len {
                            break;
                        }
                        let end = (start + bs).min(len);
                        cache
                            .insert(BlockKey::new(object.clone(), bs, index), block(start, end))
                            .await;
                    }
                    Ok(block(0, bs.min(len)))
                }
            };
            let block = cache
                .get_or_load(BlockKey::new(object.clone(), bs, first), Box::pin(loader))
                .await
                .map_err(load_error)?;
            blocks.insert(first, block);
            for &index in &missing[1..] {
                let block_key = BlockKey::new(object.clone(), bs, index);
                let block = match cache.get(&block_key).await {
                    Some(block) => block,
                    None => {
                        // Evicted or loaded by another fetch with another span: read it alone.
                        let storage = self.storage.clone();
                        let key = key.clone();
                        let range = index * bs..((index + 1) * bs).min(object_size);
                        cache
                            .get_or_load(
                                block_key,
                                Box::pin(async move {
                                    storage
                                        .fetch(&key, range)
                                        .await
                                        .map_err(|e| Box::new(e) as diskless_cache::BoxError)
                                }),
                            )
                            .await
                            .map_err(load_error)?
                    }
                };
                blocks.insert(index, block);
            }
        }
        ranges
            .iter()
            .map(|r| slice_blocks(&blocks, bs, object.as_ref(), r))
            .collect()
    }
}

fn load_error(e: diskless_cache::LoadError) -> StorageError {
    StorageError::Transient {
        source: e.to_string().into(),
    }
}

/// The bytes of `range` from aligned blocks (a slice when it lies in one block, else a copy).
fn slice_blocks(
    blocks: &HashMap<u64, Bytes>,
    bs: u64,
    object: &str,
    range: &Range<u64>,
) -> Result<Bytes, StorageError> {
    let short = || StorageError::InvalidRange {
        key: object.to_string(),
        start: range.start,
        end: range.end,
        size: None,
    };
    let first = range.start / bs;
    let last = (range.end - 1) / bs;
    if first == last {
        let block = blocks.get(&first).ok_or_else(short)?;
        let start = (range.start - first * bs) as usize;
        let end = (range.end - first * bs) as usize;
        if end > block.len() {
            return Err(short());
        }
        return Ok(block.slice(start..end));
    }
    let mut out = BytesMut::with_capacity((range.end - range.start) as usize);
    for index in first..=last {
        let block = blocks.get(&index).ok_or_else(short)?;
        let block_start = index * bs;
        let from = range.start.max(block_start) - block_start;
        let to = range.end.min(block_start + bs) - block_start;
        if to as usize > block.len() {
            return Err(short());
        }
        out.extend_from_slice(&block[from as usize..to as usize]);
    }
    Ok(out.freeze())
}

/// Checks that stored bytes are the batch the coordinates describe, and injects the assigned offsets.
fn serve_batch(
    bytes: Bytes,
    coordinate: &BatchCoordinate,
    leader_epoch: i32,
) -> Result<[Bytes; 2], String> {
    let batch = frame_stored_batch(bytes, coordinate)?;
    let log_append_time = (coordinate.timestamp_type == TimestampType::LogAppendTime)
        .then_some(coordinate.log_append_time);
    // With LogAppendTime the CRC is recomputed, so the stored one is checked first (same pass):
    // corruption must reach the consumer as an error, never behind a fresh valid CRC.
    rewrite_batch_verified(
        &batch,
        &BatchRewrite {
            base_offset: coordinate.base_offset,
            partition_leader_epoch: leader_epoch,
            log_append_time,
        },
    )
    .map(RewrittenBatch::into_chunks)
    .map_err(|e| {
        format!(
            "stored batch at {}+{} of {}: {e}",
            coordinate.byte_offset, coordinate.byte_size, coordinate.object_key
        )
    })
}

/// Frames stored bytes as one batch and checks that it is the batch the coordinates describe (its
/// size and its number of records). The CRC is left to the caller.
pub(crate) fn frame_stored_batch(
    bytes: Bytes,
    coordinate: &BatchCoordinate,
) -> Result<RecordBatch, String> {
    let batch = RecordBatch::parse(bytes).map_err(|e| {
        format!(
            "stored batch at {}+{} of {} does not frame: {e}",
            coordinate.byte_offset, coordinate.byte_size, coordinate.object_key
        )
    })?;
    let records = coordinate
        .last_offset
        .checked_sub(coordinate.base_offset)
        .and_then(|d| d.checked_add(1));
    if batch.len() != coordinate.byte_size as usize
        || Some(i64::from(batch.last_offset_delta()) + 1) != records
    {
        return Err(format!(
            "stored batch at {}+{} of {} does not match its coordinates",
            coordinate.byte_offset, coordinate.byte_size, coordinate.object_key
        ));
    }
    Ok(batch)
}
