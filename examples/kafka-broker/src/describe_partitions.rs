//! DescribeTopicPartitions (API 75, KIP-966), as a Kafka broker without an authorizer answers it
//! (`DescribeTopicPartitionsRequestHandler`, `KRaftMetadataCache.getTopicMetadataForDescribeTopicResponse`):
//!
//! - the requested topics (duplicates once), or every topic when the list is empty, in name order,
//!   from the cursor's topic on (names before it are left out);
//! - at most `response_partition_limit` partitions, capped by Kafka's
//!   `max.request.partition.size.limit` (2000) and at least 1; the cursor's topic starts at the
//!   cursor's partition. When the limit cuts a topic, `next_cursor` is that topic and its first
//!   partition left out; when the limit is used up exactly and topics remain, it is the next topic
//!   and partition 0 (that topic need not exist);
//! - a requested topic that does not exist is `UNKNOWN_TOPIC_OR_PARTITION`, one with an invalid
//!   name `INVALID_TOPIC_EXCEPTION` (neither counts against the limit); when all topics are asked
//!   for, none is an error;
//! - a cursor whose topic is not among the requested topics, or whose partition is negative, fails
//!   the whole request: every requested topic answered `INVALID_REQUEST` (the request's
//!   `getErrorResponse`);
//! - `topic_authorized_operations`: every operation a TOPIC resource supports (Kafka's
//!   `AclEntry.supportedOperations`, what `AuthHelper.authorizedOperations` answers without an
//!   authorizer), on every topic of the response, errors included (version 0 always has the field);
//! - each partition's leader, replicas and ISR exactly as Metadata answers them for the same client
//!   (see [`crate::metadata`]: produce gateways as leaders when the coordinator is sharded, the
//!   client's rack from its client id), leader epoch 0, no offline replicas, and empty eligible
//!   leader replicas and last known ELR (Kafka's `Replicas.toList` of an empty set).

use std::sync::Arc;

