//! Which topics are diskless: the batch coordinator's topic list, cached.
//!
//! Nisshi's `Storage` calls name a topic by its name. A name is diskless when the batch
//! coordinator has a live topic of that name; the answer is cached, and a name the cache does not
//! know is looked up again at most once per [`REFRESH_INTERVAL`] (topics created through another
//! node of the cluster become visible within it). A topic's kind never changes while it lives
//! (`diskless.enable` cannot be altered, as in KIP-1150), so a cached answer is only stale when a
//! topic is deleted and re-created under the same name with the other kind through another node
//! within that interval — the same lag a Kafka broker's metadata cache has behind its controller.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use diskless_coordinator::{BatchCoordinator, CoordinatorError, TopicInfo};
use uuid::Uuid;

/// How often at most the coordinator's topic list is read again for a name the cache lacks.
pub const REFRESH_INTERVAL: Duration = Duration::from_secs(1);

/// The cache of diskless topics by name.
#[derive(Debug)]
pub(crate) struct DisklessTopics {
    coordinator: Arc<dyn BatchCoordinator>,
    state: tokio::sync::Mutex<Snapshot>,
}

#[derive(Debug, Default)]
struct Snapshot {
    by_name: HashMap<String, TopicInfo>,
    read_at: Option<Instant>,
}

impl DisklessTopics {
    pub(crate) fn new(coordinator: Arc<dyn BatchCoordinator>) -> Self {
        DisklessTopics {
            coordinator,
            state: tokio::sync::Mutex::new(Snapshot::default()),
        }
    }

    /// The diskless topic named `name`, or `None` when it is not one (as of the last read).
    pub(crate) async fn get(&self, name: &str) -> Result<Option<TopicInfo>, CoordinatorError> {
        let mut state = self.state.lock().await;
        // Read again once a REFRESH_INTERVAL: topics other nodes created, grew, altered or
        // deleted are seen within it.
        let stale = state
            .read_at
            .is_none_or(|at| at.elapsed() >= REFRESH_INTERVAL);
        if stale {
            self.refresh_locked(&mut state).await?;
        }
        Ok(state.by_name.get(name).cloned())
    }

    /// The diskless topic with id `id`, reading the coordinator's list again when not cached.
    pub(crate) async fn by_id(&self, id: Uuid) -> Result<Option<TopicInfo>, CoordinatorError> {
        let mut state = self.state.lock().await;
        if let Some(info) = state.by_name.values().find(|t| t.topic_id == id) {
            return Ok(Some(info.clone()));
        }
        self.refresh_locked(&mut state).await?;
        Ok(state.by_name.values().find(|t| t.topic_id == id).cloned())
    }

    async fn refresh_locked(&self, state: &mut Snapshot) -> Result<(), CoordinatorError> {
        let topics = self.coordinator.list_topics().await?;
        state.by_name = topics.into_iter().map(|t| (t.name.clone(), t)).collect();
        state.read_at = Some(Instant::now());
        Ok(())
    }

    /// Records a topic this node just created, grew or altered.
    pub(crate) async fn insert(&self, info: TopicInfo) {
        self.state
            .lock()
            .await
            .by_name
            .insert(info.name.clone(), info);
    }

    /// Forgets a topic this node just deleted.
    pub(crate) async fn remove(&self, name: &str) {
        self.state.lock().await.by_name.remove(name);
    }
}
