//! The topic registry: names and ids of the coordinator's topics, cached briefly.
//!
//! The coordinator is the source of truth (`create_topic`/`list_topics`); this cache saves a
//! coordinator round trip per request. A name not in the cache triggers a reload, and the whole cache
//! is reloaded when older than [`MAX_AGE`], so topics created or deleted by another broker process
//! sharing the coordinator show up quickly.
//!
//! Topic configs: the coordinator keeps the ones that act on a diskless topic ([`TopicConfig`]); the
//! others Kafka knows (see [`crate::admin_configs`]) are accepted and kept in the broker's store
//! (`broker.db`, [`Store`]) per topic id ([`Topics::overrides`]), so that DescribeConfigs shows what
//! was set, also after a restart. Manual replica assignments (CreateTopics, CreatePartitions) are
//! kept there too ([`Topic::assignments`]) and shape Metadata's leaders and replicas. Both are
//! loaded from the store once and written through. After a config change [`Topics::invalidate`]
//! makes the next lookup reload, so Produce validates with the new `max.message.bytes` and timestamp
//! type at once.
//!
//! (The store belongs to this broker process: several broker processes sharing one PostgreSQL
//! coordinator share the applied configs, not these. A production broker keeps them in its cluster
//! metadata.)

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use diskless_coordinator::{BatchCoordinator, CoordinatorError, TopicConfig, TopicInfo};
use parking_lot::RwLock;
use uuid::Uuid;

use crate::config::{Config, DEFAULT_SEGMENT_BYTES, DEFAULT_SEGMENT_MS};
use crate::store::{Store, StoreError};

/// How long a loaded topic list is trusted.
const MAX_AGE: Duration = Duration::from_secs(5);

/// Topic configs set on a topic (Kafka's `TOPIC_CONFIG` source): name → canonical value.
pub(crate) type Overrides = BTreeMap<String, String>;

/// Manual replica assignments of a topic's partitions: partition → replicas (broker ids).
pub(crate) type Assignments = BTreeMap<i32, Vec<i32>>;

/// What the broker's store keeps per topic id.
#[derive(Clone, Debug, Default)]
struct Extras {
    overrides: Overrides,
    assignments: Assignments,
}

/// The broker settings that shape new topics (Kafka's `auto.create.topics.enable`,
/// `num.partitions`, `log.roll.ms`, `log.segment.bytes`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TopicDefaults {
    /// Metadata for an unknown topic creates it.
    pub auto_create: bool,
    /// Partitions of a topic created automatically or with `num_partitions = -1`.
    pub num_partitions: i32,
    /// `log.roll.ms`: the `segment.ms` of a topic that does not set it.
    pub segment_ms: i64,
    /// `log.segment.bytes`: the `segment.bytes` of a topic that does not set it.
    pub segment_bytes: i32,
}

impl Default for TopicDefaults {
    fn default() -> Self {
        TopicDefaults {
            auto_create: false,
            num_partitions: 1,
            segment_ms: DEFAULT_SEGMENT_MS,
            segment_bytes: DEFAULT_SEGMENT_BYTES,
        }
    }
}

impl TopicDefaults {
    /// The settings of the command line that shape new topics.
    pub(crate) fn of(config: &Config) -> TopicDefaults {
        TopicDefaults {
            auto_create: config.auto_create_topics,
            num_partitions: config.num_partitions,
            segment_ms: config.segment_ms,
            segment_bytes: config.segment_bytes,
        }
    }