use kafka_protocol::messages::describe_topic_partitions_response::{
    Cursor, DescribeTopicPartitionsResponsePartition, DescribeTopicPartitionsResponseTopic,
};
use kafka_protocol::messages::{
    DescribeTopicPartitionsRequest, DescribeTopicPartitionsResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use tracing::warn;
use uuid::Uuid;

use crate::admin_configs;
use crate::authz;
use crate::broker::Broker;
use crate::cluster::GatewayLeaders;
use crate::codes;
use crate::ctx::Ctx;
use crate::topics::Topic;

/// Kafka's `max.request.partition.size.limit` default: the most partitions one response holds.
const MAX_REQUEST_PARTITION_SIZE_LIMIT: i32 = 2000;

/// Kafka's internal topics (`Topic.isInternal`).
fn is_internal(name: &str) -> bool {
    matches!(
        name,
        "__consumer_offsets" | "__transaction_state" | "__share_group_state"
    )
}

/// Java's `String.compareTo` (UTF-16 code units), which orders Kafka's topic list.
fn java_order(a: &str, b: &str) -> std::cmp::Ordering {
    a.encode_utf16().cmp(b.encode_utf16())
}

fn topic_name(s: &str) -> TopicName {
    TopicName(StrBytes::from_string(s.to_string()))
}

/// A topic without partitions: an error, or (code 0) a topic whose partitions are filled in later.
fn topic_entry(name: &str, id: Uuid, code: i16) -> DescribeTopicPartitionsResponseTopic {
    let mut t = DescribeTopicPartitionsResponseTopic::default();
    t.error_code = code;
    t.name = Some(topic_name(name));
    t.topic_id = id;
    t.is_internal = is_internal(name);
    t.topic_authorized_operations = authz::topic_authorized_operations();
    t
}

/// Partitions `start..end` of `topic`, with the leaders, replicas and ISR Metadata answers
/// (`metadata::partition_leaders`).
fn partitions(
    broker: &Broker,
    gateways: Option<&GatewayLeaders>,
    ctx: &Ctx,
    topic: &Topic,
    start: i32,
    end: i32,
) -> Vec<DescribeTopicPartitionsResponsePartition> {
    crate::metadata::partition_leaders(broker, gateways, ctx, topic, start..end)
        .into_iter()
        .map(|(p, leader, replicas)| {
            let mut m = DescribeTopicPartitionsResponsePartition::default();
            m.partition_index = p;
            m.leader_id = leader;
            m.leader_epoch = 0;
            m.isr_nodes = replicas.clone();
            m.replica_nodes = replicas;
            m.eligible_leader_replicas = Some(Vec::new());
            m.last_known_elr = Some(Vec::new());
            m.offline_replicas = Vec::new();
            m
        })
        .collect()
}

/// The request failed as a whole (Kafka's `DescribeTopicPartitionsRequest.getErrorResponse`):
/// every requested topic, in request order, with `code`.
fn error_response(
    request: &DescribeTopicPartitionsRequest,
    code: i16,
) -> DescribeTopicPartitionsResponse {
    let mut response = DescribeTopicPartitionsResponse::default();
    response.topics = request
        .topics
        .iter()
        .map(|t| {
            let mut r = DescribeTopicPartitionsResponseTopic::default();
            r.error_code = code;
            r.name = Some(t.name.clone());
            r.is_internal = false;
            r
        })
        .collect();
    response
}

/// DescribeTopicPartitions.
pub(crate) async fn describe_topic_partitions(
    broker: &Arc<Broker>,
    ctx: &Ctx,
    request: DescribeTopicPartitionsRequest,
) -> DescribeTopicPartitionsResponse {
    let fetch_all = request.topics.is_empty();
    let cursor_topic = request
        .cursor
        .as_ref()
        .map(|c| c.topic_name.as_str().to_string())
        .unwrap_or_default();
    let after_cursor = |name: &str| java_order(name, &cursor_topic).is_ge();
    let mut names: Vec<String> = if fetch_all {
        match broker.topics.all().await {
            Ok(all) => all
                .iter()
                .map(|t| t.name.clone())
                .filter(|n| after_cursor(n))
                .collect(),
            Err(e) => {
                warn!(error = %e, "DescribeTopicPartitions: cannot list topics");
                return error_response(&request, e.error_code().code());
            }
        }
    } else {
        let names: Vec<String> = request
            .topics
            .iter()
            .map(|t| t.name.as_str().to_string())
            .filter(|n| after_cursor(n))
            .collect();
        if request.cursor.is_some() && !names.contains(&cursor_topic) {
            return error_response(&request, codes::INVALID_REQUEST);
        }
        names
    };
    if request
        .cursor
        .as_ref()
        .is_some_and(|c| c.partition_index < 0)
    {
        return error_response(&request, codes::INVALID_REQUEST);
    }
    names.sort_by(|a, b| java_order(a, b));
    names.dedup();

    let cursor_partition = request.cursor.as_ref().map_or(0, |c| c.partition_index);
    // Kafka: max(min(max.request.partition.size.limit, response_partition_limit), 1).
    let limit = request
        .response_partition_limit
        .clamp(1, MAX_REQUEST_PARTITION_SIZE_LIMIT);
    let gateways = broker.gateway_leaders();
    let mut remaining = limit;
    let mut response = DescribeTopicPartitionsResponse::default();
    for name in names {
        if remaining == 0 {
            // The limit is used up: the next response starts at this topic's first partition.
            let mut next = Cursor::default();
            next.topic_name = topic_name(&name);
            next.partition_index = 0;
            response.next_cursor = Some(next);
            break;
        }
        let found = if admin_configs::invalid_topic_name(&name).is_some() {
            Err(codes::INVALID_TOPIC_EXCEPTION)
        } else {
            match broker.topics.by_name(&name).await {
                Ok(Some(topic)) => Ok(topic),
                Ok(None) => Err(codes::UNKNOWN_TOPIC_OR_PARTITION),
                Err(e) => {
                    warn!(error = %e, topic = %name, "DescribeTopicPartitions: cannot look a topic up");
                    Err(e.error_code().code())
                }
            }
        };
        let topic = match found {
            Ok(topic) => topic,
            Err(code) => {
                // Kafka leaves out topics it cannot describe when all topics are asked for.
                if !fetch_all {
                    response.topics.push(topic_entry(&name, Uuid::nil(), code));
                }
                continue;
            }
        };
        let start = if name == cursor_topic {
            cursor_partition
        } else {
            0
        };
        let end = topic.partitions.min(start.saturating_add(remaining));
        let mut entry = topic_entry(&name, topic.id, codes::NONE);
        entry.partitions = partitions(broker, gateways.as_deref(), ctx, &topic, start, end);
        let described = i32::try_from(entry.partitions.len()).unwrap_or(i32::MAX);
        response.topics.push(entry);
        if end < topic.partitions {
            let mut next = Cursor::default();
            next.topic_name = topic_name(&name);
            next.partition_index = end;
            response.next_cursor = Some(next);
            break;
        }
        remaining -= described;
    }
    response
}
