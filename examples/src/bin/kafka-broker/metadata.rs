//! Metadata, CreateTopics, DeleteTopics.
//!
//! Topics live in the batch coordinator (`create_topic`/`list_topics`/`delete_topic`); every topic
//! of this broker is a diskless topic. Automatic topic creation is off. Topic configs honoured:
//! `retention.ms`, `retention.bytes`, `max.message.bytes`, `message.timestamp.type`,
//! `message.timestamp.before.max.ms`, `message.timestamp.after.max.ms`; a few others that do not
//! change a diskless topic are accepted (`cleanup.policy=delete`, `compression.type=producer`,
//! `diskless.enable=true`, `min.insync.replicas`, `segment.bytes`, `segment.ms`), anything else is
//! `INVALID_CONFIG`.

use std::sync::Arc;

use diskless_coordinator::{CoordinatorError, CreateTopicRequest, TimestampType, TopicConfig};
use kafka_protocol::messages::create_topics_response::{
    CreatableTopicConfigs, CreatableTopicResult,
};
use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::{
    BrokerId, CreateTopicsRequest, CreateTopicsResponse, DeleteTopicsRequest, DeleteTopicsResponse,
    MetadataRequest, MetadataResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use tracing::{info, warn};
use uuid::Uuid;

use crate::broker::Broker;
use crate::cluster::{GatewayLeaders, client_rack};
use crate::codes;
use crate::server::Ctx;
use crate::topics::Topic;

/// The largest partition count accepted.
const MAX_PARTITIONS: i32 = 10_000;

fn str(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_string())
}

fn topic_name(s: &str) -> TopicName {
    TopicName(str(s))
}

fn describe_topic(
    broker: &Broker,
    gateways: Option<&GatewayLeaders>,
    ctx: &Ctx,
    topic: &Topic,
) -> MetadataResponseTopic {
    let rack = client_rack(&ctx.client_id);
    let mut t = MetadataResponseTopic::default();
    t.name = Some(topic_name(&topic.name));
    if ctx.version >= 10 {
        t.topic_id = topic.id;
    }
    // Sharded: each partition's leader is a produce gateway of its shard (in the client's rack).
    let gateway_leaders = gateways.and_then(|g| g.leaders(topic.id, topic.partitions, rack));
    t.partitions = (0..topic.partitions)
        .map(|p| {
            let leader = gateway_leaders
                .as_ref()
                .and_then(|l| l.get(usize::try_from(p).ok()?).copied())
                .unwrap_or_else(|| broker.cluster.leader_for(topic.id, p, rack));
            let replicas: Vec<BrokerId> = broker
                .cluster
                .replicas(leader)
                .into_iter()
                .map(BrokerId)
                .collect();
            let mut m = MetadataResponsePartition::default();
            m.partition_index = p;
            m.leader_id = BrokerId(leader);
            m.leader_epoch = 0;
            m.isr_nodes = replicas.clone();
            m.replica_nodes = replicas;
            m
        })
        .collect();
    t
}

fn unknown_topic(ctx: &Ctx, name: Option<TopicName>, id: Uuid, code: i16) -> MetadataResponseTopic {
    let mut t = MetadataResponseTopic::default();
    t.error_code = code;
    t.name = name;
    if ctx.version >= 10 {
        t.topic_id = id;
    }
    t
}

