//! Fetch and ListOffsets in place of Nisshi's, for requests that mix classic and diskless
//! partitions.
//!
//! - **Fetch** ([`FetchService`]): the diskless partitions of a request are read in one
//!   [`Fetcher::fetch`](diskless_core::Fetcher::fetch) (KIP-74 byte limits, offsets injected,
//!   `read_committed` stopping at the LSO with the **aborted transactions** listed as Kafka lists
//!   them), the classic ones through Nisshi's engine as Nisshi reads them, and the whole request
//!   **long-polls** as Kafka's `DelayedFetch` does, through the library's
//!   [`Fetcher::long_poll`](diskless_core::Fetcher::long_poll): it answers once `min_bytes` are
//!   there, a partition has an error, or `max_wait_ms` passed, and is woken by any commit of this
//!   node (diskless writer, transaction markers, and the classic appends of
//!   [`crate::services::ProduceService`], which notify the same signal). Nisshi 0.6.0's own
//!   Fetch sleeps half of the remaining wait after every read, even when it has data, and sends no
//!   aborted transactions.
//! - **ListOffsets** ([`ListOffsetsService`]): every special timestamp on diskless partitions
//!   (`-1` latest, `-2` earliest, `-3` max timestamp, `-4` earliest local, `-5` latest tiered),
//!   record-level answers through [`Fetcher::list_offsets`](diskless_core::Fetcher::list_offsets).
//!   Nisshi 0.6.0 refuses the whole request on `-3`/`-4`/`-5`; on classic partitions this one
//!   answers `-4` as the earliest offset and `-5` as "none" (`-1`), as Kafka does without tiered
//!   storage, and `-3` with `UNSUPPORTED_VERSION` (Nisshi's engine cannot find it).

use std::time::Duration;

use diskless_coordinator::{IsolationLevel as DisklessIsolation, TopicIdPartition, TopicInfo};
use diskless_core::{FetchPartition as DisklessFetch, FetchedPartition, ListOffsetsPartition};
use rama::{Context, Service};
use tansu_sans_io::{
    ApiKey, ErrorCode, FetchRequest, FetchResponse, IsolationLevel, ListOffset, ListOffsetsRequest,
    ListOffsetsResponse,
    fetch_request::FetchTopic,
    fetch_response::{AbortedTransaction, FetchableTopicResponse, PartitionData},
    list_offsets_response::{ListOffsetsPartitionResponse, ListOffsetsTopicResponse},
    record::deflated::{Batch, Frame},
};
use tansu_storage::{Error, Storage, TopicId, Topition};
use tracing::{debug, warn};
use uuid::Uuid;

use crate::convert;
use crate::storage::DisklessStorage;

/// Nisshi's cap on a Fetch response (its `DEFAULT_MAX_BYTES`), kept for classic partitions.
const MAX_RESPONSE_BYTES: u32 = 5 * 1024 * 1024;

/// Fetch over classic and diskless partitions. See the [module documentation](self).
#[derive(Clone, Copy, Debug, Default)]
pub struct FetchService;

impl ApiKey for FetchService {
    const KEY: i16 = FetchRequest::KEY;
}

/// One topic of the request, resolved.
struct Topic {
    /// The name or id as the request gave them (echoed in the answer).
    name: Option<String>,
    id: Option<[u8; 16]>,
    kind: Kind,
    partitions: Vec<(i32, i64, u32)>,
}

enum Kind {
    Diskless(TopicInfo),
    Classic(String),
    Unknown,
}

/// One read of every partition of the request, in request order.
type Read = Vec<Vec<PartitionData>>;

impl<S: Storage> Service<DisklessStorage<S>, FetchRequest> for FetchService {
    type Response = FetchResponse;
    type Error = Error;

    async fn serve(
        &self,
        ctx: Context<DisklessStorage<S>>,
        req: FetchRequest,
    ) -> Result<FetchResponse, Error> {
        let storage = ctx.state().clone();
        let isolation = match req.isolation_level {
            Some(level) => IsolationLevel::try_from(level)?,
            None => IsolationLevel::ReadUncommitted,
        };
        let max_wait = Duration::from_millis(u64::try_from(req.max_wait_ms.max(0)).unwrap_or(0));
        let min_bytes = u64::try_from(req.min_bytes.max(0)).unwrap_or(0);
        let max_bytes = req
            .max_bytes
            .map_or(MAX_RESPONSE_BYTES, |b| u32::try_from(b.max(0)).unwrap_or(0));

        let mut topics = Vec::new();
        for t in req.topics.as_deref().unwrap_or_default() {
            topics.push(resolve(&storage, t).await?);
        }
        let fetcher = storage.shared.fetcher.clone();
        let read = fetcher
            .long_poll(max_wait, || {
                read_all(&storage, &topics, isolation, max_bytes, min_bytes)
            })
            .await?;
        let responses = topics
            .iter()
            .zip(read)
            .map(|(t, partitions)| {
                FetchableTopicResponse::default()
                    .topic(t.name.clone())
                    .topic_id(t.id)
                    .partitions(Some(partitions))
            })
            .collect();
        Ok(FetchResponse::default()
            .throttle_time_ms(Some(0))
            .error_code(Some(ErrorCode::None.into()))
            .session_id(Some(0))
            .node_endpoints(Some(Vec::new()))
            .responses(Some(responses)))
    }
}

