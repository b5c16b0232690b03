//! Kafka error codes used by the example broker beyond those of `diskless_coordinator::ErrorCode`.

pub(crate) const NONE: i16 = 0;
pub(crate) const UNKNOWN_SERVER_ERROR: i16 = -1;
pub(crate) const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
pub(crate) const COORDINATOR_NOT_AVAILABLE: i16 = 15;
pub(crate) const INVALID_TOPIC_EXCEPTION: i16 = 17;
pub(crate) const ILLEGAL_GENERATION: i16 = 22;
pub(crate) const INCONSISTENT_GROUP_PROTOCOL: i16 = 23;
pub(crate) const INVALID_GROUP_ID: i16 = 24;
pub(crate) const UNKNOWN_MEMBER_ID: i16 = 25;
pub(crate) const INVALID_SESSION_TIMEOUT: i16 = 26;
pub(crate) const REBALANCE_IN_PROGRESS: i16 = 27;
pub(crate) const TOPIC_ALREADY_EXISTS: i16 = 36;
pub(crate) const INVALID_PARTITIONS: i16 = 37;
pub(crate) const INVALID_REPLICATION_FACTOR: i16 = 38;
pub(crate) const INVALID_REPLICA_ASSIGNMENT: i16 = 39;
pub(crate) const INVALID_CONFIG: i16 = 40;
pub(crate) const INVALID_REQUEST: i16 = 42;
pub(crate) const KAFKA_STORAGE_ERROR: i16 = 56;
pub(crate) const UNKNOWN_TOPIC_ID: i16 = 100;
