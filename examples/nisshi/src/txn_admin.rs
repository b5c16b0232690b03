//! The two requests Kafka's tooling ends a hanging transaction with, which tansu 0.6.0 does not
//! route: **DescribeProducers** (API 61: the producers of a partition and the first offset of the
//! transaction each holds open, `kafka-transactions.sh find-hanging` / `describe-producers`) and
//! **WriteTxnMarkers** (API 27: `Admin.abortTransaction`, `kafka-transactions.sh abort`, sends it
//! to the partition's leader). On a diskless partition both go to the batch coordinator
//! (`list_producers`, `write_txn_markers` with no transaction number: an operator's marker).
//!
//! Why a host needs them here: an operator ends a transaction that no client will end (a
//! producer gone whose timeout is long) with Kafka's own tooling, on any node; the batch
//! coordinator's transaction record finishes every transaction a client or a timeout decided.
//! Classic partitions are Nisshi's, whose engine keeps no producer state a host can read or mark:
//! they are answered with an error.

use diskless_coordinator::{TopicIdPartition, TopicInfo, TxnMarker};
use rama::{Context, Service};
use tansu_sans_io::{
    ApiKey, DescribeProducersRequest, DescribeProducersResponse, ErrorCode, WriteTxnMarkersRequest,
    WriteTxnMarkersResponse,
    describe_producers_response::{PartitionResponse, ProducerState, TopicResponse},
    write_txn_markers_response::{
        WritableTxnMarkerPartitionResult, WritableTxnMarkerResult, WritableTxnMarkerTopicResult,
    },
};
use tansu_storage::{Error, Storage, TopicId};
use tracing::{info, warn};

use crate::convert;
use crate::storage::DisklessStorage;

/// What a topic named in one of these requests is.
enum Lookup {
    Diskless(TopicInfo),
    /// One of Nisshi's own topics.
    Classic,
    /// None by that name (or a name Kafka refuses: this code).
    Unknown(ErrorCode),
}

/// Looks `name` up: the diskless topics first, then Nisshi's Metadata.
async fn lookup<S: Storage>(storage: &DisklessStorage<S>, name: &str) -> Result<Lookup, Error> {
    if !diskless_coordinator::is_valid_topic_name(name) {
        return Ok(Lookup::Unknown(ErrorCode::InvalidTopicException));
    }
    if let Some(t) = storage.diskless_topic(name).await? {
        return Ok(Lookup::Diskless(t));
    }
    let meta = storage
        .metadata(Some(&[TopicId::Name(name.into())]))
        .await?;
    Ok(match meta.topics().first() {
        Some(t) if t.error_code == i16::from(ErrorCode::None) => Lookup::Classic,
        _ => Lookup::Unknown(ErrorCode::UnknownTopicOrPartition),
    })
}

/// Partition `index` of a looked-up topic: a diskless partition, or the code (and message) it is
/// answered with.
fn target(topic: &Lookup, index: i32) -> Result<TopicIdPartition, (ErrorCode, &'static str)> {
    match topic {
        Lookup::Diskless(t) if (0..t.partitions).contains(&index) => {
            Ok(TopicIdPartition::new(t.topic_id, index))
        }
        Lookup::Diskless(_) | Lookup::Unknown(ErrorCode::UnknownTopicOrPartition) => Err((
            ErrorCode::UnknownTopicOrPartition,
            "This server does not host this topic-partition.",
        )),
        Lookup::Unknown(code) => Err((*code, "invalid topic name")),
        Lookup::Classic => Err((
            ErrorCode::UnknownServerError,
            "a classic partition: Nisshi 0.6.0's engine keeps no producer state a host can read \
             or mark",
        )),
    }
}

/// DescribeProducers. See the [module documentation](self).
#[derive(Clone, Copy, Debug, Default)]
pub struct DescribeProducersService;

impl ApiKey for DescribeProducersService {
    const KEY: i16 = DescribeProducersRequest::KEY;
}

