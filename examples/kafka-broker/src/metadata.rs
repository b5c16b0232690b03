//! Metadata, CreateTopics, DeleteTopics.
//!
//! Topics live in the batch coordinator (`create_topic`/`list_topics`/`delete_topic`); every topic
//! of this broker is a diskless topic. As on a Kafka broker:
//! - a topic name outside Kafka's rules (`[a-zA-Z0-9._-]`, 1 to 249 characters, not `.` or `..`)
//!   is answered `INVALID_TOPIC_EXCEPTION`, in Metadata and CreateTopics;
//! - with `--auto-create-topics` (Kafka's `auto.create.topics.enable`, off by default), Metadata for
//!   an unknown topic creates it with `--num-partitions` partitions and answers
//!   `LEADER_NOT_AVAILABLE` for it in that round (the next Metadata shows it), unless the request
//!   (version 4 or later) says `allow_auto_topic_creation=false`;
//! - CreateTopics takes manual replica assignments (the partition count is theirs; they are checked
//!   as Kafka checks them, kept in the broker's store and reported by Metadata as the partition's
//!   replicas and leader, as Kafka reports them; every broker still serves every diskless
//!   partition),
//!   `num_partitions`/`replication_factor` -1 for the defaults, `validate_only`, and every topic
//!   config Kafka knows (see [`crate::admin_configs`] for which ones act on a diskless topic and
//!   which are refused).

use std::sync::Arc;

use std::collections::BTreeSet;

use diskless_coordinator::{CoordinatorError, CreateTopicRequest, TopicConfig};
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

use crate::admin_configs;
use crate::broker::Broker;
use crate::cluster::{GatewayLeaders, client_rack};
use crate::codes;
use crate::ctx::{ApiError, Ctx};
use crate::topics::Topic;

/// The largest partition count accepted.
const MAX_PARTITIONS: i32 = 10_000;
/// `LEADER_NOT_AVAILABLE`: the answer for a topic being created automatically.
const LEADER_NOT_AVAILABLE: i16 = 5;

fn str(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_string())
}

fn topic_name(s: &str) -> TopicName {
    TopicName(str(s))
}

/// The leader and replicas (= ISR) of partitions `partitions` of `topic` as this client sees them:
/// with a sharded coordinator each partition's leader is a produce gateway of its shard (in the
/// client's rack), otherwise its manual replica assignment if it has one, otherwise the cluster's
/// leader for it. Metadata and DescribeTopicPartitions
/// both answer from here, so they agree.
pub(crate) fn partition_leaders(
    broker: &Broker,
    gateways: Option<&GatewayLeaders>,
    ctx: &Ctx,
    topic: &Topic,
    partitions: std::ops::Range<i32>,
) -> Vec<(i32, BrokerId, Vec<BrokerId>)> {
    let rack = client_rack(&ctx.client_id);
    let gateway_leaders = gateways.and_then(|g| g.leaders(topic.id, topic.partitions, rack));
    partitions
        .map(|p| {
            let gateway = gateway_leaders
                .as_ref()
                .and_then(|l| l.get(usize::try_from(p).ok()?).copied());
            // A manual replica assignment (CreateTopics / CreatePartitions) is reported as Kafka
            // reports it: those replicas, the first one (the preferred replica) leading. Every
            // broker serves every diskless partition, so this only steers clients.
            let assigned = topic
                .assignments
                .get(&p)
                .filter(|r| !r.is_empty())
                .filter(|r| {
                    r.iter()
                        .all(|id| broker.cluster.nodes.iter().any(|n| n.id == *id))
                });
            match (gateway, assigned) {
                (None, Some(replicas)) => (
                    p,
                    BrokerId(replicas[0]),
                    replicas.iter().copied().map(BrokerId).collect(),
                ),
                _ => {
                    let leader =
                        gateway.unwrap_or_else(|| broker.cluster.leader_for(topic.id, p, rack));
                    let replicas = broker
                        .cluster
                        .replicas(leader)
                        .into_iter()
                        .map(BrokerId)
                        .collect();
                    (p, BrokerId(leader), replicas)
                }
            }
        })
        .collect()
}

