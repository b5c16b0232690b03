//! [`DiskCache`]: a [`LocalCache`] that keeps blocks in files on local disk, survives a restart,
//! and serves only bytes it has verified (issue 15's local disk tier, KIP-1163's "local segments").

use crate::{BlockKey, BoxError, CacheStats, ConfigError, LoadError, LocalCache};
use async_trait::async_trait;
use bytes::Bytes;
use futures::future::BoxFuture;
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::SystemTime;
use tokio::sync::watch;

/// The first bytes of every block file: the format and its version.
const MAGIC: &[u8; 8] = b"DLBLK001";
/// The fixed part of a block file's header: magic, key length (u32), block size, block index,
/// payload length (u64 each), CRC-32C of the payload (u32); all little-endian.
const FIXED_HEADER: usize = 8 + 4 + 8 + 8 + 8 + 4;
/// The longest object key a block file holds; blocks of longer keys are not cached.
const MAX_KEY_LEN: usize = 64 << 10;
/// The extension of block files.
const BLOCK_EXT: &str = ".blk";
/// The extension of block files being written.
const TMP_EXT: &str = ".tmp";
/// Hex digits of a block file's name (a 128-bit hash).
const NAME_HEX: usize = 32;

/// Settings of a [`DiskCache`].
///
/// ```
/// use diskless_cache::DiskCacheConfig;
///
/// let config = DiskCacheConfig::new("/var/cache/diskless").with_max_bytes(10 << 30);
/// assert_eq!(config.max_bytes, 10 << 30);
/// assert!(config.validate().is_ok());
/// assert!(config.with_max_bytes(0).validate().is_err());
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct DiskCacheConfig {
    /// The directory of the block files (created if missing). The cache owns the files it names
    /// (`<32 hex digits>.blk` and `<32 hex digits>.<n>.tmp`); other files there are left alone.
    /// One cache at a time per directory.
    pub dir: PathBuf,
    /// The most block bytes the cache holds (the sum of the cached blocks' lengths; each file
    /// also holds a header of about 50 bytes plus the object key). Default
    /// [`DiskCacheConfig::DEFAULT_MAX_BYTES`] (1 GiB). Must be positive.
    pub max_bytes: u64,
}

diskless_common::with_setters!(DiskCacheConfig {
    with_dir => dir: into [PathBuf],
    with_max_bytes => max_bytes: [u64],
});

impl DiskCacheConfig {
    /// The default [`max_bytes`](Self::max_bytes): 1 GiB.
    pub const DEFAULT_MAX_BYTES: u64 = 1 << 30;

    /// Settings for a cache in `dir`, with the default byte bound.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        DiskCacheConfig {
            dir: dir.into(),
            max_bytes: Self::DEFAULT_MAX_BYTES,
        }
    }

    /// Checks the settings: `max_bytes` must be positive (a disk cache that holds nothing is
    /// not wanted: leave it out instead).
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.max_bytes == 0 {
            return Err(ConfigError::Invalid {
                field: "max_bytes",
                reason: "must be positive (to cache nothing, use no disk cache)".to_owned(),
            });
        }
        Ok(())
    }
}

/// Why a [`DiskCache`] could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DiskCacheError {
    /// The settings are invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The directory could not be created or listed.
    #[error("cannot open the disk cache directory {}: {source}", dir.display())]
    Io {
        /// The directory.
        dir: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
}

