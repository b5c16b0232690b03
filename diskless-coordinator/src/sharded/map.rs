//! The stored partition → shard map ([`ShardMapStore`]) and its two implementations.

use crate::{CoordinatorError, ShardId};
use async_trait::async_trait;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use uuid::Uuid;

/// The placement of every topic: for each topic id, the shard of each partition (index = partition).
pub type Placements = BTreeMap<Uuid, Arc<[ShardId]>>;

/// Where a [`super::ShardedCoordinator`] stores which shard each partition belongs to.
///
/// A partition's shard is chosen once, when the partition is created (with its topic, or by
/// CreatePartitions, which appends to the topic's placement), and never changes while the topic
/// lives, so that every router (one per broker) and every restart routes a partition to the same
/// shard. In a Kafka
/// deployment the host would keep it in the cluster metadata (KRaft); [`FileShardMap`] keeps it in a
/// local file and [`MemoryShardMap`] in memory (tests, single-process demos).
///
/// All routers of a cluster must see the same placements: a [`FileShardMap`] is local to one
/// process, so several processes sharing the same shard coordinators need a shared store (whose
/// `load` reads the shared state). A router loads the placements when it opens, and again (at most
/// once a second) when a request names a topic it does not know, so a topic created through another
/// router on the same store becomes routable without a restart.
#[async_trait]
pub trait ShardMapStore: Send + Sync + std::fmt::Debug {
    /// Every stored placement.
    async fn load(&self) -> Result<Placements, CoordinatorError>;

    /// Stores `shards` as the placement of `topic_id` unless one is stored already; returns the
    /// placement in force afterwards (the stored one wins, so a retried creation routes the same).
    async fn put_if_absent(
        &self,
        topic_id: Uuid,
        shards: Arc<[ShardId]>,
    ) -> Result<Arc<[ShardId]>, CoordinatorError>;

    /// Grows a topic's placement (CreatePartitions): keeps every partition the stored placement
    /// has and appends the shards `shards` names for the partitions beyond it; returns the
    /// placement in force afterwards (never shorter than the stored one, whose partitions never
    /// move, so a concurrent or retried growth keeps what was stored first). A topic without a
    /// stored placement is [`CoordinatorError::UnknownTopic`].
    async fn extend(
        &self,
        topic_id: Uuid,
        shards: Arc<[ShardId]>,
    ) -> Result<Arc<[ShardId]>, CoordinatorError>;

    /// Forgets a topic's placement (missing topics are fine).
    async fn remove(&self, topic_id: Uuid) -> Result<(), CoordinatorError>;
}

/// The placement after [`ShardMapStore::extend`]: `stored`, then `proposed` beyond its length.
/// `None` when `proposed` adds nothing.
fn extended(stored: &[ShardId], proposed: &[ShardId]) -> Option<Arc<[ShardId]>> {
    (proposed.len() > stored.len()).then(|| {
        stored
            .iter()
            .chain(&proposed[stored.len()..])
            .copied()
            .collect()
    })
}

/// A [`ShardMapStore`] in memory: nothing survives the process.
#[derive(Debug, Default)]
pub struct MemoryShardMap {
    map: std::sync::Mutex<Placements>,
}

impl MemoryShardMap {
    /// An empty map.
    pub fn new() -> Self {
        Self::default()
    }
}

fn poisoned() -> CoordinatorError {
    CoordinatorError::Storage("shard map lock poisoned".into())
}

#[async_trait]
impl ShardMapStore for MemoryShardMap {
    async fn load(&self) -> Result<Placements, CoordinatorError> {
        Ok(self.map.lock().map_err(|_| poisoned())?.clone())
    }

    async fn put_if_absent(
        &self,
        topic_id: Uuid,
        shards: Arc<[ShardId]>,
    ) -> Result<Arc<[ShardId]>, CoordinatorError> {
        let mut map = self.map.lock().map_err(|_| poisoned())?;
        Ok(map.entry(topic_id).or_insert(shards).clone())
    }

    async fn extend(
        &self,
        topic_id: Uuid,
        shards: Arc<[ShardId]>,
    ) -> Result<Arc<[ShardId]>, CoordinatorError> {
        let mut map = self.map.lock().map_err(|_| poisoned())?;
        let stored = map
            .get_mut(&topic_id)
            .ok_or_else(|| CoordinatorError::UnknownTopic(topic_id.to_string()))?;
        if let Some(grown) = extended(stored, &shards) {
            *stored = grown;
        }
        Ok(stored.clone())
    }