fn describe_topic(
    broker: &Broker,
    gateways: Option<&GatewayLeaders>,
    ctx: &Ctx,
    topic: &Topic,
) -> MetadataResponseTopic {
    let mut t = MetadataResponseTopic::default();
    t.name = Some(topic_name(&topic.name));
    if ctx.version >= 10 {
        t.topic_id = topic.id;
    }
    t.partitions = partition_leaders(broker, gateways, ctx, topic, 0..topic.partitions)
        .into_iter()
        .map(|(p, leader, replicas)| {
            let mut m = MetadataResponsePartition::default();
            m.partition_index = p;
            m.leader_id = leader;
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
    let include_topic_operations = request.include_topic_authorized_operations;
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
    // Versions 8-10 (librdkafka's describe_cluster reads it here): every cluster operation, as
    // Kafka answers without an authorizer; INT32_MIN when not asked for.
    if (8..=10).contains(&ctx.version) {
        response.cluster_authorized_operations = if request.include_cluster_authorized_operations {
            crate::authz::cluster_authorized_operations()
        } else {
            i32::MIN
        };
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
            let auto_create = broker.topics.defaults().auto_create
                && (ctx.version < 4 || request.allow_auto_topic_creation);
            for wanted in list {
                if let Some(name) = &wanted.name
                    && admin_configs::invalid_topic_name(name.as_str()).is_some()
                {
                    response.topics.push(unknown_topic(
                        ctx,
                        wanted.name.clone(),
                        wanted.topic_id,
                        codes::INVALID_TOPIC_EXCEPTION,
                    ));
                    continue;
                }
                let found = match (&wanted.name, wanted.topic_id) {
                    (Some(name), _) => broker.topics.by_name(name.as_str()).await,
                    (None, id) if !id.is_nil() => broker.topics.by_id(id).await,
                    (None, _) => Ok(None),
                };
                response.topics.push(match found {
                    Ok(Some(topic)) => describe_topic(broker, gateways.as_deref(), ctx, &topic),
                    Ok(None) => {
                        let code = match &wanted.name {
                            None => codes::UNKNOWN_TOPIC_ID,
                            Some(name) if auto_create => {
                                auto_create_topic(broker, name.as_str()).await
                            }
                            Some(_) => codes::UNKNOWN_TOPIC_OR_PARTITION,
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
    // Versions 8+: every topic operation when asked for (Kafka without an authorizer answers them
    // for every topic it lists, errors included), INT32_MIN otherwise.
    if ctx.version >= 8 {
        let operations = if include_topic_operations {
            crate::authz::topic_authorized_operations()
        } else {
            i32::MIN
        };
        for t in &mut response.topics {
            t.topic_authorized_operations = operations;
        }
    }
    response
}

/// Creates `name` for Metadata (Kafka's `AutoTopicCreationManager`): the error code for that
/// round, `LEADER_NOT_AVAILABLE` once the topic is created (or was just created by someone else).
async fn auto_create_topic(broker: &Arc<Broker>, name: &str) -> i16 {
    let partitions = broker.topics.defaults().num_partitions;
    let new = NewTopic {
        partitions,
        replication: 1,
        overrides: Default::default(),
        config: broker.topics.defaults().topic_config(),
        assignments: Vec::new(),
    };
    match create(broker, name, &new).await {
        Ok(topic_id) => {
            info!(topic = %name, %topic_id, partitions, "diskless topic created automatically");
            LEADER_NOT_AVAILABLE
        }
        Err(e) if e.code == codes::TOPIC_ALREADY_EXISTS => LEADER_NOT_AVAILABLE,
        // A name that collides with an existing one (`.` vs `_`) never gets created: fail fast.
        Err(e) if e.code == codes::INVALID_TOPIC_EXCEPTION => e.code,
        Err(e) => {
            warn!(topic = %name, code = e.code, "cannot create a topic automatically: {}", e.message);
            codes::UNKNOWN_TOPIC_OR_PARTITION
        }
    }
}

/// Kafka's collision rule: `.` and `_` may not be the only difference between two topic names.
async fn collision(broker: &Broker, name: &str) -> Result<Option<String>, ApiError> {
    if !name.contains(['.', '_']) {
        return Ok(None);
    }
    let unified = name.replace('.', "_");
    let all = broker
        .topics
        .all()
        .await
        .map_err(|e| ApiError::new(e.error_code().code(), e.to_string()))?;
    Ok(all
        .iter()
        .find(|t| t.name != name && t.name.replace('.', "_") == unified)
        .map(|t| t.name.clone()))
}

/// Creates a diskless topic in the coordinator; its id.
async fn create(broker: &Arc<Broker>, name: &str, new: &NewTopic) -> Result<uuid::Uuid, ApiError> {
    if let Some(other) = collision(broker, name).await? {
        return Err(ApiError::new(
            codes::INVALID_TOPIC_EXCEPTION,
            format!("Topic '{name}' collides with existing topic: {other}"),
        ));
    }
    let topic_id = crate::random_uuid();
    let created = broker
        .coordinator
        .create_topic(CreateTopicRequest {
            topic_id,
            name: name.to_string(),
            partitions: new.partitions,
            config: new.config.clone(),
        })
        .await;
    broker.topics.invalidate();
    match created {
        Ok(()) => {
            // The topic exists now; what only this broker keeps is written after it (a failure
            // here loses kept configs or assignments, never the topic).
            if let Err(e) = broker
                .topics
                .set_overrides(topic_id, new.overrides.clone())
                .await
            {
                warn!(topic = %name, error = %e, "cannot keep the topic's configs");
            }
            if let Err(e) = broker
                .topics
                .add_assignments(topic_id, new.assignments.clone())
                .await
            {
                warn!(topic = %name, error = %e, "cannot keep the topic's replica assignments");
            }
            // Again: a lookup between the two may have cached the topic without its assignments.
            broker.topics.invalidate();
            Ok(topic_id)
        }
        Err(CoordinatorError::TopicAlreadyExists(_)) => Err(ApiError::new(
            codes::TOPIC_ALREADY_EXISTS,
            format!("Topic '{name}' already exists."),
        )),
        Err(e) => Err(ApiError::new(e.error_code().code(), e.to_string())),
    }
}

/// The checks of one CreateTopics entry, in Kafka's order (`ReplicationControlManager.createTopics`);
/// the partition count, replication factor and the topic's configs.
async fn check_new_topic(
    broker: &Arc<Broker>,
    topic: &kafka_protocol::messages::create_topics_request::CreatableTopic,
) -> Result<NewTopic, ApiError> {
    let name = topic.name.as_str();
    if let Some(why) = admin_configs::invalid_topic_name(name) {
        return Err(ApiError::new(codes::INVALID_TOPIC_EXCEPTION, why));
    }
    let exists = broker
        .topics
        .by_name(name)
        .await
        .map_err(|e| ApiError::new(e.error_code().code(), e.to_string()))?
        .is_some();
    if exists {
        return Err(ApiError::new(
            codes::TOPIC_ALREADY_EXISTS,
            format!("Topic '{name}' already exists."),
        ));
    }
    if let Some(other) = collision(broker, name).await? {
        return Err(ApiError::new(
            codes::INVALID_TOPIC_EXCEPTION,
            format!("Topic '{name}' collides with existing topic: {other}"),
        ));
    }
    let nulls: Vec<&str> = topic
        .configs
        .iter()
        .filter(|c| c.value.is_none())
        .map(|c| c.name.as_str())
        .collect();
    if !nulls.is_empty() {
        return Err(ApiError::new(
            codes::INVALID_CONFIG,
            format!(
                "Null value not supported for topic configs: {}",
                nulls.join(",")
            ),
        ));
    }
    let configs: Vec<(String, String)> = topic
        .configs
        .iter()
        .filter_map(|c| {
            Some((
                c.name.as_str().to_string(),
                c.value.as_ref()?.as_str().to_string(),
            ))
        })
        .collect();
    let defaults = broker.topics.defaults();
    let (overrides, config) =
        admin_configs::resolve(&defaults.topic_config(), &defaults, &configs)?;
    let default_replication = i16::try_from(broker.cluster.nodes.len()).unwrap_or(i16::MAX);
    let (partitions, replication) = if !topic.assignments.is_empty() {
        if topic.replication_factor != -1 {
            return Err(ApiError::new(
                codes::INVALID_REQUEST,
                "A manual partition assignment was specified, but replication factor was not set to -1.",
            ));
        }
        if topic.num_partitions != -1 {
            return Err(ApiError::new(
                codes::INVALID_REQUEST,
                "A manual partition assignment was specified, but numPartitions was not set to -1.",
            ));
        }
        check_assignments(broker, topic)?
    } else if topic.replication_factor < -1 || topic.replication_factor == 0 {
        return Err(ApiError::new(
            codes::INVALID_REPLICATION_FACTOR,
            "Replication factor must be larger than 0, or -1 to use the default value.",
        ));
    } else if topic.num_partitions < -1 || topic.num_partitions == 0 {
        return Err(ApiError::new(
            codes::INVALID_PARTITIONS,
            "Number of partitions was set to an invalid non-positive value.",
        ));
    } else {
        let partitions = if topic.num_partitions == -1 {
            broker.topics.defaults().num_partitions
        } else {
            topic.num_partitions
        };
        let replication = if topic.replication_factor == -1 {
            default_replication
        } else {
            topic.replication_factor
        };
        if replication > default_replication {
            return Err(ApiError::new(
                codes::INVALID_REPLICATION_FACTOR,
                format!(
                    "Unable to replicate the partition {replication} time(s): The target \
                     replication factor of {replication} cannot be reached because only \
                     {default_replication} broker(s) are registered."
                ),
            ));
        }
        (partitions, replication)
    };
    if partitions > MAX_PARTITIONS {
        return Err(ApiError::new(
            codes::INVALID_PARTITIONS,
            format!("this broker creates at most {MAX_PARTITIONS} partitions per topic"),
        ));
    }
    let assignments = topic
        .assignments
        .iter()
        .map(|a| {
            (
                a.partition_index,
                a.broker_ids.iter().map(|b| b.0).collect(),
            )
        })
        .collect();
    Ok(NewTopic {
        partitions,
        replication,
        overrides,
        config,
        assignments,
    })
}

/// A checked CreateTopics entry.
struct NewTopic {
    partitions: i32,
    replication: i16,
    overrides: crate::topics::Overrides,
    config: TopicConfig,
    /// Manual replica assignments (partition, replicas in the given order).
    assignments: Vec<(i32, Vec<i32>)>,
}

/// Kafka's checks of manual replica assignments: the partition count and the replication factor
/// they give.
fn check_assignments(
    broker: &Broker,
    topic: &kafka_protocol::messages::create_topics_request::CreatableTopic,
) -> Result<(i32, i16), ApiError> {
    let bad = |m: String| Err(ApiError::new(codes::INVALID_REPLICA_ASSIGNMENT, m));
    let mut seen = BTreeSet::new();
    let mut replication: Option<usize> = None;
    for a in &topic.assignments {
        if !seen.insert(a.partition_index) {
            return bad(format!(
                "Found multiple manual partition assignments for partition {}",
                a.partition_index
            ));
        }
        if a.broker_ids.is_empty() {
            return bad("The manual partition assignment includes an empty replica list.".into());
        }
        let mut ids: Vec<i32> = a.broker_ids.iter().map(|b| b.0).collect();
        ids.sort_unstable();
        for (i, id) in ids.iter().enumerate() {
            if !broker.cluster.nodes.iter().any(|n| n.id == *id) {
                return bad(format!(
                    "The manual partition assignment includes broker {id}, but no such broker is registered."
                ));
            }
            if i > 0 && ids[i - 1] == *id {
                return bad(format!(
                    "The manual partition assignment includes the broker {id} more than once."
                ));
            }
        }
        if let Some(r) = replication
            && r != ids.len()
        {
            return bad(format!(
                "The manual partition assignment includes a partition with {} replica(s), but \
                 this is not consistent with previous partitions, which have {r} replica(s).",
                ids.len()
            ));
        }
        replication = Some(ids.len());
    }
    let count = i32::try_from(seen.len()).unwrap_or(i32::MAX);
    if !(0..count).all(|p| seen.contains(&p)) {
        return bad("partitions should be a consecutive 0-based integer sequence".into());
    }
    Ok((
        count,
        i16::try_from(replication.unwrap_or(1)).unwrap_or(i16::MAX),
    ))
}

/// CreateTopics: diskless topics in the coordinator.
pub(crate) async fn create_topics(
    broker: &Arc<Broker>,
    ctx: &Ctx,
    request: CreateTopicsRequest,
) -> CreateTopicsResponse {
    let mut response = CreateTopicsResponse::default();
    let mut names: Vec<&str> = request.topics.iter().map(|t| t.name.as_str()).collect();
    names.sort_unstable();
    let duplicates: BTreeSet<&str> = names
        .windows(2)
        .filter(|w| w[0] == w[1])
        .map(|w| w[0])
        .collect();
    for topic in &request.topics {
        let name = topic.name.as_str();
        let mut result = CreatableTopicResult::default();
        result.name = topic.name.clone();
        let outcome = if duplicates.contains(name) {
            Err(ApiError::new(
                codes::INVALID_REQUEST,
                "Duplicate topic name.",
            ))
        } else {
            match check_new_topic(broker, topic).await {
                Err(e) => Err(e),
                Ok(new) if request.validate_only => Ok((
                    crate::random_uuid(),
                    new.partitions,
                    new.replication,
                    new.overrides,
                )),
                Ok(new) => {
                    let (partitions, replication, overrides) =
                        (new.partitions, new.replication, new.overrides.clone());
                    create(broker, name, &new).await.map(|id| {
                        info!(topic = %name, %id, partitions, "diskless topic created");
                        (id, partitions, replication, overrides)
                    })
                }
            }
        };
        match outcome {
            Ok((topic_id, partitions, replication, overrides)) => {
                if ctx.version >= 5 {
                    result.num_partitions = partitions;
                    result.replication_factor = replication;
                    result.configs = Some(
                        admin_configs::topic_entries(&overrides, &broker.topics.defaults(), None)
                            .into_iter()
                            .map(|e| {
                                let mut c = CreatableTopicConfigs::default();
                                c.name = str(e.name);
                                c.value = Some(StrBytes::from_string(e.value));
                                c.read_only = false;
                                c.config_source = e.source;
                                c.is_sensitive = false;
                                c
                            })
                            .collect(),
                    );
                }
                if ctx.version >= 7 {
                    result.topic_id = topic_id;
                }
            }
            Err(e) => {
                info!(topic = %name, code = e.code, "CreateTopics refused: {}", e.message);
                result.error_code = e.code;
                result.error_message = Some(StrBytes::from_string(e.message));
            }
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
                        if let Err(e) = broker.topics.forget(topic.id).await {
                            warn!(error = %e, "cannot forget the kept configs of a deleted topic");
                        }
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
