//! Fetch, ListOffsets, DeleteRecords.
//!
//! Fetch goes through the shared `Fetcher` (KIP-74 byte limits, offsets injected into the stored
//! batches), versions 4-17: fetch sessions (KIP-227) from version 7, kept as Kafka keeps them
//! ([`crate::fetch_session`]), topic ids from version 13. It long-polls as Kafka does, through the
//! library's `Fetcher::fetch_wait`: while fewer than `min_bytes` are available, no read failed and
//! `max_wait_ms` (at most the fetcher's `max_wait_limit`, 30 s) has not passed, it waits for a
//! commit of any broker of the process or a transaction marker (the node's commit signal), or
//! re-checks every `long_poll_interval` (250 ms, for writers in other processes sharing the
//! coordinator), and fetches again. `read_committed` fetches stop at the last
//! stable offset and carry the aborted transactions of what they return (the library's
//! `Fetcher`); transaction markers are served as Kafka's control batches.
//!
//! ListOffsets goes through the shared `Fetcher` too (`Fetcher::list_offsets`: record-level
//! answers, reading the one batch a timestamp falls in); DeleteRecords moves log start offsets in
//! the coordinator (`-1` deletes up to the high watermark; beyond it is `OFFSET_OUT_OF_RANGE`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use diskless_coordinator::{
    CoordinatorError, DeleteRecordsRequest as CoordDeleteRecords, IsolationLevel, TopicIdPartition,
};
use diskless_core::validate::fetch_codec_error;
use diskless_core::{FetchPartition, ListOffsetsPartition, list_offsets_min_version};
use kafka_protocol::messages::delete_records_response::{
    DeleteRecordsPartitionResult, DeleteRecordsTopicResult,
};
use kafka_protocol::messages::fetch_response::{
    AbortedTransaction, FetchableTopicResponse, PartitionData,
};
use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use kafka_protocol::messages::{
    DeleteRecordsRequest, DeleteRecordsResponse, FetchRequest, FetchResponse, ListOffsetsRequest,
    ListOffsetsResponse, ProducerId, TopicName,
};
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::broker::Broker;
use crate::codes;
use crate::ctx::Ctx;
use crate::fetch_session::{
    self, Context, FINAL_EPOCH, INVALID_SESSION_ID, PartitionKey, PartitionOutcome,
    PartitionRequest, TopicKey,
};
use crate::topics::Topic;

/// Kafka's UNSUPPORTED_VERSION error code.
const UNSUPPORTED_VERSION: i16 = 35;

/// Where one partition of a fetch is answered from.
enum Slot {
    /// The n-th partition handed to the fetcher.
    Fetch(usize),
    /// Answered without reading (unknown topic, topic id or partition).
    Error(i16),
    /// Not read, answered with this error among the read partitions: Kafka reads it, then
    /// replaces the data (a Fetch older than v10 of a `compression.type=zstd` topic,
    /// `KafkaApis.maybeConvertFetchedData`).
    Refused(i16),
}

/// Kafka's `NOT_LEADER_OR_FOLLOWER`.
const NOT_LEADER_OR_FOLLOWER: i16 = 6;
/// Kafka's `KAFKA_STORAGE_ERROR`.
const KAFKA_STORAGE_ERROR: i16 = 56;
/// Kafka's `UNKNOWN_TOPIC_ID`.
const UNKNOWN_TOPIC_ID: i16 = 100;

/// The replica id of a fetch request (the field moved into `replica_state` in version 15).
fn replica_id(version: i16, request: &FetchRequest) -> i32 {
    if version >= 15 {
        request.replica_state.replica_id.0
    } else {
        request.replica_id.0
    }
}

/// The request's partitions in request order, a partition named twice counted once at its first
/// place with its last parameters (Kafka's `FetchRequest.fetchData`, a linked hash map), and the
/// partitions it forgets.
fn request_partitions(
    version: i16,
    request: &FetchRequest,
) -> (Vec<(PartitionKey, PartitionRequest)>, Vec<PartitionKey>) {
    let topic_key = |name: &TopicName, id: uuid::Uuid| {
        if version >= 13 {
            TopicKey::Id(id)
        } else {
            TopicKey::Name(name.clone())
        }
    };
    let mut data: Vec<(PartitionKey, PartitionRequest)> = Vec::new();
    let mut seen: HashMap<PartitionKey, usize> = HashMap::new();
    for topic in &request.topics {
        for p in &topic.partitions {
            let key = PartitionKey {
                topic: topic_key(&topic.topic, topic.topic_id),
                partition: p.partition,
            };
            let wanted = PartitionRequest {
                fetch_offset: p.fetch_offset,
                max_bytes: p.partition_max_bytes,
                log_start_offset: p.log_start_offset,
                current_leader_epoch: p.current_leader_epoch,
                last_fetched_epoch: p.last_fetched_epoch,
            };
            match seen.get(&key) {
                Some(&i) => data[i].1 = wanted,
                None => {
                    seen.insert(key.clone(), data.len());
                    data.push((key, wanted));
                }
            }
        }
    }
    let forgotten = if version >= 7 {
        request
            .forgotten_topics_data
            .iter()
            .flat_map(|t| {
                let topic = topic_key(&t.topic, t.topic_id);
                t.partitions.iter().map(move |&partition| PartitionKey {
                    topic: topic.clone(),
                    partition,
                })
            })
            .collect()
    } else {
        Vec::new()
    };
    (data, forgotten)
}