    async fn remove(&self, topic_id: Uuid) -> Result<(), CoordinatorError> {
        self.map.lock().map_err(|_| poisoned())?.remove(&topic_id);
        Ok(())
    }
}

/// A [`ShardMapStore`] in a small text file, rewritten atomically (write a temporary file, fsync,
/// rename over the old one, fsync the directory) on every change.
///
/// Format: a first line `diskless-shard-map v1`, then one line per topic:
/// `<topic uuid> <shard of partition 0>,<shard of partition 1>,...`.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// use diskless_coordinator::sharded::{FileShardMap, ShardMapStore};
/// let dir = tempfile::tempdir().unwrap();
/// let path = dir.path().join("shards.map");
/// let map = FileShardMap::open(&path).await.unwrap();
/// let topic = uuid::Uuid::from_u128(7);
/// map.put_if_absent(topic, vec![0, 1, 2].into()).await.unwrap();
/// // A restart reads the same placement back.
/// let again = FileShardMap::open(&path).await.unwrap();
/// assert_eq!(&*again.load().await.unwrap()[&topic], &[0, 1, 2]);
/// # });
/// ```
#[derive(Debug)]
pub struct FileShardMap {
    path: PathBuf,
    map: tokio::sync::Mutex<Placements>,
}

const HEADER: &str = "diskless-shard-map v1";

fn io_error(context: &str, e: std::io::Error) -> CoordinatorError {
    CoordinatorError::Storage(format!("shard map {context}: {e}").into())
}

fn corrupt(line: usize, why: &str) -> CoordinatorError {
    CoordinatorError::Storage(format!("shard map line {line}: {why}").into())
}

/// Parses a shard map file's content.
fn parse(text: &str) -> Result<Placements, CoordinatorError> {
    let mut lines = text.lines();
    match lines.next() {
        None => return Ok(Placements::new()),
        Some(HEADER) => {}
        Some(_) => return Err(corrupt(1, "unknown header")),
    }
    let mut map = Placements::new();
    for (i, line) in lines.enumerate() {
        let n = i + 2;
        if line.trim().is_empty() {
            continue;
        }
        let (id, shards) = line
            .split_once(' ')
            .ok_or_else(|| corrupt(n, "no shards"))?;
        let id = Uuid::try_parse(id).map_err(|_| corrupt(n, "bad topic id"))?;
        let shards = shards
            .split(',')
            .map(|s| s.parse::<ShardId>().map_err(|_| corrupt(n, "bad shard id")))
            .collect::<Result<Vec<_>, _>>()?;
        if map.insert(id, shards.into()).is_some() {
            return Err(corrupt(n, "topic listed twice"));
        }
    }
    Ok(map)
}

fn render(map: &Placements) -> String {
    let mut out = String::from(HEADER);
    out.push('\n');
    for (id, shards) in map {
        let shards: Vec<String> = shards.iter().map(ToString::to_string).collect();
        out.push_str(&format!("{id} {}\n", shards.join(",")));
    }
    out
}

fn write_atomically(path: &Path, content: &str) -> Result<(), CoordinatorError> {
    use std::io::Write;
    // `<file name>.tmp` beside it (not `with_extension`, which would give the path itself for a
    // map file already named `*.tmp`).
    let mut tmp_name = path.file_name().unwrap_or_default().to_os_string();
    tmp_name.push(".tmp");
    let tmp = path.with_file_name(tmp_name);
    let mut file = std::fs::File::create(&tmp).map_err(|e| io_error("create", e))?;
    file.write_all(content.as_bytes())
        .map_err(|e| io_error("write", e))?;
    file.sync_all().map_err(|e| io_error("fsync", e))?;
    drop(file);
    std::fs::rename(&tmp, path).map_err(|e| io_error("rename", e))?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        // Make the rename durable: the placement must survive a crash once put_if_absent returned.
        // (Where a directory cannot be opened at all, e.g. on some non-Unix platforms, there is
        // nothing to sync.)
        if let Ok(dir) = std::fs::File::open(dir) {
            dir.sync_all().map_err(|e| io_error("fsync directory", e))?;
        }
    }
    Ok(())
}