async fn resolve<S: Storage>(storage: &DisklessStorage<S>, t: &FetchTopic) -> Result<Topic, Error> {
    let partitions = t
        .partitions
        .as_deref()
        .unwrap_or_default()
        .iter()
        .map(|p| {
            (
                p.partition,
                p.fetch_offset,
                u32::try_from(p.partition_max_bytes.max(0)).unwrap_or(0),
            )
        })
        .collect();
    let diskless = match (&t.topic, t.topic_id) {
        (Some(name), _) => storage.diskless_topic(name).await?,
        (None, Some(id)) => storage.diskless_topic_by_id(Uuid::from_bytes(id)).await?,
        (None, None) => None,
    };
    let kind = match diskless {
        Some(info) => Kind::Diskless(info),
        None => {
            let id = match (&t.topic, t.topic_id) {
                (Some(name), _) => Some(TopicId::Name(name.clone())),
                (None, Some(id)) => Some(TopicId::Id(Uuid::from_bytes(id))),
                (None, None) => None,
            };
            match id {
                None => Kind::Unknown,
                Some(id) => {
                    let meta = storage.inner().metadata(Some(&[id])).await?;
                    match meta.topics().first() {
                        Some(m) if m.error_code == i16::from(ErrorCode::None) => {
                            m.name.clone().map_or(Kind::Unknown, Kind::Classic)
                        }
                        _ => Kind::Unknown,
                    }
                }
            }
        }
    };
    Ok(Topic {
        name: t.topic.clone(),
        id: t.topic_id,
        kind,
        partitions,
    })
}

/// Reads every partition once: the diskless ones in one fetcher call, then the classic ones with
/// what is left of `max_bytes`. Done when `min_bytes` are there or a partition has an error.
async fn read_all<S: Storage>(
    storage: &DisklessStorage<S>,
    topics: &[Topic],
    isolation: IsolationLevel,
    max_bytes: u32,
    min_bytes: u64,
) -> (Result<Read, Error>, bool) {
    let diskless_isolation = match isolation {
        IsolationLevel::ReadCommitted => DisklessIsolation::ReadCommitted,
        IsolationLevel::ReadUncommitted => DisklessIsolation::ReadUncommitted,
    };
    let mut wanted = Vec::new();
    for t in topics {
        if let Kind::Diskless(info) = &t.kind {
            for &(partition, offset, partition_max) in &t.partitions {
                if (0..info.partitions).contains(&partition) {
                    wanted.push(DisklessFetch {
                        partition: TopicIdPartition::new(info.topic_id, partition),
                        fetch_offset: offset,
                        partition_max_bytes: partition_max,
                        leader_epoch: 0,
                        isolation: diskless_isolation,
                    });
                }
            }
        }
    }
    let mut fetched: std::vec::IntoIter<FetchedPartition> = Vec::new().into_iter();
    let mut whole_error = None;
    if !wanted.is_empty() {
        match storage.shared.fetcher.fetch(&wanted, max_bytes).await {
            Ok(parts) => fetched = parts.into_iter(),
            Err(e) => {
                warn!(error = %e, "diskless fetch failed");
                whole_error = Some(convert::code(e.error_code()));
            }
        }
    }
    let mut budget = max_bytes;
    let mut bytes = 0u64;
    let mut error = false;
    let mut out = Vec::with_capacity(topics.len());
    for t in topics {
        let mut partitions = Vec::with_capacity(t.partitions.len());
        for &(partition, offset, partition_max) in &t.partitions {
            let p = match &t.kind {
                Kind::Unknown => error_partition(partition, ErrorCode::UnknownTopicOrPartition),
                Kind::Diskless(info) if !(0..info.partitions).contains(&partition) => {
                    error_partition(partition, ErrorCode::UnknownTopicOrPartition)
                }
                Kind::Diskless(_) => match (whole_error, fetched.next()) {
                    (Some(code), _) => error_partition(partition, code),
                    (None, Some(part)) => {
                        let len = part.records_len();
                        budget = budget.saturating_sub(u32::try_from(len).unwrap_or(u32::MAX));
                        bytes += len as u64;
                        match diskless_partition(partition, part) {
                            Ok(p) => p,
                            Err(e) => return (Err(e), true),
                        }
                    }
                    (None, None) => error_partition(partition, ErrorCode::UnknownServerError),
                },
                Kind::Classic(name) => {
                    let tp = Topition::new(name.clone(), partition);
                    let limit = budget.min(partition_max);
                    match classic_partition(storage, &tp, offset, limit, isolation).await {
                        Ok((p, len)) => {
                            budget = budget.saturating_sub(len);
                            bytes += u64::from(len);
                            p
                        }
                        Err(Error::Api(code)) => error_partition(partition, code),
                        Err(e) => {
                            warn!(error = ?e, ?tp, "classic fetch failed");
                            error_partition(partition, ErrorCode::UnknownServerError)
                        }
                    }
                }
            };
            error |= p.error_code != i16::from(ErrorCode::None);
            partitions.push(p);
        }
        out.push(partitions);
    }
    let done = error || bytes >= min_bytes;
    debug!(bytes, min_bytes, done, "fetch read");
    (Ok(out), done)
}