/// A [`LocalCache`] on local disk: one file per block, bounded by bytes, kept across restarts,
/// verified on every read.
///
/// - **Files**: block `(object, block_size, index)` is the file `<dir>/<h>.blk`, where `<h>` is
///   the 32 hex digits of a 128-bit FNV-1a hash of the key (never the object key itself, which
///   contains `/`). The file holds a header — magic and version `DLBLK001`, the object key, block
///   size, block index, payload length, CRC-32C of the payload, CRC-32C of the header — and then
///   the block. It is written under a temporary name and renamed into place, so a file under a
///   block name is never half-written by this cache; there is no fsync: a file torn by a crash
///   fails verification and is dropped (the cache is not durable storage, as KIP-1163 says of
///   local segments).
/// - **Verification**: [`get`](LocalCache::get) reads the whole file and serves it only if the
///   header is intact, names the requested key, and the payload has the header's length and
///   CRC-32C. Anything else is a miss, the file is deleted, and
///   [`verification_failures`](DiskCache::verification_failures) counts it.
/// - **Byte bound**: the blocks' lengths sum to at most [`DiskCacheConfig::max_bytes`]; an insert
///   that would exceed it first evicts least recently used blocks (a `get` hit or an insert makes
///   a block most recently used). A block larger than the bound is not cached.
/// - **Restart**: [`DiskCache::open`] scans the directory and rebuilds the index from the
///   headers (the payloads are verified lazily, on read). Files whose header is unreadable,
///   inconsistent with the file's name or size, or too large for the bound, and leftover
///   temporary files, are deleted; files with other names are ignored. The recency order after
///   a restart is the files' modification times (reads before the restart are not remembered);
///   if the blocks exceed the bound (e.g. it was lowered), the oldest are evicted.
/// - **Coalesced loads**: [`get_or_load`](LocalCache::get_or_load) runs one load per key at a
///   time, as [`MokaCache`](crate::MokaCache) does, with the same cancel-safety guarantees.
/// - **Invalidation**: an in-memory map object → blocks makes
///   [`invalidate_object`](LocalCache::invalidate_object) cost O(blocks of the object).
///
/// File I/O runs on tokio's blocking threads (`spawn_blocking`), so the cache must be used from
/// within a tokio runtime. Directory changes (rename into place, delete) are made under the
/// index's lock, so the index and the directory agree.
///
/// # Statistics
///
/// All of [`stats()`](LocalCache::stats) is exact at any time: `hits`, `misses` (including reads
/// that failed verification), `loads`, `inserts` (calls of `insert` and successful loads, cached
/// or not), `entries` and `bytes` (blocks indexed and their lengths).
///
/// # Cancel safety
///
/// Every method keeps the guarantees of [`LocalCache`]'s *Cancel safety* sections. The file work
/// of a call (a read, a write and rename, the deletes of an invalidation) runs to its end on a
/// blocking thread even when the call is dropped, and updates the index with it, so the index
/// always names exactly the files in place. In `get_or_load`, the call that runs the load polls
/// it itself: dropping that call drops the load (nothing cached), and a caller waiting on it
/// runs its own load; dropping a waiting call changes nothing for the others. A call dropped
/// after its load succeeded, while the block is being written, leaves the write to finish.
///
/// # Example
///
/// ```
/// use bytes::Bytes;
/// use diskless_cache::{BlockKey, DiskCache, DiskCacheConfig, LocalCache};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let dir = tempfile::tempdir()?;
/// let config = DiskCacheConfig::new(dir.path()).with_max_bytes(64 << 20);
/// let key = BlockKey::new("wal/0001", 4 << 20, 0);
/// {
///     let cache = DiskCache::open(config.clone()).await?;
///     cache.insert(key.clone(), Bytes::from_static(b"hot bytes")).await;
/// }
/// // A new cache over the same directory (e.g. after a broker restart) still has the block.
/// let cache = DiskCache::open(config).await?;
/// assert_eq!(cache.get(&key).await, Some(Bytes::from_static(b"hot bytes")));
/// assert_eq!(cache.stats().bytes, 9);
/// # Ok(())
/// # }
/// ```
pub struct DiskCache {
    inner: Arc<Inner>,
    /// The loads running, by key: callers of `get_or_load` that find one wait on its outcome.
    flights: Mutex<HashMap<BlockKey, FlightReceiver>>,
}

/// The outcome of a load, `None` while it runs.
type FlightReceiver = watch::Receiver<Option<Result<Bytes, LoadError>>>;

/// What is shared with the blocking threads.
struct Inner {
    config: DiskCacheConfig,
    state: Mutex<State>,
    counters: Counters,
    /// Distinguishes the temporary files of concurrent writes.
    tmp_seq: AtomicU64,
    /// Whether blocks dropped other than by `invalidate_object` are logged in `dropped` (for a
    /// [`crate::TwoTierCache`], whose memory tier holds only blocks this tier holds).
    track_dropped: AtomicBool,
    /// Keys of blocks dropped (evicted, failed verification, gone) since the last
    /// [`DiskCache::take_dropped`].
    dropped: Mutex<Vec<BlockKey>>,
}

