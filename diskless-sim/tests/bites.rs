//! The simulation catches real defects: run against components with a known bug, it reports the
//! broken invariant within a few seeds.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use diskless_coordinator::{
    BatchCoordinator, CommitBatchResult, CommitFileRequest, CoordinatorError, CreateTopicRequest,
    DeleteRecordsRequest, DeleteRecordsResponse, FindBatchesRequest, FindBatchesResponse,
    ListOffsetsRequest, ListOffsetsResponse, ObjectInfo, ObjectToDelete, ProducerExpiryReport,
    ProducerState, RetentionReport, TopicIdPartition, TopicInfo, object_key_time_ms,
};
use diskless_sim::{Components, SimConfig, Variant, Violation, run_with};
use diskless_storage::ObjectStoreStorage;
use diskless_testkit::coordinator::InMemoryCoordinator;

/// Which defect a [`Mutant`] has.
#[derive(Debug, Clone, Copy)]
enum Bug {
    /// The orphan collector's fence is not enforced at the commit point: `fence_orphans` answers
    /// the unknown keys but records nothing, so a commit stalled past the collector's two phases
    /// still lands, on an object the collector deleted (the defect #12 fixed).
    NoFence,
    /// `find_batches` leaves out the second batch it found: readers see a gap.
    SkipsABatch,
}

/// The reference model with one defect.
#[derive(Debug)]
struct Mutant {
    inner: Arc<dyn BatchCoordinator>,
    bug: Bug,
}

#[async_trait]
impl BatchCoordinator for Mutant {
    async fn create_topic(&self, request: CreateTopicRequest) -> Result<(), CoordinatorError> {
        self.inner.create_topic(request).await
    }

    async fn delete_topic(&self, topic_id: uuid::Uuid) -> Result<(), CoordinatorError> {
        self.inner.delete_topic(topic_id).await
    }

    async fn list_topics(&self) -> Result<Vec<TopicInfo>, CoordinatorError> {
        self.inner.list_topics().await
    }

    async fn commit_file(
        &self,
        request: CommitFileRequest,
    ) -> Result<Vec<CommitBatchResult>, CoordinatorError> {
        self.inner.commit_file(request).await
    }

    async fn find_batches(
        &self,
        requests: &[FindBatchesRequest],
        fetch_max_bytes: u32,
    ) -> Result<Vec<FindBatchesResponse>, CoordinatorError> {
        let mut found = self.inner.find_batches(requests, fetch_max_bytes).await?;
        if let Bug::SkipsABatch = self.bug {
            for answer in &mut found {
                if answer.batches.len() > 2 {
                    answer.batches.remove(1);
                }
            }
        }
        Ok(found)
    }

    async fn list_offsets(
        &self,
        requests: &[ListOffsetsRequest],
    ) -> Result<Vec<ListOffsetsResponse>, CoordinatorError> {
        self.inner.list_offsets(requests).await
    }

    async fn delete_records(
        &self,
        requests: &[DeleteRecordsRequest],
    ) -> Result<Vec<DeleteRecordsResponse>, CoordinatorError> {
        self.inner.delete_records(requests).await
    }

    async fn enforce_retention(
        &self,
        max_batches: u32,
    ) -> Result<RetentionReport, CoordinatorError> {
        self.inner.enforce_retention(max_batches).await
    }

    async fn objects_to_delete(
        &self,
        marked_before_ms: i64,
        limit: u32,
    ) -> Result<Vec<ObjectToDelete>, CoordinatorError> {
        self.inner.objects_to_delete(marked_before_ms, limit).await
    }

    async fn confirm_deleted(&self, object_keys: &[String]) -> Result<(), CoordinatorError> {
        self.inner.confirm_deleted(object_keys).await
    }

    async fn fence_orphans(&self, object_keys: &[String]) -> Result<Vec<String>, CoordinatorError> {
        match self.bug {
            Bug::NoFence => {
                let known = self.inner.known_objects(object_keys).await?;
                Ok(object_keys
                    .iter()
                    .filter(|k| !known.contains(k) && object_key_time_ms(k).is_some())
                    .cloned()
                    .collect())
            }
            Bug::SkipsABatch => self.inner.fence_orphans(object_keys).await,
        }
    }

    async fn expire_producers(
        &self,
        max_producers: u32,
    ) -> Result<ProducerExpiryReport, CoordinatorError> {
        self.inner.expire_producers(max_producers).await
    }

    async fn known_objects(&self, object_keys: &[String]) -> Result<Vec<String>, CoordinatorError> {
        self.inner.known_objects(object_keys).await
    }

    async fn object_info(&self, object_key: &str) -> Result<Option<ObjectInfo>, CoordinatorError> {
        self.inner.object_info(object_key).await
    }

    async fn producer_state(
        &self,
        partition: TopicIdPartition,
        producer_id: i64,
    ) -> Result<Option<ProducerState>, CoordinatorError> {
        self.inner.producer_state(partition, producer_id).await
    }
}

/// Runs seeds from 1 against a mutant until one fails; returns that violation.
fn first_violation(bug: Bug, max_seeds: u64) -> Option<Box<Violation>> {
    for seed in 1..=max_seeds {
        let config = SimConfig::new(seed, Variant::Model);
        let result = run_with(&config, &format!("{bug:?}"), |clock| async move {
            let max_commit_age = Duration::from_secs(60);
            let model = InMemoryCoordinator::new(clock).with_max_commit_age(max_commit_age);
            let mutant = Mutant {
                inner: Arc::new(model),
                bug,
            };
            Ok(Components::new(
                Arc::new(ObjectStoreStorage::in_memory()),
                Arc::new(mutant),
                max_commit_age,
            ))
        });
        if let Err(v) = result {
            eprintln!("{bug:?} found at seed {seed}:\n{v}");
            return Some(v);
        }
    }
    None
}

#[test]
fn a_commit_point_without_the_orphan_fence_is_caught() {
    let v = first_violation(Bug::NoFence, 10).expect("no violation in 10 seeds");
    assert!(
        [diskless_sim::OBJECTS, diskless_sim::ACKED_READABLE].contains(&v.invariant),
        "{v}"
    );
}

#[test]
fn a_coordinator_that_skips_a_batch_is_caught() {
    let v = first_violation(Bug::SkipsABatch, 5).expect("no violation in 5 seeds");
    assert!(
        [diskless_sim::OFFSETS, diskless_sim::CONSUMER].contains(&v.invariant),
        "{v}"
    );
}
