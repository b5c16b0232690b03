//! Produce and InitProducerId.
//!
//! Every partition of a Produce request goes into one `WalWriter::append` call of the broker the
//! request came to (any broker accepts any diskless partition). `acks=0` gets no response; `acks=1`
//! and `acks=-1` are both answered once the WAL segment is committed — a diskless topic has no
//! follower to wait for. Idempotent producers get their producer id from a durable allocator; the
//! coordinator checks their sequences. A transactional InitProducerId goes to the transaction
//! coordinator ([`crate::txn`]). A transactional batch is verified against it before it enters the
//! writer (KIP-890 part 1's server-side verification, as Kafka's `AddPartitionsToTxnManager`): the
//! request must carry a `transactional_id` (else `TRANSACTIONAL_ID_AUTHORIZATION_FAILED` for the
//! whole request), the batch's producer id and epoch must be the transactional id's, and the
//! partition must be in its ongoing transaction (else `INVALID_TXN_STATE`, `TRANSACTION_ABORTABLE`
//! from v11; `INVALID_PRODUCER_EPOCH` for a stale epoch); a verified batch carries the
//! transaction's number to the batch coordinator ([`ProducePartition::with_txn_seq`]).

use std::sync::Arc;

use diskless_coordinator::{ErrorCode, TopicIdPartition};
use diskless_core::validate::check_produce_codec;
use diskless_core::{PartitionResponse, ProducePartition};
use kafka_protocol::messages::produce_response::{
    BatchIndexAndErrorMessage, PartitionProduceResponse, TopicProduceResponse,
};
use kafka_protocol::messages::{
    InitProducerIdRequest, InitProducerIdResponse, ProduceRequest, ProduceResponse, ProducerId,
};
use kafka_protocol::protocol::StrBytes;
use tracing::{debug, warn};

use crate::broker::Broker;
use crate::codes;
use crate::ctx::{Ctx, encode_response};

/// Kafka's `INVALID_REQUIRED_ACKS`.
const INVALID_REQUIRED_ACKS: i16 = 21;
/// Kafka's `TRANSACTIONAL_ID_AUTHORIZATION_FAILED`: a Produce with transactional batches but no
/// transactional id.
const TRANSACTIONAL_ID_AUTHORIZATION_FAILED: i16 = 53;

/// Where each partition of the request is answered from.
enum Slot {
    /// The n-th answer of the writer.
    Writer(usize),
    /// Answered without the writer (unknown topic or partition, no records).
    Error(i16, String),
}