#[derive(Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    loads: AtomicU64,
    inserts: AtomicU64,
    verification_failures: AtomicU64,
}

/// One indexed block file.
struct Entry {
    key: BlockKey,
    len: u64,
    /// Its place in the recency order (a key of [`State::lru`]).
    tick: u64,
    /// Which write put the file in place: a reader that found a bad file removes the entry
    /// (and the file) only if no other write replaced it since.
    generation: u64,
}

/// The index of the cached blocks, by file id (the hash of the key).
#[derive(Default)]
struct State {
    entries: HashMap<u128, Entry>,
    /// Recency order: the first tick is the least recently used block.
    lru: BTreeMap<u64, u128>,
    objects: HashMap<Arc<str>, HashSet<u128>>,
    bytes: u64,
    next_tick: u64,
    next_generation: u64,
}

impl State {
    /// The id and generation of `key`'s file, if indexed.
    fn find(&self, key: &BlockKey) -> Option<(u128, u64)> {
        let id = file_id(key);
        self.entries
            .get(&id)
            .filter(|entry| entry.key == *key)
            .map(|entry| (id, entry.generation))
    }

    fn tick(&mut self) -> u64 {
        let tick = self.next_tick;
        self.next_tick += 1;
        tick
    }

    /// Makes `id` the most recently used block.
    fn touch(&mut self, id: u128) {
        let tick = self.tick();
        if let Some(entry) = self.entries.get_mut(&id) {
            self.lru.remove(&entry.tick);
            entry.tick = tick;
            self.lru.insert(tick, id);
        }
    }

    /// Indexes a file just put in place, as the most recently used block.
    fn add(&mut self, id: u128, key: BlockKey, len: u64) {
        self.remove(id);
        let tick = self.tick();
        let generation = self.next_generation;
        self.next_generation += 1;
        self.objects
            .entry(Arc::clone(&key.object))
            .or_default()
            .insert(id);
        self.lru.insert(tick, id);
        self.bytes += len;
        self.entries.insert(
            id,
            Entry {
                key,
                len,
                tick,
                generation,
            },
        );
    }

    /// Unindexes `id` (its file is the caller's business).
    fn remove(&mut self, id: u128) -> Option<Entry> {
        let entry = self.entries.remove(&id)?;
        self.lru.remove(&entry.tick);
        if let Some(blocks) = self.objects.get_mut(&entry.key.object) {
            blocks.remove(&id);
            if blocks.is_empty() {
                self.objects.remove(&entry.key.object);
            }
        }
        self.bytes -= entry.len;
        Some(entry)
    }

    /// The least recently used block.
    fn lru_victim(&self) -> Option<u128> {
        self.lru.first_key_value().map(|(_, id)| *id)
    }
}

/// The parsed header of a block file.
struct Header {
    key: BlockKey,
    len: u64,
    crc: u32,
    /// Bytes of the header (the payload follows).
    header_len: usize,
}

/// The 128-bit FNV-1a hash of a key: the name of its file. Stable across builds and platforms
/// (files written by one version are found by the next).
fn file_id(key: &BlockKey) -> u128 {
    const OFFSET: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
    const PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013b;
    let mut hash = OFFSET;
    let object = key.object.as_bytes();
    for part in [
        &(object.len() as u64).to_le_bytes()[..],
        object,
        &key.block_size.to_le_bytes()[..],
        &key.index.to_le_bytes()[..],
    ] {
        for byte in part {
            hash ^= u128::from(*byte);
            hash = hash.wrapping_mul(PRIME);
        }
    }
    hash
}

fn block_file_name(id: u128) -> String {
    format!("{id:032x}{BLOCK_EXT}")
}

/// The id of a block file's name (`<32 lowercase hex>.blk`).
fn parse_block_name(name: &str) -> Option<u128> {
    let hex = name.strip_suffix(BLOCK_EXT)?;
    if hex.len() != NAME_HEX
        || !hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return None;
    }
    u128::from_str_radix(hex, 16).ok()
}