/// Metadata: the brokers, and the requested (or all) topics with their leaders.
pub(crate) async fn metadata(
    broker: &Arc<Broker>,
    ctx: &Ctx,
    request: MetadataRequest,
) -> MetadataResponse {
    let mut response = MetadataResponse::default();
    response.brokers = broker
        .cluster
        .nodes
        .iter()
        .map(|n| {
            let mut b = MetadataResponseBroker::default();
            b.node_id = BrokerId(n.id);
            b.host = str(&n.host);
            b.port = n.port;
            if ctx.version >= 1 {
                b.rack = Some(str(&n.rack));
            }
            b
        })
        .collect();
    if ctx.version >= 2 {
        response.cluster_id = Some(str(&broker.cluster.cluster_id));
    }
    if ctx.version >= 1 {
        response.controller_id = BrokerId(broker.cluster.controller_id());
    }
    let gateways = broker.gateway_leaders();
    // Version 0: an empty list means all topics; later versions use null for that.
    let wanted = match request.topics {
        Some(list) if !(ctx.version == 0 && list.is_empty()) => Some(list),
        _ => None,
    };
    match wanted {
        None => match broker.topics.all().await {
            Ok(all) => {
                response.topics = all
                    .iter()
                    .map(|t| describe_topic(broker, gateways.as_deref(), ctx, t))
                    .collect();
            }
            Err(e) => warn!(error = %e, "metadata: cannot list topics"),
        },
        Some(list) => {
            for wanted in list {
                let found = match (&wanted.name, wanted.topic_id) {
                    (Some(name), _) => broker.topics.by_name(name.as_str()).await,
                    (None, id) if !id.is_nil() => broker.topics.by_id(id).await,
                    (None, _) => Ok(None),
                };
                response.topics.push(match found {
                    Ok(Some(topic)) => describe_topic(broker, gateways.as_deref(), ctx, &topic),
                    Ok(None) => {
                        let code = if wanted.name.is_none() {
                            codes::UNKNOWN_TOPIC_ID
                        } else {
                            codes::UNKNOWN_TOPIC_OR_PARTITION
                        };
                        unknown_topic(ctx, wanted.name, wanted.topic_id, code)
                    }
                    Err(e) => {
                        warn!(error = %e, "metadata: cannot look a topic up");
                        unknown_topic(
                            ctx,
                            wanted.name,
                            wanted.topic_id,
                            codes::KAFKA_STORAGE_ERROR,
                        )
                    }
                });
            }
        }
    }
    response
}

/// Kafka's rules for topic names.
fn valid_topic_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name == "." || name == ".." {
        return Err(format!("invalid topic name {name:?}"));
    }
    if name.len() > 249 {
        return Err("topic name longer than 249 characters".into());
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
    {
        return Err(format!(
            "topic name {name:?} has characters other than ASCII alphanumerics, '.', '_' and '-'"
        ));
    }
    Ok(())
}

/// Applies CreateTopics configs to the defaults.
fn topic_config(configs: &[(String, Option<String>)]) -> Result<TopicConfig, String> {
    let mut config = TopicConfig::default();
    for (name, value) in configs {
        let Some(value) = value.as_deref() else {
            return Err(format!("config {name} has a null value"));
        };
        let int = |min: i64| -> Result<i64, String> {
            value
                .parse::<i64>()
                .ok()
                .filter(|v| *v >= min)
                .ok_or_else(|| format!("config {name}={value:?}: expected an integer >= {min}"))
        };
        match name.as_str() {
            "retention.ms" => config.retention_ms = int(-1)?,
            "retention.bytes" => config.retention_bytes = int(-1)?,
            "max.message.bytes" => {
                config.max_message_bytes = i32::try_from(int(0)?)
                    .map_err(|_| format!("config {name}={value:?} is too large"))?
            }
            "message.timestamp.type" => {
                config.timestamp_type = match value {
                    "CreateTime" => TimestampType::CreateTime,
                    "LogAppendTime" => TimestampType::LogAppendTime,
                    _ => {
                        return Err(format!(
                            "config {name}={value:?}: expected CreateTime or LogAppendTime"
                        ));
                    }
                }
            }
            "message.timestamp.before.max.ms" => config.message_timestamp_before_max_ms = int(0)?,
            "message.timestamp.after.max.ms" => config.message_timestamp_after_max_ms = int(0)?,
            "cleanup.policy" if value == "delete" => {}
            "compression.type" if value == "producer" => {}
            "diskless.enable" if value == "true" => {}
            "min.insync.replicas" | "segment.bytes" | "segment.ms" => {}
            _ => {
                return Err(format!(
                    "config {name}={value:?} is not supported on diskless topics"
                ));
            }
        }
    }
    Ok(config)
}

