//! Kafka protocol error codes used by diskless topics.
//!
//! The numbers are Kafka's own (`org.apache.kafka.common.protocol.Errors`), so a host broker can put
//! [`ErrorCode::code`] straight into a response.

/// A Kafka protocol error code, as carried in Produce, Fetch, ListOffsets and DeleteRecords responses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
#[repr(i16)]
pub enum ErrorCode {
    /// The server experienced an unexpected error (-1).
    UnknownServerError = -1,
    /// No error (0).
    None = 0,
    /// The requested offset is outside the range the partition holds (1).
    OffsetOutOfRange = 1,
    /// A message failed its CRC check or could not be framed (2).
    CorruptMessage = 2,
    /// The topic or partition does not exist (3).
    UnknownTopicOrPartition = 3,
    /// The broker is not the leader or follower of the partition (6).
    NotLeaderOrFollower = 6,
    /// The request timed out (7).
    RequestTimedOut = 7,
    /// A batch is larger than `max.message.bytes` (10).
    MessageTooLarge = 10,
    /// A topic name Kafka refuses: empty, longer than 249 characters, `.` or `..`, or with a
    /// character outside `[a-zA-Z0-9._-]` (17; [`crate::is_valid_topic_name`]).
    InvalidTopicException = 17,
    /// Fewer in-sync replicas than required; Kafka's partition leader also answers it for a
    /// transaction verification that could not complete, so old clients retry (19).
    NotEnoughReplicas = 19,
    /// A record's timestamp is out of the accepted range (32).
    InvalidTimestamp = 32,
    /// The version of the API is not supported (35); also what a host answers for an operation
    /// its coordinator does not serve ([`crate::CoordinatorError::Unsupported`]).
    UnsupportedVersion = 35,
    /// The topic already exists (36).
    TopicAlreadyExists = 36,
    /// The partition count is invalid (37).
    InvalidPartitions = 37,
    /// A topic configuration value is invalid (40).
    InvalidConfig = 40,
    /// The request is malformed or not allowed (42).
    InvalidRequest = 42,
    /// The producer sent a sequence number that does not follow the last one (45).
    OutOfOrderSequenceNumber = 45,
    /// The producer's epoch is older than the one the partition knows (47).
    InvalidProducerEpoch = 47,
    /// The producer attempted a transactional operation in an invalid state: a transactional batch
    /// outside a transaction the partition knows of, a plain batch during one (48).
    InvalidTxnState = 48,
    /// The producer id is not the one the transactional id is mapped to (49).
    InvalidProducerIdMapping = 49,
    /// The transaction coordinator is busy completing the producer's previous transaction (51).
    ConcurrentTransactions = 51,
    /// A transaction marker came from a transaction coordinator older than the last one seen (52).
    TransactionCoordinatorFenced = 52,
    /// A storage error on the broker; the client may retry (56).
    KafkaStorageError = 56,
    /// The producer id is not known to the partition (59).
    UnknownProducerId = 59,
    /// The request's version cannot carry the codec: a ZStandard batch in Produce v3 to v6, or
    /// Fetch v4 to v9 of a topic whose `compression.type` is `zstd` (76).
    UnsupportedCompressionType = 76,
    /// A record failed validation (87).
    InvalidRecord = 87,
    /// A newer producer with the same transactional id has fenced this one (90).
    ProducerFenced = 90,
    /// The transaction cannot go on but may be aborted by the producer (120).
    TransactionAbortable = 120,
}

impl ErrorCode {
    /// The numeric Kafka error code.
    pub fn code(self) -> i16 {
        self as i16
    }

    /// Whether this code means success.
    pub fn is_ok(self) -> bool {
        self == ErrorCode::None
    }

    /// Whether a client may retry the request that got this error (Kafka's `RetriableException`).
    pub fn is_retriable(self) -> bool {
        matches!(
            self,
            ErrorCode::CorruptMessage
                | ErrorCode::UnknownTopicOrPartition
                | ErrorCode::NotLeaderOrFollower
                | ErrorCode::NotEnoughReplicas
                | ErrorCode::ConcurrentTransactions
                | ErrorCode::RequestTimedOut
                | ErrorCode::OutOfOrderSequenceNumber
                | ErrorCode::KafkaStorageError
        )
    }