/// Whether `name` is a temporary file of this cache (`<32 hex>.<n>.tmp`).
fn is_tmp_name(name: &str) -> bool {
    name.strip_suffix(TMP_EXT)
        .and_then(|rest| rest.split_once('.'))
        .is_some_and(|(hex, seq)| {
            hex.len() == NAME_HEX
                && hex.bytes().all(|b| b.is_ascii_hexdigit())
                && !seq.is_empty()
                && seq.bytes().all(|b| b.is_ascii_digit())
        })
}

fn le_u32(buf: &[u8], at: usize) -> u32 {
    let mut bytes = [0; 4];
    bytes.copy_from_slice(&buf[at..at + 4]);
    u32::from_le_bytes(bytes)
}

fn le_u64(buf: &[u8], at: usize) -> u64 {
    let mut bytes = [0; 8];
    bytes.copy_from_slice(&buf[at..at + 8]);
    u64::from_le_bytes(bytes)
}

/// The header of a block file holding `block` under `key`.
fn encode_header(key: &BlockKey, block: &[u8]) -> Vec<u8> {
    let object = key.object.as_bytes();
    let mut header = Vec::with_capacity(FIXED_HEADER + object.len() + 4);
    header.extend_from_slice(MAGIC);
    header.extend_from_slice(&(object.len() as u32).to_le_bytes());
    header.extend_from_slice(&key.block_size.to_le_bytes());
    header.extend_from_slice(&key.index.to_le_bytes());
    header.extend_from_slice(&(block.len() as u64).to_le_bytes());
    header.extend_from_slice(&crc32c::crc32c(block).to_le_bytes());
    header.extend_from_slice(object);
    let header_crc = crc32c::crc32c(&header);
    header.extend_from_slice(&header_crc.to_le_bytes());
    header
}

/// The key length a header announces, from its fixed part (`buf` holds at least that).
fn header_len(fixed: &[u8]) -> Result<usize, &'static str> {
    if fixed.len() < FIXED_HEADER {
        return Err("truncated header");
    }
    if &fixed[..MAGIC.len()] != MAGIC {
        return Err("not a block file of this version (bad magic)");
    }
    let key_len = le_u32(fixed, 8) as usize;
    if key_len > MAX_KEY_LEN {
        return Err("object key too long");
    }
    Ok(FIXED_HEADER + key_len + 4)
}

/// Parses and checks the header at the start of `buf`.
fn parse_header(buf: &[u8]) -> Result<Header, &'static str> {
    let header_len = header_len(buf)?;
    if buf.len() < header_len {
        return Err("truncated header");
    }
    let key_end = header_len - 4;
    if crc32c::crc32c(&buf[..key_end]) != le_u32(buf, key_end) {
        return Err("header checksum mismatch");
    }
    let object =
        std::str::from_utf8(&buf[FIXED_HEADER..key_end]).map_err(|_| "object key is not UTF-8")?;
    Ok(Header {
        key: BlockKey::new(object, le_u64(buf, 12), le_u64(buf, 20)),
        len: le_u64(buf, 28),
        crc: le_u32(buf, 36),
        header_len,
    })
}

/// The block in a whole block file's bytes, if they verify as `key`'s.
fn verify(key: &BlockKey, data: Vec<u8>) -> Result<Bytes, &'static str> {
    let header = parse_header(&data)?;
    if header.key != *key {
        return Err("the header names another block");
    }
    let payload_len = (data.len() - header.header_len) as u64;
    if payload_len != header.len {
        return Err("payload length mismatch");
    }
    if crc32c::crc32c(&data[header.header_len..]) != header.crc {
        return Err("payload checksum mismatch");
    }
    Ok(Bytes::from(data).slice(header.header_len..))
}

/// Deletes a file; a file already gone is fine, other failures are logged.
fn remove_file(path: &Path) {
    match fs::remove_file(path) {
        Ok(()) => {}
        Err(error) if error.kind() == io::ErrorKind::NotFound => {}
        Err(error) => {
            tracing::warn!(path = %path.display(), %error, "disk cache: cannot delete a file")
        }
    }
}