fn config_entries(config: &TopicConfig) -> Vec<CreatableTopicConfigs> {
    let ts = match config.timestamp_type {
        TimestampType::CreateTime => "CreateTime",
        TimestampType::LogAppendTime => "LogAppendTime",
    };
    [
        ("diskless.enable", "true".to_string()),
        ("retention.ms", config.retention_ms.to_string()),
        ("retention.bytes", config.retention_bytes.to_string()),
        ("max.message.bytes", config.max_message_bytes.to_string()),
        ("message.timestamp.type", ts.to_string()),
    ]
    .into_iter()
    .map(|(name, value)| {
        let mut c = CreatableTopicConfigs::default();
        c.name = str(name);
        c.value = Some(StrBytes::from_string(value));
        c.config_source = 5; // DEFAULT_CONFIG; good enough for an example.
        c
    })
    .collect()
}

/// CreateTopics: diskless topics in the coordinator.
pub(crate) async fn create_topics(
    broker: &Arc<Broker>,
    ctx: &Ctx,
    request: CreateTopicsRequest,
) -> CreateTopicsResponse {
    let mut response = CreateTopicsResponse::default();
    let brokers = i16::try_from(broker.cluster.nodes.len()).unwrap_or(i16::MAX);
    for topic in request.topics {
        let name = topic.name.as_str().to_string();
        let mut result = CreatableTopicResult::default();
        result.name = topic.name.clone();
        let fail = |mut result: CreatableTopicResult, code: i16, message: String| {
            info!(topic = %name, code, "CreateTopics refused: {message}");
            result.error_code = code;
            result.error_message = Some(StrBytes::from_string(message));
            result
        };
        if let Err(e) = valid_topic_name(&name) {
            response
                .topics
                .push(fail(result, codes::INVALID_TOPIC_EXCEPTION, e));
            continue;
        }
        if !topic.assignments.is_empty() {
            response.topics.push(fail(
                result,
                codes::INVALID_REPLICA_ASSIGNMENT,
                "manual replica assignments do not apply to diskless topics".into(),
            ));
            continue;
        }
        let partitions = if topic.num_partitions == -1 {
            1
        } else {
            topic.num_partitions
        };
        if !(1..=MAX_PARTITIONS).contains(&partitions) {
            response.topics.push(fail(
                result,
                codes::INVALID_PARTITIONS,
                format!("partition count must be within 1..={MAX_PARTITIONS}"),
            ));
            continue;
        }
        if topic.replication_factor == 0 || topic.replication_factor < -1 {
            response.topics.push(fail(
                result,
                codes::INVALID_REPLICATION_FACTOR,
                "replication factor must be -1 or positive".into(),
            ));
            continue;
        }
        let configs: Vec<(String, Option<String>)> = topic
            .configs
            .iter()
            .map(|c| {
                (
                    c.name.as_str().to_string(),
                    c.value.as_ref().map(|v| v.as_str().to_string()),
                )
            })
            .collect();
        let config = match topic_config(&configs) {
            Ok(c) => c,
            Err(e) => {
                response.topics.push(fail(result, codes::INVALID_CONFIG, e));
                continue;
            }
        };
        let topic_id = crate::random_uuid();
        let exists = match broker.topics.by_name(&name).await {
            Ok(found) => found.is_some(),
            Err(e) => {
                response
                    .topics
                    .push(fail(result, e.error_code().code(), e.to_string()));
                continue;
            }
        };
        if exists {
            response.topics.push(fail(
                result,
                codes::TOPIC_ALREADY_EXISTS,
                format!("topic {name:?} already exists"),
            ));
            continue;
        }
        if !request.validate_only {
            let created = broker
                .coordinator
                .create_topic(CreateTopicRequest {
                    topic_id,
                    name: name.clone(),
                    partitions,
                    config: config.clone(),
                })
                .await;
            broker.topics.invalidate();
            if let Err(e) = created {
                let code = match &e {
                    CoordinatorError::TopicAlreadyExists(_) => codes::TOPIC_ALREADY_EXISTS,
                    other => other.error_code().code(),
                };
                response.topics.push(fail(result, code, e.to_string()));
                continue;
            }
            info!(topic = %name, %topic_id, partitions, "diskless topic created");
        }
        if ctx.version >= 5 {
            result.num_partitions = partitions;
            result.replication_factor = brokers;
            result.configs = Some(config_entries(&config));
        }
        if ctx.version >= 7 {
            result.topic_id = topic_id;
        }
        response.topics.push(result);
    }
    response
}

