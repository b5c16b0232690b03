//! [`DisklessStorage`]: Nisshi's `Storage` trait, diskless topics served by the library and
//! everything else by Nisshi's own engine.
//!
//! Who owns which fact (one source of truth each):
//!
//! | fact | owner | why |
//! |---|---|---|
//! | topic names, ids, configs as described; classic partition counts | Nisshi's engine `S` | Metadata, DescribeConfigs, DescribeTopicPartitions and the group coordinator read them there; a diskless topic is created in `S` first and takes the id `S` gives it |
//! | a diskless topic's partition count | the batch coordinator | CreatePartitions grows it there only ([`crate::admin`]); Metadata and DescribeTopicPartitions answers are extended to it |
//! | which topics are diskless | the batch coordinator (a live topic there is diskless) | the data path must not depend on `S` to route a partition; `S` also keeps `diskless.enable=true` in the topic's configs for DescribeConfigs |
//! | a diskless partition's batches, offsets, log start, high watermark, LSO, producer sequences | the batch coordinator | KIP-1164 |
//! | the applied copy of a diskless topic's configs ([`TopicConfig`]) | the batch coordinator, rebuilt from `S`'s configs on every alter | the writer and the lifecycle workers read it there |
//! | producer ids and epochs, group offsets, SCRAM, brokers | `S` | Nisshi's InitProducerId and group handling own them |
//! | a transactional id's transaction: its producer, state, number, diskless partitions, timeout | the batch coordinator's transaction record | shared by every node, so a transaction's coordinator may move between nodes (the module documentation below) |
//!
//! Transactions: the transaction state Kafka keeps in `__transaction_state` is kept in the batch
//! coordinator, which every node shares: one record per transactional id
//! ([`diskless_coordinator::txn_record`]). Nisshi's engine keeps its own too (tansu 0.6.0 per
//! engine, deciding whatever it is asked), so every transition goes through the record first and
//! reaches the engine only if the record took it:
//! - InitProducerId fences the open transaction in the record (`PrepareAbort`), finishes it, asks
//!   the engine for the new epoch and records it;
//! - AddPartitionsToTxn and AddOffsetsToTxn open the next transaction in the record (its number
//!   taken there) or add to it, then ask the engine; a diskless batch is verified against the
//!   record (`TxnRecord::txn_seq_for`, read on the node that takes the Produce, whichever node
//!   the client's transaction coordinator is);
//! - EndTxn records the outcome (`PrepareCommit`/`PrepareAbort`) *before* the engine is asked to
//!   decide, then the engine decides, the diskless markers are written and the record completed
//!   ([`DisklessStorage::drive_ending`]). A node killed anywhere in between leaves a prepared
//!   record, which the client's retry on any node, the next InitProducerId, or any node's
//!   `maintain` ([`DisklessStorage::finish_endings`]) drives to its end: the engine asked again
//!   (tansu 0.6.0's `txn_end` decides what it is asked and answers `NONE` again), the markers
//!   written again (they carry the transaction's number, so the coordinator answers a repeat as a
//!   duplicate);
//! - a transaction open longer than its timeout is aborted by the record
//!   (`BatchCoordinator::txn_endings`, at the coordinator's clock), its epoch fenced until the
//!   next InitProducerId, and finished like an EndTxn.
//!
//! So no node acts on a transaction it alone remembers: an EndTxn on any node writes the markers
//! of every diskless partition the transaction added on any node, and a timeout cannot abort a
//! transaction the client committed (the record decided it first). One gap is the engine's: its
//! `txn_end` names no transaction, so a node that finishes an abandoned ending calls it only
//! after reading the record prepared again, right before the call (a client whose next
//! transaction began in that instant would see it decided by the engine). `tests/storage.rs`
//! (`an_end_txn_decided_before_a_crash_is_finished_after_it`) kills the adapter between the
//! engine's decision and the markers; `tests/multinode.rs` ends a transaction on another node.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use diskless_coordinator::{
    BatchCoordinator, Clock, CreateTopicRequest, DeleteRecordsRequest, EARLIEST_TIMESTAMP,
    IsolationLevel as DisklessIsolation, LATEST_TIMESTAMP, TopicConfig, TopicIdPartition,
    TopicInfo, TxnAnswer, TxnMarker, TxnRecord, TxnStatus, TxnTransition,
};
use diskless_core::{
    DisklessNode, FetchPartition, Fetcher, ListOffsetsPartition, ListedOffset, PartitionResponse,
    ProducePartition, WalWriter,
};
use tansu_sans_io::ScramMechanism;
use tansu_sans_io::delete_groups_response::DeletableGroupResult;
use tansu_sans_io::{
    ConfigResource, ErrorCode, IsolationLevel, ListOffset,
    add_partitions_to_txn_request::AddPartitionsToTxnTopic,
    create_topics_request::{CreatableTopic, CreatableTopicConfig},
    delete_records_request::DeleteRecordsTopic,
    delete_records_response::{DeleteRecordsPartitionResult, DeleteRecordsTopicResult},
    describe_cluster_response::DescribeClusterBroker,
    describe_configs_response::DescribeConfigsResult,
    describe_topic_partitions_response::DescribeTopicPartitionsResponseTopic,
    incremental_alter_configs_request::AlterConfigsResource,
    incremental_alter_configs_response::AlterConfigsResourceResponse,
    list_groups_response::ListedGroup,
    record::deflated,
    txn_offset_commit_response::TxnOffsetCommitResponseTopic,
};
use tansu_storage::{
    BrokerRegistrationRequest, Error, GroupDetail, ListOffsetResponse, MetadataResponse,
    NamedGroupDetail, OffsetCommitRequest, OffsetStage, ProducerIdResponse, Result,
    ScramCredential, Storage, TopicId, Topition, TxnAddPartitionsRequest, TxnAddPartitionsResponse,
    TxnOffsetCommitRequest, UpdateError, Version,
};
use tracing::{debug, error, warn};
use url::Url;
use uuid::Uuid;

use crate::convert;
use crate::topics::DisklessTopics;
use diskless_coordinator::ErrorCode as DisklessCode;

/// KIP-1150's topic config: `true` makes a topic diskless. Fixed at creation.
pub const DISKLESS_ENABLE: &str = "diskless.enable";

/// Nisshi's config resource type number for a topic (Kafka's `ConfigResource.Type.TOPIC`).
const TOPIC_RESOURCE: i8 = 2;

/// Kafka's broker default `transaction.max.timeout.ms` (15 minutes): the longest transaction
/// timeout an InitProducerId may ask for.
pub const TRANSACTION_MAX_TIMEOUT_MS: i32 = 900_000;

/// How many decided transactions one `maintain` finishes at most.
const ENDINGS_PER_PASS: u32 = 100;

/// How long a decided transaction is left to the node that decided it before another node's
/// `maintain` finishes it (ms): that node is writing its markers, or died.
pub const ENDING_GRACE_MS: i64 = 2_000;

/// Kafka's `IncrementalAlterConfigs` operation `DELETE`.
const OP_DELETE: i8 = 1;
const OP_APPEND: i8 = 2;
const OP_SUBTRACT: i8 = 3;

