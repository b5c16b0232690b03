//! The topic registry: names and ids of the coordinator's topics, cached briefly.
//!
//! The coordinator is the source of truth (`create_topic`/`list_topics`); this cache saves a
//! coordinator round trip per request. A name not in the cache triggers a reload, and the whole cache
//! is reloaded when older than [`MAX_AGE`], so topics created or deleted by another broker process
//! sharing the coordinator show up quickly.
//!
//! Topic configs: the coordinator keeps the ones that act on a diskless topic ([`TopicConfig`]); the
//! others Kafka knows (see [`crate::admin_configs`]) are accepted and kept here, in this process's
//! memory, per topic id ([`Topics::overrides`]), so that DescribeConfigs shows what was set. They do
//! not survive a restart (nothing reads them). After a config change [`Topics::invalidate`] makes
//! the next lookup reload, so Produce validates with the new `max.message.bytes` and timestamp type
//! at once.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use diskless_coordinator::{BatchCoordinator, CoordinatorError, TopicConfig, TopicInfo};
use parking_lot::RwLock;
use uuid::Uuid;

/// How long a loaded topic list is trusted.
const MAX_AGE: Duration = Duration::from_secs(5);

/// Topic configs set on a topic (Kafka's `TOPIC_CONFIG` source): name → canonical value.
pub(crate) type Overrides = BTreeMap<String, String>;

/// The broker settings that shape new topics (Kafka's `auto.create.topics.enable`, `num.partitions`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TopicDefaults {
    /// Metadata for an unknown topic creates it.
    pub auto_create: bool,
    /// Partitions of a topic created automatically or with `num_partitions = -1`.
    pub num_partitions: i32,
}

impl Default for TopicDefaults {
    fn default() -> Self {
        TopicDefaults {
            auto_create: false,
            num_partitions: 1,
        }
    }
}

/// A live topic.
#[derive(Debug)]
pub(crate) struct Topic {
    pub id: Uuid,
    pub name: String,
    pub partitions: i32,
    pub config: Arc<TopicConfig>,
}

impl Topic {
    fn from_info(info: TopicInfo) -> Topic {
        Topic {
            id: info.topic_id,
            name: info.name,
            partitions: info.partitions,
            config: Arc::new(info.config),
        }
    }

    /// Whether `partition` exists.
    pub(crate) fn has_partition(&self, partition: i32) -> bool {
        (0..self.partitions).contains(&partition)
    }
}

#[derive(Default)]
struct Snapshot {
    by_name: HashMap<String, Arc<Topic>>,
    by_id: HashMap<Uuid, Arc<Topic>>,
    ordered: Vec<Arc<Topic>>,
    loaded_at: Option<Instant>,
}

/// The cached topic list.
#[derive(Debug)]
pub(crate) struct Topics {
    coordinator: Arc<dyn BatchCoordinator>,
    snapshot: RwLock<Arc<Snapshot>>,
    defaults: TopicDefaults,
    /// Configs set per topic id (see the module docs).
    overrides: RwLock<HashMap<Uuid, Overrides>>,
}

impl std::fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Snapshot")
            .field("topics", &self.ordered.len())
            .finish()
    }
}

impl Topics {
    /// The registry with the given topic defaults.
    pub(crate) fn with_defaults(
        coordinator: Arc<dyn BatchCoordinator>,
        defaults: TopicDefaults,
    ) -> Topics {
        Topics {
            coordinator,
            snapshot: RwLock::new(Arc::new(Snapshot::default())),
            defaults,
            overrides: RwLock::new(HashMap::new()),
        }
    }

    /// The broker settings for new topics.
    pub(crate) fn defaults(&self) -> TopicDefaults {
        self.defaults
    }

    /// The configs set on topic `id` and kept by this process (empty if none).
    pub(crate) fn overrides(&self, id: Uuid) -> Overrides {
        self.overrides.read().get(&id).cloned().unwrap_or_default()
    }

    /// Records the configs set on topic `id` (all of them: this replaces what was kept).
    pub(crate) fn set_overrides(&self, id: Uuid, overrides: Overrides) {
        let mut map = self.overrides.write();
        if overrides.is_empty() {
            map.remove(&id);
        } else {
            map.insert(id, overrides);
        }
    }

    /// Reloads the list from the coordinator.
    pub(crate) async fn reload(&self) -> Result<(), CoordinatorError> {
        let list = self.coordinator.list_topics().await?;
        let mut snap = Snapshot {
            loaded_at: Some(Instant::now()),
            ..Snapshot::default()
        };
        for info in list {
            let topic = Arc::new(Topic::from_info(info));
            snap.by_name.insert(topic.name.clone(), topic.clone());
            snap.by_id.insert(topic.id, topic.clone());
            snap.ordered.push(topic);
        }
        *self.snapshot.write() = Arc::new(snap);
        Ok(())
    }

    async fn fresh(&self) -> Result<Arc<Snapshot>, CoordinatorError> {
        let snap = self.snapshot.read().clone();
        if snap.loaded_at.is_some_and(|t| t.elapsed() < MAX_AGE) {
            return Ok(snap);
        }
        self.reload().await?;
        Ok(self.snapshot.read().clone())
    }

    /// Every live topic, ordered by name.
    pub(crate) async fn all(&self) -> Result<Vec<Arc<Topic>>, CoordinatorError> {
        Ok(self.fresh().await?.ordered.clone())
    }

    /// A topic by name (reloading once when the name is not known).
    pub(crate) async fn by_name(&self, name: &str) -> Result<Option<Arc<Topic>>, CoordinatorError> {
        let snap = self.fresh().await?;
        if let Some(t) = snap.by_name.get(name) {
            return Ok(Some(t.clone()));
        }
        self.reload().await?;
        Ok(self.snapshot.read().by_name.get(name).cloned())
    }

    /// A topic by id (reloading once when the id is not known).
    pub(crate) async fn by_id(&self, id: Uuid) -> Result<Option<Arc<Topic>>, CoordinatorError> {
        let snap = self.fresh().await?;
        if let Some(t) = snap.by_id.get(&id) {
            return Ok(Some(t.clone()));
        }
        self.reload().await?;
        Ok(self.snapshot.read().by_id.get(&id).cloned())
    }

    /// Forgets the cached list (after a create or delete).
    pub(crate) fn invalidate(&self) {
        *self.snapshot.write() = Arc::new(Snapshot::default());
    }
}