    /// The code for a number, if diskless-rs knows it.
    pub fn from_code(code: i16) -> Option<ErrorCode> {
        use ErrorCode::*;
        [
            UnknownServerError,
            None,
            OffsetOutOfRange,
            CorruptMessage,
            UnknownTopicOrPartition,
            NotLeaderOrFollower,
            RequestTimedOut,
            MessageTooLarge,
            InvalidTopicException,
            NotEnoughReplicas,
            InvalidTimestamp,
            UnsupportedVersion,
            TopicAlreadyExists,
            InvalidPartitions,
            InvalidConfig,
            InvalidRequest,
            OutOfOrderSequenceNumber,
            InvalidProducerEpoch,
            InvalidTxnState,
            InvalidProducerIdMapping,
            ConcurrentTransactions,
            TransactionCoordinatorFenced,
            KafkaStorageError,
            UnknownProducerId,
            UnsupportedCompressionType,
            InvalidRecord,
            ProducerFenced,
            TransactionAbortable,
        ]
        .into_iter()
        .find(|c| c.code() == code)
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self {
            ErrorCode::UnknownServerError => "UNKNOWN_SERVER_ERROR",
            ErrorCode::None => "NONE",
            ErrorCode::OffsetOutOfRange => "OFFSET_OUT_OF_RANGE",
            ErrorCode::CorruptMessage => "CORRUPT_MESSAGE",
            ErrorCode::UnknownTopicOrPartition => "UNKNOWN_TOPIC_OR_PARTITION",
            ErrorCode::NotLeaderOrFollower => "NOT_LEADER_OR_FOLLOWER",
            ErrorCode::RequestTimedOut => "REQUEST_TIMED_OUT",
            ErrorCode::MessageTooLarge => "MESSAGE_TOO_LARGE",
            ErrorCode::InvalidTopicException => "INVALID_TOPIC_EXCEPTION",
            ErrorCode::NotEnoughReplicas => "NOT_ENOUGH_REPLICAS",
            ErrorCode::InvalidTimestamp => "INVALID_TIMESTAMP",
            ErrorCode::UnsupportedVersion => "UNSUPPORTED_VERSION",
            ErrorCode::TopicAlreadyExists => "TOPIC_ALREADY_EXISTS",
            ErrorCode::InvalidPartitions => "INVALID_PARTITIONS",
            ErrorCode::InvalidConfig => "INVALID_CONFIG",
            ErrorCode::InvalidRequest => "INVALID_REQUEST",
            ErrorCode::OutOfOrderSequenceNumber => "OUT_OF_ORDER_SEQUENCE_NUMBER",
            ErrorCode::InvalidProducerEpoch => "INVALID_PRODUCER_EPOCH",
            ErrorCode::InvalidTxnState => "INVALID_TXN_STATE",
            ErrorCode::InvalidProducerIdMapping => "INVALID_PRODUCER_ID_MAPPING",
            ErrorCode::ConcurrentTransactions => "CONCURRENT_TRANSACTIONS",
            ErrorCode::TransactionCoordinatorFenced => "TRANSACTION_COORDINATOR_FENCED",
            ErrorCode::KafkaStorageError => "KAFKA_STORAGE_ERROR",
            ErrorCode::UnknownProducerId => "UNKNOWN_PRODUCER_ID",
            ErrorCode::UnsupportedCompressionType => "UNSUPPORTED_COMPRESSION_TYPE",
            ErrorCode::InvalidRecord => "INVALID_RECORD",
            ErrorCode::ProducerFenced => "PRODUCER_FENCED",
            ErrorCode::TransactionAbortable => "TRANSACTION_ABORTABLE",
        };
        write!(f, "{name} ({})", self.code())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_match_kafka() {
        assert_eq!(ErrorCode::CorruptMessage.code(), 2);
        assert_eq!(ErrorCode::InvalidRecord.code(), 87);
        assert_eq!(ErrorCode::OutOfOrderSequenceNumber.code(), 45);
        assert_eq!(ErrorCode::InvalidTxnState.code(), 48);
        assert_eq!(ErrorCode::TransactionCoordinatorFenced.code(), 52);
        assert_eq!(ErrorCode::ProducerFenced.code(), 90);
        assert_eq!(ErrorCode::TransactionAbortable.code(), 120);
        for code in -1..=200 {
            if let Some(c) = ErrorCode::from_code(code) {
                assert_eq!(c.code(), code);
            }
        }
        assert_eq!(ErrorCode::from_code(1000), None);
    }
}