/// Fetch with fetch sessions (KIP-227, see [`crate::fetch_session`]) and long polling.
///
/// As Kafka's `KafkaApis.handleFetchRequest`: the partitions of the request (full and sessionless
/// fetches) or of the session (incremental fetches) are resolved — a topic id that names no topic
/// is `UNKNOWN_TOPIC_ID` (version 13+), an unknown topic or partition `UNKNOWN_TOPIC_OR_PARTITION`
/// — and the others are read, waiting while fewer than `min_bytes` are available, no read failed
/// and `max_wait_ms` has not passed. The answer lists the read partitions first, then those
/// answered with an error, a topic's consecutive partitions in one entry.
pub(crate) async fn fetch(broker: &Arc<Broker>, ctx: &Ctx, request: FetchRequest) -> FetchResponse {
    let version = ctx.version;
    let uses_topic_ids = version >= 13;
    let (session_id, session_epoch) = if version >= 7 {
        (request.session_id, request.session_epoch)
    } else {
        (INVALID_SESSION_ID, FINAL_EPOCH)
    };
    let privileged = replica_id(version, &request) >= 0;
    let (fetch_data, forgotten) = request_partitions(version, &request);
    let context = fetch_session::with_cache(ctx.node, |cache| {
        cache.new_context(
            Instant::now().into_std(),
            uses_topic_ids,
            session_id,
            session_epoch,
            &fetch_data,
            &forgotten,
        )
    });
    let partitions = match &context {
        Context::Error(code) => {
            debug!(
                node = ctx.node,
                session_id, session_epoch, code, "fetch session error"
            );
            let mut response = FetchResponse::default();
            response.error_code = *code;
            response.session_id = INVALID_SESSION_ID;
            return response;
        }
        Context::Sessionless | Context::Full => fetch_data,
        Context::Incremental { partitions, .. } => partitions.clone(),
    };

    // Resolve: the partitions to read (in order), and those answered at once.
    let mut slots = Vec::with_capacity(partitions.len());
    let mut wanted = Vec::new();
    let mut names: HashMap<TopicKey, Result<Option<Arc<Topic>>, i16>> = HashMap::new();
    for (key, asked) in &partitions {
        if !names.contains_key(&key.topic) {
            let found = match &key.topic {
                TopicKey::Name(name) => broker.topics.by_name(name.as_str()).await,
                TopicKey::Id(id) => broker.topics.by_id(*id).await,
            };
            names.insert(key.topic.clone(), found.map_err(|e| e.error_code().code()));
        }
        let slot = match names.get(&key.topic) {
            Some(Err(code)) => Slot::Error(*code),
            Some(Ok(Some(t))) if t.has_partition(key.partition) => {
                match fetch_codec_error(&t.config, version) {
                    Some(code) => Slot::Refused(code.code()),
                    None => {
                        wanted.push(FetchPartition {
                            partition: TopicIdPartition::new(t.id, key.partition),
                            fetch_offset: asked.fetch_offset,
                            partition_max_bytes: u32::try_from(asked.max_bytes).unwrap_or(0),
                            leader_epoch: 0,
                            isolation: isolation(request.isolation_level),
                        });
                        Slot::Fetch(wanted.len() - 1)
                    }
                }
            }
            Some(Ok(None)) if matches!(key.topic, TopicKey::Id(_)) => Slot::Error(UNKNOWN_TOPIC_ID),
            _ => Slot::Error(codes::UNKNOWN_TOPIC_OR_PARTITION),
        };
        slots.push(slot);
    }

    let max_bytes = u32::try_from(request.max_bytes).unwrap_or(0);
    let min_bytes = u32::try_from(request.min_bytes).unwrap_or(0);
    let max_wait = Duration::from_millis(u64::try_from(request.max_wait_ms).unwrap_or(0));
    // Kafka's `DelayedFetch` (the library caps the wait): answer at once when nothing is to be
    // read, enough bytes are there or a read failed; partitions answered with an error here (not
    // handed to the fetcher) do not cut the wait short.
    let fetched = broker
        .fetcher
        .fetch_wait(&wanted, max_bytes, min_bytes, max_wait)
        .await;

    let (parts, whole_error) = match fetched {
        Ok(parts) => (parts, None),
        Err(e) => {
            warn!(error = %e, "fetch failed");
            (Vec::new(), Some(e.error_code().code()))
        }
    };
    let mut parts: Vec<Option<diskless_core::FetchedPartition>> =
        parts.into_iter().map(Some).collect();
    // The answers: read partitions first, then the erroneous ones (Kafka's order).
    let mut read = Vec::with_capacity(partitions.len());
    let mut erroneous = Vec::new();
    for ((key, asked), slot) in partitions.into_iter().zip(slots) {
        let mut p = PartitionData::default();
        p.partition_index = key.partition;
        p.high_watermark = -1;
        p.last_stable_offset = -1;
        p.log_start_offset = -1;
        p.records = Some(Bytes::new());
        let was_read = matches!(slot, Slot::Fetch(_) | Slot::Refused(_));
        match slot {
            Slot::Error(code) | Slot::Refused(code) => p.error_code = code,
            Slot::Fetch(i) => match (whole_error, parts.get_mut(i).and_then(Option::take)) {
                (Some(code), _) => p.error_code = code,
                (None, None) => p.error_code = codes::UNKNOWN_SERVER_ERROR,
                (None, Some(f)) => {
                    p.error_code = f.error.code();
                    p.high_watermark = f.high_watermark;
                    p.last_stable_offset = f.last_stable_offset;
                    p.log_start_offset = f.log_start_offset;
                    p.aborted_transactions = f.aborted_transactions.as_ref().map(|list| {
                        list.iter()
                            .map(|a| {
                                let mut t = AbortedTransaction::default();
                                t.producer_id = ProducerId(a.producer_id);
                                t.first_offset = a.first_offset;
                                t
                            })
                            .collect()
                    });
                    p.records = Some(f.records_bytes());
                }
            },
        }
        // Kafka: a client of version 5 or older may not know KAFKA_STORAGE_ERROR.
        if version <= 5 && p.error_code == KAFKA_STORAGE_ERROR {
            p.error_code = NOT_LEADER_OR_FOLLOWER;
        }
        let outcome = PartitionOutcome {
            error: p.error_code,
            high_watermark: p.high_watermark,
            log_start_offset: p.log_start_offset,
            records_len: p.records.as_ref().map_or(0, Bytes::len),
        };
        if version < 5 {
            p.log_start_offset = -1;
        }
        let answer = (key, asked, outcome, p);
        if was_read {
            read.push(answer);
        } else {
            erroneous.push(answer);
        }
    }
    read.extend(erroneous);
    let answers = read;

    let mut response = FetchResponse::default();
    let kept: Vec<(PartitionKey, PartitionData)> = match context {
        Context::Error(_) | Context::Sessionless => {
            response.session_id = INVALID_SESSION_ID;
            answers.into_iter().map(|(k, _, _, p)| (k, p)).collect()
        }
        Context::Full => {
            let opened: Vec<_> = answers
                .iter()
                .map(|(k, asked, outcome, _)| (k.clone(), *asked, *outcome))
                .collect();
            response.session_id = fetch_session::with_cache(ctx.node, |cache| {
                cache.open(
                    Instant::now().into_std(),
                    privileged,
                    uses_topic_ids,
                    opened,
                )
            });
            answers.into_iter().map(|(k, _, _, p)| (k, p)).collect()
        }
        Context::Incremental {
            session_id, epoch, ..
        } => {
            let outcomes: Vec<_> = answers
                .iter()
                .map(|(k, _, outcome, _)| (k.clone(), *outcome))
                .collect();
            let include = fetch_session::with_cache(ctx.node, |cache| {
                cache.respond_incremental(session_id, epoch, &outcomes)
            });
            match include {
                Err(code) => {
                    debug!(
                        node = ctx.node,
                        session_id, "fetch session epoch moved: duplicate request"
                    );
                    response.error_code = code;
                    response.session_id = session_id;
                    Vec::new()
                }
                Ok(include) => {
                    response.session_id = session_id;
                    answers
                        .into_iter()
                        .zip(include)
                        .filter(|(_, keep)| *keep)
                        .map(|((k, _, _, p), _)| (k, p))
                        .collect()
                }
            }
        }
    };
    // Group consecutive partitions of one topic (Kafka's `FetchResponse.toMessage`).
    for (key, p) in kept {
        let same = response.responses.last().is_some_and(|t| match &key.topic {
            TopicKey::Name(name) => t.topic == *name,
            TopicKey::Id(id) => t.topic_id == *id,
        });
        if !same {
            let mut topic = FetchableTopicResponse::default();
            match &key.topic {
                TopicKey::Name(name) => topic.topic = name.clone(),
                TopicKey::Id(id) => topic.topic_id = *id,
            }
            response.responses.push(topic);
        }
        if let Some(topic) = response.responses.last_mut() {
            topic.partitions.push(p);
        }
    }
    response
}

