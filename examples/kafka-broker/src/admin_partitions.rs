//! CreatePartitions: grows diskless topics in the coordinator (`BatchCoordinator::create_partitions`),
//! with the checks and messages of Kafka's controller (`ReplicationControlManager.createPartitions`).
//! Manual replica assignments are checked as Kafka checks them and kept in the broker's store;
//! Metadata reports them as the new partitions' replicas (see [`crate::metadata::partition_leaders`]).

use std::collections::BTreeSet;
use std::sync::Arc;

use diskless_coordinator::{CoordinatorError, check_new_partition_count};
use kafka_protocol::messages::create_partitions_request::CreatePartitionsTopic;
use kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
use kafka_protocol::messages::{CreatePartitionsRequest, CreatePartitionsResponse};
use kafka_protocol::protocol::StrBytes;
use tracing::{info, warn};

use crate::broker::Broker;
use crate::codes;
use crate::ctx::{ApiError, Ctx};

/// CreatePartitions, topic by topic in request order.
pub(crate) async fn create_partitions(
    broker: &Arc<Broker>,
    _ctx: &Ctx,
    request: CreatePartitionsRequest,
) -> CreatePartitionsResponse {
    let mut names: Vec<&str> = request.topics.iter().map(|t| t.name.as_str()).collect();
    names.sort_unstable();
    let duplicates: BTreeSet<&str> = names
        .windows(2)
        .filter(|w| w[0] == w[1])
        .map(|w| w[0])
        .collect();
    let mut response = CreatePartitionsResponse::default();
    for topic in &request.topics {
        let name = topic.name.as_str();
        let outcome = if duplicates.contains(name) {
            Err(ApiError::new(
                codes::INVALID_REQUEST,
                "Duplicate topic name.",
            ))
        } else {
            grow(broker, topic, request.validate_only).await
        };
        let mut result = CreatePartitionsTopicResult::default();
        result.name = topic.name.clone();
        if let Err(e) = outcome {
            info!(topic = %name, code = e.code, "CreatePartitions refused: {}", e.message);
            result.error_code = e.code;
            result.error_message = Some(StrBytes::from_string(e.message));
        }
        response.results.push(result);
    }
    response
}

async fn grow(
    broker: &Arc<Broker>,
    request: &CreatePartitionsTopic,
    validate_only: bool,
) -> Result<(), ApiError> {
    let name = request.name.as_str();
    let coordinator_error =
        |e: CoordinatorError| ApiError::new(e.error_code().code(), e.to_string());
    let Some(topic) = broker
        .topics
        .by_name(name)
        .await
        .map_err(coordinator_error)?
    else {
        return Err(ApiError::new(
            codes::UNKNOWN_TOPIC_OR_PARTITION,
            "This server does not host this topic-partition.",
        ));
    };
    let current = topic.partitions;
    if request.count < current {
        return Err(ApiError::new(
            codes::INVALID_PARTITIONS,
            format!(
                "The topic {name} currently has {current} partition(s); {} would not be an increase.",
                request.count
            ),
        ));
    }
    if request.count == current {
        return Err(ApiError::new(
            codes::INVALID_PARTITIONS,
            format!("Topic already has {current} partition(s)."),
        ));
    }
    check_new_partition_count(current, request.count).map_err(coordinator_error)?;
    if let Some(assignments) = &request.assignments {
        let added = request.count - current;
        if usize::try_from(added).ok() != Some(assignments.len()) {
            return Err(ApiError::new(
                codes::INVALID_REPLICA_ASSIGNMENT,
                format!(
                    "Attempted to add {added} additional partition(s), but only {} assignment(s) were specified.",
                    assignments.len()
                ),
            ));
        }
        let known: BTreeSet<i32> = broker.cluster.nodes.iter().map(|n| n.id).collect();
        for assignment in assignments {
            if assignment.broker_ids.is_empty() {
                return Err(ApiError::new(
                    codes::INVALID_REPLICA_ASSIGNMENT,
                    "The manual partition assignment includes an empty replica list.",
                ));
            }
            let mut seen = BTreeSet::new();
            for id in &assignment.broker_ids {
                if !known.contains(&id.0) {
                    return Err(ApiError::new(
                        codes::INVALID_REPLICA_ASSIGNMENT,
                        format!(
                            "The manual partition assignment includes broker {}, but no such broker is registered.",
                            id.0
                        ),
                    ));
                }
                if !seen.insert(id.0) {
                    return Err(ApiError::new(
                        codes::INVALID_REPLICA_ASSIGNMENT,
                        format!(
                            "The manual partition assignment includes the broker {} more than once.",
                            id.0
                        ),
                    ));
                }
            }
        }
    }
    if validate_only {
        return Ok(());
    }
    let grown = broker
        .coordinator
        .create_partitions(topic.id, request.count)
        .await;
    broker.topics.invalidate();
    grown.map_err(coordinator_error)?;
    info!(topic = %name, from = current, to = request.count, "diskless topic grown");
    if let Some(assignments) = &request.assignments {
        let assigned = (current..request.count)
            .zip(assignments)
            .map(|(p, a)| (p, a.broker_ids.iter().map(|b| b.0).collect()))
            .collect();
        if let Err(e) = broker.topics.add_assignments(topic.id, assigned).await {
            warn!(topic = %name, error = %e, "cannot keep the new partitions' replica assignments");
        }
        broker.topics.invalidate();
    }
    Ok(())
}