/// A block file's header and modification time, without reading the payload.
fn read_file_header(path: &Path, max_bytes: u64) -> Result<(Header, SystemTime), String> {
    let mut file = File::open(path).map_err(|e| e.to_string())?;
    let metadata = file.metadata().map_err(|e| e.to_string())?;
    let modified = metadata.modified().unwrap_or(SystemTime::UNIX_EPOCH);
    let mut buf = vec![0; FIXED_HEADER];
    file.read_exact(&mut buf)
        .map_err(|_| "truncated header".to_owned())?;
    let header_len = header_len(&buf)?;
    buf.resize(header_len, 0);
    file.read_exact(&mut buf[FIXED_HEADER..])
        .map_err(|_| "truncated header".to_owned())?;
    let header = parse_header(&buf)?;
    if metadata.len() != header.header_len as u64 + header.len {
        return Err("file size does not match the header".to_owned());
    }
    if header.len > max_bytes {
        return Err("block larger than the byte bound".to_owned());
    }
    Ok((header, modified))
}

impl Inner {
    fn path(&self, id: u128) -> PathBuf {
        self.config.dir.join(block_file_name(id))
    }

    /// Evicts least recently used blocks until `incoming` more bytes fit. Under the lock.
    fn make_room(&self, state: &mut State, incoming: u64) {
        while state.bytes + incoming > self.config.max_bytes {
            let Some(victim) = state.lru_victim() else {
                break;
            };
            self.unindex(state, victim);
            remove_file(&self.path(victim));
        }
    }

    /// Unindexes `id` because its block is dropped (not invalidated), logging the key when
    /// [`DiskCache::track_dropped`] asked for it.
    fn unindex(&self, state: &mut State, id: u128) {
        if let Some(entry) = state.remove(id)
            && self.track_dropped.load(Ordering::Relaxed)
        {
            self.dropped.lock().push(entry.key);
        }
    }