/// Handles a Produce request: resolves topics and appends to the writer now (in request order), then
/// returns the reply that resolves once committed: the response, or for `acks=0` nothing on success
/// and an error (which closes the connection) on failure.
pub(crate) async fn produce(
    broker: &Arc<Broker>,
    ctx: Ctx,
    request: ProduceRequest,
) -> Result<Option<tokio::task::JoinHandle<Result<Option<bytes::Bytes>, String>>>, String> {
    let mut layout: Vec<(kafka_protocol::messages::TopicName, Vec<(i32, Slot)>)> = Vec::new();
    let mut partitions = Vec::new();
    let valid_acks = (-1..=1).contains(&request.acks);
    let tid = request
        .transactional_id
        .as_ref()
        .map(|t| t.as_str().to_string());
    // Kafka's `KafkaApis.handleProduceRequest`: transactional records without a transactional id
    // fail the whole request.
    let unauthorized = tid.is_none()
        && request
            .topic_data
            .iter()
            .flat_map(|t| &t.partition_data)
            .any(|p| {
                p.records
                    .as_ref()
                    .is_some_and(|r| txn_producer(r).is_some())
            });
    for topic in request.topic_data {
        let found = if valid_acks {
            broker.topics.by_name(topic.name.as_str()).await
        } else {
            Ok(None)
        };
        let mut slots = Vec::with_capacity(topic.partition_data.len());
        for p in topic.partition_data {
            // Kafka's ProduceRequest.validateRecords: ZStandard needs Produce v7.
            let codec_error = p
                .records
                .as_ref()
                .and_then(|r| check_produce_codec(ctx.version, r).err())
                .map(|e| (e.error_code().code(), e.to_string()));
            let slot = match (&found, p.records) {
                _ if !valid_acks => Slot::Error(
                    INVALID_REQUIRED_ACKS,
                    format!("acks={} is not one of 0, 1, -1", request.acks),
                ),
                _ if unauthorized => Slot::Error(
                    TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                    "transactional records without a transactional id".into(),
                ),
                (Err(e), _) => Slot::Error(e.error_code().code(), e.to_string()),
                (Ok(None), _) => Slot::Error(
                    codes::UNKNOWN_TOPIC_OR_PARTITION,
                    format!("unknown topic {:?}", topic.name.as_str()),
                ),
                (Ok(Some(t)), _) if !t.has_partition(p.index) => Slot::Error(
                    codes::UNKNOWN_TOPIC_OR_PARTITION,
                    format!("topic {:?} has no partition {}", t.name, p.index),
                ),
                (Ok(Some(_)), None) => Slot::Error(
                    ErrorCode::InvalidRecord.code(),
                    "no records in the request".into(),
                ),
                (Ok(Some(_)), Some(_)) if codec_error.is_some() => {
                    let (code, message) = codec_error.unwrap_or_default();
                    Slot::Error(code, message)
                }
                (Ok(Some(t)), Some(records)) => {
                    let partition = TopicIdPartition::new(t.id, p.index);
                    let verified = match (txn_producer(&records), &tid) {
                        // Transaction version 2 (Produce v12): the partition joins implicitly.
                        (Some((producer_id, epoch)), Some(tid)) if ctx.version >= 12 => {
                            crate::txn::add_and_verify(
                                broker,
                                tid,
                                producer_id,
                                epoch,
                                partition,
                                &t.name,
                                ctx.version,
                            )
                            .await
                            .map(Some)
                        }
                        (Some((producer_id, epoch)), Some(tid)) => broker
                            .txns
                            .verify(tid, producer_id, epoch, partition, ctx.version)
                            .await
                            .map(Some),
                        _ => Ok(None),
                    };
                    match verified {
                        Ok(txn_seq) => {
                            let mut produce =
                                ProducePartition::new(partition, t.config.clone(), records);
                            if let Some(seq) = txn_seq {
                                produce = produce.with_txn_seq(seq);
                            }
                            partitions.push(produce);
                            Slot::Writer(partitions.len() - 1)
                        }
                        Err(code) => Slot::Error(
                            code,
                            format!(
                                "{}-{} was not verified in the transaction of {:?}",
                                t.name,
                                p.index,
                                tid.as_deref().unwrap_or("")
                            ),
                        ),
                    }
                }
            };
            slots.push((p.index, slot));
        }
        layout.push((topic.name, slots));
    }
    let Some(writer) = broker.writers.get(&ctx.node).cloned() else {
        return Err(format!("no writer for broker {}", ctx.node));
    };
    let pending = if partitions.is_empty() {
        None
    } else {
        Some(writer.append(partitions).await)
    };
    let acks = request.acks;
    let task = tokio::spawn(async move {
        let answers: Vec<PartitionResponse> = match pending {
            Some(p) => p.await,
            None => Vec::new(),
        };
        for a in answers.iter().filter(|a| !a.error.is_ok()) {
            debug!(
                partition = %a.partition,
                error = ?a.error,
                message = a.error_message.as_deref().unwrap_or(""),
                "produce failed for a partition"
            );
        }
        if acks == 0 {
            // No response; but as Kafka's `KafkaApis.handleProduceRequest` does, a failed acks=0
            // produce closes the connection, the only way the client can learn of it.
            return match first_error(&layout, &answers) {
                None => Ok(None),
                Some(e) => Err(format!("acks=0 produce failed ({e})")),
            };
        }
        let response = build_response(&ctx, layout, &answers);
        encode_response(&ctx, ctx.version, &response).map(Some)
    });
    Ok(Some(task))
}