/// What a request asked per topic: for each partition, the index of the query made for it, or the
/// error code that already answers it.
type Layout = Vec<(TopicName, Vec<(i32, Result<usize, i16>)>)>;

/// Resolves the topics of a ListOffsets / DeleteRecords request to partitions and builds one
/// query per known partition (`query`), in request order.
async fn resolve<P, Q>(
    broker: &Arc<Broker>,
    topics: Vec<(TopicName, Vec<P>)>,
    index_of: impl Fn(&P) -> i32,
    query: impl Fn(TopicIdPartition, P) -> Q,
) -> (Layout, Vec<Q>) {
    let mut layout = Vec::with_capacity(topics.len());
    let mut queries = Vec::new();
    for (name, partitions) in topics {
        let found = broker.topics.by_name(name.as_str()).await;
        let mut slots = Vec::with_capacity(partitions.len());
        for p in partitions {
            let index = index_of(&p);
            let slot = match &found {
                Err(e) => Err(e.error_code().code()),
                Ok(Some(t)) if t.has_partition(index) => {
                    queries.push(query(TopicIdPartition::new(t.id, index), p));
                    Ok(queries.len() - 1)
                }
                Ok(_) => Err(codes::UNKNOWN_TOPIC_OR_PARTITION),
            };
            slots.push((index, slot));
        }
        layout.push((name, slots));
    }
    (layout, queries)
}