/// What [`DisklessStorage`] is configured with besides its parts.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct DisklessSettings {
    /// A topic created without `diskless.enable` is diskless (the broker option making diskless
    /// the default). Default `false`: only `diskless.enable=true` makes a topic diskless.
    pub default_diskless: bool,
    /// The broker id whose writer this storage appends with (the node's id).
    pub broker_id: i32,
    /// The base of every diskless topic's [`TopicConfig`] before its Kafka configs are applied:
    /// the broker-level defaults (e.g. `producer.id.expiration.ms`).
    pub topic_defaults: TopicConfig,
    /// Nisshi's engine implements DeleteRecords (tansu 0.6.0: PostgreSQL does; its SQLite
    /// engine panics with `todo!()`, which ends its request loop and with it every later call).
    /// When `false`, classic partitions are refused with `POLICY_VIOLATION` without asking the
    /// engine. Default `false`.
    pub engine_delete_records: bool,
    /// Nisshi's engine deletes one topic when asked to delete one. tansu 0.6.0's SQL engines
    /// (SQLite and PostgreSQL) do not: their `topic_delete_by.sql` deletes every topic row of
    /// the cluster that holds the named topic, so one DeleteTopics wipes every topic's metadata
    /// (classic and diskless); its `s3://` engine deletes the one topic. When `false`, DeleteTopics
    /// is answered `TOPIC_DELETION_DISABLED` (Kafka's answer with `delete.topic.enable=false`)
    /// without touching either side, and a topic the coordinator refused is left in Nisshi's
    /// engine rather than undone through that delete. Default `false`.
    pub engine_delete_topic: bool,
    /// Kafka's `auto.create.topics.enable` (tansu 0.6.0 has no automatic creation): `Some(n)`
    /// creates a topic a Metadata request names and allows to create, with `n` partitions
    /// ([`crate::metadata`]). Default `None`: off, as in Nisshi.
    pub auto_create_partitions: Option<i32>,
}

impl Default for DisklessSettings {
    fn default() -> Self {
        DisklessSettings {
            default_diskless: false,
            broker_id: 1,
            topic_defaults: TopicConfig::default(),
            engine_delete_records: false,
            engine_delete_topic: false,
            auto_create_partitions: None,
        }
    }
}

diskless_common::with_setters!(DisklessSettings {
    with_default_diskless => default_diskless: [bool],
    with_broker_id => broker_id: [i32],
    with_topic_defaults => topic_defaults: [TopicConfig],
    with_engine_delete_records => engine_delete_records: [bool],
    with_engine_delete_topic => engine_delete_topic: [bool],
    with_auto_create_partitions => auto_create_partitions: [Option<i32>],
});

/// The parts every clone of a [`DisklessStorage`] shares.
pub(crate) struct Shared {
    /// The diskless node's clock (the maintenance tick).
    clock: Arc<dyn Clock>,
    pub(crate) node: parking_lot::Mutex<Option<DisklessNode>>,
    pub(crate) writer: Arc<WalWriter>,
    pub(crate) fetcher: Fetcher,
    pub(crate) coordinator: Arc<dyn BatchCoordinator>,
    pub(crate) topics: DisklessTopics,
    pub(crate) settings: DisklessSettings,
    /// Fail point for tests: `txn_end` stops right after Nisshi's engine decided, as a process
    /// killed there would ([`DisklessStorage::stop_after_engine_decides`]).
    stop_after_engine_decides: std::sync::atomic::AtomicBool,
    /// Produce requests served from their frame (`services::produce_direct`).
    pub(crate) direct_produces: std::sync::atomic::AtomicU64,
}

/// Nisshi's [`Storage`] with diskless topics: calls about a diskless partition's data go to the
/// library's [`WalWriter`], [`Fetcher`] and [`BatchCoordinator`] (through one [`DisklessNode`]);
/// every other call goes to Nisshi's own engine `S`. See the [module documentation](self) for who
/// owns which fact.
#[derive(Clone)]
pub struct DisklessStorage<S> {
    inner: S,
    pub(crate) shared: Arc<Shared>,
}

impl<S: fmt::Debug> fmt::Debug for DisklessStorage<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DisklessStorage")
            .field("inner", &self.inner)
            .field("settings", &self.shared.settings)
            .finish_non_exhaustive()
    }
}

/// What went wrong building a [`DisklessStorage`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// The node has no writer for the configured broker id.
    #[error("the diskless node has no writer for broker id {0}")]
    NoWriter(i32),
}

impl<S: Storage> DisklessStorage<S> {
    /// Diskless topics through `node` (its writer for `settings.broker_id`, its fetcher and
    /// coordinator) beside Nisshi's engine `inner`.
    pub fn new(
        inner: S,
        node: DisklessNode,
        settings: DisklessSettings,
    ) -> Result<Self, BuildError> {
        let writer = node
            .writer(settings.broker_id)
            .cloned()
            .ok_or(BuildError::NoWriter(settings.broker_id))?;
        let fetcher = node.fetcher().clone();
        let coordinator = node.coordinator().clone();
        let clock = node.clock().clone();
        Ok(DisklessStorage {
            inner,
            shared: Arc::new(Shared {
                writer,
                fetcher,
                topics: DisklessTopics::new(coordinator.clone()),
                coordinator,
                settings,
                clock,
                node: parking_lot::Mutex::new(Some(node)),
                stop_after_engine_decides: std::sync::atomic::AtomicBool::new(false),
                direct_produces: std::sync::atomic::AtomicU64::new(0),
            }),
        })
    }

    /// The partition count of automatically created topics, when automatic creation is on
    /// ([`DisklessSettings::auto_create_partitions`]).
    pub fn auto_create_partitions(&self) -> Option<i32> {
        self.shared.settings.auto_create_partitions
    }

    /// Nisshi's engine.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// The diskless node, until [`DisklessStorage::close`].
    pub fn with_node<T>(&self, f: impl FnOnce(&DisklessNode) -> T) -> Option<T> {
        self.shared.node.lock().as_ref().map(f)
    }

    /// Stops the diskless node (writers answer what they accepted; lifecycle workers stop). Calls
    /// after it fail.
    pub async fn close(&self) {
        let node = self.shared.node.lock().take();
        if let Some(node) = node {
            node.close().await;
        }
    }

    /// Records what this node just changed of a diskless topic (before the next refresh).
    pub(crate) async fn note_topic(&self, info: TopicInfo) {
        self.shared.topics.insert(info).await;
    }

    /// The diskless topic with id `id`, if it is one.
    pub async fn diskless_topic_by_id(&self, id: Uuid) -> Result<Option<TopicInfo>> {
        self.shared
            .topics
            .by_id(id)
            .await
            .map_err(|e| convert::api_error(&e))
    }

    async fn diskless_named(&self, name: Option<&str>) -> Result<Option<TopicInfo>> {
        match name {
            Some(name) => self.diskless_topic(name).await,
            None => Ok(None),
        }
    }

    /// The diskless topic named `name`, if it is one.
    pub async fn diskless_topic(&self, name: &str) -> Result<Option<TopicInfo>> {
        self.shared
            .topics
            .get(name)
            .await
            .map_err(|e| convert::api_error(&e))
    }