fn error_partition(partition: i32, code: ErrorCode) -> PartitionData {
    PartitionData::default()
        .partition_index(partition)
        .error_code(code.into())
        .high_watermark(-1)
        .last_stable_offset(Some(-1))
        .log_start_offset(Some(-1))
        .diverging_epoch(None)
        .current_leader(None)
        .snapshot_id(None)
        .aborted_transactions(None)
        .preferred_read_replica(Some(-1))
        .records(None)
}

fn diskless_partition(partition: i32, part: FetchedPartition) -> Result<PartitionData, Error> {
    let batches = convert::batches(&part.records_bytes())?;
    let aborted = part.aborted_transactions.map(|list| {
        list.iter()
            .map(|a| {
                AbortedTransaction::default()
                    .producer_id(a.producer_id)
                    .first_offset(a.first_offset)
            })
            .collect()
    });
    Ok(PartitionData::default()
        .partition_index(partition)
        .error_code(convert::code(part.error).into())
        .high_watermark(part.high_watermark)
        .last_stable_offset(Some(part.last_stable_offset))
        .log_start_offset(Some(part.log_start_offset))
        .diverging_epoch(None)
        .current_leader(None)
        .snapshot_id(None)
        .aborted_transactions(aborted)
        .preferred_read_replica(Some(-1))
        .records(frame(batches)))
}

fn frame(batches: Vec<Batch>) -> Option<Frame> {
    (!batches.is_empty()).then_some(Frame { batches })
}

/// A classic partition as Nisshi's own Fetch reads it (batches from `offset` until its engine
/// has no more or `limit` bytes are used), and the bytes read.
async fn classic_partition<S: Storage>(
    storage: &DisklessStorage<S>,
    tp: &Topition,
    offset: i64,
    limit: u32,
    isolation: IsolationLevel,
) -> Result<(PartitionData, u32), Error> {
    let engine = storage.inner();
    let mut batches = Vec::new();
    let mut next = offset;
    let mut left = limit;
    while left > 0 {
        let fetched = engine.fetch(tp, next, 1, left, isolation).await?;
        let before = next;
        for b in fetched.into_iter().filter(|b| b.record_count > 0) {
            left = left.saturating_sub(u32::try_from(b.record_data.len()).unwrap_or(u32::MAX));
            next = next.max(b.base_offset + i64::from(b.last_offset_delta) + 1);
            batches.push(b);
        }
        if next == before {
            break;
        }
    }
    let stage = engine.offset_stage(tp).await?;
    let len = limit - left;
    Ok((
        PartitionData::default()
            .partition_index(tp.partition())
            .error_code(ErrorCode::None.into())
            .high_watermark(stage.high_watermark())
            .last_stable_offset(Some(stage.last_stable()))
            .log_start_offset(Some(stage.log_start()))
            .diverging_epoch(None)
            .current_leader(None)
            .snapshot_id(None)
            .aborted_transactions(Some(Vec::new()))
            .preferred_read_replica(Some(-1))
            .records(frame(batches)),
        len,
    ))
}

/// ListOffsets with every special timestamp. See the [module documentation](self).
#[derive(Clone, Copy, Debug, Default)]
pub struct ListOffsetsService;

impl ApiKey for ListOffsetsService {
    const KEY: i16 = ListOffsetsRequest::KEY;
}

/// Where one partition of the request is answered from.
enum Answer {
    Diskless(usize),
    Classic(usize),
    Ready(ListOffsetsPartitionResponse),
}

impl<S: Storage> Service<DisklessStorage<S>, ListOffsetsRequest> for ListOffsetsService {
    type Response = ListOffsetsResponse;
    type Error = Error;