/// The coordinator's answer for one slot of a [`Layout`], or the error code answering it.
fn answer<A>(
    slot: Result<usize, i16>,
    answers: &Result<Vec<A>, CoordinatorError>,
) -> Result<&A, i16> {
    match (slot, answers) {
        (Err(code), _) => Err(code),
        (Ok(_), Err(e)) => Err(e.error_code().code()),
        (Ok(i), Ok(list)) => list.get(i).ok_or(codes::UNKNOWN_SERVER_ERROR),
    }
}

/// ListOffsets through the library's `Fetcher::list_offsets`: record-level answers exactly as a Kafka
/// broker gives them (the first record at or after a timestamp, with that record's timestamp; the
/// record holding the max timestamp for MAX_TIMESTAMP), not the coordinator's batch-level ones.
///
/// As Kafka (`ReplicaManager.fetchOffset`), in this order: a partition named more than once is
/// answered once, `INVALID_REQUEST`; a timestamp the request version does not support
/// (MAX_TIMESTAMP before v7, EARLIEST_LOCAL before v8, LATEST_TIERED before v9, any other negative
/// value) `UNSUPPORTED_VERSION`; an unknown topic or partition `UNKNOWN_TOPIC_OR_PARTITION`. An
/// error answer has offset -1, timestamp -1 and leader epoch -1; a found offset carries the leader
/// epoch Metadata announces (0) from version 4. Topics named twice are answered in one entry.
pub(crate) async fn list_offsets(
    broker: &Arc<Broker>,
    ctx: &Ctx,
    request: ListOffsetsRequest,
) -> ListOffsetsResponse {
    let supported =
        |timestamp: i64| list_offsets_min_version(timestamp).is_some_and(|v| ctx.version >= v);
    let mut count: HashMap<(TopicName, i32), usize> = HashMap::new();
    for t in &request.topics {
        for p in &t.partitions {
            *count
                .entry((t.name.clone(), p.partition_index))
                .or_default() += 1;
        }
    }
    // One entry per topic, one per partition (a duplicate keeps its first place).
    let mut merged: Vec<(TopicName, Vec<ListOffsetsPartition>)> = Vec::new();
    let mut placed: std::collections::HashSet<(TopicName, i32)> = std::collections::HashSet::new();
    for t in request.topics {
        let at = match merged.iter().position(|(name, _)| *name == t.name) {
            Some(at) => at,
            None => {
                merged.push((t.name.clone(), Vec::new()));
                merged.len() - 1
            }
        };
        for p in t.partitions {
            if placed.insert((t.name.clone(), p.partition_index)) {
                merged[at].1.push(ListOffsetsPartition {
                    // Filled in below once the topic is known.
                    partition: TopicIdPartition::new(uuid::Uuid::nil(), p.partition_index),
                    timestamp: p.timestamp,
                    // The epoch Fetch writes into served batches (see `fetch`).
                    leader_epoch: 0,
                    isolation: isolation(request.isolation_level),
                });
            }
        }
    }
    // Per partition: the index of its query, or the error code answering it.
    let mut layout: Layout = Vec::new();
    let mut wanted = Vec::new();
    for (name, partitions) in merged {
        let found = broker.topics.by_name(name.as_str()).await;
        let mut slots = Vec::with_capacity(partitions.len());
        for mut q in partitions {
            let index = q.partition.partition;
            let slot = if count.get(&(name.clone(), index)).is_some_and(|&n| n > 1) {
                Err(codes::INVALID_REQUEST)
            } else if !supported(q.timestamp) {
                Err(UNSUPPORTED_VERSION)
            } else {
                match &found {
                    Err(e) => Err(e.error_code().code()),
                    Ok(Some(t)) if t.has_partition(index) => {
                        q.partition = TopicIdPartition::new(t.id, index);
                        wanted.push(q);
                        Ok(wanted.len() - 1)
                    }
                    Ok(_) => Err(codes::UNKNOWN_TOPIC_OR_PARTITION),
                }
            };
            slots.push((index, slot));
        }
        layout.push((name, slots));
    }
    let answers = if wanted.is_empty() {
        Ok(Vec::new())
    } else {
        broker.fetcher.list_offsets(&wanted).await
    };
    if let Err(e) = &answers {
        warn!(error = %e, "list offsets failed");
    }
    let mut response = ListOffsetsResponse::default();
    for (name, slots) in layout {
        let mut topic = ListOffsetsTopicResponse::default();
        topic.name = name;
        for (index, slot) in slots {
            let mut p = ListOffsetsPartitionResponse::default();
            p.partition_index = index;
            p.offset = -1;
            p.timestamp = -1;
            p.leader_epoch = -1;
            let found = match (slot, &answers) {
                (Err(code), _) => Err(code),
                (Ok(_), Err(e)) => Err(e.error_code().code()),
                (Ok(i), Ok(list)) => list.get(i).ok_or(codes::UNKNOWN_SERVER_ERROR),
            };
            match found {
                Err(code) => p.error_code = code,
                Ok(a) => {
                    p.error_code = a.error.code();
                    p.offset = a.offset;
                    p.timestamp = a.timestamp;
                    if ctx.version >= 4 {
                        p.leader_epoch = a.leader_epoch;
                    }
                }
            }
            topic.partitions.push(p);
        }
        response.topics.push(topic);
    }
    response
}

