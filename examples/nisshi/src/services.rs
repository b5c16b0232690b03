//! The request handlers this crate gives Nisshi in place of (or beside) its own.
//!
//! - **Produce** ([`ProduceService`]): Nisshi's produce service awaits the partitions of a
//!   request one after another; with diskless storage that costs one commit wait per partition.
//!   This one appends every diskless partition of a request to the writer in one call (one WAL
//!   segment, one commit wait) while the classic partitions go to Nisshi's own produce service at
//!   the same time; it also answers diskless partitions with their `log_append_time_ms`,
//!   `log_start_offset` and record errors, which Nisshi's service always answers as -1 / 0 / none.
//! - **EndTxn** ([`EndTxnService`]): tansu 0.6.0 has no route for EndTxn (its storage has
//!   `txn_end`, nothing calls it), so a transactional producer could never commit; this route
//!   calls `Storage::txn_end`, which [`DisklessStorage`] extends with the diskless markers.

use std::collections::BTreeMap;

use bytes::{Bytes, BytesMut};
use diskless_coordinator::ErrorCode as DisklessCode;
use diskless_core::ProducePartition;
use diskless_core::produce_request::PartitionAnswer;
use rama::{Context, Service};
use tansu_sans_io::{
    ApiKey, EndTxnRequest, EndTxnResponse, ErrorCode, ProduceRequest, ProduceResponse,
    produce_request::{PartitionProduceData, TopicProduceData},
    produce_response::{BatchIndexAndErrorMessage, PartitionProduceResponse, TopicProduceResponse},
};
use tansu_storage::{Error, Storage};

use crate::convert;
use crate::storage::DisklessStorage;

/// Produce with diskless partitions committed together. See the [module documentation](self).
#[derive(Clone, Copy, Debug, Default)]
pub struct ProduceService;

impl ApiKey for ProduceService {
    const KEY: i16 = ProduceRequest::KEY;
}

/// Where one partition of the request is answered from.
enum Slot {
    /// The n-th partition handed to the writer.
    Diskless(usize),
    /// Nisshi's answer (topic name, partition index).
    Classic,
    /// Answered here.
    Error(DisklessCode, String),
}

impl<S: Storage> Service<DisklessStorage<S>, ProduceRequest> for ProduceService {
    type Response = ProduceResponse;
    type Error = Error;