    /// Reads and verifies `key`'s file (id `id`, indexed at `generation`). Blocking.
    fn read_block(&self, key: &BlockKey, id: u128, generation: u64) -> Option<Bytes> {
        let path = self.path(id);
        let failure = match fs::read(&path) {
            Ok(data) => match verify(key, data) {
                Ok(block) => {
                    let mut state = self.state.lock();
                    if state.find(key).is_some_and(|(_, g)| g == generation) {
                        state.touch(id);
                    }
                    return Some(block);
                }
                Err(reason) => reason.to_owned(),
            },
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                // Deleted behind the index's back (or by a concurrent eviction): unindex it.
                let mut state = self.state.lock();
                if state.find(key).is_some_and(|(_, g)| g == generation) {
                    self.unindex(&mut state, id);
                }
                return None;
            }
            Err(error) => error.to_string(),
        };
        self.counters
            .verification_failures
            .fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            path = %path.display(), object = %key.object, index = key.index, reason = %failure,
            "disk cache: a block file failed verification; deleted, not served"
        );
        let mut state = self.state.lock();
        // Only if no write replaced the file since it was read (writes rename under the lock).
        if state.find(key).is_some_and(|(_, g)| g == generation) {
            self.unindex(&mut state, id);
            remove_file(&path);
        }
        None
    }

    /// Writes `block` as `key`'s file and indexes it, evicting as needed. Blocking.
    fn write_block(&self, key: BlockKey, block: Bytes) {
        let id = file_id(&key);
        let path = self.path(id);
        let len = block.len() as u64;
        if len > self.config.max_bytes || key.object.len() > MAX_KEY_LEN {
            // Not cached; an older version of the block must not be served either.
            let mut state = self.state.lock();
            if state.find(&key).is_some() {
                self.unindex(&mut state, id);
                remove_file(&path);
            }
            return;
        }
        let seq = self.tmp_seq.fetch_add(1, Ordering::Relaxed);
        let tmp = self.config.dir.join(format!("{id:032x}.{seq}{TMP_EXT}"));
        let written = File::create(&tmp).and_then(|mut file| {
            file.write_all(&encode_header(&key, &block))?;
            file.write_all(&block)
        });
        if let Err(error) = written {
            tracing::warn!(path = %tmp.display(), %error, "disk cache: cannot write a block file");
            remove_file(&tmp);
            return;
        }
        let mut state = self.state.lock();
        // The file in place (this key's older version, or another key's with the same hash) is
        // replaced by the rename.
        if state.entries.get(&id).is_some_and(|e| e.key != key) {
            self.unindex(&mut state, id);
        } else {
            state.remove(id);
        }
        self.make_room(&mut state, len);
        match fs::rename(&tmp, &path) {
            Ok(()) => state.add(id, key, len),
            Err(error) => {
                tracing::warn!(path = %path.display(), %error, "disk cache: cannot rename a block file into place");
                remove_file(&tmp);
                remove_file(&path);
            }
        }
    }

    /// Deletes every block of `object`. Blocking.
    fn invalidate(&self, object: &str) -> usize {
        let mut state = self.state.lock();
        let Some(ids) = state.objects.remove(object) else {
            return 0;
        };
        for id in &ids {
            state.remove(*id);
            remove_file(&self.path(*id));
        }
        ids.len()
    }

    /// Rebuilds the index from the directory. Blocking.
    fn scan(&self) -> io::Result<()> {
        let dir = &self.config.dir;
        fs::create_dir_all(dir)?;
        let mut found = Vec::new();
        let (mut removed, mut ignored) = (0usize, 0usize);
        for entry in fs::read_dir(dir)? {
            let entry = match entry {
                Ok(entry) => entry,
                Err(error) => {
                    tracing::warn!(dir = %dir.display(), %error, "disk cache: cannot list an entry");
                    continue;
                }
            };
            let path = entry.path();
            let is_file = entry.file_type().is_ok_and(|t| t.is_file());
            let name = entry.file_name();
            let Some(name) = name.to_str().filter(|_| is_file) else {
                ignored += 1;
                continue;
            };
            if is_tmp_name(name) {
                remove_file(&path);
                removed += 1;
                continue;
            }
            let Some(id) = parse_block_name(name) else {
                tracing::debug!(path = %path.display(), "disk cache: ignoring a file it did not write");
                ignored += 1;
                continue;
            };
            match read_file_header(&path, self.config.max_bytes) {
                Ok((header, _)) if file_id(&header.key) != id => {
                    tracing::warn!(path = %path.display(), "disk cache: the file name does not match the header's key; deleted");
                    remove_file(&path);
                    removed += 1;
                }
                Ok((header, modified)) => found.push((modified, id, header)),
                Err(reason) => {
                    tracing::warn!(path = %path.display(), %reason, "disk cache: unreadable block file; deleted");
                    remove_file(&path);
                    removed += 1;
                }
            }
        }
        found.sort_by_key(|(modified, id, _)| (*modified, *id));
        let mut state = self.state.lock();
        for (_, id, header) in found {
            state.add(id, header.key, header.len);
        }
        self.make_room(&mut state, 0);
        tracing::info!(
            dir = %dir.display(), blocks = state.entries.len(), bytes = state.bytes, removed, ignored,
            "disk cache opened"
        );
        Ok(())
    }
}

impl DiskCache {
    /// Opens the cache in [`DiskCacheConfig::dir`] (created if missing) once
    /// [`DiskCacheConfig::validate`] accepted the settings, and indexes the blocks found there
    /// (see *Restart* in [`DiskCache`]).
    pub async fn open(config: DiskCacheConfig) -> Result<Self, DiskCacheError> {
        config.validate()?;
        let dir = config.dir.clone();
        let inner = Arc::new(Inner {
            config,
            state: Mutex::new(State::default()),
            counters: Counters::default(),
            tmp_seq: AtomicU64::new(0),
            track_dropped: AtomicBool::new(false),
            dropped: Mutex::new(Vec::new()),
        });
        let scanning = Arc::clone(&inner);
        let scanned = tokio::task::spawn_blocking(move || scanning.scan())
            .await
            .unwrap_or_else(|join| Err(io::Error::other(join.to_string())));
        scanned.map_err(|source| DiskCacheError::Io { dir, source })?;
        Ok(DiskCache {
            inner,
            flights: Mutex::new(HashMap::new()),
        })
    }