    /// The [`TopicConfig`] of a new topic that sets no config: Kafka's defaults, with this
    /// broker's `segment.ms` and `segment.bytes`.
    pub(crate) fn topic_config(&self) -> TopicConfig {
        TopicConfig {
            segment_ms: self.segment_ms,
            segment_bytes: self.segment_bytes,
            ..TopicConfig::default()
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
    /// Manual replica assignments of its partitions (most topics have none).
    pub assignments: Assignments,
}

impl Topic {
    fn from_info(info: TopicInfo, assignments: Assignments) -> Topic {
        Topic {
            id: info.topic_id,
            name: info.name,
            partitions: info.partitions,
            config: Arc::new(info.config),
            assignments,
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
    /// Kept configs and manual assignments per topic id (see the module docs), loaded from `store`
    /// at first use.
    extras: tokio::sync::OnceCell<RwLock<HashMap<Uuid, Extras>>>,
    store: Store,
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
        store: Store,
    ) -> Topics {
        Topics {
            coordinator,
            snapshot: RwLock::new(Arc::new(Snapshot::default())),
            defaults,
            extras: tokio::sync::OnceCell::new(),
            store,
        }
    }

    /// The broker settings for new topics.
    pub(crate) fn defaults(&self) -> TopicDefaults {
        self.defaults
    }

    async fn extras(&self) -> Result<&RwLock<HashMap<Uuid, Extras>>, StoreError> {
        self.extras
            .get_or_try_init(|| async {
                let mut map: HashMap<Uuid, Extras> = HashMap::new();
                for (id, overrides) in self.store.topic_configs().await? {
                    map.entry(id).or_default().overrides = overrides;
                }
                for (id, partition, replicas) in self.store.assignments().await? {
                    map.entry(id)
                        .or_default()
                        .assignments
                        .insert(partition, replicas);
                }
                Ok(RwLock::new(map))
            })
            .await
    }

    /// The configs set on topic `id` and kept by this broker (empty if none).
    pub(crate) async fn overrides(&self, id: Uuid) -> Result<Overrides, StoreError> {
        let map = self.extras().await?.read();
        Ok(map
            .get(&id)
            .map(|e| e.overrides.clone())
            .unwrap_or_default())
    }

    /// Records the configs set on topic `id` (all of them: this replaces what was kept).
    pub(crate) async fn set_overrides(
        &self,
        id: Uuid,
        overrides: Overrides,
    ) -> Result<(), StoreError> {
        let extras = self.extras().await?;
        self.store.set_topic_configs(id, &overrides).await?;
        extras.write().entry(id).or_default().overrides = overrides;
        Ok(())
    }

    /// Records manual replica assignments of partitions of topic `id`.
    pub(crate) async fn add_assignments(
        &self,
        id: Uuid,
        assignments: Vec<(i32, Vec<i32>)>,
    ) -> Result<(), StoreError> {
        if assignments.is_empty() {
            return Ok(());
        }
        let extras = self.extras().await?;
        self.store.add_assignments(id, &assignments).await?;
        extras
            .write()
            .entry(id)
            .or_default()
            .assignments
            .extend(assignments);
        Ok(())
    }

    /// Forgets what is kept for a deleted topic.
    pub(crate) async fn forget(&self, id: Uuid) -> Result<(), StoreError> {
        let extras = self.extras().await?;
        self.store.forget_topic_id(id).await?;
        extras.write().remove(&id);
        Ok(())
    }

    /// Reloads the list from the coordinator.
    pub(crate) async fn reload(&self) -> Result<(), CoordinatorError> {
        let list = self.coordinator.list_topics().await?;
        let mut snap = Snapshot {
            loaded_at: Some(Instant::now()),
            ..Snapshot::default()
        };
        let extras = match self.extras().await {
            Ok(extras) => Some(extras.read()),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the manual replica assignments");
                None
            }
        };
        for info in list {
            let assignments = extras
                .as_ref()
                .and_then(|m| m.get(&info.topic_id))
                .map(|e| e.assignments.clone())
                .unwrap_or_default();
            let topic = Arc::new(Topic::from_info(info, assignments));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Parsed;

    #[test]
    fn topic_defaults_come_from_the_command_line() {
        let args = [
            "--auto-create-topics=false",
            "--num-partitions=2",
            "--segment-ms=60000",
        ];
        let Ok(Parsed::Run(c)) = Config::parse(args.iter().map(|s| s.to_string())) else {
            panic!("the arguments parse");
        };
        let defaults = TopicDefaults::of(&c);
        assert!(!defaults.auto_create);
        assert_eq!(defaults.num_partitions, 2);
        assert_eq!(defaults.segment_ms, 60_000);
        assert_eq!(defaults.segment_bytes, DEFAULT_SEGMENT_BYTES);
    }
}