/// DeleteTopics: by name (versions 1-5) or name or id (version 6).
pub(crate) async fn delete_topics(
    broker: &Arc<Broker>,
    ctx: &Ctx,
    request: DeleteTopicsRequest,
) -> DeleteTopicsResponse {
    let wanted: Vec<(Option<TopicName>, Uuid)> = if ctx.version >= 6 {
        request
            .topics
            .into_iter()
            .map(|t| (t.name, t.topic_id))
            .collect()
    } else {
        request
            .topic_names
            .into_iter()
            .map(|n| (Some(n), Uuid::nil()))
            .collect()
    };
    let mut response = DeleteTopicsResponse::default();
    for (name, id) in wanted {
        let mut result = DeletableTopicResult::default();
        let found = match &name {
            Some(n) => broker.topics.by_name(n.as_str()).await,
            None => broker.topics.by_id(id).await,
        };
        let outcome = match found {
            Ok(Some(topic)) => {
                result.name = Some(topic_name(&topic.name));
                if ctx.version >= 6 {
                    result.topic_id = topic.id;
                }
                let deleted = broker.coordinator.delete_topic(topic.id).await;
                broker.topics.invalidate();
                match deleted {
                    Ok(()) => {
                        info!(topic = %topic.name, id = %topic.id, "topic deleted");
                        if let Err(e) = broker.store.delete_topic(&topic.name).await {
                            warn!(error = %e, "cannot forget the committed offsets of a deleted topic");
                        }
                        Ok(())
                    }
                    Err(e) => Err((e.error_code().code(), e.to_string())),
                }
            }
            Ok(None) => {
                result.name = name;
                if ctx.version >= 6 {
                    result.topic_id = id;
                }
                Err((
                    if id.is_nil() {
                        codes::UNKNOWN_TOPIC_OR_PARTITION
                    } else {
                        codes::UNKNOWN_TOPIC_ID
                    },
                    "unknown topic".to_string(),
                ))
            }
            Err(e) => {
                result.name = name;
                Err((e.error_code().code(), e.to_string()))
            }
        };
        if let Err((code, message)) = outcome {
            result.error_code = code;
            if ctx.version >= 5 {
                result.error_message = Some(StrBytes::from_string(message));
            }
        }
        response.responses.push(result);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_configs_are_parsed_and_checked() {
        let c = topic_config(&[
            ("retention.ms".into(), Some("1000".into())),
            ("retention.bytes".into(), Some("-1".into())),
            ("max.message.bytes".into(), Some("2048".into())),
            (
                "message.timestamp.type".into(),
                Some("LogAppendTime".into()),
            ),
            ("cleanup.policy".into(), Some("delete".into())),
        ])
        .unwrap();
        assert_eq!(c.retention_ms, 1000);
        assert_eq!(c.retention_bytes, -1);
        assert_eq!(c.max_message_bytes, 2048);
        assert_eq!(c.timestamp_type, TimestampType::LogAppendTime);
        for bad in [
            ("retention.ms", Some("-2")),
            ("max.message.bytes", Some("x")),
            ("message.timestamp.type", Some("Now")),
            ("cleanup.policy", Some("compact")),
            ("unknown.config", Some("1")),
            ("retention.ms", None),
        ] {
            let configs = [(bad.0.to_string(), bad.1.map(str::to_string))];
            assert!(topic_config(&configs).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn topic_names_follow_kafka_rules() {
        assert!(valid_topic_name("orders.v1_x-y").is_ok());
        for bad in ["", ".", "..", "a b", "ä", &"x".repeat(250)] {
            assert!(valid_topic_name(bad).is_err(), "{bad:?} accepted");
        }
    }
}