impl<S: Storage> Service<DisklessStorage<S>, DescribeProducersRequest>
    for DescribeProducersService
{
    type Response = DescribeProducersResponse;
    type Error = Error;

    async fn serve(
        &self,
        ctx: Context<DisklessStorage<S>>,
        req: DescribeProducersRequest,
    ) -> Result<DescribeProducersResponse, Error> {
        let storage = ctx.state();
        let mut topics = Vec::new();
        for t in req.topics.unwrap_or_default() {
            let topic = lookup(storage, &t.name).await?;
            let mut partitions = Vec::new();
            for index in t.partition_indexes.unwrap_or_default() {
                let answer = PartitionResponse::default().partition_index(index);
                let answer =
                    match target(&topic, index) {
                        Err((code, message)) => answer
                            .error_code(code.into())
                            .error_message(Some(message.into()))
                            .active_producers(Some(vec![])),
                        Ok(tp) => match storage.shared.coordinator.list_producers(tp).await {
                            Ok(states) => answer
                                .error_code(ErrorCode::None.into())
                                .active_producers(Some(
                                    states
                                        .iter()
                                        .map(|s| {
                                            let d = s.described();
                                            ProducerState::default()
                                                .producer_id(d.producer_id)
                                                .producer_epoch(d.producer_epoch)
                                                .last_sequence(d.last_sequence)
                                                .last_timestamp(d.last_timestamp)
                                                .coordinator_epoch(d.coordinator_epoch)
                                                .current_txn_start_offset(
                                                    d.current_txn_start_offset,
                                                )
                                        })
                                        .collect(),
                                )),
                            Err(e) => {
                                warn!(error = %e, partition = %tp, "list producers failed");
                                answer
                                    .error_code(convert::code(e.error_code()).into())
                                    .error_message(Some(e.to_string()))
                                    .active_producers(Some(vec![]))
                            }
                        },
                    };
                partitions.push(answer);
            }
            topics.push(
                TopicResponse::default()
                    .name(t.name)
                    .partitions(Some(partitions)),
            );
        }
        Ok(DescribeProducersResponse::default()
            .throttle_time_ms(0)
            .topics(Some(topics)))
    }
}

/// WriteTxnMarkers. See the [module documentation](self).
#[derive(Clone, Copy, Debug, Default)]
pub struct WriteTxnMarkersService;

impl ApiKey for WriteTxnMarkersService {
    const KEY: i16 = WriteTxnMarkersRequest::KEY;
}

impl<S: Storage> Service<DisklessStorage<S>, WriteTxnMarkersRequest> for WriteTxnMarkersService {
    type Response = WriteTxnMarkersResponse;
    type Error = Error;

    async fn serve(
        &self,
        ctx: Context<DisklessStorage<S>>,
        req: WriteTxnMarkersRequest,
    ) -> Result<WriteTxnMarkersResponse, Error> {
        let storage = ctx.state();
        // Every diskless marker of the request in one coordinator call; `slots` says, per marker,
        // topic and partition, where its answer comes from.
        let mut to_write: Vec<TxnMarker> = Vec::new();
        let mut layout = Vec::new();
        for m in req.markers.unwrap_or_default() {
            let mut topics = Vec::new();
            for t in m.topics.unwrap_or_default() {
                let topic = lookup(storage, &t.name).await?;
                let mut slots = Vec::new();
                for index in t.partition_indexes.unwrap_or_default() {
                    let slot = match target(&topic, index) {
                        Err((code, _)) => Err(code),
                        Ok(tp) => {
                            info!(
                                partition = %tp,
                                producer_id = m.producer_id,
                                producer_epoch = m.producer_epoch,
                                commit = m.transaction_result,
                                "transaction marker asked by WriteTxnMarkers"
                            );
                            to_write.push(TxnMarker {
                                partition: tp,
                                producer_id: m.producer_id,
                                producer_epoch: m.producer_epoch,
                                // One transaction coordinator here, the batch coordinator's
                                // transaction records, whose markers carry epoch 0: a higher
                                // epoch kept in the partition would refuse their markers for
                                // good (TRANSACTION_COORDINATOR_FENCED).
                                coordinator_epoch: 0,
                                commit: m.transaction_result,
                                // An operator's marker (Admin.abortTransaction): never deduplicated.
                                txn_seq: None,
                            });
                            Ok(to_write.len() - 1)
                        }
                    };
                    slots.push((index, slot));
                }
                topics.push((t.name, slots));
            }
            layout.push((m.producer_id, topics));
        }
        let results = if to_write.is_empty() {
            Ok(Vec::new())
        } else {
            storage
                .shared
                .coordinator
                .write_txn_markers(&to_write)
                .await
        };
        let code_of = |slot: Result<usize, ErrorCode>| -> ErrorCode {
            match (slot, &results) {
                (Err(code), _) => code,
                (Ok(i), Ok(results)) => results
                    .get(i)
                    .map_or(ErrorCode::UnknownServerError, |r| convert::code(r.error)),
                (Ok(_), Err(e)) => convert::code(e.error_code()),
            }
        };
        if let Err(e) = &results {
            warn!(error = %e, "WriteTxnMarkers failed");
        }
        let markers = layout
            .into_iter()
            .map(|(producer_id, topics)| {
                WritableTxnMarkerResult::default()
                    .producer_id(producer_id)
                    .topics(Some(
                        topics
                            .into_iter()
                            .map(|(name, slots)| {
                                WritableTxnMarkerTopicResult::default()
                                    .name(name)
                                    .partitions(Some(
                                        slots
                                            .into_iter()
                                            .map(|(index, slot)| {
                                                WritableTxnMarkerPartitionResult::default()
                                                    .partition_index(index)
                                                    .error_code(code_of(slot).into())
                                            })
                                            .collect(),
                                    ))
                            })
                            .collect(),
                    ))
            })
            .collect();
        Ok(WriteTxnMarkersResponse::default().markers(Some(markers)))
    }
}
