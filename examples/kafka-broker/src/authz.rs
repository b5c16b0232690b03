//! The authorized operations an authorizer-less Kafka broker reports: every operation a resource
//! supports (Kafka's `AclEntry.supportedOperations`, what `AuthHelper.authorizedOperations` answers
//! without an authorizer), as the bit fields of Metadata, DescribeCluster and
//! DescribeTopicPartitions.

/// The ACL operation codes a CLUSTER resource supports (Kafka's `AclEntry.supportedOperations`):
/// CREATE 5, ALTER 7, DESCRIBE 8, CLUSTER_ACTION 9, DESCRIBE_CONFIGS 10, ALTER_CONFIGS 11,
/// IDEMPOTENT_WRITE 12.
const CLUSTER_OPERATIONS: [u8; 7] = [5, 7, 8, 9, 10, 11, 12];

/// The ACL operation codes a TOPIC resource supports (Kafka's `AclEntry.supportedOperations`):
/// READ 3, WRITE 4, CREATE 5, DELETE 6, ALTER 7, DESCRIBE 8, DESCRIBE_CONFIGS 10, ALTER_CONFIGS 11.
const TOPIC_OPERATIONS: [u8; 8] = [3, 4, 5, 6, 7, 8, 10, 11];

/// Kafka's `Utils.to32BitField` of [`CLUSTER_OPERATIONS`]: what an authorizer-less broker allows.
pub(crate) fn cluster_authorized_operations() -> i32 {
    CLUSTER_OPERATIONS
        .iter()
        .fold(0i32, |bits, op| bits | (1i32 << op))
}

/// Kafka's `Utils.to32BitField` of [`TOPIC_OPERATIONS`]: what an authorizer-less broker allows.
pub(crate) fn topic_authorized_operations() -> i32 {
    TOPIC_OPERATIONS
        .iter()
        .fold(0i32, |bits, op| bits | (1i32 << op))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_authorizer_less_kafka_allows_every_cluster_operation() {
        // CREATE, ALTER, DESCRIBE, CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS, IDEMPOTENT_WRITE.
        assert_eq!(cluster_authorized_operations(), 0b1_1111_1010_0000);
        assert_eq!(cluster_authorized_operations(), 8096);
    }
}