    /// Applies `transition` to the transaction record (the batch coordinator's), a failure
    /// answered with its Kafka error code.
    async fn txn_transition(&self, transition: TxnTransition) -> Result<TxnAnswer> {
        self.shared
            .coordinator
            .txn_transition(transition)
            .await
            .map_err(|e| {
                warn!(error = %e, "transaction record not changed");
                // Kafka answers a failed transaction-log write with COORDINATOR_NOT_AVAILABLE,
                // which clients retry; KAFKA_STORAGE_ERROR or REQUEST_TIMED_OUT on EndTxn would
                // make librdkafka abort a transaction whose commit may have been recorded.
                match e {
                    diskless_coordinator::CoordinatorError::InvalidRequest(_) => {
                        Error::Api(ErrorCode::InvalidRequest)
                    }
                    _ => Error::Api(ErrorCode::CoordinatorNotAvailable),
                }
            })
    }

    /// The transaction record of `transactional_id`, if any: what a transactional batch is
    /// verified against on this node, whichever node the client's transaction coordinator is.
    pub(crate) async fn txn_record(
        &self,
        transactional_id: &str,
    ) -> std::result::Result<Option<TxnRecord>, String> {
        self.shared
            .coordinator
            .describe_txn(transactional_id)
            .await
            .map_err(|e| e.to_string())
    }

    /// Finishes the decided transactions whose markers are not all written (the record's prepared
    /// ones: an EndTxn or a fence interrupted by a crash or a failure, and the transactions
    /// `txn_endings` just aborted for their timeout), on behalf of whichever node decided them.
    /// One decided less than [`ENDING_GRACE_MS`] before `now_ms` is left to the node finishing
    /// it (unless its timeout aborted it). Returns how many are left unfinished.
    pub async fn finish_endings(&self, now_ms: i64) -> usize {
        let endings = match self.shared.coordinator.txn_endings(ENDINGS_PER_PASS).await {
            Ok(endings) => endings,
            Err(e) => {
                warn!(error = %e, "transaction endings not read");
                return 0;
            }
        };
        let mut left = 0;
        for record in endings {
            if !record.fenced && now_ms.saturating_sub(record.updated_ms) < ENDING_GRACE_MS {
                left += 1;
                continue;
            }
            if record.fenced && record.status == TxnStatus::PrepareAbort {
                warn!(
                    transactional_id = record.transactional_id,
                    producer_id = record.producer_id,
                    "transaction aborted (timed out or fenced); finishing it"
                );
            }
            match self.drive_ending(&record, true).await {
                Ok(ErrorCode::None) => {}
                Ok(code) => {
                    warn!(
                        transactional_id = record.transactional_id,
                        ?code,
                        "a decided transaction not finished"
                    );
                    left += 1;
                }
                Err(e) => {
                    warn!(transactional_id = record.transactional_id, error = ?e, "a decided transaction not finished");
                    left += 1;
                }
            }
        }
        left
    }

    /// Finishes the decided transaction of `record`: Nisshi's engine decides it (again: see the
    /// module documentation), its diskless markers are written, the record completed. With
    /// `recheck`, the record is read again first and the engine asked only if it still shows
    /// this transaction prepared (a node finishing another node's ending). Returns `NONE` once
    /// the engine decided; markers that could not be written leave the record prepared, for
    /// [`DisklessStorage::finish_endings`] to finish.
    pub(crate) async fn drive_ending(
        &self,
        record: &TxnRecord,
        recheck: bool,
    ) -> Result<ErrorCode> {
        let Some(commit) = record.status.outcome() else {
            return Ok(ErrorCode::InvalidTxnState);
        };
        if !record.status.is_prepared() {
            return Ok(ErrorCode::None);
        }
        if recheck {
            let fresh = self
                .txn_record(&record.transactional_id)
                .await
                .map_err(Error::Message)?;
            let same = fresh.is_some_and(|f| {
                f.status == record.status
                    && f.txn_seq == record.txn_seq
                    && f.producer_id == record.producer_id
            });
            if !same {
                return Ok(ErrorCode::None);
            }
        }
        let code = match self
            .inner
            .txn_end(
                &record.transactional_id,
                record.producer_id,
                record.producer_epoch,
                commit,
            )
            .await
        {
            Ok(code) => code,
            Err(Error::Api(code)) => code,
            Err(e) => return Err(e),
        };
        // The engine keeps nothing of this producer epoch (tansu 0.6.0's S3 engine answers
        // PRODUCER_FENCED for an epoch it has moved past): nothing is left to end on its side,
        // and the record's decision stands for the diskless side.
        let code = match code {
            ErrorCode::ProducerFenced
            | ErrorCode::InvalidProducerEpoch
            | ErrorCode::InvalidProducerIdMapping
            | ErrorCode::TransactionalIdNotFound => {
                warn!(
                    transactional_id = record.transactional_id,
                    ?code,
                    "Nisshi's engine has nothing of this transaction; its markers are written"
                );
                ErrorCode::None
            }
            code => code,
        };
        if self
            .shared
            .stop_after_engine_decides
            .load(std::sync::atomic::Ordering::SeqCst)
        {
            return Err(Error::Message(
                "fail point: stopped after the engine decided".into(),
            ));
        }
        if code != ErrorCode::None {
            // tansu 0.6.0's engine never refuses; another engine's refusal leaves the record
            // prepared (the diskless side waits, its LSO held) and is reported.
            warn!(
                transactional_id = record.transactional_id,
                ?code,
                "Nisshi's engine refused a decided transaction's end"
            );
            return Ok(code);
        }
        let failed = self.write_markers(record.markers()).await;
        if failed.is_empty() {
            let complete = TxnTransition::Complete {
                transactional_id: record.transactional_id.clone(),
                producer_id: record.producer_id,
                txn_seq: record.txn_seq,
            };
            if let Err(e) = self.txn_transition(complete).await {
                warn!(error = ?e, "transaction not recorded complete yet; finished again later");
            }
        } else {
            // Decided; the markers are retried by `maintain` and by the next request of this
            // transactional id (which waits for them, Kafka's CONCURRENT_TRANSACTIONS).
            warn!(
                transactional_id = record.transactional_id,
                left = failed.len(),
                "transaction markers not written yet"
            );
        }
        Ok(ErrorCode::None)
    }

    /// Applies `transition`; while the record shows a decided transaction not finished
    /// (`CONCURRENT_TRANSACTIONS` with a prepared record), finishes it and asks once more.
    async fn transition_after_endings(&self, transition: TxnTransition) -> Result<TxnAnswer> {
        let mut answer = self.txn_transition(transition.clone()).await?;
        for _ in 0..2 {
            let prepared = answer
                .record
                .as_ref()
                .filter(|r| r.status.is_prepared())
                .cloned();
            match prepared {
                Some(record) if answer.error == DisklessCode::ConcurrentTransactions => {
                    if self.drive_ending(&record, false).await? != ErrorCode::None {
                        break;
                    }
                    answer = self.txn_transition(transition.clone()).await?;
                }
                _ => break,
            }
        }
        Ok(answer)
    }