/// DeleteRecords: moves log start offsets in the coordinator.
pub(crate) async fn delete_records(
    broker: &Arc<Broker>,
    _ctx: &Ctx,
    request: DeleteRecordsRequest,
) -> DeleteRecordsResponse {
    let topics = request
        .topics
        .into_iter()
        .map(|t| (t.name, t.partitions))
        .collect();
    let (layout, deletes) = resolve(
        broker,
        topics,
        |p| p.partition_index,
        |partition, p| CoordDeleteRecords {
            partition,
            offset: p.offset,
        },
    )
    .await;
    let answers = if deletes.is_empty() {
        Ok(Vec::new())
    } else {
        broker.coordinator.delete_records(&deletes).await
    };
    let mut response = DeleteRecordsResponse::default();
    for (name, slots) in layout {
        let mut topic = DeleteRecordsTopicResult::default();
        topic.name = name;
        for (index, slot) in slots {
            let mut p = DeleteRecordsPartitionResult::default();
            p.partition_index = index;
            p.low_watermark = -1;
            match answer(slot, &answers) {
                Err(code) => p.error_code = code,
                Ok(a) => {
                    p.error_code = a.error.code();
                    p.low_watermark = a.low_watermark;
                }
            }
            topic.partitions.push(p);
        }
        response.topics.push(topic);
    }
    response
}

/// A request's `isolation_level` (Fetch v4+, ListOffsets v2+; 0 before): 1 is `read_committed`.
/// Kafka fails a request with another value as a whole (`IsolationLevel.forId` throws); a client
/// never sends one, and it is read as `read_uncommitted` here.
fn isolation(level: i8) -> IsolationLevel {
    IsolationLevel::from_kafka(level).unwrap_or_default()
}
