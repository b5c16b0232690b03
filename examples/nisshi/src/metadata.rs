//! Metadata with Kafka's automatic topic creation (`auto.create.topics.enable`), which tansu
//! 0.6.0 does not have: its Metadata route answers `UNKNOWN_TOPIC_OR_PARTITION` for a topic that
//! does not exist, whatever the request's `allow_auto_topic_creation`.
//!
//! [`MetadataService`] answers as Nisshi's route does (the same fields, from
//! [`DisklessStorage`]'s `metadata`); when the node is started with automatic creation
//! ([`crate::DisklessSettings::auto_create_partitions`]) and the request allows it (Metadata v4+'s
//! `allow_auto_topic_creation`, always for older versions, as Kafka does), each named topic that
//! does not exist and has a valid Kafka topic name is created first, through the same
//! `create_topic` as CreateTopics (so `--diskless-default` makes it diskless), with the
//! configured partition count and replication factor 1. A named topic whose name Kafka would
//! refuse is answered `INVALID_TOPIC_EXCEPTION`, as Kafka does.

use diskless_coordinator::is_valid_topic_name;
use rama::{Context, Service};
use tansu_sans_io::create_topics_request::CreatableTopic;
use tansu_sans_io::{ApiKey, ErrorCode, MetadataRequest, MetadataResponse};
use tansu_storage::{Error, Storage, TopicId};
use tracing::{debug, info};

use crate::storage::DisklessStorage;

/// Metadata. See the [module documentation](self).
#[derive(Clone, Copy, Debug, Default)]
pub struct MetadataService;

impl ApiKey for MetadataService {
    const KEY: i16 = MetadataRequest::KEY;
}

impl<S: Storage> Service<DisklessStorage<S>, MetadataRequest> for MetadataService {
    type Response = MetadataResponse;
    type Error = Error;

    async fn serve(
        &self,
        ctx: Context<DisklessStorage<S>>,
        req: MetadataRequest,
    ) -> Result<MetadataResponse, Error> {
        let storage = ctx.state();
        let topics = req
            .topics
            .as_ref()
            .map(|topics| topics.iter().map(TopicId::from).collect::<Vec<_>>());
        let mut response = storage.metadata(topics.as_deref()).await?;
        if let Some(partitions) = storage.auto_create_partitions()
            && req.allow_auto_topic_creation.unwrap_or(true)
        {
            let missing: Vec<String> = response
                .topics()
                .iter()
                .filter(|t| t.error_code == i16::from(ErrorCode::UnknownTopicOrPartition))
                .filter_map(|t| t.name.clone())
                // Named in the request (not looked up by id), a valid name, not internal.
                .filter(|name| {
                    is_valid_topic_name(name)
                        && !name.starts_with("__")
                        && topics.as_deref().is_some_and(|ids| {
                            ids.iter()
                                .any(|id| matches!(id, TopicId::Name(n) if n == name))
                        })
                })
                .collect();
            let mut created = false;
            for name in missing {
                let topic = CreatableTopic::default()
                    .name(name.clone())
                    .num_partitions(partitions)
                    .replication_factor(1)
                    .assignments(Some(Vec::new()))
                    .configs(Some(Vec::new()));
                match storage.create_topic(topic, false).await {
                    Ok(id) => {
                        info!(topic = %name, %id, partitions, "topic created automatically");
                        created = true;
                    }
                    // Created meanwhile by another request: listed by the second read.
                    Err(Error::Api(ErrorCode::TopicAlreadyExists)) => created = true,
                    Err(e) => debug!(error = ?e, topic = %name, "automatic creation failed"),
                }
            }
            if created {
                response = storage.metadata(topics.as_deref()).await?;
            }
        }
        // As Kafka answers a named topic that cannot exist: INVALID_TOPIC_EXCEPTION, so that a
        // producer fails its records at once rather than waiting for the topic until they time
        // out (librdkafka 0057_invalid_topic).
        let mut listed = response.topics().to_owned();
        for t in &mut listed {
            if t.error_code == i16::from(ErrorCode::UnknownTopicOrPartition)
                && t.name
                    .as_deref()
                    .is_some_and(|name| !is_valid_topic_name(name))
            {
                t.error_code = ErrorCode::InvalidTopicException.into();
            }
        }
        Ok(MetadataResponse::default()
            .throttle_time_ms(Some(0))
            .brokers(Some(response.brokers().to_owned()))
            .cluster_id(response.cluster().map(Into::into))
            .controller_id(response.controller())
            .topics(Some(listed))
            .cluster_authorized_operations(Some(-1)))
    }
}
