//! Fetch, ListOffsets, DeleteRecords.
//!
//! ListOffsets goes through the shared `Fetcher` too (`Fetcher::list_offsets`: record-level answers,
//! reading the one batch a timestamp falls in). Fetch goes through the shared `Fetcher` (KIP-74 byte limits, offsets injected into the stored
//! batches). It long-polls as Kafka does: while fewer than `min_bytes` are available and `max_wait_ms`
//! has not passed, it waits for a commit of any broker of the process (or re-checks every
//! [`POLL_INTERVAL`], for writers in other processes sharing the coordinator) and fetches again.
//! There are no transactions on diskless topics yet, so `read_committed` and `read_uncommitted` read
//! the same records and the last stable offset is the high watermark. Fetch sessions (KIP-227) are
//! not kept: every response is a full one with session id 0.

use std::sync::Arc;
use std::time::Duration;

use diskless_coordinator::{
    CoordinatorError, DeleteRecordsRequest as CoordDeleteRecords, TopicIdPartition,
};
use diskless_core::{FetchPartition, ListOffsetsPartition, list_offsets_min_version};
use kafka_protocol::messages::delete_records_response::{
    DeleteRecordsPartitionResult, DeleteRecordsTopicResult,
};
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use kafka_protocol::messages::{
    DeleteRecordsRequest, DeleteRecordsResponse, FetchRequest, FetchResponse, ListOffsetsRequest,
    ListOffsetsResponse, TopicName,
};
use tokio::time::Instant;
use tracing::warn;

use crate::broker::Broker;
use crate::codes;
use crate::server::Ctx;

/// Longest sleep of a long-polling fetch between two looks at the coordinator.
const POLL_INTERVAL: Duration = Duration::from_millis(250);
/// Upper bound on `max_wait_ms`.
const MAX_WAIT: Duration = Duration::from_secs(30);
/// Kafka's UNSUPPORTED_VERSION error code.
const UNSUPPORTED_VERSION: i16 = 35;

/// Where each requested partition is answered from.
enum Slot {
    /// The n-th partition handed to the fetcher.
    Fetch(usize),
    Error(i16),
}

