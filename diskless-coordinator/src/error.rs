//! Errors of coordinator calls as a whole (per-batch and per-partition outcomes are [`ErrorCode`]s in
//! the responses).

use crate::ErrorCode;

use diskless_common::BoxError;

/// Why a coordinator call failed as a whole.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CoordinatorError {
    /// A topic with this name or id already exists.
    #[error("topic already exists: {0}")]
    TopicAlreadyExists(String),
    /// A topic name Kafka refuses ([`crate::is_valid_topic_name`]; `INVALID_TOPIC_EXCEPTION`).
    #[error("invalid topic name: {0}")]
    InvalidTopic(String),
    /// No live topic has this id.
    #[error("unknown topic: {0}")]
    UnknownTopic(String),
    /// A partition count that Kafka refuses (`INVALID_PARTITIONS`): CreatePartitions asking for no
    /// more partitions than the topic has.
    #[error("invalid partitions: {0}")]
    InvalidPartitions(String),
    /// An object with this key was already committed; a WAL segment is committed once.
    #[error("object already committed: {0}")]
    ObjectAlreadyCommitted(String),
    /// The request breaks a rule of the API (bad partition count, empty object key, ...).
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// The call may or may not have taken effect (e.g. the connection was lost after the commit was
    /// sent). The caller must not assume either; an idempotent producer's retry is safe.
    #[error("outcome unknown: {0}")]
    OutcomeUnknown(#[source] BoxError),
    /// The call did not take effect and may be retried (the database was unreachable, busy, ...).
    #[error("coordinator unavailable: {0}")]
    Unavailable(#[source] BoxError),
    /// The coordinator's own store failed or holds data it cannot read.
    #[error("coordinator storage error: {0}")]
    Storage(#[source] BoxError),
    /// The coordinator was closed.
    #[error("coordinator closed")]
    Closed,
    /// A commit arrived after its object's commit deadline (checked inside the commit transaction,
    /// see [`crate::check_commit_deadline`]): it was refused and certainly not applied, since the
    /// orphan collector may already consider the object garbage. The producer may retry (a new segment will be written).
    #[error("commit deadline exceeded: {0}")]
    DeadlineExceeded(String),
    /// A commit of an object the orphan collector has fenced
    /// ([`crate::BatchCoordinator::fence_orphans`]): refused and certainly not applied, since the
    /// object is being deleted. The producer may retry (a new segment will be written).
    #[error("object fenced as an orphan: {0}")]
    ObjectFenced(String),
    /// An operation of a capability this coordinator does not serve
    /// ([`crate::BatchCoordinator::capabilities`]): nothing applied. A host answers Kafka's
    /// `UNSUPPORTED_VERSION`, as for an API it does not serve.
    #[error("the coordinator does not serve {0} (capability {cap})", cap = .0.capability())]
    Unsupported(crate::CoordinatorOp),
}

impl CoordinatorError {
    /// The Kafka error code a broker should answer with.
    pub fn error_code(&self) -> ErrorCode {
        match self {
            CoordinatorError::TopicAlreadyExists(_) => ErrorCode::TopicAlreadyExists,
            CoordinatorError::UnknownTopic(_) => ErrorCode::UnknownTopicOrPartition,
            CoordinatorError::InvalidTopic(_) => ErrorCode::InvalidTopicException,
            CoordinatorError::InvalidPartitions(_) => ErrorCode::InvalidPartitions,
            CoordinatorError::ObjectAlreadyCommitted(_) | CoordinatorError::InvalidRequest(_) => {
                ErrorCode::InvalidRequest
            }
            CoordinatorError::OutcomeUnknown(_)
            | CoordinatorError::DeadlineExceeded(_)
            | CoordinatorError::ObjectFenced(_) => ErrorCode::RequestTimedOut,
            CoordinatorError::Unavailable(_)
            | CoordinatorError::Storage(_)
            | CoordinatorError::Closed => ErrorCode::KafkaStorageError,
            CoordinatorError::Unsupported(_) => ErrorCode::UnsupportedVersion,
        }
    }

    /// Whether the call certainly did not take effect and may simply be retried.
    pub fn is_retriable(&self) -> bool {
        matches!(self, CoordinatorError::Unavailable(_))
    }

    /// Whether the call certainly did not take effect (so, for a commit, its object is garbage).
    /// `OutcomeUnknown`, `ObjectAlreadyCommitted` and `Storage` (which can come after a commit
    /// applied, when its answer cannot be read) are not.
    pub fn certainly_not_applied(&self) -> bool {
        matches!(
            self,
            CoordinatorError::Unavailable(_)
                | CoordinatorError::InvalidRequest(_)
                | CoordinatorError::InvalidPartitions(_)
                | CoordinatorError::Closed
                | CoordinatorError::DeadlineExceeded(_)
                | CoordinatorError::ObjectFenced(_)
                | CoordinatorError::TopicAlreadyExists(_)
                | CoordinatorError::InvalidTopic(_)
                | CoordinatorError::UnknownTopic(_)
                | CoordinatorError::Unsupported(_)
        )
    }
}
