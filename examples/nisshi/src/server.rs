//! The listener: Nisshi's own request routes over a [`DisklessStorage`], with this crate's
//! Produce and EndTxn ([`crate::services`]) in place of Nisshi's.
//!
//! `tansu_broker::Broker::listen` builds its routes inside (`tansu_broker::service::services`), so a
//! host cannot swap one handler; this accept loop builds the same routes from tansu's public
//! per-API route functions.
//!
//! Each connection is served by the library's [`diskless_core::connection::serve`], not by
//! tansu-service's `TcpBytesLayer`: that one handles a connection's requests strictly one at a
//! time, so an idempotent producer keeping five Produce requests in flight had each wait the
//! previous one's diskless commit (~100 ms: one WAL segment per request, produce at 0.22x the
//! example broker). Here consecutive Produce requests overlap, as in the example broker: each
//! enters the writer in request order, then waits for its commit while the next one is read.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use diskless_core::connection::{self, ConnectionLimits, RequestFrame};
use rama::layer::{MapErrLayer, MapStateLayer};
use rama::{Layer as _, Service as _};
use tansu_broker::coordinator::group::Coordinator;
use tansu_broker::service::{auth, coordinator, storage as routes};
use tansu_sans_io::{
    ApiKey as _, CreatePartitionsRequest, DescribeProducersRequest, EndTxnRequest, FetchRequest,
    ListOffsetsRequest, MetadataRequest, ProduceRequest, WriteTxnMarkersRequest,
};
use tansu_service::{BytesFrameLayer, FrameRequestLayer, FrameRouteBuilder, FrameRouteService};
use tansu_storage::Storage;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::admin::CreatePartitionsService;
use crate::fetch::{FetchService, ListOffsetsService};
use crate::metadata::MetadataService;
use crate::services::{EndTxnService, ProduceService};
use crate::storage::DisklessStorage;
use crate::txn_admin;

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
/// EndTxn, DescribeProducers, WriteTxnMarkers), the group coordinator's and SASL's.
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
    let builder = route!(
        builder,
        DescribeProducersRequest,
        txn_admin::DescribeProducersService
    );
    let builder = route!(
        builder,
        WriteTxnMarkersRequest,
        txn_admin::WriteTxnMarkersService
    );
    let builder = coordinator::services(builder, groups)?;
    let builder = auth::services(builder)?;
    builder.build().map_err(Into::into)
}

/// Serves Kafka clients on `listener` until `cancel` fires: each connection through the routes of
/// [`route_service`]; `storage.maintain` every `maintenance` (Nisshi's maintenance tick, which
/// also retries pending transaction markers).
pub async fn serve<S, G>(
    listener: TcpListener,
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
                let route = route_service(storage.clone(), groups.clone())?;
                let frames = BytesFrameLayer::default().with_sasl_config(None);
                set.spawn(connection(
                    Arc::new(frames.into_layer(route)),
                    storage.clone(),
                    stream,
                    addr,
                ));
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

tokio::task_local! {
    /// Set by [`connection`] around the handling of a Produce request; [`produce_ordered`] fires it.
    static PRODUCE_ORDERED: RefCell<Option<oneshot::Sender<()>>>;
}

/// Called by the Produce handler once the request's effect is ordered: its diskless partitions are
/// in the writer (committed in that order) and its classic partitions are written. The connection
/// then reads its next request. Does nothing outside a request of [`connection`].
pub(crate) fn produce_ordered() {
    let _ = PRODUCE_ORDERED.try_with(|slot| {
        if let Some(tx) = slot.borrow_mut().take() {
            let _ = tx.send(());
        }
    });
}

/// Serves one connection with the library's connection discipline
/// ([`diskless_core::connection::serve`]): requests take effect in the order they arrive, as on a
/// Kafka broker, except that consecutive Produce requests overlap. A Produce is read only after
/// the previous one's effect is ordered ([`produce_ordered`]: its batches are in the writer), so an
/// idempotent producer's pipelined requests keep their sequence order; it is answered with its
/// commit. Answers are written in request order; a failed request ends the connection after the
/// earlier answers, as tansu's own listener does.
///
/// A Produce whose topics are all diskless skips Nisshi's codec
/// ([`crate::services::produce_direct`]); every other request goes through Nisshi's routes.
async fn connection<Svc, S>(
    service: Arc<Svc>,
    storage: DisklessStorage<S>,
    stream: TcpStream,
    addr: SocketAddr,
) where
    Svc: rama::Service<(), Bytes, Response = Bytes, Error = tansu_broker::Error>,
    S: Storage,
{
    if let Err(e) = stream.set_nodelay(true) {
        debug!(error = %e, "set_nodelay failed");
    }
    let (rd, wr) = stream.into_split();
    connection::serve(
        rd,
        wr,
        ConnectionLimits::default(),
        addr,
        |frame: RequestFrame| {
            let service = service.clone();
            let storage = storage.clone();
            async move {
                let is_produce = frame.api_key() == Some(ProduceRequest::KEY);
                if is_produce
                    && let Some(answer) =
                        crate::services::produce_direct(&storage, frame.sized()).await
                {
                    // Its batches are in the writer: ordered.
                    return Ok(Some(answer));
                }
                let (ordered_tx, ordered) = oneshot::channel();
                let answer = tokio::spawn(PRODUCE_ORDERED.scope(
                    RefCell::new(Some(ordered_tx)),
                    async move {
                        service
                            .serve(rama::Context::default(), frame.sized())
                            .await
                            .map(Some)
                            .map_err(|e| format!("{e:?}"))
                    },
                ));
                if is_produce {
                    // Until the request's effect is ordered, or it ended without saying so (an
                    // error, or nothing reached the writer): either way its sender is gone.
                    let _ = ordered.await;
                }
                Ok(Some(answer))
            }
        },
    )
    .await;
}