    /// The settings this cache was opened with.
    pub fn config(&self) -> &DiskCacheConfig {
        &self.inner.config
    }

    /// Where `key`'s block file is (whether or not the block is cached).
    pub fn file_path(&self, key: &BlockKey) -> PathBuf {
        self.inner.path(file_id(key))
    }

    /// Reads of a block file that failed verification (bad header, wrong key, length or
    /// checksum, or an I/O error) since the cache was opened; each was a miss and deleted
    /// the file.
    pub fn verification_failures(&self) -> u64 {
        self.inner
            .counters
            .verification_failures
            .load(Ordering::Relaxed)
    }

    /// From now on, keeps the keys of blocks dropped other than by
    /// [`LocalCache::invalidate_object`] (evicted by the byte bound, failed verification, found
    /// gone) until [`DiskCache::take_dropped`] takes them.
    pub(crate) fn track_dropped(&self) {
        self.inner.track_dropped.store(true, Ordering::Relaxed);
    }

    /// Whether `key`'s block is indexed (without reading or verifying it).
    pub(crate) fn lookup_indexed(&self, key: &BlockKey) -> bool {
        self.inner.state.lock().find(key).is_some()
    }

    /// The keys logged since the last call (see [`DiskCache::track_dropped`]).
    pub(crate) fn take_dropped(&self) -> Vec<BlockKey> {
        std::mem::take(&mut *self.inner.dropped.lock())
    }

    /// The verified block of `key`, without counting a hit or a miss.
    pub(crate) async fn lookup(&self, key: &BlockKey) -> Option<Bytes> {
        let (id, generation) = self.inner.state.lock().find(key)?;
        let inner = Arc::clone(&self.inner);
        let key = key.clone();
        match tokio::task::spawn_blocking(move || inner.read_block(&key, id, generation)).await {
            Ok(found) => found,
            Err(error) => {
                tracing::warn!(%error, "disk cache: a block read did not complete");
                None
            }
        }
    }

    /// Writes a block (to the end, even if the caller is dropped).
    pub(crate) async fn store(&self, key: BlockKey, block: Bytes) {
        let inner = Arc::clone(&self.inner);
        if let Err(error) = tokio::task::spawn_blocking(move || inner.write_block(key, block)).await
        {
            tracing::warn!(%error, "disk cache: a block write did not complete");
        }
    }
}

/// The one running load of a key: removes it from the flights when dropped; dropped without
/// [`finish`](Flight::finish) (the caller was cancelled), its waiters see the channel closed.
struct Flight<'a> {
    flights: &'a Mutex<HashMap<BlockKey, FlightReceiver>>,
    key: BlockKey,
    sender: watch::Sender<Option<Result<Bytes, LoadError>>>,
    receiver: FlightReceiver,
}

impl Flight<'_> {
    fn finish(self, outcome: Result<Bytes, LoadError>) {
        self.sender.send_replace(Some(outcome));
    }
}

impl Drop for Flight<'_> {
    fn drop(&mut self) {
        let mut flights = self.flights.lock();
        if flights
            .get(&self.key)
            .is_some_and(|receiver| receiver.same_channel(&self.receiver))
        {
            flights.remove(&self.key);
        }
    }
}

