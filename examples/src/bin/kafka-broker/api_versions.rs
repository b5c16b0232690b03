//! ApiVersions, and the table of what this broker handles.
//!
//! Only the versions listed here are advertised, and only those are served: a request of another
//! API or version closes the connection with a log line (as Kafka does), except ApiVersions itself,
//! which is answered with `UNSUPPORTED_VERSION` in a version-0 response that lists what is supported
//! (Kafka's rule, so that a newer client can retry with a version both sides know).

use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::{ApiKey, ApiVersionsRequest, ApiVersionsResponse};

use crate::server::Ctx;

/// `UNSUPPORTED_VERSION`.
pub(crate) const UNSUPPORTED_VERSION: i16 = 35;

/// (API, min version, max version) served by this broker.
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
    // Transaction version 1 (no `transaction.version` feature is advertised): AddPartitionsToTxn
    // v4-5 are the broker-to-coordinator verification API, EndTxn v5 and TxnOffsetCommit v5 TV2's.
    (ApiKey::AddPartitionsToTxn, 0, 3),
    (ApiKey::AddOffsetsToTxn, 0, 4),
    (ApiKey::EndTxn, 0, 4),
    (ApiKey::TxnOffsetCommit, 0, 4),
    (ApiKey::DescribeTransactions, 0, 0),
    (ApiKey::ListTransactions, 0, 1),
];

/// The supported version range of an API key, if any.
pub(crate) fn supported(api_key: i16) -> Option<(ApiKey, i16, i16)> {
    SUPPORTED
        .iter()
        .copied()
        .find(|(key, _, _)| *key as i16 == api_key)
}

fn api_list() -> Vec<ApiVersion> {
    SUPPORTED
        .iter()
        .map(|&(key, min, max)| {
            let mut v = ApiVersion::default();
            v.api_key = key as i16;
            v.min_version = min;
            v.max_version = max;
            v
        })
        .collect()
}

/// The ApiVersions answer.
pub(crate) fn handle(_ctx: &Ctx, _request: ApiVersionsRequest) -> ApiVersionsResponse {
    let mut response = ApiVersionsResponse::default();
    response.api_keys = api_list();
    response
}

/// The answer to an ApiVersions request of a version this broker does not know (to be encoded as
/// version 0).
pub(crate) fn unsupported() -> ApiVersionsResponse {
    let mut response = ApiVersionsResponse::default();
    response.error_code = UNSUPPORTED_VERSION;
    response.api_keys = api_list();
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advertised_versions_are_within_what_the_codec_knows() {
        for &(key, min, max) in SUPPORTED {
            let valid = key.valid_versions();
            assert!(min <= max, "{key:?}");
            assert!(
                valid.min <= min && max <= valid.max,
                "{key:?} {min}..={max} outside {valid}"
            );
        }
    }
}