    /// How many Produce requests this node read from their frame, without Nisshi's codec (their
    /// topics all diskless; `services::produce_direct`).
    pub fn direct_produce_requests(&self) -> u64 {
        self.shared
            .direct_produces
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Fail point for tests: from now on, `txn_end` stops right after Nisshi's engine decided
    /// (answering an error), as a process killed at that moment would.
    #[doc(hidden)]
    pub fn stop_after_engine_decides(&self) {
        self.shared
            .stop_after_engine_decides
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Writes `markers`, returning those that failed (to retry).
    async fn write_markers(&self, markers: Vec<TxnMarker>) -> Vec<TxnMarker> {
        match self.shared.coordinator.write_txn_markers(&markers).await {
            Ok(results) => markers
                .into_iter()
                .zip(results)
                .filter(|(marker, result)| {
                    use diskless_coordinator::ErrorCode as E;
                    match result.error {
                        E::None => false,
                        // The partition is gone (its topic deleted): nothing to end there.
                        E::UnknownTopicOrPartition => false,
                        // Refusals that a retry cannot change (a newer producer epoch or
                        // coordinator epoch there, e.g. an operator's marker through
                        // WriteTxnMarkers): retried, they would keep the transaction decided
                        // and not finished forever, and its transactional id waiting.
                        E::InvalidProducerEpoch | E::TransactionCoordinatorFenced => {
                            warn!(partition = %marker.partition, error = ?result.error, "transaction marker refused for good; not retried");
                            false
                        }
                        error => {
                            warn!(partition = %marker.partition, ?error, "transaction marker not written; will retry");
                            true
                        }
                    }
                })
                .map(|(marker, _)| marker)
                .collect(),
            Err(e) => {
                warn!(error = %e, "transaction markers not written; will retry");
                markers
            }
        }
    }

    /// Whether a new topic with `configs` is diskless.
    fn wants_diskless(&self, configs: Option<&[CreatableTopicConfig]>) -> Result<bool> {
        match configs
            .unwrap_or_default()
            .iter()
            .find(|c| c.name == DISKLESS_ENABLE)
            .and_then(|c| c.value.as_deref())
        {
            None => Ok(self.shared.settings.default_diskless),
            Some(v) if v.eq_ignore_ascii_case("true") => Ok(true),
            Some(v) if v.eq_ignore_ascii_case("false") => Ok(false),
            Some(_) => Err(Error::Api(ErrorCode::InvalidConfig)),
        }
    }

    /// The [`TopicConfig`] of a diskless topic from Kafka config entries.
    fn topic_config<'a>(
        &self,
        entries: impl IntoIterator<Item = (&'a str, Option<&'a str>)>,
    ) -> Result<TopicConfig> {
        TopicConfig::from_kafka_configs(self.shared.settings.topic_defaults.clone(), entries)
            .map_err(|e| {
                debug!(error = %e, "invalid diskless topic config");
                Error::Api(ErrorCode::InvalidConfig)
            })
    }

    /// The partition of a diskless topic named in a Nisshi call.
    async fn partition_of(
        &self,
        topition: &Topition,
    ) -> Result<Option<(TopicInfo, TopicIdPartition)>> {
        Ok(self.diskless_topic(topition.topic()).await?.map(|t| {
            let p = TopicIdPartition::new(t.topic_id, topition.partition());
            (t, p)
        }))
    }

    /// Appends one batch to a diskless partition and waits for its commit.
    pub(crate) async fn produce_diskless(
        &self,
        transaction_id: Option<&str>,
        topic: &TopicInfo,
        partition: i32,
        records: bytes::Bytes,
    ) -> PartitionResponse {
        let tp = TopicIdPartition::new(topic.topic_id, partition);
        let txn = match transaction_id {
            Some(tid) => self.txn_record(tid).await,
            None => Ok(None),
        };
        let produce = match self.diskless_partition(&txn, topic, partition, Some(records)) {
            Ok(produce) => produce,
            Err((code, message)) => return PartitionResponse::error(tp, code, message),
        };
        let pending = self.shared.writer.append(vec![produce]).await;
        let answer = pending.await.into_iter().next().unwrap_or_else(|| {
            PartitionResponse::error(
                tp,
                diskless_coordinator::ErrorCode::UnknownServerError,
                "the writer gave no answer",
            )
        });
        if answer.error == diskless_coordinator::ErrorCode::UnknownTopicOrPartition {
            // Deleted through another node: forget it here too.
            self.shared.topics.remove(&topic.name).await;
        }
        answer
    }

    /// One partition of a diskless topic as the writer takes it, or why it is refused before: an
    /// index the topic does not have, or no records. A transactional batch carries its
    /// transaction's number when the transaction record (`txn`, read for the request's
    /// transactional id) shows the partition added to the producer's open transaction, as
    /// Kafka's partition leader verifies it (KIP-890); otherwise none, and the coordinator
    /// refuses it (`INVALID_TXN_STATE`). A record that could not be read (`Err`) refuses a
    /// transactional batch with the retriable `NOT_ENOUGH_REPLICAS`, as Kafka's `ReplicaManager`
    /// answers a verification that failed.
    pub(crate) fn diskless_partition(
        &self,
        txn: &std::result::Result<Option<TxnRecord>, String>,
        info: &TopicInfo,
        index: i32,
        records: Option<bytes::Bytes>,
    ) -> Result<ProducePartition, (diskless_coordinator::ErrorCode, String)> {
        if index < 0 || index >= info.partitions {
            return Err((
                diskless_coordinator::ErrorCode::UnknownTopicOrPartition,
                format!("topic {:?} has no partition {index}", info.name),
            ));
        }
        let Some(bytes) = records else {
            return Err((
                diskless_coordinator::ErrorCode::InvalidRecord,
                "no records".into(),
            ));
        };
        let tp = TopicIdPartition::new(info.topic_id, index);
        let batch = diskless_core::RecordBatch::parse(bytes.clone())
            .ok()
            .filter(|b| b.attributes().is_transactional() && !b.attributes().is_control());
        let txn_seq = match (batch, txn) {
            (None, _) | (Some(_), Ok(None)) => None,
            (Some(b), Ok(Some(record))) => {
                record.txn_seq_for(b.producer_id(), b.producer_epoch(), tp)
            }
            (Some(_), Err(why)) => {
                return Err((
                    diskless_coordinator::ErrorCode::NotEnoughReplicas,
                    format!(
                        "Unable to verify the partition has been added to the transaction: {why}"
                    ),
                ));
            }
        };
        let mut produce = ProducePartition::new(tp, Arc::new(info.config.clone()), bytes);
        if let Some(seq) = txn_seq {
            produce = produce.with_txn_seq(seq);
        }
        Ok(produce)
    }

    /// Now, by the diskless node's clock (what the maintenance tick gives [`Storage::maintain`]).
    pub fn now(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(u64::try_from(self.shared.clock.now_ms()).unwrap_or(0))
    }

    /// The diskless fetch of one partition, as Nisshi's `fetch` answers it: whole batches from
    /// `offset`, at most `max_bytes` (at least one batch), read_committed stopping at the LSO and
    /// leaving out the batches of aborted transactions (Nisshi's fetch service sends no aborted
    /// transaction list).
    async fn fetch_diskless(
        &self,
        tp: TopicIdPartition,
        offset: i64,
        max_bytes: u32,
        isolation: IsolationLevel,
    ) -> Result<Vec<deflated::Batch>> {
        let isolation = match isolation {
            IsolationLevel::ReadCommitted => DisklessIsolation::ReadCommitted,
            IsolationLevel::ReadUncommitted => DisklessIsolation::ReadUncommitted,
        };
        let answer = self
            .shared
            .fetcher
            .fetch(
                &[FetchPartition {
                    partition: tp,
                    fetch_offset: offset,
                    partition_max_bytes: max_bytes,
                    leader_epoch: 0,
                    isolation,
                }],
                max_bytes,
            )
            .await
            .map_err(|e| Error::Api(convert::code(e.error_code())))?;
        let Some(part) = answer.into_iter().next() else {
            return Ok(Vec::new());
        };
        if !part.error.is_ok() {
            return Err(Error::Api(convert::code(part.error)));
        }
        let mut batches = convert::batches(&part.records_bytes())?;
        if let Some(aborted) = &part.aborted_transactions {
            batches.retain(|b| {
                !(b.is_transactional()
                    && !b.is_control()
                    && aborted.iter().any(|a| {
                        a.producer_id == b.producer_id
                            && a.first_offset <= b.base_offset
                            && b.base_offset <= a.last_offset
                    }))
            });
        }
        Ok(batches)
    }

    /// Log start, high watermark and last stable offset of a diskless partition.
    pub(crate) async fn stage_diskless(&self, tp: TopicIdPartition) -> Result<(i64, i64, i64)> {
        let ask = |timestamp, isolation| diskless_coordinator::ListOffsetsRequest {
            partition: tp,
            timestamp,
            isolation,
        };
        let answers = self
            .shared
            .coordinator
            .list_offsets(&[
                ask(EARLIEST_TIMESTAMP, DisklessIsolation::ReadUncommitted),
                ask(LATEST_TIMESTAMP, DisklessIsolation::ReadUncommitted),
                ask(LATEST_TIMESTAMP, DisklessIsolation::ReadCommitted),
            ])
            .await
            .map_err(|e| convert::api_error(&e))?;
        if let Some(bad) = answers.iter().find(|a| !a.error.is_ok()) {
            return Err(Error::Api(convert::code(bad.error)));
        }
        match answers.as_slice() {
            [start, hw, lso] => Ok((start.offset, hw.offset, lso.offset)),
            _ => Err(Error::Message(
                "the coordinator answered the wrong number of offsets".into(),
            )),
        }
    }

    /// Record-level ListOffsets of diskless partitions (every special timestamp).
    pub(crate) async fn list_offsets_diskless(
        &self,
        requests: &[ListOffsetsPartition],
    ) -> Result<Vec<ListedOffset>> {
        self.shared
            .fetcher
            .list_offsets(requests)
            .await
            .map_err(|e| Error::Api(convert::code(e.error_code())))
    }

    /// The diskless partitions of a transaction-add request.
    async fn diskless_partitions_of(
        &self,
        topics: &[AddPartitionsToTxnTopic],
    ) -> Result<Vec<TopicIdPartition>> {
        let mut partitions = Vec::new();
        for topic in topics {
            if let Some(info) = self.diskless_topic(&topic.name).await? {
                partitions.extend(
                    topic
                        .partitions
                        .as_deref()
                        .unwrap_or_default()
                        .iter()
                        .map(|p| TopicIdPartition::new(info.topic_id, *p)),
                );
            }
        }
        Ok(partitions)
    }

    /// AddPartitionsToTxn's (and AddOffsetsToTxn's, with no partitions) step in the transaction
    /// record: `NONE` when the engine may be asked next, else Kafka's error. A decided
    /// transaction not finished yet is finished first (the client's EndTxn was answered before
    /// its markers were all written).
    async fn record_added(
        &self,
        transaction_id: &str,
        producer_id: i64,
        producer_epoch: i16,
        partitions: Vec<TopicIdPartition>,
    ) -> Result<ErrorCode> {
        let answer = self
            .transition_after_endings(TxnTransition::AddPartitions {
                transactional_id: transaction_id.to_string(),
                producer_id,
                producer_epoch,
                partitions,
            })
            .await?;
        Ok(convert::code(answer.error))
    }

    /// Rebuilds a diskless topic's applied config from Nisshi's stored configs and gives it to the
    /// coordinator.
    async fn sync_config(&self, info: &TopicInfo) -> Result<()> {
        let described = self
            .inner
            .describe_config(&info.name, ConfigResource::Topic, None)
            .await?;
        let entries: Vec<(String, Option<String>)> = described
            .configs
            .unwrap_or_default()
            .into_iter()
            .map(|c| (c.name, c.value))
            .collect();
        let config = self.topic_config(entries.iter().map(|(n, v)| (n.as_str(), v.as_deref())))?;
        self.shared
            .coordinator
            .alter_topic_config(info.topic_id, config.clone())
            .await
            .map_err(|e| convert::api_error(&e))?;
        self.shared
            .topics
            .insert(TopicInfo {
                config,
                ..info.clone()
            })
            .await;
        Ok(())
    }
}

/// Appends copies of the last partition (renumbered by `set_index`) until there are `total`;
/// whether any was added.
fn grow_partitions<P: Clone>(
    partitions: &mut Option<Vec<P>>,
    total: i32,
    set_index: impl Fn(&mut P, i32),
) -> bool {
    let Some(list) = partitions.as_mut() else {
        return false;
    };
    let Some(template) = list.last().cloned() else {
        return false;
    };
    let have = i32::try_from(list.len()).unwrap_or(i32::MAX);
    for i in have..total {
        let mut p = template.clone();
        set_index(&mut p, i);
        list.push(p);
    }
    have < total
}

fn delete_records_error(topic: &DeleteRecordsTopic, code: ErrorCode) -> DeleteRecordsTopicResult {
    DeleteRecordsTopicResult::default()
        .name(topic.name.clone())
        .partitions(Some(
            topic
                .partitions
                .as_deref()
                .unwrap_or_default()
                .iter()
                .map(|p| {
                    DeleteRecordsPartitionResult::default()
                        .partition_index(p.partition_index)
                        .low_watermark(-1)
                        .error_code(code.into())
                })
                .collect(),
        ))
}

fn system_time_ms(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_millis()).unwrap_or(i64::MAX),
        Err(_) => -1,
    }
}

