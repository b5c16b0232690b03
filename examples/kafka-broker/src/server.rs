//! Listeners, connections, framing and dispatch.
//!
//! A connection is served by the library's [`diskless_core::connection::serve`] (framing, Kafka's
//! request ordering, consecutive Produce requests in flight together); this module decodes each
//! request's header and body with `kafka-protocol` and hands it to its handler. Handlers run
//! concurrently, but responses go out in request order (Kafka's rule); Produce requests enter the
//! `WalWriter` in the order they were read, so an idempotent producer's pipelined requests keep
//! their sequence order. A frame that is too large, truncated or does not decode closes the
//! connection with a log line; a request of an
//! API or version this broker does not serve too (after logging why), except ApiVersions, which gets
//! `UNSUPPORTED_VERSION` (see [`crate::api_versions`]).

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::{Buf, Bytes};
use diskless_core::connection::{self, ConnectionLimits, RequestFrame};
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, CreateTopicsRequest, DeleteRecordsRequest, DeleteTopicsRequest,
    FetchRequest, FindCoordinatorRequest, HeartbeatRequest, InitProducerIdRequest,
    JoinGroupRequest, LeaveGroupRequest, ListOffsetsRequest, MetadataRequest, OffsetCommitRequest,
    OffsetFetchRequest, ProduceRequest, RequestHeader, SyncGroupRequest,
};
use kafka_protocol::protocol::Decodable;
use tokio::net::{TcpListener, TcpStream};
use tracing::{debug, info, warn};

use crate::broker::Broker;
use crate::config::Config;
use crate::ctx::{Ctx, encode_response};
use crate::{api_versions, fetch, groups, metadata, offsets, produce};

/// The encoded response of one request (`None`: no response, as for `acks=0`), or why the
/// connection must close.
type Reply = connection::Answer;