    async fn serve(
        &self,
        ctx: Context<DisklessStorage<S>>,
        req: ProduceRequest,
    ) -> Result<ProduceResponse, Error> {
        let storage = ctx.state().clone();
        let transactional_id = req.transactional_id.clone();
        let mut txn: Option<std::result::Result<Option<diskless_coordinator::TxnRecord>, String>> =
            None;
        let mut layout: Vec<(String, Vec<(i32, Slot)>)> = Vec::new();
        let mut diskless: Vec<ProducePartition> = Vec::new();
        let mut classic: Vec<TopicProduceData> = Vec::new();
        for topic in req.topic_data.unwrap_or_default() {
            let info = storage.diskless_topic(&topic.name).await?;
            let mut slots = Vec::new();
            let mut classic_partitions: Vec<PartitionProduceData> = Vec::new();
            for p in topic.partition_data.unwrap_or_default() {
                let Some(info) = &info else {
                    slots.push((p.index, Slot::Classic));
                    classic_partitions.push(p);
                    continue;
                };
                let records = p.records.map(|frame| {
                    let mut batches = frame.batches.into_iter();
                    match (batches.next(), batches.len()) {
                        // One batch (Produce v3+): its bytes as they are, no second copy.
                        (Some(only), 0) => convert::batch_bytes(only),
                        (first, _) => {
                            let mut bytes = BytesMut::new();
                            for batch in first.into_iter().chain(batches) {
                                bytes.extend_from_slice(&convert::batch_bytes(batch));
                            }
                            bytes.freeze()
                        }
                    }
                });
                // The transaction record, read once per request (for its first diskless partition).
                if txn.is_none() {
                    txn = Some(match transactional_id.as_deref() {
                        Some(tid) => storage.txn_record(tid).await,
                        None => Ok(None),
                    });
                }
                let slot = match storage.diskless_partition(
                    txn.as_ref().unwrap_or(&Ok(None)),
                    info,
                    p.index,
                    records,
                ) {
                    Ok(produce) => {
                        diskless.push(produce);
                        Slot::Diskless(diskless.len() - 1)
                    }
                    Err((code, message)) => Slot::Error(code, message),
                };
                slots.push((p.index, slot));
            }
            if !classic_partitions.is_empty() {
                classic.push(
                    TopicProduceData::default()
                        .name(topic.name.clone())
                        .partition_data(Some(classic_partitions)),
                );
            }
            layout.push((topic.name, slots));
        }

        let writer = storage.shared.writer.clone();
        // Phase one: the diskless partitions enter the writer (in the order of this connection's
        // requests, see `server::produce_ordered`); their commit is awaited below.
        let diskless_appended = async move {
            if diskless.is_empty() {
                None
            } else {
                Some(writer.append(diskless).await)
            }
        };
        let classic_request = ProduceRequest::default()
            .transactional_id(req.transactional_id)
            .acks(req.acks)
            .timeout_ms(req.timeout_ms)
            .topic_data(Some(classic));
        let has_classic = classic_request
            .topic_data
            .as_ref()
            .is_some_and(|t| !t.is_empty());
        let classic_ctx = ctx.clone();
        let classic_answers = async move {
            if has_classic {
                tansu_storage::ProduceService
                    .serve(classic_ctx, classic_request)
                    .await
                    .map(Some)
            } else {
                Ok(None)
            }
        };
        let (pending, classic_response) = futures::join!(diskless_appended, classic_answers);
        // This request's effect is now ordered: the listener may start the connection's next
        // Produce while this one waits for its commit.
        crate::server::produce_ordered();
        let answers = match pending {
            Some(pending) => pending.await,
            None => Vec::new(),
        };
        let classic_response = classic_response?;
        if has_classic {
            // Wakes long-polling fetches of classic partitions too (the writer notifies for the
            // diskless ones).
            storage.shared.fetcher.commit_signal().notify();
        }

        let mut from_classic: BTreeMap<(String, i32), PartitionProduceResponse> = BTreeMap::new();
        for topic in classic_response
            .and_then(|r| r.responses)
            .unwrap_or_default()
        {
            for p in topic.partition_responses.unwrap_or_default() {
                from_classic.insert((topic.name.clone(), p.index), p);
            }
        }

        let responses = layout
            .into_iter()
            .map(|(name, slots)| {
                let partitions = slots
                    .into_iter()
                    .map(|(index, slot)| match slot {
                        Slot::Diskless(i) => nisshi_answer(answers.get(i).map_or_else(
                            || no_answer(index),
                            |a| PartitionAnswer::from_response(index, a),
                        )),
                        Slot::Classic => from_classic
                            .remove(&(name.clone(), index))
                            .unwrap_or_else(|| nisshi_answer(no_answer(index))),
                        Slot::Error(code, message) => {
                            nisshi_answer(PartitionAnswer::error(index, code.code(), message))
                        }
                    })
                    .collect();
                TopicProduceResponse::default()
                    .name(name)
                    .partition_responses(Some(partitions))
            })
            .collect();
        Ok(ProduceResponse::default()
            .responses(Some(responses))
            .throttle_time_ms(Some(0))
            .node_endpoints(None))
    }
}