/// Nisshi's `OffsetStage` (its fields are private; it is built through its serde form).
fn offset_stage(log_start: i64, high_watermark: i64, last_stable: i64) -> Result<OffsetStage> {
    serde_json::from_value(serde_json::json!({
        "last_stable": last_stable,
        "high_watermark": high_watermark,
        "log_start": log_start,
    }))
    .map_err(|e| Error::Message(format!("offset stage: {e}")))
}

#[async_trait]
impl<S: Storage> Storage for DisklessStorage<S> {
    async fn register_broker(&self, broker_registration: BrokerRegistrationRequest) -> Result<()> {
        self.inner.register_broker(broker_registration).await
    }

    async fn create_topic(&self, mut topic: CreatableTopic, validate_only: bool) -> Result<Uuid> {
        // Manual replica assignments give the partition count (Kafka requires
        // num_partitions = -1 with them); tansu 0.6.0's CreateTopics route has already turned
        // that -1 into its default of 3 partitions.
        if let Some(assignments) = topic.assignments.as_deref()
            && !assignments.is_empty()
        {
            topic.num_partitions = i32::try_from(assignments.len()).unwrap_or(i32::MAX);
        }
        if !self.wants_diskless(topic.configs.as_deref())? {
            return self.inner.create_topic(topic, validate_only).await;
        }
        let config = self.topic_config(
            topic
                .configs
                .as_deref()
                .unwrap_or_default()
                .iter()
                .map(|c| (c.name.as_str(), c.value.as_deref())),
        )?;
        // Nisshi keeps the flag with the topic's configs, so DescribeConfigs shows it.
        let configs = topic.configs.get_or_insert_with(Vec::new);
        if !configs.iter().any(|c| c.name == DISKLESS_ENABLE) {
            configs.push(
                CreatableTopicConfig::default()
                    .name(DISKLESS_ENABLE.into())
                    .value(Some("true".into())),
            );
        }
        let name = topic.name.clone();
        let id = self.inner.create_topic(topic, validate_only).await?;
        if validate_only {
            return Ok(id);
        }
        let partitions = match self.inner.metadata(Some(&[TopicId::Id(id)])).await {
            Ok(m) => m
                .topics()
                .first()
                .and_then(|t| t.partitions.as_ref())
                .map_or(0, |p| i32::try_from(p.len()).unwrap_or(i32::MAX)),
            Err(e) => {
                warn!(error = ?e, topic = %name, "cannot read the new topic's partition count");
                0
            }
        };
        let request = CreateTopicRequest {
            topic_id: id,
            name: name.clone(),
            partitions,
            config: config.clone(),
        };
        if let Err(e) = self.shared.coordinator.create_topic(request).await {
            if self.shared.settings.engine_delete_topic {
                warn!(error = %e, topic = %name, "the coordinator refused the diskless topic; removing it from Nisshi");
                if let Err(undo) = self.inner.delete_topic(&TopicId::Id(id)).await {
                    warn!(error = ?undo, topic = %name, "could not remove the half-created topic");
                }
            } else {
                // Undoing through this engine's delete would delete every topic of the cluster
                // (DisklessSettings::engine_delete_topic).
                error!(error = %e, topic = %name, "the coordinator refused the diskless topic; it stays in Nisshi's engine without diskless data (this engine cannot delete one topic)");
            }
            return Err(convert::api_error(&e));
        }
        self.shared
            .topics
            .insert(TopicInfo {
                topic_id: id,
                name,
                partitions,
                config,
            })
            .await;
        Ok(id)
    }

