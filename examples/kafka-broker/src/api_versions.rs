//! ApiVersions, and the table of what this broker handles.
//!
//! Only the versions listed here are advertised, and only those are served: a request of another
//! API or version closes the connection with a log line (as Kafka does), except ApiVersions itself,
//! which is answered with `UNSUPPORTED_VERSION` in a version-0 response that lists what is supported
//! (Kafka's rule, so that a newer client can retry with a version both sides know).

use kafka_protocol::messages::api_versions_response::{
    ApiVersion, FinalizedFeatureKey, SupportedFeatureKey,
};
use kafka_protocol::messages::{ApiKey, ApiVersionsRequest, ApiVersionsResponse};
use kafka_protocol::protocol::StrBytes;

use crate::ctx::Ctx;

/// `UNSUPPORTED_VERSION`.
pub(crate) const UNSUPPORTED_VERSION: i16 = 35;

/// The `transaction.version` feature (KIP-890, Kafka's `TransactionVersion`).
pub(crate) const TRANSACTION_VERSION: &str = "transaction.version";

/// The versions only transaction version 2 clients use (Produce v12: partitions join the
/// transaction implicitly; EndTxn v5: the epoch is bumped per transaction; TxnOffsetCommit v5:
/// the group joins implicitly; InitProducerId v5), advertised only when `transaction.version` 2 is
/// finalized (`--transaction-version 2`, the default), as a Kafka cluster does.
const TV2_MAX: &[(ApiKey, i16)] = &[
    (ApiKey::Produce, 12),
    (ApiKey::EndTxn, 5),
    (ApiKey::TxnOffsetCommit, 5),
    (ApiKey::InitProducerId, 5),
];

/// (API, min version, max version) served by this broker with transaction version 1 (see
/// [`TV2_MAX`] for 2).
pub(crate) const SUPPORTED: &[(ApiKey, i16, i16)] = &[
    (ApiKey::Produce, 3, 11),
    (ApiKey::Fetch, 4, 17),
    (ApiKey::ListOffsets, 1, 10),
    (ApiKey::Metadata, 0, 12),
    (ApiKey::OffsetCommit, 2, 8),
    (ApiKey::OffsetFetch, 1, 7),
    (ApiKey::FindCoordinator, 0, 4),
    (ApiKey::JoinGroup, 0, 9),
    (ApiKey::Heartbeat, 0, 4),
    (ApiKey::LeaveGroup, 0, 5),
    (ApiKey::SyncGroup, 0, 5),
    (ApiKey::ApiVersions, 0, 3),
    (ApiKey::CreateTopics, 2, 7),
    (ApiKey::DeleteTopics, 1, 6),
    (ApiKey::DeleteRecords, 0, 2),
    (ApiKey::InitProducerId, 0, 4),
    (ApiKey::CreatePartitions, 0, 3),
    (ApiKey::DescribeTopicPartitions, 0, 0),
    (ApiKey::DescribeConfigs, 1, 4),
    (ApiKey::IncrementalAlterConfigs, 0, 1),
    (ApiKey::AlterConfigs, 0, 2),
    (ApiKey::ListGroups, 0, 5),
    (ApiKey::DescribeGroups, 0, 5),
    (ApiKey::DeleteGroups, 0, 2),
    (ApiKey::OffsetDelete, 0, 0),
    (ApiKey::DescribeCluster, 0, 2),
    (ApiKey::DescribeProducers, 0, 0),
    // AddPartitionsToTxn v4-5 are the broker-to-coordinator verification API (not a client's).
    (ApiKey::AddPartitionsToTxn, 0, 3),
    (ApiKey::AddOffsetsToTxn, 0, 4),
    (ApiKey::EndTxn, 0, 4),
    (ApiKey::TxnOffsetCommit, 0, 4),
    (ApiKey::DescribeTransactions, 0, 0),
    (ApiKey::ListTransactions, 0, 1),
];

/// The supported version range of an API key, if any, under the finalized
/// `transaction_version`.
pub(crate) fn supported(api_key: i16, transaction_version: i16) -> Option<(ApiKey, i16, i16)> {
    let (key, min, max) = SUPPORTED
        .iter()
        .copied()
        .find(|(key, _, _)| *key as i16 == api_key)?;
    let max = match TV2_MAX.iter().find(|(k, _)| *k == key) {
        Some(&(_, tv2)) if transaction_version >= 2 => tv2,
        _ => max,
    };
    Some((key, min, max))
}

fn api_list(transaction_version: i16) -> Vec<ApiVersion> {
    SUPPORTED
        .iter()
        .filter_map(|&(key, _, _)| supported(key as i16, transaction_version))
        .map(|(key, min, max)| {
            let mut v = ApiVersion::default();
            v.api_key = key as i16;
            v.min_version = min;
            v.max_version = max;
            v
        })
        .collect()
}

/// The ApiVersions answer. From version 3 it carries the features (KIP-584): `transaction.version`
/// supported 0..=2 and finalized at the broker's level (clients of Kafka 4 read it to choose
/// between transaction versions 1 and 2). The features epoch is fixed: the level never changes
/// while the process runs.
pub(crate) fn handle(
    _ctx: &Ctx,
    _request: ApiVersionsRequest,
    transaction_version: i16,
) -> ApiVersionsResponse {
    let mut response = ApiVersionsResponse::default();
    response.api_keys = api_list(transaction_version);
    let mut supported = SupportedFeatureKey::default();
    supported.name = StrBytes::from_static_str(TRANSACTION_VERSION);
    supported.min_version = 0;
    supported.max_version = 2;
    response.supported_features = vec![supported];
    let mut finalized = FinalizedFeatureKey::default();
    finalized.name = StrBytes::from_static_str(TRANSACTION_VERSION);
    finalized.min_version_level = transaction_version;
    finalized.max_version_level = transaction_version;
    response.finalized_features = vec![finalized];
    response.finalized_features_epoch = 1;
    response
}

/// The answer to an ApiVersions request of a version this broker does not know (to be encoded as
/// version 0).
pub(crate) fn unsupported(transaction_version: i16) -> ApiVersionsResponse {
    let mut response = ApiVersionsResponse::default();
    response.error_code = UNSUPPORTED_VERSION;
    response.api_keys = api_list(transaction_version);
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advertised_versions_are_within_what_the_codec_knows() {
        for tv in [1, 2] {
            for &(key, _, _) in SUPPORTED {
                let (_, min, max) = supported(key as i16, tv).unwrap();
                let valid = key.valid_versions();
                assert!(min <= max, "{key:?}");
                assert!(
                    valid.min <= min && max <= valid.max,
                    "{key:?} {min}..={max} outside {valid}"
                );
            }
        }
    }

    /// Transaction version 2's APIs are advertised only when it is finalized.
    #[test]
    fn tv2_versions_follow_the_finalized_level() {
        assert_eq!(supported(ApiKey::EndTxn as i16, 1).unwrap().2, 4);
        assert_eq!(supported(ApiKey::EndTxn as i16, 2).unwrap().2, 5);
        assert_eq!(supported(ApiKey::Produce as i16, 1).unwrap().2, 11);
        assert_eq!(supported(ApiKey::Produce as i16, 2).unwrap().2, 12);
        assert_eq!(
            supported(ApiKey::Fetch as i16, 1),
            supported(ApiKey::Fetch as i16, 2)
        );
    }
}