/// A Produce request whose topics are all diskless, served from its frame without Nisshi's codec
/// (`diskless_core::produce_request`: the records stay slices of the frame; tansu-sans-io would
/// copy every batch and check its CRC before the writer checks it again, ~35% more CPU per GB,
/// BENCHMARKS.md "Nisshi: throughput"). Returns once the request's batches are in the writer
/// (its effect ordered), with the task answering it after the commit; `None` leaves the request
/// to Nisshi's codec and [`ProduceService`]: another version, a malformed frame, `acks` outside
/// -1..=1, or a topic that is not diskless (classic, unknown, or the lookup failed).
pub(crate) async fn produce_direct<S: Storage>(
    storage: &DisklessStorage<S>,
    frame: Bytes,
) -> Option<diskless_core::connection::Answer> {
    use diskless_core::produce_request::{ProduceRequest as Direct, encode_produce_response};
    let request = Direct::parse(frame).ok()?;
    if request.topics.is_empty() || !(-1..=1).contains(&request.acks) {
        return None;
    }
    let mut infos = Vec::with_capacity(request.topics.len());
    for t in &request.topics {
        infos.push(storage.diskless_topic(&t.name).await.ok()??);
    }
    // The transaction record its transactional batches are verified against.
    let txn = match request.transactional_id.as_deref() {
        Some(tid) => storage.txn_record(tid).await,
        None => Ok(None),
    };
    // Per topic, per partition: the writer's n-th answer, or the refusal made here.
    type Slots = Vec<(i32, Result<usize, (DisklessCode, String)>)>;
    let mut layout: Vec<(String, Slots)> = Vec::new();
    let mut diskless: Vec<ProducePartition> = Vec::new();
    for (t, info) in request.topics.iter().zip(&infos) {
        let slots = t
            .partitions
            .iter()
            .map(|p| {
                let slot = storage
                    .diskless_partition(&txn, info, p.index, p.records.clone())
                    .map(|produce| {
                        diskless.push(produce);
                        diskless.len() - 1
                    });
                (p.index, slot)
            })
            .collect();
        layout.push((t.name.clone(), slots));
    }
    let pending = if diskless.is_empty() {
        None
    } else {
        Some(storage.shared.writer.append(diskless).await)
    };
    storage
        .shared
        .direct_produces
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    Some(tokio::spawn(async move {
        let answers = match pending {
            Some(pending) => pending.await,
            None => Vec::new(),
        };
        let topics: Vec<(String, Vec<PartitionAnswer>)> = layout
            .into_iter()
            .map(|(name, slots)| {
                let partitions = slots
                    .into_iter()
                    .map(|(index, slot)| match slot {
                        Ok(i) => answers.get(i).map_or_else(
                            || no_answer(index),
                            |a| PartitionAnswer::from_response(index, a),
                        ),
                        Err((code, message)) => PartitionAnswer::error(index, code.code(), message),
                    })
                    .collect();
                (name, partitions)
            })
            .collect();
        if request.acks == 0 {
            // No answer; a failure closes the connection, as Kafka signals it for acks=0.
            return match topics
                .iter()
                .flat_map(|(_, p)| p)
                .find(|a| a.error_code != 0)
            {
                Some(a) => Err(format!(
                    "acks=0 produce failed: error {} {:?}",
                    a.error_code, a.error_message
                )),
                None => Ok(None),
            };
        }
        Ok(Some(encode_produce_response(&request, &topics)))
    }))
}

/// The answer for a partition the writer (or the checks before it) answered: the library's
/// [`PartitionAnswer`], the one mapping of a diskless partition's outcome to Kafka's fields (the
/// direct path encodes it as it is), in Nisshi's types.
fn nisshi_answer(a: PartitionAnswer) -> PartitionProduceResponse {
    PartitionProduceResponse::default()
        .index(a.index)
        .error_code(a.error_code)
        .base_offset(a.base_offset)
        .log_append_time_ms(Some(a.log_append_time_ms))
        .log_start_offset(Some(a.log_start_offset))
        .record_errors(Some(
            a.record_errors
                .into_iter()
                .map(|(batch_index, message)| {
                    BatchIndexAndErrorMessage::default()
                        .batch_index(batch_index)
                        .batch_index_error_message(message)
                })
                .collect(),
        ))
        .error_message(a.error_message)
        .current_leader(None)
}

/// A partition the writer gave no answer for.
fn no_answer(index: i32) -> PartitionAnswer {
    PartitionAnswer::error(
        index,
        DisklessCode::UnknownServerError.code(),
        "no answer for the partition",
    )
}

/// EndTxn, which tansu 0.6.0 does not route. See the [module documentation](self).
#[derive(Clone, Copy, Debug, Default)]
pub struct EndTxnService;

impl ApiKey for EndTxnService {
    const KEY: i16 = EndTxnRequest::KEY;
}

impl<S: Storage> Service<S, EndTxnRequest> for EndTxnService {
    type Response = EndTxnResponse;
    type Error = Error;

    async fn serve(&self, ctx: Context<S>, req: EndTxnRequest) -> Result<EndTxnResponse, Error> {
        let code = match ctx
            .state()
            .txn_end(
                &req.transactional_id,
                req.producer_id,
                req.producer_epoch,
                req.committed,
            )
            .await
        {
            Ok(code) => code,
            Err(Error::Api(code)) => code,
            Err(e) => {
                // The end is saved before the engine is asked (DisklessStorage::txn_end) and is
                // finished later; the client's retry finishes it now. Kafka answers a failed
                // transaction-log append with this retriable code too.
                tracing::warn!(error = ?e, "EndTxn failed; the client retries");
                ErrorCode::CoordinatorNotAvailable
            }
        };
        Ok(EndTxnResponse::default()
            .throttle_time_ms(0)
            .error_code(code.into()))
    }
}