    async fn incremental_alter_resource(
        &self,
        resource: AlterConfigsResource,
    ) -> Result<AlterConfigsResourceResponse> {
        if let Some(why) = unsupported_op(&resource) {
            return Ok(refusal(&resource, why));
        }
        let diskless = if resource.resource_type == TOPIC_RESOURCE {
            self.diskless_topic(&resource.resource_name).await?
        } else {
            None
        };
        let Some(info) = diskless else {
            if resource.resource_type == TOPIC_RESOURCE
                && resource
                    .configs
                    .as_deref()
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.name == DISKLESS_ENABLE && c.value.as_deref() == Some("true"))
            {
                return Ok(refusal(
                    &resource,
                    "diskless.enable cannot be changed after creation",
                ));
            }
            return self.inner.incremental_alter_resource(resource).await;
        };
        // Checked before Nisshi stores anything: the flag is fixed, values must parse.
        let mut probe = info.config.clone();
        for c in resource.configs.as_deref().unwrap_or_default() {
            if c.name == DISKLESS_ENABLE {
                return Ok(refusal(
                    &resource,
                    "diskless.enable cannot be changed after creation",
                ));
            }
            if c.config_operation != OP_DELETE
                && let Some(value) = c.value.as_deref()
                && let Err(e) = probe.set_kafka_config(&c.name, value)
            {
                return Ok(refusal(&resource, &e.to_string()));
            }
        }
        let response = self.inner.incremental_alter_resource(resource).await?;
        if response.error_code == i16::from(ErrorCode::None) {
            self.sync_config(&info).await?;
        }
        Ok(response)
    }

    async fn delete_records(
        &self,
        topics: &[DeleteRecordsTopic],
    ) -> Result<Vec<DeleteRecordsTopicResult>> {
        let mut out: Vec<Option<DeleteRecordsTopicResult>> = vec![None; topics.len()];
        let mut classic = Vec::new();
        let mut classic_at = Vec::new();
        for (i, topic) in topics.iter().enumerate() {
            let Some(info) = self.diskless_topic(&topic.name).await? else {
                classic.push(topic.clone());
                classic_at.push(i);
                continue;
            };
            let partitions = topic.partitions.as_deref().unwrap_or_default();
            let requests: Vec<DeleteRecordsRequest> = partitions
                .iter()
                .map(|p| DeleteRecordsRequest {
                    partition: TopicIdPartition::new(info.topic_id, p.partition_index),
                    offset: p.offset,
                })
                .collect();
            let answers = self.shared.coordinator.delete_records(&requests).await;
            let results = partitions
                .iter()
                .enumerate()
                .map(|(j, p)| {
                    let (code, low) = match &answers {
                        Ok(a) => a.get(j).map_or((ErrorCode::UnknownServerError, -1), |r| {
                            (convert::code(r.error), r.low_watermark)
                        }),
                        Err(e) => (convert::code(e.error_code()), -1),
                    };
                    DeleteRecordsPartitionResult::default()
                        .partition_index(p.partition_index)
                        .low_watermark(low)
                        .error_code(code.into())
                })
                .collect();
            out[i] = Some(
                DeleteRecordsTopicResult::default()
                    .name(topic.name.clone())
                    .partitions(Some(results)),
            );
        }
        if !classic.is_empty() {
            let answers = if self.shared.settings.engine_delete_records {
                self.inner.delete_records(&classic).await?
            } else {
                classic
                    .iter()
                    .map(|t| delete_records_error(t, ErrorCode::PolicyViolation))
                    .collect()
            };
            for (i, answer) in classic_at.into_iter().zip(answers) {
                out[i] = Some(answer);
            }
        }
        Ok(out.into_iter().flatten().collect())
    }

    async fn delete_topic(&self, topic: &TopicId) -> Result<ErrorCode> {
        if !self.shared.settings.engine_delete_topic {
            // Nothing deleted on either side: this engine would delete every topic of the
            // cluster (DisklessSettings::engine_delete_topic).
            warn!(
                ?topic,
                "DeleteTopics refused: Nisshi's engine cannot delete a single topic"
            );
            return Ok(ErrorCode::TopicDeletionDisabled);
        }
        let info = match topic {
            TopicId::Name(name) => self.diskless_topic(name).await?,
            TopicId::Id(id) => self
                .shared
                .topics
                .by_id(*id)
                .await
                .map_err(|e| convert::api_error(&e))?,
        };
        if let Some(info) = info {
            // The coordinator first: once it forgets the topic its data is logically deleted and
            // its objects go to the lifecycle workers; a failure of Nisshi's delete after it is
            // retried by the client (the coordinator then answers "unknown", taken as done).
            match self.shared.coordinator.delete_topic(info.topic_id).await {
                Ok(()) => {}
                Err(e)
                    if e.error_code()
                        == diskless_coordinator::ErrorCode::UnknownTopicOrPartition => {}
                Err(e) => return Err(convert::api_error(&e)),
            }
            self.shared.topics.remove(&info.name).await;
        }
        self.inner.delete_topic(topic).await
    }

    async fn brokers(&self) -> Result<Vec<DescribeClusterBroker>> {
        self.inner.brokers().await
    }

    async fn produce(
        &self,
        transaction_id: Option<&str>,
        topition: &Topition,
        batch: deflated::Batch,
    ) -> Result<i64> {
        let Some(info) = self.diskless_topic(topition.topic()).await? else {
            return self.inner.produce(transaction_id, topition, batch).await;
        };
        let answer = self
            .produce_diskless(
                transaction_id,
                &info,
                topition.partition(),
                convert::batch_bytes(batch),
            )
            .await;
        if answer.error.is_ok() {
            Ok(answer.base_offset)
        } else {
            Err(Error::Api(convert::code(answer.error)))
        }
    }

    async fn fetch(
        &self,
        topition: &'_ Topition,
        offset: i64,
        min_bytes: u32,
        max_bytes: u32,
        isolation: IsolationLevel,
    ) -> Result<Vec<deflated::Batch>> {
        match self.partition_of(topition).await? {
            Some((_, tp)) => self.fetch_diskless(tp, offset, max_bytes, isolation).await,
            None => {
                self.inner
                    .fetch(topition, offset, min_bytes, max_bytes, isolation)
                    .await
            }
        }
    }

    async fn offset_stage(&self, topition: &Topition) -> Result<OffsetStage> {
        match self.partition_of(topition).await? {
            Some((_, tp)) => {
                let (start, hw, lso) = self.stage_diskless(tp).await?;
                offset_stage(start, hw, lso)
            }
            None => self.inner.offset_stage(topition).await,
        }
    }

    async fn list_offsets(
        &self,
        isolation_level: IsolationLevel,
        offsets: &[(Topition, ListOffset)],
    ) -> Result<Vec<(Topition, ListOffsetResponse)>> {
        let mut out: Vec<Option<(Topition, ListOffsetResponse)>> = vec![None; offsets.len()];
        let mut classic = Vec::new();
        let mut classic_at = Vec::new();
        let mut diskless = Vec::new();
        let mut diskless_at = Vec::new();
        let isolation = match isolation_level {
            IsolationLevel::ReadCommitted => DisklessIsolation::ReadCommitted,
            IsolationLevel::ReadUncommitted => DisklessIsolation::ReadUncommitted,
        };
        for (i, (topition, asked)) in offsets.iter().enumerate() {
            match self.partition_of(topition).await? {
                Some((_, tp)) => {
                    let timestamp = match asked {
                        ListOffset::Earliest => EARLIEST_TIMESTAMP,
                        ListOffset::Latest => LATEST_TIMESTAMP,
                        ListOffset::Timestamp(t) => system_time_ms(*t),
                    };
                    diskless.push(ListOffsetsPartition {
                        partition: tp,
                        timestamp,
                        leader_epoch: 0,
                        isolation,
                    });
                    diskless_at.push(i);
                }
                None => {
                    classic.push((topition.clone(), *asked));
                    classic_at.push(i);
                }
            }
        }
        if !diskless.is_empty() {
            let answers = self.list_offsets_diskless(&diskless).await?;
            for ((i, answer), asked) in diskless_at.into_iter().zip(answers).zip(&diskless) {
                let _ = asked;
                let response = ListOffsetResponse {
                    error_code: convert::code(answer.error),
                    timestamp: (answer.timestamp >= 0).then(|| {
                        UNIX_EPOCH + Duration::from_millis(answer.timestamp.unsigned_abs())
                    }),
                    offset: (answer.offset >= 0).then_some(answer.offset),
                };
                out[i] = Some((offsets[i].0.clone(), response));
            }
        }
        if !classic.is_empty() {
            let answers = self.inner.list_offsets(isolation_level, &classic).await?;
            for (i, answer) in classic_at.into_iter().zip(answers) {
                out[i] = Some(answer);
            }
        }
        Ok(out.into_iter().flatten().collect())
    }

    async fn offset_commit(
        &self,
        group_id: &str,
        retention_time_ms: Option<Duration>,
        offsets: &[(Topition, OffsetCommitRequest)],
    ) -> Result<Vec<(Topition, ErrorCode)>> {
        self.inner
            .offset_commit(group_id, retention_time_ms, offsets)
            .await
    }

    async fn offset_fetch(
        &self,
        group_id: Option<&str>,
        topics: &[Topition],
        require_stable: Option<bool>,
    ) -> Result<BTreeMap<Topition, i64>> {
        self.inner
            .offset_fetch(group_id, topics, require_stable)
            .await
    }

    async fn committed_offset_topitions(&self, group_id: &str) -> Result<BTreeMap<Topition, i64>> {
        self.inner.committed_offset_topitions(group_id).await
    }

    async fn metadata(&self, topics: Option<&[TopicId]>) -> Result<MetadataResponse> {
        let response = self.inner.metadata(topics).await?;
        // A diskless topic's partition count is the coordinator's (CreatePartitions grows it
        // there only): Nisshi's engine lists the partitions it was created with.
        let mut listed = response.topics().to_vec();
        let mut grown = false;
        for t in &mut listed {
            if let Some(info) = self.diskless_named(t.name.as_deref()).await? {
                grown |= grow_partitions(&mut t.partitions, info.partitions, |p, i| {
                    p.partition_index = i;
                });
            }
        }
        if !grown {
            return Ok(response);
        }
        let mut value = serde_json::to_value(&response)
            .map_err(|e| Error::Message(format!("metadata: {e}")))?;
        value["topics"] =
            serde_json::to_value(&listed).map_err(|e| Error::Message(format!("metadata: {e}")))?;
        serde_json::from_value(value).map_err(|e| Error::Message(format!("metadata: {e}")))
    }

    async fn upsert_user_scram_credential(
        &self,
        user: &str,
        mechanism: ScramMechanism,
        credential: ScramCredential,
    ) -> Result<()> {
        self.inner
            .upsert_user_scram_credential(user, mechanism, credential)
            .await
    }

    async fn delete_user_scram_credential(
        &self,
        user: &str,
        mechanism: ScramMechanism,
    ) -> Result<()> {
        self.inner
            .delete_user_scram_credential(user, mechanism)
            .await
    }

    async fn user_scram_credential(
        &self,
        user: &str,
        mechanism: ScramMechanism,
    ) -> Result<Option<ScramCredential>> {
        self.inner.user_scram_credential(user, mechanism).await
    }

    async fn describe_config(
        &self,
        name: &str,
        resource: ConfigResource,
        keys: Option<&[String]>,
    ) -> Result<DescribeConfigsResult> {
        self.inner.describe_config(name, resource, keys).await
    }

    async fn list_groups(&self, states_filter: Option<&[String]>) -> Result<Vec<ListedGroup>> {
        self.inner.list_groups(states_filter).await
    }

    async fn delete_groups(
        &self,
        group_ids: Option<&[String]>,
    ) -> Result<Vec<DeletableGroupResult>> {
        self.inner.delete_groups(group_ids).await
    }

    async fn describe_groups(
        &self,
        group_ids: Option<&[String]>,
        include_authorized_operations: bool,
    ) -> Result<Vec<NamedGroupDetail>> {
        self.inner
            .describe_groups(group_ids, include_authorized_operations)
            .await
    }

    async fn describe_topic_partitions(
        &self,
        topics: Option<&[TopicId]>,
        partition_limit: i32,
        cursor: Option<Topition>,
    ) -> Result<Vec<DescribeTopicPartitionsResponseTopic>> {
        let mut listed = self
            .inner
            .describe_topic_partitions(topics, partition_limit, cursor)
            .await?;
        for t in &mut listed {
            if let Some(info) = self.diskless_named(t.name.as_deref()).await? {
                // Up to the coordinator's count, within the request's partition limit.
                let total = info.partitions.min(partition_limit.max(1));
                grow_partitions(&mut t.partitions, total, |p, i| p.partition_index = i);
            }
        }
        Ok(listed)
    }

    async fn update_group(
        &self,
        group_id: &str,
        detail: GroupDetail,
        version: Option<Version>,
    ) -> Result<Version, UpdateError<GroupDetail>> {
        self.inner.update_group(group_id, detail, version).await
    }

    async fn init_producer(
        &self,
        transaction_id: Option<&str>,
        transaction_timeout_ms: i32,
        producer_id: Option<i64>,
        producer_epoch: Option<i16>,
    ) -> Result<ProducerIdResponse> {
        // Nisshi 0.6.0's engines only handle a fresh InitProducerId (id and epoch -1) and panic
        // (`todo!()`, ending the engine's request loop) on anything else: versions 0-2 (no id
        // fields) and KIP-360's re-initialisation with the current id and epoch. Both are asked
        // as a fresh one: a new id, or for a transactional id the next epoch, fencing the old
        // one, which KIP-360 clients accept.
        let _ = (producer_id, producer_epoch);
        // Kafka refuses a transaction timeout outside (0, transaction.max.timeout.ms] before
        // anything else; tansu 0.6.0 accepts any (librdkafka 0103_transactions).
        if transaction_id.is_some()
            && !(1..=TRANSACTION_MAX_TIMEOUT_MS).contains(&transaction_timeout_ms)
        {
            return Ok(ProducerIdResponse {
                error: ErrorCode::InvalidTransactionTimeout,
                id: -1,
                epoch: -1,
            });
        }
        let Some(tid) = transaction_id else {
            return self
                .inner
                .init_producer(None, transaction_timeout_ms, Some(-1), Some(-1))
                .await;
        };
        let refused = |error: ErrorCode| ProducerIdResponse {
            error,
            id: -1,
            epoch: -1,
        };
        let timeout_ms = i64::from(transaction_timeout_ms);
        // The open transaction is fenced (decided aborted) and finished, and one whose end was
        // decided is finished, before the engine bumps the epoch (Kafka answers
        // CONCURRENT_TRANSACTIONS while one completes): fencing never turns a decided commit into
        // an abort.
        let fence = self
            .transition_after_endings(TxnTransition::Init {
                transactional_id: tid.to_string(),
                producer: None,
                timeout_ms,
            })
            .await?;
        if fence.error != DisklessCode::None {
            return Ok(refused(convert::code(fence.error)));
        }
        let answer = self
            .inner
            .init_producer(transaction_id, transaction_timeout_ms, Some(-1), Some(-1))
            .await?;
        if answer.error != ErrorCode::None {
            return Ok(answer);
        }
        // Recorded with its timeout; a transaction an old producer opened meanwhile is fenced
        // and finished the same way.
        let recorded = self
            .transition_after_endings(TxnTransition::Init {
                transactional_id: tid.to_string(),
                producer: Some((answer.id, answer.epoch)),
                timeout_ms,
            })
            .await?;
        if recorded.error != DisklessCode::None {
            return Ok(refused(convert::code(recorded.error)));
        }
        Ok(answer)
    }

    async fn txn_add_offsets(
        &self,
        transaction_id: &str,
        producer_id: i64,
        producer_epoch: i16,
        group_id: &str,
    ) -> Result<ErrorCode> {
        // The group's offsets partition, in Kafka: the transaction opens (or goes on) here too.
        let code = self
            .record_added(transaction_id, producer_id, producer_epoch, Vec::new())
            .await?;
        if code != ErrorCode::None {
            return Ok(code);
        }
        self.inner
            .txn_add_offsets(transaction_id, producer_id, producer_epoch, group_id)
            .await
    }

    async fn txn_add_partitions(
        &self,
        partitions: TxnAddPartitionsRequest,
    ) -> Result<TxnAddPartitionsResponse> {
        match &partitions {
            TxnAddPartitionsRequest::VersionZeroToThree {
                transaction_id,
                producer_id,
                producer_epoch,
                topics,
            } => {
                // In the record before the engine: the previous transaction's end goes first
                // (Kafka: CONCURRENT_TRANSACTIONS), a fenced producer goes no further.
                let partitions = self.diskless_partitions_of(topics).await?;
                let code = self
                    .record_added(transaction_id, *producer_id, *producer_epoch, partitions)
                    .await?;
                if code != ErrorCode::None {
                    return Err(Error::Api(code));
                }
            }
            TxnAddPartitionsRequest::VersionFourPlus { .. } => {
                // Versions 4+ are broker-to-broker (KIP-890); Nisshi 0.6.0's engines panic on
                // them (`todo!()`, ending their request loop).
                return Err(Error::Api(ErrorCode::UnsupportedVersion));
            }
        }
        self.inner.txn_add_partitions(partitions).await
    }

    async fn txn_offset_commit(
        &self,
        offsets: TxnOffsetCommitRequest,
    ) -> Result<Vec<TxnOffsetCommitResponseTopic>> {
        self.inner.txn_offset_commit(offsets).await
    }

    async fn txn_end(
        &self,
        transaction_id: &str,
        producer_id: i64,
        producer_epoch: i16,
        committed: bool,
    ) -> Result<ErrorCode> {
        // Decided in the record before the engine is asked (module documentation); a retry of
        // the same outcome finds it decided and drives it on.
        let answer = self
            .txn_transition(TxnTransition::End {
                transactional_id: transaction_id.to_string(),
                producer_id,
                producer_epoch,
                commit: committed,
            })
            .await?;
        if answer.error != DisklessCode::None {
            return Ok(convert::code(answer.error));
        }
        match answer.record {
            Some(record) => self.drive_ending(&record, false).await,
            None => Ok(ErrorCode::InvalidTxnState),
        }
    }

    async fn maintain(&self, now: SystemTime) -> Result<()> {
        let now_ms = now
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        let left = self.finish_endings(now_ms).await;
        if left > 0 {
            debug!(left, "decided transactions not finished yet");
        }
        self.inner.maintain(now).await
    }

    async fn cluster_id(&self) -> Result<String> {
        self.inner.cluster_id().await
    }

    async fn node(&self) -> Result<i32> {
        self.inner.node().await
    }

    async fn advertised_listener(&self) -> Result<Url> {
        self.inner.advertised_listener().await
    }

    async fn ping(&self) -> Result<()> {
        self.inner.ping().await
    }
}

/// Why Nisshi's engine cannot take `resource`'s operations: tansu 0.6.0 panics on APPEND and
/// SUBTRACT (`todo!()`, ending the engine's request loop).
fn unsupported_op(resource: &AlterConfigsResource) -> Option<&'static str> {
    resource
        .configs
        .as_deref()
        .unwrap_or_default()
        .iter()
        .any(|c| c.config_operation == OP_APPEND || c.config_operation == OP_SUBTRACT)
        .then_some("APPEND and SUBTRACT are not supported by Nisshi 0.6.0's engine")
}

/// An IncrementalAlterConfigs answer refusing `resource` with `INVALID_CONFIG`.
fn refusal(resource: &AlterConfigsResource, message: &str) -> AlterConfigsResourceResponse {
    AlterConfigsResourceResponse::default()
        .error_code(ErrorCode::InvalidConfig.into())
        .error_message(Some(message.to_string()))
        .resource_type(resource.resource_type)
        .resource_name(resource.resource_name.clone())
}
