//! Reading stored batches: grouped by object, through the cache in aligned blocks, or by ranged
//! GETs without one.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Range;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use diskless_cache::{BlockKey, LocalCache};
use diskless_coordinator::BatchCoordinate;
use diskless_storage::{ObjectKey, StorageError, fetch_ranges};
use futures::StreamExt;
use tracing::warn;

use super::Fetcher;

/// What one object read covers: its size, and the byte range of each wanted batch under its slot.
type ObjectReads<K> = (u64, Vec<(K, Range<u64>)>);

/// Where the bytes of a read came from. Every byte of a batch read is counted once: as a hit
/// when the cache held its block when the read looked, else as a miss (read from storage, by
/// this read or by a concurrent one it waited for). So `hit_bytes + miss_bytes` is the size of
/// the batches read successfully.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ReadStats {
    /// Batch bytes found in the cache.
    pub(crate) hit_bytes: u64,
    /// Batch bytes read from object storage.
    pub(crate) miss_bytes: u64,
}

impl ReadStats {
    /// Adds `other`'s bytes.
    pub(crate) fn add(&mut self, other: ReadStats) {
        self.hit_bytes += other.hit_bytes;
        self.miss_bytes += other.miss_bytes;
    }
}

/// Each batch's bytes, or why they could not be read, under its slot.
pub(crate) type BatchBytes<K> = HashMap<K, Result<Bytes, String>>;

impl Fetcher {
    /// Reads the stored bytes of batches, grouped by object: one [`Self::read_object`] per object
    /// (at most `max_concurrent_objects` at once), in key order.
    pub(crate) async fn read_batches<K>(
        &self,
        wanted: Vec<(K, &BatchCoordinate)>,
    ) -> (BatchBytes<K>, ReadStats)
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
        let mut stats = ReadStats::default();
        for (object, wanted, result) in reads {
            match result {
                Ok((parts, object_stats)) => {
                    stats.add(object_stats);
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
        (bytes_of, stats)
    }

    /// Reads `ranges` of one object, through the cache when there is one.
    pub(super) async fn read_object(
        &self,
        object: &str,
        object_size: u64,
        ranges: &[Range<u64>],
    ) -> Result<(Vec<Bytes>, ReadStats), StorageError> {
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
                let parts =
                    fetch_ranges(self.storage.as_ref(), &key, ranges, &self.config.range_read)
                        .await?;
                let miss_bytes = parts.iter().map(|p| p.len() as u64).sum();
                Ok((
                    parts,
                    ReadStats {
                        hit_bytes: 0,
                        miss_bytes,
                    },
                ))
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
    ) -> Result<(Vec<Bytes>, ReadStats), StorageError> {
        let bs = self.config.cache_block_size;
        let object: Arc<str> = Arc::from(key.as_str());
        // `validate` guarantees bs >= 1; read_object guarantees non-empty ranges.
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
        // Bytes of the ranges that lie in blocks the cache held.
        let hit_bytes: u64 = ranges
            .iter()
            .flat_map(|r| {
                ((r.start / bs)..=((r.end - 1) / bs))
                    .filter(|index| blocks.contains_key(index))
                    .map(move |index| overlap(r, block_range(index, bs)))
            })
            .sum();
        if let (Some(&first), Some(&last)) = (missing.first(), missing.last()) {
            let span = first * bs..block_range(last, bs).end.min(object_size);
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
                        let end = start.saturating_add(bs).min(len);
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
                        let range = index * bs..block_range(index, bs).end.min(object_size);
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
        let parts = ranges
            .iter()
            .map(|r| slice_blocks(&blocks, bs, object.as_ref(), r))
            .collect::<Result<Vec<_>, _>>()?;
        let read: u64 = parts.iter().map(|p| p.len() as u64).sum();
        Ok((
            parts,
            ReadStats {
                hit_bytes,
                miss_bytes: read.saturating_sub(hit_bytes),
            },
        ))
    }
}

/// The byte range of block `index` (saturating at the end of the address space).
fn block_range(index: u64, bs: u64) -> Range<u64> {
    let start = index.saturating_mul(bs);
    start..start.saturating_add(bs)
}

/// The number of bytes two ranges share.
fn overlap(a: &Range<u64>, b: Range<u64>) -> u64 {
    a.end.min(b.end).saturating_sub(a.start.max(b.start))
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
        let to = range.end.min(block_start.saturating_add(bs)) - block_start;
        if to as usize > block.len() {
            return Err(short());
        }
        out.extend_from_slice(&block[from as usize..to as usize]);
    }
    Ok(out.freeze())
}
