//! OffsetCommit, OffsetFetch and OffsetDelete: committed consumer-group offsets, stored durably in
//! the broker store (`broker.db` in the data directory), so they survive a restart. Offsets of a
//! transaction (TxnOffsetCommit, [`crate::txn`]) are pending until it ends; an OffsetFetch with
//! `require_stable` (v7, KIP-447) answers `UNSTABLE_OFFSET_COMMIT` for partitions that have some.

use std::collections::HashMap;
use std::sync::Arc;

use kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use kafka_protocol::messages::offset_delete_response::{
    OffsetDeleteResponsePartition, OffsetDeleteResponseTopic,
};
use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponsePartition, OffsetFetchResponseTopic,
};
use kafka_protocol::messages::{
    OffsetCommitRequest, OffsetCommitResponse, OffsetDeleteRequest, OffsetDeleteResponse,
    OffsetFetchRequest, OffsetFetchResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use tracing::warn;

use crate::broker::Broker;
use crate::codes;
use crate::ctx::Ctx;
use crate::store::CommittedOffset;

/// Kafka's `offset.metadata.max.bytes`.
const MAX_METADATA: usize = 4096;
const OFFSET_METADATA_TOO_LARGE: i16 = 12;
/// Kafka's `UNSTABLE_OFFSET_COMMIT` (OffsetFetch `require_stable`).
const UNSTABLE_OFFSET_COMMIT: i16 = 88;
/// OffsetDelete of a topic the group consumes.
const GROUP_SUBSCRIBED_TO_TOPIC: i16 = 86;

/// One partition of an OffsetCommit or TxnOffsetCommit whose group passed its checks: the offset
/// to store, or the partition's error code (the topic lookup failed, an unknown topic or
/// partition, metadata over `offset.metadata.max.bytes`).
fn offset_to_store(
    found: &Result<Option<Arc<crate::topics::Topic>>, diskless_coordinator::CoordinatorError>,
    partition: i32,
    offset: i64,
    leader_epoch: i32,
    metadata: Option<StrBytes>,
) -> Result<CommittedOffset, i16> {
    match found {
        Err(e) => Err(e.error_code().code()),
        Ok(Some(t)) if t.has_partition(partition) => {
            let metadata = metadata.map(|m| m.as_str().to_string());
            if metadata.as_ref().is_some_and(|m| m.len() > MAX_METADATA) {
                return Err(OFFSET_METADATA_TOO_LARGE);
            }
            Ok(CommittedOffset {
                topic: t.name.clone(),
                partition,
                offset,
                leader_epoch,
                metadata,
            })
        }
        Ok(_) => Err(codes::UNKNOWN_TOPIC_OR_PARTITION),
    }
}

/// One partition of an OffsetCommit or TxnOffsetCommit request, its leader epoch already read as
/// the request's version allows.
pub(crate) struct OffsetToCommit {
    pub partition: i32,
    pub offset: i64,
    pub leader_epoch: i32,
    pub metadata: Option<StrBytes>,
}

/// The per-topic, per-partition answer codes of a commit request.
pub(crate) type CommitLayout = Vec<(TopicName, Vec<(i32, i16)>)>;

/// Checks every partition of an OffsetCommit or TxnOffsetCommit: each gets `group_error` when the
/// group or transaction checks failed, else its own check ([`offset_to_store`]). Returns the codes
/// and the offsets to store.
pub(crate) async fn check_offsets(
    broker: &Broker,
    group_error: i16,
    topics: Vec<(TopicName, Vec<OffsetToCommit>)>,
) -> (CommitLayout, Vec<CommittedOffset>) {
    let mut layout = Vec::with_capacity(topics.len());
    let mut to_store = Vec::new();
    for (name, partitions) in topics {
        let found = if group_error == codes::NONE {
            broker.topics.by_name(name.as_str()).await
        } else {
            Ok(None)
        };
        let mut parts = Vec::with_capacity(partitions.len());
        for p in partitions {
            let code = if group_error != codes::NONE {
                group_error
            } else {
                match offset_to_store(&found, p.partition, p.offset, p.leader_epoch, p.metadata) {
                    Ok(offset) => {
                        to_store.push(offset);
                        codes::NONE
                    }
                    Err(code) => code,
                }
            };
            parts.push((p.partition, code));
        }
        layout.push((name, parts));
    }
    (layout, to_store)
}

/// A partition's answer once the store write is known: an accepted offset that could not be
/// stored is `COORDINATOR_NOT_AVAILABLE`.
pub(crate) fn stored_code(code: i16, stored: bool) -> i16 {
    if code == codes::NONE && !stored {
        codes::COORDINATOR_NOT_AVAILABLE
    } else {
        code
    }
}

/// OffsetCommit.
pub(crate) async fn offset_commit(
    broker: &Arc<Broker>,
    ctx: &Ctx,
    request: OffsetCommitRequest,
) -> OffsetCommitResponse {
    let group = request.group_id.as_str().to_string();
    let instance = if ctx.version >= 7 {
        request
            .group_instance_id
            .as_ref()
            .map(|s| s.as_str().to_string())
    } else {
        None
    };
    let group_error = match broker.groups.load(&broker.store).await {
        Err(code) => code,
        Ok(()) => broker.groups.validate_commit(
            &group,
            request.generation_id_or_member_epoch,
            request.member_id.as_str(),
            instance.as_deref(),
        ),
    };
    let topics = request
        .topics
        .into_iter()
        .map(|t| {
            let partitions = t
                .partitions
                .into_iter()
                .map(|p| OffsetToCommit {
                    partition: p.partition_index,
                    offset: p.committed_offset,
                    leader_epoch: if ctx.version >= 6 {
                        p.committed_leader_epoch
                    } else {
                        -1
                    },
                    metadata: p.committed_metadata,
                })
                .collect();
            (t.name, partitions)
        })
        .collect();
    let (layout, to_store) = check_offsets(broker, group_error, topics).await;
    let stored = if to_store.is_empty() {
        Ok(())
    } else {
        broker
            .store
            .commit(&group, &to_store, broker.clock.now_ms())
            .await
    };
    if let Err(e) = &stored {
        warn!(group = %group, error = %e, "cannot store committed offsets");
    }
    let mut response = OffsetCommitResponse::default();
    for (name, parts) in layout {
        let mut topic = OffsetCommitResponseTopic::default();
        topic.name = name;
        topic.partitions = parts
            .into_iter()
            .map(|(index, code)| {
                let mut p = OffsetCommitResponsePartition::default();
                p.partition_index = index;
                p.error_code = stored_code(code, stored.is_ok());
                p
            })
            .collect();
        response.topics.push(topic);
    }
    response
}

/// OffsetFetch (one group per request: versions 1-7).
pub(crate) async fn offset_fetch(
    broker: &Arc<Broker>,
    ctx: &Ctx,
    request: OffsetFetchRequest,
) -> OffsetFetchResponse {
    let mut response = OffsetFetchResponse::default();
    let committed = match broker.store.fetch(request.group_id.as_str()).await {
        Ok(c) => c,
        Err(e) => {
            warn!(group = %request.group_id.as_str(), error = %e, "cannot read committed offsets");
            if ctx.version >= 2 {
                response.error_code = codes::COORDINATOR_NOT_AVAILABLE;
            }
            return response;
        }
    };
    let unstable = if ctx.version >= 7 && request.require_stable {
        match broker
            .store
            .pending_partitions(request.group_id.as_str())
            .await
        {
            Ok(u) => u,
            Err(e) => {
                warn!(group = %request.group_id.as_str(), error = %e, "cannot read pending offsets");
                response.error_code = codes::COORDINATOR_NOT_AVAILABLE;
                return response;
            }
        }
    } else {
        Default::default()
    };
    let partition = |topic: &str, index: i32, found: Option<&CommittedOffset>| {
        let mut p = OffsetFetchResponsePartition::default();
        p.partition_index = index;
        if unstable.contains(&(topic.to_string(), index)) {
            // Kafka's answer: no offset, the error, the client retries.
            p.committed_offset = -1;
            p.committed_leader_epoch = -1;
            p.metadata = Some(StrBytes::default());
            p.error_code = UNSTABLE_OFFSET_COMMIT;
            return p;
        }
        p.committed_offset = found.map_or(-1, |c| c.offset);
        if ctx.version >= 5 {
            p.committed_leader_epoch = found.map_or(-1, |c| c.leader_epoch);
        }
        p.metadata = Some(StrBytes::from_string(
            found.and_then(|c| c.metadata.clone()).unwrap_or_default(),
        ));
        p
    };
    match request.topics {
        Some(topics) => {
            let by_key: HashMap<(&str, i32), &CommittedOffset> = committed
                .iter()
                .map(|c| ((c.topic.as_str(), c.partition), c))
                .collect();
            for topic in topics {
                let mut t = OffsetFetchResponseTopic::default();
                t.partitions = topic
                    .partition_indexes
                    .iter()
                    .map(|&i| {
                        partition(
                            topic.name.as_str(),
                            i,
                            by_key.get(&(topic.name.as_str(), i)).copied(),
                        )
                    })
                    .collect();
                t.name = topic.name;
                response.topics.push(t);
            }
        }
        None => {
            // Every committed offset of the group.
            let mut by_topic: Vec<(String, Vec<&CommittedOffset>)> = Vec::new();
            for c in &committed {
                match by_topic.last_mut() {
                    Some((name, list)) if *name == c.topic => list.push(c),
                    _ => by_topic.push((c.topic.clone(), vec![c])),
                }
            }
            for (name, list) in by_topic {
                let mut t = OffsetFetchResponseTopic::default();
                t.name = TopicName(StrBytes::from_string(name));
                t.partitions = list
                    .into_iter()
                    .map(|c| partition(&c.topic, c.partition, Some(c)))
                    .collect();
                response.topics.push(t);
            }
        }
    }
    response
}

/// A partition of an OffsetDelete and its error (`None`: its offset is to be deleted).
type PartitionVerdict = (i32, Option<i16>);

/// OffsetDelete (Kafka's `handleDeleteOffsets`): deletes a group's committed offsets of partitions
/// the group does not consume — all of them when the group is empty; a consumer group with members
/// keeps the offsets of its subscribed topics (`GROUP_SUBSCRIBED_TO_TOPIC`); another group with
/// members refuses (`NON_EMPTY_GROUP`). Unknown topics and partitions answer
/// `UNKNOWN_TOPIC_OR_PARTITION`.
pub(crate) async fn offset_delete(
    broker: &Arc<Broker>,
    _ctx: &Ctx,
    request: OffsetDeleteRequest,
) -> OffsetDeleteResponse {
    let mut response = OffsetDeleteResponse::default();
    if let Err(code) = broker.groups.load(&broker.store).await {
        response.error_code = code;
        return response;
    }
    let group = request.group_id.as_str();
    // Per topic: (partition, its error, or `None`: to delete).
    let mut layout: Vec<(TopicName, Vec<PartitionVerdict>)> = Vec::new();
    let mut known_topics = Vec::new();
    for topic in request.topics {
        let found = broker.topics.by_name(topic.name.as_str()).await;
        let parts = topic
            .partitions
            .iter()
            .map(|p| {
                let code = match &found {
                    Err(e) => Some(e.error_code().code()),
                    Ok(Some(t)) if t.has_partition(p.partition_index) => None,
                    Ok(_) => Some(codes::UNKNOWN_TOPIC_OR_PARTITION),
                };
                (p.partition_index, code)
            })
            .collect::<Vec<_>>();
        if parts.iter().any(|(_, c)| c.is_none()) {
            known_topics.push(topic.name.as_str().to_string());
        }
        layout.push((topic.name, parts));
    }
    let subscribed = match broker.groups.offsets_deletable(group, &known_topics) {
        Ok(s) => s,
        Err(code) => {
            response.error_code = code;
            return response;
        }
    };
    let mut to_delete = Vec::new();
    for (name, parts) in &mut layout {
        for (partition, code) in parts.iter_mut() {
            if code.is_none() {
                if subscribed.contains(name.as_str()) {
                    *code = Some(GROUP_SUBSCRIBED_TO_TOPIC);
                } else {
                    to_delete.push((name.as_str().to_string(), *partition));
                }
            }
        }
    }
    let deleted = if to_delete.is_empty() {
        codes::NONE
    } else {
        match broker.store.delete_offsets(group, &to_delete).await {
            Ok(()) => codes::NONE,
            Err(e) => {
                warn!(group = %group, error = %e, "cannot delete committed offsets");
                codes::COORDINATOR_NOT_AVAILABLE
            }
        }
    };
    if deleted != codes::NONE {
        response.error_code = deleted;
        return response;
    }
    for (name, parts) in layout {
        let mut t = OffsetDeleteResponseTopic::default();
        t.name = name;
        t.partitions = parts
            .into_iter()
            .map(|(index, code)| {
                let mut p = OffsetDeleteResponsePartition::default();
                p.partition_index = index;
                p.error_code = code.unwrap_or(codes::NONE);
                p
            })
            .collect();
        response.topics.push(t);
    }
    response
}
