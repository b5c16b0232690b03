//! CreatePartitions, which tansu 0.6.0 does not route ([`CreatePartitionsService`]): a diskless
//! topic grows in the batch coordinator (`BatchCoordinator::create_partitions`, with the library's
//! `check_new_partition_count`), and [`DisklessStorage`]'s Metadata and DescribeTopicPartitions
//! answers report the new partitions. A classic topic cannot grow: Nisshi's engine has no call
//! for it, so it is refused with `INVALID_REQUEST`.

use std::collections::BTreeSet;

use diskless_coordinator::{TopicInfo, check_new_partition_count};
use rama::{Context, Service};
use tansu_sans_io::{
    ApiKey, CreatePartitionsRequest, CreatePartitionsResponse, ErrorCode,
    create_partitions_request::CreatePartitionsTopic,
    create_partitions_response::CreatePartitionsTopicResult,
};
use tansu_storage::{Error, Storage, TopicId};
use tracing::info;

use crate::convert;
use crate::storage::DisklessStorage;

/// CreatePartitions. See the [module documentation](self).
#[derive(Clone, Copy, Debug, Default)]
pub struct CreatePartitionsService;

impl ApiKey for CreatePartitionsService {
    const KEY: i16 = CreatePartitionsRequest::KEY;
}

impl<S: Storage> Service<DisklessStorage<S>, CreatePartitionsRequest> for CreatePartitionsService {
    type Response = CreatePartitionsResponse;
    type Error = Error;

    async fn serve(
        &self,
        ctx: Context<DisklessStorage<S>>,
        req: CreatePartitionsRequest,
    ) -> Result<CreatePartitionsResponse, Error> {
        let storage = ctx.state();
        let topics = req.topics.unwrap_or_default();
        let mut seen = BTreeSet::new();
        let duplicates: BTreeSet<String> = topics
            .iter()
            .filter(|t| !seen.insert(t.name.clone()))
            .map(|t| t.name.clone())
            .collect();
        let mut results = Vec::with_capacity(topics.len());
        for topic in &topics {
            let outcome = if duplicates.contains(&topic.name) {
                Err((
                    ErrorCode::InvalidRequest,
                    "Duplicate topic name.".to_string(),
                ))
            } else {
                grow(storage, topic, req.validate_only).await?
            };
            let (code, message) = match outcome {
                Ok(()) => (ErrorCode::None, None),
                Err((code, message)) => (code, Some(message)),
            };
            results.push(
                CreatePartitionsTopicResult::default()
                    .name(topic.name.clone())
                    .error_code(code.into())
                    .error_message(message),
            );
        }
        Ok(CreatePartitionsResponse::default()
            .throttle_time_ms(0)
            .results(Some(results)))
    }
}

/// One topic: `Ok(Err(..))` is the topic's error answer, `Err` a failure of the whole request.
async fn grow<S: Storage>(
    storage: &DisklessStorage<S>,
    topic: &CreatePartitionsTopic,
    validate_only: bool,
) -> Result<Result<(), (ErrorCode, String)>, Error> {
    let Some(info) = storage.diskless_topic(&topic.name).await? else {
        let known = storage
            .inner()
            .metadata(Some(&[TopicId::Name(topic.name.clone())]))
            .await?
            .topics()
            .first()
            .is_some_and(|t| t.error_code == i16::from(ErrorCode::None));
        return Ok(Err(if known {
            (
                ErrorCode::InvalidRequest,
                format!(
                    "{} is a classic topic: Nisshi 0.6.0's engine cannot add partitions to it",
                    topic.name
                ),
            )
        } else {
            (
                ErrorCode::UnknownTopicOrPartition,
                "This server does not host this topic-partition.".to_string(),
            )
        }));
    };
    if let Err(e) = check_new_partition_count(info.partitions, topic.count) {
        return Ok(Err((convert::code(e.error_code()), e.to_string())));
    }
    if let Some(assignments) = &topic.assignments {
        let added = topic.count - info.partitions;
        if usize::try_from(added).ok() != Some(assignments.len()) {
            return Ok(Err((
                ErrorCode::InvalidReplicaAssignment,
                format!(
                    "Attempted to add {added} additional partition(s), but only {} assignment(s) were specified.",
                    assignments.len()
                ),
            )));
        }
    }
    if validate_only {
        return Ok(Ok(()));
    }
    if let Err(e) = storage
        .shared
        .coordinator
        .create_partitions(info.topic_id, topic.count)
        .await
    {
        return Ok(Err((convert::code(e.error_code()), e.to_string())));
    }
    storage
        .note_topic(TopicInfo {
            partitions: topic.count,
            ..info.clone()
        })
        .await;
    info!(topic = %info.name, from = info.partitions, to = topic.count, "diskless topic grown");
    Ok(Ok(()))
}