/// The producer id and epoch of a transactional record batch (`None`: not a v2 batch, or not
/// transactional; the writer validates the rest).
fn txn_producer(records: &bytes::Bytes) -> Option<(i64, i16)> {
    let batch = diskless_core::RecordBatch::parse(records.clone()).ok()?;
    (batch.attributes().is_transactional() && !batch.attributes().is_control())
        .then(|| (batch.producer_id(), batch.producer_epoch()))
}

/// The first failed partition of a request, for the acks=0 close.
fn first_error(
    layout: &[(kafka_protocol::messages::TopicName, Vec<(i32, Slot)>)],
    answers: &[PartitionResponse],
) -> Option<String> {
    layout.iter().find_map(|(name, slots)| {
        slots.iter().find_map(|(index, slot)| match slot {
            Slot::Error(code, message) => Some(format!(
                "{}-{index}: error {code}: {message}",
                name.as_str()
            )),
            Slot::Writer(i) => answers.get(*i).filter(|a| !a.error.is_ok()).map(|a| {
                format!(
                    "{}-{index}: {:?}: {}",
                    name.as_str(),
                    a.error,
                    a.error_message.as_deref().unwrap_or("")
                )
            }),
        })
    })
}

fn build_response(
    ctx: &Ctx,
    layout: Vec<(kafka_protocol::messages::TopicName, Vec<(i32, Slot)>)>,
    answers: &[PartitionResponse],
) -> ProduceResponse {
    let mut response = ProduceResponse::default();
    for (name, slots) in layout {
        let mut topic = TopicProduceResponse::default();
        topic.name = name;
        for (index, slot) in slots {
            let mut p = PartitionProduceResponse::default();
            p.index = index;
            let (code, message) = match slot {
                Slot::Error(code, message) => (code, Some(message)),
                Slot::Writer(i) => match answers.get(i) {
                    Some(a) => {
                        p.base_offset = a.base_offset;
                        p.log_append_time_ms = a.log_append_time;
                        if ctx.version >= 5 {
                            p.log_start_offset = a.log_start_offset;
                        }
                        if ctx.version >= 8 {
                            p.record_errors = a
                                .record_errors
                                .iter()
                                .map(|e| {
                                    let mut r = BatchIndexAndErrorMessage::default();
                                    r.batch_index = e.batch_index;
                                    r.batch_index_error_message =
                                        Some(StrBytes::from_string(e.message.clone()));
                                    r
                                })
                                .collect();
                        }
                        (a.error.code(), a.error_message.clone())
                    }
                    None => (
                        codes::UNKNOWN_SERVER_ERROR,
                        Some("the writer gave no answer".to_string()),
                    ),
                },
            };
            p.error_code = code;
            if code != codes::NONE {
                p.base_offset = -1;
                if ctx.version >= 8 {
                    p.error_message = message.map(StrBytes::from_string);
                }
            }
            topic.partition_responses.push(p);
        }
        response.responses.push(topic);
    }
    response
}

/// InitProducerId: for idempotent producers a fresh producer id from the durable allocator; with
/// a transactional id, the transaction coordinator's answer.
pub(crate) async fn init_producer_id(
    broker: &Arc<Broker>,
    ctx: &Ctx,
    request: InitProducerIdRequest,
) -> InitProducerIdResponse {
    if let Some(tid) = request.transactional_id.clone() {
        return crate::txn::init_producer_id(broker, ctx, request, tid.as_str()).await;
    }
    let mut response = InitProducerIdResponse::default();
    // As Kafka's TransactionCoordinator: without a transactional id, a request always gets a new
    // producer id at epoch 0, whatever id and epoch it names (KIP-360's epoch bump of a
    // non-transactional producer is answered with a fresh id). Bumping the named id's epoch
    // would let any client fence another producer.
    match broker.producer_ids.next(broker.coordinator.as_ref()).await {
        Ok(id) => {
            response.producer_id = ProducerId(id);
            response.producer_epoch = 0;
        }
        Err(e) => {
            warn!(error = %e, "cannot allocate a producer id");
            response.error_code = codes::KAFKA_STORAGE_ERROR;
            response.producer_id = ProducerId(-1);
            response.producer_epoch = -1;
        }
    }
    response
}