impl FileShardMap {
    /// Opens the map stored at `path`, or an empty one if the file does not exist yet.
    pub async fn open(path: impl AsRef<Path>) -> Result<Self, CoordinatorError> {
        let path = path.as_ref().to_path_buf();
        let read_path = path.clone();
        let text = tokio::task::spawn_blocking(move || match std::fs::read_to_string(&read_path) {
            Ok(text) => Ok(text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(String::new()),
            Err(e) => Err(io_error("read", e)),
        })
        .await
        .map_err(|e| CoordinatorError::Storage(Box::new(e)))??;
        Ok(FileShardMap {
            path,
            map: tokio::sync::Mutex::new(parse(&text)?),
        })
    }

    async fn persist(&self, map: &Placements) -> Result<(), CoordinatorError> {
        let content = render(map);
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || write_atomically(&path, &content))
            .await
            .map_err(|e| CoordinatorError::Storage(Box::new(e)))?
    }
}

#[async_trait]
impl ShardMapStore for FileShardMap {
    async fn load(&self) -> Result<Placements, CoordinatorError> {
        Ok(self.map.lock().await.clone())
    }

    async fn put_if_absent(
        &self,
        topic_id: Uuid,
        shards: Arc<[ShardId]>,
    ) -> Result<Arc<[ShardId]>, CoordinatorError> {
        let mut map = self.map.lock().await;
        if let Some(existing) = map.get(&topic_id) {
            return Ok(existing.clone());
        }
        let mut next = map.clone();
        next.insert(topic_id, shards.clone());
        self.persist(&next).await?;
        *map = next;
        Ok(shards)
    }

    async fn extend(
        &self,
        topic_id: Uuid,
        shards: Arc<[ShardId]>,
    ) -> Result<Arc<[ShardId]>, CoordinatorError> {
        let mut map = self.map.lock().await;
        let stored = map
            .get(&topic_id)
            .ok_or_else(|| CoordinatorError::UnknownTopic(topic_id.to_string()))?;
        let Some(grown) = extended(stored, &shards) else {
            return Ok(stored.clone());
        };
        let mut next = map.clone();
        next.insert(topic_id, grown.clone());
        self.persist(&next).await?;
        *map = next;
        Ok(grown)
    }

    async fn remove(&self, topic_id: Uuid) -> Result<(), CoordinatorError> {
        let mut map = self.map.lock().await;
        if !map.contains_key(&topic_id) {
            return Ok(());
        }
        let mut next = map.clone();
        next.remove(&topic_id);
        self.persist(&next).await?;
        *map = next;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_parse_round_trip() {
        let mut map = Placements::new();
        map.insert(Uuid::from_u128(1), vec![0, 2, 1].into());
        map.insert(Uuid::from_u128(2), vec![5].into());
        assert_eq!(parse(&render(&map)).unwrap(), map);
        assert_eq!(parse("").unwrap(), Placements::new());
    }

    /// Growth keeps every stored partition where it is and only appends.
    #[tokio::test]
    async fn extend_only_appends() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("shards.map");
        let file = FileShardMap::open(&path).await.unwrap();
        let memory = MemoryShardMap::new();
        let topic = Uuid::from_u128(9);
        for store in [&file as &dyn ShardMapStore, &memory] {
            assert!(matches!(
                store.extend(topic, vec![0, 1].into()).await,
                Err(CoordinatorError::UnknownTopic(_))
            ));
            store.put_if_absent(topic, vec![0, 1].into()).await.unwrap();
            // The proposal's first two entries differ from the stored ones: the stored ones stay.
            let grown = store.extend(topic, vec![1, 1, 2, 0].into()).await.unwrap();
            assert_eq!(&*grown, &[0, 1, 2, 0]);
            // A shorter proposal (a stale or retried growth) changes nothing.
            let same = store.extend(topic, vec![2, 2, 2].into()).await.unwrap();
            assert_eq!(&*same, &[0, 1, 2, 0]);
            assert_eq!(&*store.load().await.unwrap()[&topic], &[0, 1, 2, 0]);
        }
        // Durable: a restart reads the grown placement.
        let again = FileShardMap::open(&path).await.unwrap();
        assert_eq!(&*again.load().await.unwrap()[&topic], &[0, 1, 2, 0]);
    }

    #[test]
    fn corrupt_files_are_errors_not_panics() {
        for bad in [
            "nope\n",
            "diskless-shard-map v1\nxyz 1,2\n",
            "diskless-shard-map v1\n00000000-0000-0000-0000-000000000001\n",
            "diskless-shard-map v1\n00000000-0000-0000-0000-000000000001 1,x\n",
            "diskless-shard-map v1\n00000000-0000-0000-0000-000000000001 1\n00000000-0000-0000-0000-000000000001 2\n",
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }
}