    async fn serve(
        &self,
        ctx: Context<DisklessStorage<S>>,
        req: ListOffsetsRequest,
    ) -> Result<ListOffsetsResponse, Error> {
        let storage = ctx.state().clone();
        let isolation = match req.isolation_level {
            Some(level) => IsolationLevel::try_from(level)?,
            None => IsolationLevel::ReadUncommitted,
        };
        let diskless_isolation = match isolation {
            IsolationLevel::ReadCommitted => DisklessIsolation::ReadCommitted,
            IsolationLevel::ReadUncommitted => DisklessIsolation::ReadUncommitted,
        };
        let mut diskless = Vec::new();
        let mut classic = Vec::new();
        let mut layout = Vec::new();
        for topic in req.topics.unwrap_or_default() {
            let info = storage.diskless_topic(&topic.name).await?;
            let mut answers = Vec::new();
            for p in topic.partitions.unwrap_or_default() {
                let index = p.partition_index;
                let answer = match &info {
                    Some(info) if !(0..info.partitions).contains(&index) => Answer::Ready(
                        offset_answer(index, ErrorCode::UnknownTopicOrPartition, -1, -1),
                    ),
                    Some(info) => {
                        diskless.push(ListOffsetsPartition {
                            partition: TopicIdPartition::new(info.topic_id, index),
                            timestamp: p.timestamp,
                            leader_epoch: p.current_leader_epoch.unwrap_or(-1),
                            isolation: diskless_isolation,
                        });
                        Answer::Diskless(diskless.len() - 1)
                    }
                    None => match p.timestamp {
                        // Kafka without tiered storage: the earliest local offset is the log
                        // start; there is no tiered offset.
                        EARLIEST_LOCAL => {
                            classic.push((
                                Topition::new(topic.name.clone(), index),
                                ListOffset::Earliest,
                            ));
                            Answer::Classic(classic.len() - 1)
                        }
                        LATEST_TIERED => {
                            Answer::Ready(offset_answer(index, ErrorCode::None, -1, -1))
                        }
                        MAX_TIMESTAMP => Answer::Ready(offset_answer(
                            index,
                            ErrorCode::UnsupportedVersion,
                            -1,
                            -1,
                        )),
                        t => match ListOffset::try_from(t) {
                            Ok(asked) => {
                                classic.push((Topition::new(topic.name.clone(), index), asked));
                                Answer::Classic(classic.len() - 1)
                            }
                            Err(_) => Answer::Ready(offset_answer(
                                index,
                                ErrorCode::InvalidRequest,
                                -1,
                                -1,
                            )),
                        },
                    },
                };
                answers.push((index, answer));
            }
            layout.push((topic.name, answers));
        }
        let listed = if diskless.is_empty() {
            Vec::new()
        } else {
            storage.list_offsets_diskless(&diskless).await?
        };
        let classic_answers = if classic.is_empty() {
            Vec::new()
        } else {
            storage.inner().list_offsets(isolation, &classic).await?
        };
        let topics = layout
            .into_iter()
            .map(|(name, answers)| {
                let partitions = answers
                    .into_iter()
                    .map(|(index, answer)| match answer {
                        Answer::Ready(r) => r,
                        Answer::Diskless(i) => listed.get(i).map_or_else(
                            || offset_answer(index, ErrorCode::UnknownServerError, -1, -1),
                            |l| {
                                offset_answer(index, convert::code(l.error), l.offset, l.timestamp)
                                    .leader_epoch(Some(l.leader_epoch))
                            },
                        ),
                        Answer::Classic(i) => classic_answers.get(i).map_or_else(
                            || offset_answer(index, ErrorCode::UnknownServerError, -1, -1),
                            |(_, r)| {
                                offset_answer(
                                    index,
                                    r.error_code(),
                                    r.offset().unwrap_or(-1),
                                    r.timestamp().ok().flatten().unwrap_or(-1),
                                )
                            },
                        ),
                    })
                    .collect();
                ListOffsetsTopicResponse::default()
                    .name(name)
                    .partitions(Some(partitions))
            })
            .collect();
        Ok(ListOffsetsResponse::default()
            .throttle_time_ms(Some(0))
            .topics(Some(topics)))
    }
}

/// Kafka's special ListOffsets timestamps beyond Nisshi's `ListOffset` (KIP-734, KIP-1005).
const MAX_TIMESTAMP: i64 = -3;
const EARLIEST_LOCAL: i64 = -4;
const LATEST_TIERED: i64 = -5;

fn offset_answer(
    index: i32,
    code: ErrorCode,
    offset: i64,
    timestamp: i64,
) -> ListOffsetsPartitionResponse {
    ListOffsetsPartitionResponse::default()
        .partition_index(index)
        .error_code(code.into())
        // Version 0's list of offsets, and the single offset of versions 1 and later.
        .old_style_offsets(Some(if offset >= 0 {
            vec![offset]
        } else {
            Vec::new()
        }))
        .timestamp(Some(timestamp))
        .offset(Some(offset))
        .leader_epoch(Some(if offset >= 0 { 0 } else { -1 }))
}