impl std::fmt::Debug for DiskCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskCache")
            .field("config", &self.inner.config)
            .field("stats", &self.stats())
            .field("verification_failures", &self.verification_failures())
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl LocalCache for DiskCache {
    async fn get(&self, key: &BlockKey) -> Option<Bytes> {
        let found = self.lookup(key).await;
        let counter = if found.is_some() {
            &self.inner.counters.hits
        } else {
            &self.inner.counters.misses
        };
        counter.fetch_add(1, Ordering::Relaxed);
        found
    }

    async fn insert(&self, key: BlockKey, block: Bytes) {
        self.inner.counters.inserts.fetch_add(1, Ordering::Relaxed);
        self.store(key, block).await;
    }

    async fn get_or_load(
        &self,
        key: BlockKey,
        load: BoxFuture<'static, Result<Bytes, BoxError>>,
    ) -> Result<Bytes, LoadError> {
        let counters = &self.inner.counters;
        if let Some(block) = self.lookup(&key).await {
            counters.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(block);
        }
        counters.misses.fetch_add(1, Ordering::Relaxed);
        // Wait on the running load of the key, if any; lead once there is none.
        let flight = loop {
            let waiting = {
                let mut flights = self.flights.lock();
                match flights.get(&key) {
                    Some(receiver) => receiver.clone(),
                    None => {
                        let (sender, receiver) = watch::channel(None);
                        flights.insert(key.clone(), receiver.clone());
                        break Flight {
                            flights: &self.flights,
                            key: key.clone(),
                            sender,
                            receiver,
                        };
                    }
                }
            };
            let mut waiting = waiting;
            if let Ok(outcome) = waiting.wait_for(Option::is_some).await
                && let Some(outcome) = outcome.clone()
            {
                return outcome;
            }
            // The leader was dropped before finishing: try again (maybe leading).
        };
        // A load that finished between the lookup above and taking the lead has cached the block.
        if let Some(block) = self.lookup(&key).await {
            flight.finish(Ok(block.clone()));
            return Ok(block);
        }
        counters.loads.fetch_add(1, Ordering::Relaxed);
        let outcome = match load.await {
            Ok(block) => {
                counters.inserts.fetch_add(1, Ordering::Relaxed);
                self.store(key, block.clone()).await;
                Ok(block)
            }
            Err(error) => Err(Arc::new(error)),
        };
        flight.finish(outcome.clone());
        outcome
    }

    async fn invalidate_object(&self, object: &str) {
        let inner = Arc::clone(&self.inner);
        let name = object.to_owned();
        match tokio::task::spawn_blocking(move || inner.invalidate(&name)).await {
            Ok(blocks) => tracing::debug!(object, blocks, "disk cache: invalidated an object"),
            Err(error) => tracing::warn!(%error, "disk cache: an invalidation did not complete"),
        }
    }

    fn stats(&self) -> CacheStats {
        let counters = &self.inner.counters;
        let (entries, bytes) = {
            let state = self.inner.state.lock();
            (state.entries.len() as u64, state.bytes)
        };
        CacheStats {
            hits: counters.hits.load(Ordering::Relaxed),
            misses: counters.misses.load(Ordering::Relaxed),
            loads: counters.loads.load(Ordering::Relaxed),
            inserts: counters.inserts.load(Ordering::Relaxed),
            entries,
            bytes,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_and_rejects_damage() {
        let key = BlockKey::new("topic/wal/0001", 4096, 7);
        let block = b"payload bytes";
        let mut file = encode_header(&key, block);
        let header_len = file.len();
        file.extend_from_slice(block);
        let header = parse_header(&file).unwrap();
        assert_eq!(header.key, key);
        assert_eq!(header.len, block.len() as u64);
        assert_eq!(header.header_len, header_len);
        assert_eq!(verify(&key, file.clone()).unwrap(), &block[..]);
        // Every single-byte change of the file is caught.
        for at in 0..file.len() {
            let mut damaged = file.clone();
            damaged[at] ^= 0x01;
            assert!(verify(&key, damaged).is_err(), "flip at byte {at} served");
        }
        // So is every truncation.
        for len in 0..file.len() {
            assert!(verify(&key, file[..len].to_vec()).is_err(), "cut at {len}");
        }
        assert!(verify(&BlockKey::new("topic/wal/0001", 4096, 8), file).is_err());
    }

    #[test]
    fn names_are_recognised_exactly() {
        let id = file_id(&BlockKey::new("a/b", 1, 2));
        assert_eq!(parse_block_name(&block_file_name(id)), Some(id));
        assert_ne!(id, file_id(&BlockKey::new("a/b", 1, 3)));
        assert_ne!(id, file_id(&BlockKey::new("a/b", 2, 2)));
        assert_eq!(parse_block_name("notes.blk"), None);
        assert_eq!(parse_block_name(&format!("{id:032X}.blk")), None);
        assert!(is_tmp_name(&format!("{id:032x}.12.tmp")));
        assert!(!is_tmp_name("mine.tmp"));
        assert!(!block_file_name(id).contains('/'));
    }
}