/// Fetch with long polling.
pub(crate) async fn fetch(broker: &Arc<Broker>, ctx: &Ctx, request: FetchRequest) -> FetchResponse {
    let mut layout = Vec::with_capacity(request.topics.len());
    let mut wanted = Vec::new();
    for topic in &request.topics {
        let found = broker.topics.by_name(topic.topic.as_str()).await;
        let mut slots = Vec::with_capacity(topic.partitions.len());
        for p in &topic.partitions {
            let slot = match &found {
                Err(e) => Slot::Error(e.error_code().code()),
                Ok(Some(t)) if t.has_partition(p.partition) => {
                    wanted.push(FetchPartition {
                        partition: TopicIdPartition::new(t.id, p.partition),
                        fetch_offset: p.fetch_offset,
                        partition_max_bytes: u32::try_from(p.partition_max_bytes).unwrap_or(0),
                        leader_epoch: 0,
                    });
                    Slot::Fetch(wanted.len() - 1)
                }
                Ok(_) => Slot::Error(codes::UNKNOWN_TOPIC_OR_PARTITION),
            };
            slots.push((p.partition, slot));
        }
        layout.push((topic.topic.clone(), slots));
    }
    let max_bytes = u32::try_from(request.max_bytes).unwrap_or(0);
    let min_bytes = usize::try_from(request.min_bytes).unwrap_or(0);
    let max_wait =
        Duration::from_millis(u64::try_from(request.max_wait_ms).unwrap_or(0)).min(MAX_WAIT);
    let deadline = Instant::now() + max_wait;
    let mut commits = broker.commits.subscribe();

    let fetched = loop {
        commits.borrow_and_update();
        let result = if wanted.is_empty() {
            Ok(Vec::new())
        } else {
            broker.fetcher.fetch(&wanted, max_bytes).await
        };
        let done = match &result {
            Err(_) => true,
            Ok(parts) => {
                let bytes: usize = parts.iter().map(|p| p.records_len()).sum();
                bytes >= min_bytes
                    || parts.iter().any(|p| !p.error.is_ok())
                    || layout
                        .iter()
                        .any(|(_, s)| s.iter().any(|(_, s)| matches!(s, Slot::Error(_))))
            }
        };
        let now = Instant::now();
        if done || now >= deadline || wanted.is_empty() {
            break result;
        }
        let wait = (deadline - now).min(POLL_INTERVAL);
        let _ = tokio::time::timeout(wait, commits.changed()).await;
    };

    let mut response = FetchResponse::default();
    let (parts, whole_error) = match fetched {
        Ok(parts) => (parts, None),
        Err(e) => {
            warn!(error = %e, "fetch failed");
            (Vec::new(), Some(e.error_code().code()))
        }
    };
    let mut parts: Vec<Option<diskless_core::FetchedPartition>> =
        parts.into_iter().map(Some).collect();
    for (name, slots) in layout {
        let mut topic = FetchableTopicResponse::default();
        topic.topic = name;
        for (index, slot) in slots {
            let mut p = PartitionData::default();
            p.partition_index = index;
            p.high_watermark = -1;
            p.last_stable_offset = -1;
            p.log_start_offset = -1;
            match slot {
                Slot::Error(code) => p.error_code = code,
                Slot::Fetch(i) => match (whole_error, parts.get_mut(i).and_then(Option::take)) {
                    (Some(code), _) => p.error_code = code,
                    (None, None) => p.error_code = codes::UNKNOWN_SERVER_ERROR,
                    (None, Some(f)) => {
                        p.error_code = f.error.code();
                        p.high_watermark = f.high_watermark;
                        p.last_stable_offset = f.high_watermark;
                        p.log_start_offset = f.log_start_offset;
                        p.records = Some(f.records_bytes());
                    }
                },
            }
            if ctx.version < 5 {
                p.log_start_offset = -1;
            }
            topic.partitions.push(p);
        }
        response.responses.push(topic);
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
/// As Kafka (`ReplicaManager.fetchOffset`), a timestamp the request version does not support
/// (MAX_TIMESTAMP before v7, EARLIEST_LOCAL before v8, LATEST_TIERED before v9, any other negative
/// value) is answered `UNSUPPORTED_VERSION` without looking at the partition.
pub(crate) async fn list_offsets(
    broker: &Arc<Broker>,
    ctx: &Ctx,
    request: ListOffsetsRequest,
) -> ListOffsetsResponse {
    let supported =
        |timestamp: i64| list_offsets_min_version(timestamp).is_some_and(|v| ctx.version >= v);
    let topics = request
        .topics
        .into_iter()
        .map(|t| (t.name, t.partitions))
        .collect();
    // The epoch Fetch writes into served batches (see `fetch`).
    let (layout, queries) = resolve(
        broker,
        topics,
        |p| p.partition_index,
        |partition, p| ListOffsetsPartition {
            partition,
            timestamp: p.timestamp,
            leader_epoch: 0,
        },
    )
    .await;
    // Only the supported queries go to the fetcher; `asked[i]` is query i's index among them.
    let mut asked = Vec::with_capacity(queries.len());
    let mut wanted = Vec::with_capacity(queries.len());
    for q in &queries {
        asked.push(supported(q.timestamp).then(|| {
            wanted.push(q.clone());
            wanted.len() - 1
        }));
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
            match slot.map(|i| asked.get(i).copied()) {
                Err(code) => p.error_code = code,
                Ok(None) => p.error_code = codes::UNKNOWN_SERVER_ERROR,
                Ok(Some(None)) => p.error_code = UNSUPPORTED_VERSION,
                Ok(Some(Some(i))) => match &answers {
                    Err(e) => p.error_code = e.error_code().code(),
                    Ok(list) => match list.get(i) {
                        None => p.error_code = codes::UNKNOWN_SERVER_ERROR,
                        Some(a) => {
                            p.error_code = a.error.code();
                            p.offset = a.offset;
                            p.timestamp = a.timestamp;
                            if ctx.version >= 4 {
                                p.leader_epoch = a.leader_epoch;
                            }
                        }
                    },
                },
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
