//! DescribeCluster (API 60) and DescribeProducers (API 61), as a Kafka broker without an authorizer
//! answers them.
//!
//! DescribeCluster (`KafkaApis.handleDescribeCluster`, `AuthHelper.computeDescribeClusterResponse`):
//! every logical broker with its advertised address and rack, the controller id announced in
//! Metadata (a broker of the list, as a KRaft broker announces a live broker), the cluster id, and —
//! when asked — the cluster operations an authorizer-less Kafka allows: every operation a CLUSTER
//! resource supports (CREATE, ALTER, DESCRIBE, CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS,
//! IDEMPOTENT_WRITE), else `i32::MIN` (the schema's "not asked"). A request for the controllers'
//! endpoint type is `MISMATCHED_ENDPOINT_TYPE` (`INVALID_REQUEST` at version 0), an unknown type
//! `UNSUPPORTED_ENDPOINT_TYPE`. No broker is ever fenced.
//!
//! DescribeProducers (`KafkaApis.handleDescribeProducersRequest`, `ReplicaManager.activeProducerState`):
//! the idempotent producers the coordinator keeps for each partition (`list_producers`). An invalid
//! topic name is `INVALID_TOPIC_EXCEPTION`, an unknown topic or partition
//! `UNKNOWN_TOPIC_OR_PARTITION`. `coordinator_epoch` is the epoch of the producer's last
//! transaction marker in the partition and `current_txn_start_offset` the first offset of its open
//! transaction there; both -1 when there is none, as Kafka answers. `last_timestamp` is the last batch's log append time for a LogAppendTime
//! topic; for CreateTime the coordinator does not keep the batch's max timestamp, so it is the
//! batch's commit time (Kafka answers the batch's max producer timestamp).

use std::sync::Arc;

use diskless_coordinator::TopicIdPartition;
use kafka_protocol::messages::describe_cluster_response::DescribeClusterBroker;
use kafka_protocol::messages::describe_producers_response::{
    PartitionResponse, ProducerState, TopicResponse,
};
use kafka_protocol::messages::{
    BrokerId, DescribeClusterRequest, DescribeClusterResponse, DescribeProducersRequest,
    DescribeProducersResponse, ProducerId,
};
use kafka_protocol::protocol::StrBytes;
use tracing::warn;

use crate::broker::Broker;
use crate::codes;
use crate::ctx::Ctx;

/// DescribeCluster `endpoint_type` of brokers.
const BROKER_ENDPOINT: i8 = 1;
/// DescribeCluster `endpoint_type` of controllers.
const CONTROLLER_ENDPOINT: i8 = 2;
/// `MISMATCHED_ENDPOINT_TYPE`.
const MISMATCHED_ENDPOINT_TYPE: i16 = 114;
/// `UNSUPPORTED_ENDPOINT_TYPE`.
const UNSUPPORTED_ENDPOINT_TYPE: i16 = 115;

fn str(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_string())
}

/// DescribeCluster.
pub(crate) async fn describe_cluster(
    broker: &Arc<Broker>,
    ctx: &Ctx,
    request: DescribeClusterRequest,
) -> DescribeClusterResponse {
    let mut response = DescribeClusterResponse::default();
    // The response's endpoint type (version 1+) is always the one this endpoint is.
    response.endpoint_type = BROKER_ENDPOINT;
    let asked = if ctx.version >= 1 {
        request.endpoint_type
    } else {
        BROKER_ENDPOINT
    };
    if asked != BROKER_ENDPOINT {
        let (code, message) = if asked == CONTROLLER_ENDPOINT {
            (
                MISMATCHED_ENDPOINT_TYPE,
                format!(
                    "The request was sent to an endpoint of type BROKER, but we wanted an \
                     endpoint of type {}",
                    "CONTROLLER"
                ),
            )
        } else {
            (
                UNSUPPORTED_ENDPOINT_TYPE,
                format!("Unsupported endpoint type {asked}"),
            )
        };
        response.error_code = if ctx.version == 0 {
            codes::INVALID_REQUEST
        } else {
            code
        };
        response.error_message = Some(str(&message));
        return response;
    }
    let cluster = &broker.cluster;
    response.cluster_id = str(&cluster.cluster_id);
    response.controller_id = BrokerId(cluster.controller_id());
    response.cluster_authorized_operations = if request.include_cluster_authorized_operations {
        crate::authz::cluster_authorized_operations()
    } else {
        i32::MIN
    };
    response.brokers = cluster
        .nodes
        .iter()
        .map(|n| {
            let mut b = DescribeClusterBroker::default();
            b.broker_id = BrokerId(n.id);
            b.host = str(&n.host);
            b.port = n.port;
            b.rack = Some(str(&n.rack));
            b
        })
        .collect();
    response
}

/// DescribeProducers.
pub(crate) async fn describe_producers(
    broker: &Arc<Broker>,
    _ctx: &Ctx,
    request: DescribeProducersRequest,
) -> DescribeProducersResponse {
    let mut response = DescribeProducersResponse::default();
    for topic_request in request.topics {
        let mut topic = TopicResponse::default();
        let name = topic_request.name.as_str().to_string();
        let found = if diskless_coordinator::is_valid_topic_name(&name) {
            broker
                .topics
                .by_name(&name)
                .await
                .map_err(|e| e.error_code().code())
        } else {
            Err(codes::INVALID_TOPIC_EXCEPTION)
        };
        for index in topic_request.partition_indexes {
            let mut p = PartitionResponse::default();
            p.partition_index = index;
            match &found {
                Err(code) => p.error_code = *code,
                Ok(Some(t)) if t.has_partition(index) => {
                    match broker
                        .coordinator
                        .list_producers(TopicIdPartition::new(t.id, index))
                        .await
                    {
                        Err(e) => {
                            warn!(error = %e, topic = %name, partition = index, "list producers failed");
                            p.error_code = e.error_code().code();
                            p.error_message = Some(str(&e.to_string()));
                        }
                        Ok(states) => {
                            p.active_producers = states
                                .into_iter()
                                .map(|s| {
                                    let d = s.described();
                                    let mut out = ProducerState::default();
                                    out.producer_id = ProducerId(d.producer_id);
                                    out.producer_epoch = d.producer_epoch;
                                    out.last_sequence = d.last_sequence;
                                    out.last_timestamp = d.last_timestamp;
                                    out.coordinator_epoch = d.coordinator_epoch;
                                    out.current_txn_start_offset = d.current_txn_start_offset;
                                    out
                                })
                                .collect();
                        }
                    }
                }
                Ok(_) => {
                    p.error_code = codes::UNKNOWN_TOPIC_OR_PARTITION;
                    p.error_message = Some(str("This server does not host this topic-partition."));
                }
            }
            topic.partitions.push(p);
        }
        topic.name = topic_request.name;
        response.topics.push(topic);
    }
    response
}