/// Runs the brokers until Ctrl-C or SIGTERM.
pub async fn run(config: Config) -> Result<(), String> {
    // The recorder first, so that every series the library emits from the start is kept.
    let metrics_task = match config.metrics_addr {
        Some(addr) => Some(
            diskless_core::prometheus::start(addr)
                .await
                .map_err(|e| e.to_string())?,
        ),
        None => None,
    };
    let broker = Broker::open(&config).await?;
    // Consumer groups as they were before the restart, before the first client asks.
    broker
        .groups
        .load(&broker.store)
        .await
        .map_err(|code| format!("cannot load the consumer groups from broker.db (error {code})"))?;
    // Transactions as they were: those being ended are completed, ongoing ones time out.
    crate::txn::load(&broker)
        .await
        .map_err(|e| format!("cannot load the transactions from broker.db: {e}"))?;
    broker.create_startup_topics(&config.create_topics).await?;
    let mut listeners = Vec::new();
    for l in &config.listeners {
        let listener = TcpListener::bind(l.bind)
            .await
            .map_err(|e| format!("broker {}: cannot listen on {}: {e}", l.node_id, l.bind))?;
        info!(
            node_id = l.node_id,
            listener = %l.bind,
            advertised = %format!("{}:{}", l.advertised_host, l.bind.port()),
            rack = %l.rack,
            "broker listening"
        );
        listeners.push((l.node_id, listener));
    }
    let groups_task = tokio::spawn(broker.groups.clone().run_expiry());
    let txn_task = tokio::spawn(crate::txn::run_sweeper(broker.clone()));
    let accept_tasks: Vec<_> = listeners
        .into_iter()
        .map(|(node, listener)| tokio::spawn(accept_loop(node, listener, broker.clone())))
        .collect();
    info!(
        brokers = config.listeners.len(),
        "kafka-broker ready (diskless topics; stop with Ctrl-C)"
    );
    shutdown_signal().await;
    info!("shutting down: flushing the WAL writers");
    for t in &accept_tasks {
        t.abort();
    }
    groups_task.abort();
    txn_task.abort();
    broker.close().await;
    if let Some(task) = metrics_task {
        task.abort();
    }
    info!("stopped");
    Ok(())
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(e) => {
                warn!(error = %e, "cannot watch SIGTERM; stop with Ctrl-C");
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

async fn accept_loop(node: i32, listener: TcpListener, broker: Arc<Broker>) {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                let _ = stream.set_nodelay(true);
                tokio::spawn(connection(node, stream, peer, broker.clone()));
            }
            Err(e) => {
                warn!(node, error = %e, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
    }
}

/// Serves one connection with the library's connection discipline
/// ([`diskless_core::connection::serve`]): requests take effect in the order they arrive, as on a
/// Kafka broker, except that consecutive Produce requests overlap (a Produce appends to the writer
/// before the next request is read, and its answer comes with its segment's commit), so a client
/// keeping several produce requests in flight (idempotent producers keep up to 5) is not held to
/// one per commit. Answers are written in request order.
async fn connection(node: i32, stream: TcpStream, peer: SocketAddr, broker: Arc<Broker>) {
    debug!(node, %peer, "connection opened");
    let (rd, wr) = stream.into_split();
    connection::serve(
        rd,
        wr,
        ConnectionLimits::default(),
        peer,
        |frame: RequestFrame| dispatch(node, peer, frame.request(), &broker),
    )
    .await;
    debug!(node, %peer, "connection closed");
}

fn ready(bytes: Result<Bytes, String>) -> Reply {
    tokio::spawn(async move { bytes.map(Some) })
}

/// Decodes a request and starts its handler.
async fn dispatch(
    node: i32,
    peer: SocketAddr,
    frame: Bytes,
    broker: &Arc<Broker>,
) -> Result<Option<Reply>, String> {
    if frame.len() < 8 {
        return Err(format!(
            "malformed frame: {} bytes, no request header",
            frame.len()
        ));
    }
    let mut peek = &frame[..8];
    let api_key = peek.get_i16();
    let version = peek.get_i16();
    let correlation_id = peek.get_i32();
    let Some((api, min, max)) = api_versions::supported(api_key, broker.transaction_version) else {
        return Err(format!(
            "unsupported request: API key {api_key} (version {version}) is not served by this broker"
        ));
    };
    let mut ctx = Ctx {
        node,
        peer,
        api_key: api,
        version,
        correlation_id,
        client_id: String::new(),
    };
    if !(min..=max).contains(&version) {
        if api == ApiKey::ApiVersions {
            debug!(%peer, version, "ApiVersions of an unsupported version: answering UNSUPPORTED_VERSION");
            return Ok(Some(ready(encode_response(
                &ctx,
                0,
                &api_versions::unsupported(broker.transaction_version),
            ))));
        }
        return Err(format!(
            "unsupported request: {api:?} version {version} (this broker serves {min}..={max})"
        ));
    }
    let mut buf = frame;
    let header = RequestHeader::decode(&mut buf, api.request_header_version(version))
        .map_err(|e| format!("malformed {api:?} v{version} request header: {e:#}"))?;
    ctx.client_id = header
        .client_id
        .as_ref()
        .map(|s| s.as_str().to_string())
        .unwrap_or_default();

    macro_rules! decode {
        ($ty:ty) => {
            <$ty>::decode(&mut buf, version).map_err(|e| {
                format!(
                    "malformed {api:?} v{version} request from client {:?}: {e:#}",
                    ctx.client_id
                )
            })?
        };
    }
    macro_rules! spawn {
        ($req:expr, $handler:path) => {{
            let request = $req;
            let broker = broker.clone();
            Ok(Some(tokio::spawn(async move {
                let response = $handler(&broker, &ctx, request).await;
                encode_response(&ctx, ctx.version, &response).map(Some)
            })))
        }};
    }

    match api {
        ApiKey::ApiVersions => {
            let request = decode!(ApiVersionsRequest);
            Ok(Some(ready(encode_response(
                &ctx,
                version,
                &api_versions::handle(&ctx, request, broker.transaction_version),
            ))))
        }
        ApiKey::Produce => {
            let request = decode!(ProduceRequest);
            produce::produce(broker, ctx, request).await
        }
        ApiKey::Fetch => spawn!(decode!(FetchRequest), fetch::fetch),
        ApiKey::ListOffsets => spawn!(decode!(ListOffsetsRequest), fetch::list_offsets),
        ApiKey::DeleteRecords => spawn!(decode!(DeleteRecordsRequest), fetch::delete_records),
        ApiKey::Metadata => spawn!(decode!(MetadataRequest), metadata::metadata),
        ApiKey::CreateTopics => spawn!(decode!(CreateTopicsRequest), metadata::create_topics),
        ApiKey::DeleteTopics => spawn!(decode!(DeleteTopicsRequest), metadata::delete_topics),
        ApiKey::InitProducerId => {
            spawn!(decode!(InitProducerIdRequest), produce::init_producer_id)
        }
        ApiKey::FindCoordinator => {
            spawn!(decode!(FindCoordinatorRequest), groups::find_coordinator)
        }
        ApiKey::JoinGroup => spawn!(decode!(JoinGroupRequest), groups::join_group),
        ApiKey::SyncGroup => spawn!(decode!(SyncGroupRequest), groups::sync_group),
        ApiKey::Heartbeat => spawn!(decode!(HeartbeatRequest), groups::heartbeat),
        ApiKey::LeaveGroup => spawn!(decode!(LeaveGroupRequest), groups::leave_group),
        ApiKey::OffsetCommit => spawn!(decode!(OffsetCommitRequest), offsets::offset_commit),
        ApiKey::OffsetFetch => spawn!(decode!(OffsetFetchRequest), offsets::offset_fetch),
        ApiKey::DescribeCluster => spawn!(
            decode!(kafka_protocol::messages::DescribeClusterRequest),
            crate::cluster_admin::describe_cluster
        ),
        ApiKey::DescribeProducers => spawn!(
            decode!(kafka_protocol::messages::DescribeProducersRequest),
            crate::cluster_admin::describe_producers
        ),
        ApiKey::ListGroups => spawn!(
            decode!(kafka_protocol::messages::ListGroupsRequest),
            groups::list_groups
        ),
        ApiKey::DescribeGroups => spawn!(
            decode!(kafka_protocol::messages::DescribeGroupsRequest),
            groups::describe_groups
        ),
        ApiKey::DeleteGroups => spawn!(
            decode!(kafka_protocol::messages::DeleteGroupsRequest),
            groups::delete_groups
        ),
        ApiKey::OffsetDelete => spawn!(
            decode!(kafka_protocol::messages::OffsetDeleteRequest),
            offsets::offset_delete
        ),
        ApiKey::DescribeConfigs => spawn!(
            decode!(kafka_protocol::messages::DescribeConfigsRequest),
            crate::admin_configs::describe_configs
        ),
        ApiKey::IncrementalAlterConfigs => spawn!(
            decode!(kafka_protocol::messages::IncrementalAlterConfigsRequest),
            crate::admin_configs::incremental_alter_configs
        ),
        ApiKey::AlterConfigs => spawn!(
            decode!(kafka_protocol::messages::AlterConfigsRequest),
            crate::admin_configs::alter_configs
        ),
        ApiKey::CreatePartitions => spawn!(
            decode!(kafka_protocol::messages::CreatePartitionsRequest),
            crate::admin_partitions::create_partitions
        ),
        ApiKey::AddPartitionsToTxn => spawn!(
            decode!(kafka_protocol::messages::AddPartitionsToTxnRequest),
            crate::txn::add_partitions_to_txn
        ),
        ApiKey::AddOffsetsToTxn => spawn!(
            decode!(kafka_protocol::messages::AddOffsetsToTxnRequest),
            crate::txn::add_offsets_to_txn
        ),
        ApiKey::EndTxn => spawn!(
            decode!(kafka_protocol::messages::EndTxnRequest),
            crate::txn::end_txn
        ),
        ApiKey::TxnOffsetCommit => spawn!(
            decode!(kafka_protocol::messages::TxnOffsetCommitRequest),
            crate::txn::txn_offset_commit
        ),
        ApiKey::DescribeTransactions => spawn!(
            decode!(kafka_protocol::messages::DescribeTransactionsRequest),
            crate::txn::describe_transactions
        ),
        ApiKey::ListTransactions => spawn!(
            decode!(kafka_protocol::messages::ListTransactionsRequest),
            crate::txn::list_transactions
        ),
        ApiKey::DescribeTopicPartitions => spawn!(
            decode!(kafka_protocol::messages::DescribeTopicPartitionsRequest),
            crate::describe_partitions::describe_topic_partitions
        ),
        other => Err(format!("unsupported request: {other:?} version {version}")),
    }
}
