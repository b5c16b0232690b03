//! The listener: Nisshi's own request routes over a [`DisklessStorage`], with this crate's
//! Produce and EndTxn ([`crate::services`]) in place of Nisshi's.
//!
//! `tansu_broker::Broker::listen` builds its routes inside (`tansu_broker::service::services`), so a
//! host cannot swap one handler; this accept loop is the ~40 lines of it that matter (no progress
//! spinners), building the same routes from tansu's public per-API route functions.

use std::net::SocketAddr;
use std::time::Duration;

use rama::layer::{MapErrLayer, MapStateLayer};
use rama::{Context, Layer as _, Service as _};
use tansu_broker::coordinator::group::Coordinator;
use tansu_broker::service::{auth, coordinator, storage as routes};
use tansu_sans_io::{
    ApiKey as _, CreatePartitionsRequest, EndTxnRequest, FetchRequest, ListOffsetsRequest,
    MetadataRequest, ProduceRequest,
};
use tansu_service::{
    BytesFrameLayer, FrameRequestLayer, FrameRouteBuilder, FrameRouteService, TcpBytesLayer,
    TcpContext, TcpContextLayer,
};
use tansu_storage::Storage;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::admin::CreatePartitionsService;
use crate::fetch::{FetchService, ListOffsetsService};
use crate::metadata::MetadataService;
use crate::services::{EndTxnService, ProduceService};
use crate::storage::DisklessStorage;

/// Nisshi's route-builder functions this server keeps (every one but Produce, Fetch, ListOffsets
/// and Metadata, which [`ProduceService`], [`FetchService`], [`ListOffsetsService`] and
/// [`MetadataService`] replace).
type Route<S> = fn(
    FrameRouteBuilder<(), tansu_broker::Error>,
    DisklessStorage<S>,
) -> Result<FrameRouteBuilder<(), tansu_broker::Error>, tansu_broker::Error>;

fn nisshi_routes<S: Storage>() -> [Route<S>; 22] {
    [
        routes::add_offsets_to_txn,
        routes::add_partitions_to_txn,
        routes::alter_user_scram_credentials,
        routes::consumer_group_describe,
        routes::create_acls,
        routes::create_topics,
        routes::delete_groups,
        routes::delete_records,
        routes::delete_topics,
        routes::describe_acls,
        routes::describe_cluster,
        routes::describe_configs,
        routes::describe_groups,
        routes::describe_topic_partitions,
        routes::describe_user_scram_credentials,
        routes::find_coordinator,
        routes::get_telemetry_subscriptions,
        routes::incremental_alter_configs,
        routes::init_producer_id,
        routes::list_groups,
        routes::list_partition_reassignments,
        routes::txn_offset_commit_request,
    ]
}

/// Every route: Nisshi's, this crate's (Produce, Fetch, ListOffsets, Metadata, CreatePartitions,
/// EndTxn), the group coordinator's and SASL's.
pub fn route_service<S, G>(
    storage: DisklessStorage<S>,
    groups: G,
) -> Result<FrameRouteService<(), tansu_broker::Error>, tansu_broker::Error>
where
    S: Storage,
    G: Coordinator,
{
    let builder = nisshi_routes::<S>().iter().try_fold(
        FrameRouteService::<(), tansu_broker::Error>::builder(),
        |b, route| route(b, storage.clone()),
    )?;
    // Each route of this crate: its request type and service, over a clone of the storage.
    macro_rules! route {
        ($builder:expr, $request:ty, $service:expr) => {{
            let storage = storage.clone();
            $builder.with_route(
                <$request>::KEY,
                (
                    MapErrLayer::new(tansu_broker::Error::from),
                    MapStateLayer::new(move |_| storage),
                    FrameRequestLayer::<$request>::new(),
                )
                    .into_layer($service)
                    .boxed(),
            )?
        }};
    }
    let builder = route!(builder, ProduceRequest, ProduceService);
    let builder = route!(builder, FetchRequest, FetchService);
    let builder = route!(builder, ListOffsetsRequest, ListOffsetsService);
    let builder = route!(builder, MetadataRequest, MetadataService);
    let builder = route!(builder, CreatePartitionsRequest, CreatePartitionsService);
    let builder = route!(builder, EndTxnRequest, EndTxnService);
    let builder = coordinator::services(builder, groups)?;
    let builder = auth::services(builder)?;
    builder.build().map_err(Into::into)
}

/// Serves Kafka clients on `listener` until `cancel` fires: each connection through the routes of
/// [`route_service`]; `storage.maintain` every `maintenance` (Nisshi's maintenance tick, which
/// also retries pending transaction markers).
pub async fn serve<S, G>(
    listener: TcpListener,
    cluster_id: String,
    storage: DisklessStorage<S>,
    groups: G,
    maintenance: Duration,
    cancel: CancellationToken,
) -> Result<(), tansu_broker::Error>
where
    S: Storage,
    G: Coordinator,
{
    let mut interval = tokio::time::interval(maintenance);
    let mut set = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, addr): (tokio::net::TcpStream, SocketAddr) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        warn!(error = %e, "accept failed");
                        continue;
                    }
                };
                if let Err(e) = stream.set_nodelay(true) {
                    debug!(error = %e, "set_nodelay failed");
                }
                let route = route_service(storage.clone(), groups.clone())?;
                let service = (
                    TcpContextLayer::new(TcpContext::default().cluster_id(Some(cluster_id.clone()))),
                    TcpBytesLayer::default(),
                    BytesFrameLayer::default().with_sasl_config(None),
                )
                    .into_layer(route);
                set.spawn(async move {
                    match service.serve(Context::default(), stream).await {
                        Ok(_) => {}
                        Err(tansu_broker::Error::Io(ref io))
                            if matches!(
                                io.kind(),
                                std::io::ErrorKind::UnexpectedEof
                                    | std::io::ErrorKind::BrokenPipe
                                    | std::io::ErrorKind::ConnectionReset
                            ) => {}
                        Err(e) => debug!(error = ?e, %addr, "connection ended"),
                    }
                });
            }
            _ = interval.tick() => {
                let storage = storage.clone();
                set.spawn(async move {
                    if let Err(e) = storage.maintain(storage.now()).await {
                        debug!(error = ?e, "maintenance failed");
                    }
                });
            }
            Some(_) = set.join_next(), if !set.is_empty() => {}
            _ = cancel.cancelled() => break,
        }
    }
    set.abort_all();
    while set.join_next().await.is_some() {}
    Ok(())
}
