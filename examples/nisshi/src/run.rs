//! Starting a `nisshi-diskless` node: Nisshi's engine, the diskless node, the group coordinator,
//! the listener. The binary and the tests start nodes the same way.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use diskless_cache::{LocalCache, MokaCache, MokaCacheConfig};
use diskless_coordinator::postgres::PostgresOptions;
use diskless_coordinator::{Clock, OpenOptions, OpenedCoordinator, SystemClock, open_coordinator};
use diskless_core::{DisklessNode, NodeConfig, SealPolicy, WalWriterConfig};
use diskless_storage::{ObjectStorage, ObjectStoreStorage};
use tansu_broker::coordinator::group::administrator::Controller;
use tansu_storage::{BrokerRegistrationRequest, Storage, StorageContainer};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::info;
use url::Url;

use crate::config::Config;
use crate::storage::{DisklessSettings, DisklessStorage};

/// A running node.
#[derive(Debug)]
pub struct Running {
    /// The address the listener is bound to.
    pub local_addr: std::net::SocketAddr,
    /// The storage the node serves (clone it to look inside in tests).
    pub storage: DisklessStorage<StorageContainer>,
    cancel: CancellationToken,
    server: JoinHandle<Result<(), tansu_broker::Error>>,
    coordinators: OpenedCoordinator,
    metrics: Option<JoinHandle<()>>,
}

impl Running {
    /// Stops accepting, ends the connections, and closes the diskless node (every accepted
    /// produce answered first).
    pub async fn shutdown(self) {
        self.cancel.cancel();
        match self.server.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = ?e, "the listener ended with an error"),
            Err(e) => tracing::warn!(error = %e, "the listener task failed"),
        }
        self.storage.close().await;
        self.coordinators.close().await;
        if let Some(metrics) = self.metrics {
            metrics.abort();
        }
    }

    /// Waits until the listener ends (it ends on [`Running::shutdown`] or a fatal error).
    pub async fn wait(&mut self) -> Result<(), String> {
        match (&mut self.server).await {
            Ok(r) => r.map_err(|e| format!("{e:?}")),
            Err(e) => Err(e.to_string()),
        }
    }
}

/// Nisshi's SQLite engine URL for the file at `path`. Nisshi reads a `sqlite://` URL's path
/// relative to its working directory (it strips one leading `/`), so an absolute file takes a
/// doubled slash: `sqlite:////abs/file.db`.
fn sqlite_url(path: &Path) -> Result<Url, String> {
    let abs = std::path::absolute(path).map_err(|e| format!("{}: {e}", path.display()))?;
    Url::parse(&format!("sqlite:///{}", abs.display())).map_err(|e| e.to_string())
}

/// Starts a node as `config` says; `listener` overrides `config.listener` (tests bind port 0).
pub async fn start(config: &Config, listener: Option<TcpListener>) -> Result<Running, String> {
    std::fs::create_dir_all(&config.data_dir)
        .map_err(|e| format!("cannot create {}: {e}", config.data_dir.display()))?;
    let data_dir = std::path::absolute(&config.data_dir).map_err(|e| e.to_string())?;
    // Earlier versions kept transactions' diskless partitions and pending markers in this file;
    // they are the batch coordinator's transaction records now, and the file is not read.
    let old_state = data_dir.join("diskless-txns.json");
    if old_state.exists() {
        return Err(format!(
            "{} was written by an earlier nisshi-diskless, which kept transaction state there: \
             end its transactions with that version (or abort them with kafka-transactions.sh), \
             then delete the file",
            old_state.display()
        ));
    }
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);

    let listener = match listener {
        Some(l) => l,
        None => {
            let host = config.listener.host_str().unwrap_or("[::]");
            let port = config.listener.port().unwrap_or(9092);
            TcpListener::bind(format!("{host}:{port}"))
                .await
                .map_err(|e| format!("cannot listen on {}: {e}", config.listener))?
        }
    };
    let local_addr = listener.local_addr().map_err(|e| e.to_string())?;
    let mut advertised = config.advertised_listener.clone();
    if advertised.port() == Some(0) {
        advertised
            .set_port(Some(local_addr.port()))
            .map_err(|()| "cannot set the advertised port".to_string())?;
    }

    // The recorder first, so that every series the library emits from the start is kept.
    let metrics = match config.metrics_addr {
        Some(addr) => Some(
            diskless_core::prometheus::start(addr)
                .await
                .map_err(|e| e.to_string())?,
        ),
        None => None,
    };
    let cancel = CancellationToken::new();
    let engine_url = match &config.storage_engine {
        Some(u) => u.clone(),
        None => sqlite_url(&data_dir.join("nisshi.db"))?,
    };
    // Nisshi's SQLite engine closes its file when its request task ends, which happens after
    // the last handle of a previous engine on the same file is dropped (a restart in the same
    // process): "database is locked" is retried for up to two seconds.
    let mut attempts = 0;
    let engine = loop {
        let built = StorageContainer::builder()
            .cluster_id(config.cluster_id.clone())
            .node_id(config.node_id)
            .advertised_listener(advertised.clone())
            .storage(engine_url.clone())
            .cancellation(cancel.clone())
            .silent(true)
            .build()
            .await;
        match built {
            Ok(engine) => break engine,
            Err(e) if attempts < 20 && format!("{e:?}").contains("database is locked") => {
                attempts += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err(format!("Nisshi engine {engine_url}: {e:?}")),
        }
    };

    let objects: Arc<dyn ObjectStorage> = Arc::new(
        ObjectStoreStorage::from_url_or_data_dir(config.diskless_storage.as_deref(), &data_dir)
            .map_err(|e| format!("object storage: {e}"))?,
    );
    // The library's one way of opening a coordinator (the example broker's too): SQLite files in
    // the data directory by default, `sqlite:`/`postgres:` URLs, shards behind a router.
    let coordinators = open_coordinator(
        &OpenOptions::new(&data_dir)
            .with_url(config.diskless_coordinator.clone())
            .with_shards(config.shards)
            .with_postgres(
                PostgresOptions::default().with_schema(config.coordinator_schema.clone()),
            ),
        clock.clone(),
    )
    .await
    .map_err(|e| format!("coordinator: {e}"))?;
    let coordinator = coordinators.coordinator.clone();
    let cache: Arc<dyn LocalCache> = Arc::new(
        MokaCache::new(MokaCacheConfig::default().with_max_bytes(config.cache_bytes))
            .map_err(|e| format!("cache: {e}"))?,
    );
    let mut writer = WalWriterConfig::default();
    if let Some(bytes) = config.segment_bytes {
        writer = writer.with_buffer_max_bytes(usize::try_from(bytes).unwrap_or(usize::MAX));
    }
    if let Some(ms) = config.linger_ms {
        writer = writer.with_commit_interval(Duration::from_millis(ms));
    }
    writer = writer.with_seal_policy(
        SealPolicy::from_options(config.seal_policy.as_deref(), config.seal_min_interval_ms)
            .map_err(|e| {
                format!("--diskless-seal-policy / --diskless-seal-min-interval-ms: {e}")
            })?,
    );
    let node = DisklessNode::builder(objects, coordinator)
        .with_cache(cache)
        .with_clock(clock)
        .with_config(
            NodeConfig::default()
                .with_broker_ids(vec![config.node_id])
                .with_writer(writer)
                .with_lifecycle(config.lifecycle()),
        )
        .build()
        .map_err(|e| format!("diskless node: {e}"))?;
    let storage = DisklessStorage::new(
        engine,
        node,
        DisklessSettings::default()
            .with_broker_id(config.node_id)
            .with_default_diskless(config.diskless_default)
            // tansu 0.6.0: its PostgreSQL engine deletes records, its SQLite engine panics.
            .with_engine_delete_records(engine_url.scheme().starts_with("postgres"))
            // tansu 0.6.0: its SQL engines delete every topic of the cluster for one.
            .with_engine_delete_topic(engine_url.scheme() == "s3")
            .with_auto_create_partitions(
                config.auto_create_topics.then_some(config.num_partitions),
            ),
    )
    .map_err(|e| e.to_string())?;
    storage
        .register_broker(BrokerRegistrationRequest {
            broker_id: config.node_id,
            cluster_id: config.cluster_id.clone(),
            // Random per start, drawn as the library draws its ids (no global RNG).
            incarnation_id: uuid::Uuid::from_u64_pair(
                diskless_common::entropy_seed(),
                diskless_common::entropy_seed(),
            ),
            rack: None,
        })
        .await
        .map_err(|e| format!("broker registration: {e:?}"))?;
    let groups = Controller::with_storage(storage.clone()).map_err(|e| format!("{e:?}"))?;
    info!(%local_addr, engine = %engine_url, "nisshi-diskless listening");
    let server = tokio::spawn(crate::server::serve(
        listener,
        storage.clone(),
        groups,
        config.maintenance_interval(),
        cancel.clone(),
    ));
    Ok(Running {
        local_addr,
        storage,
        cancel,
        server,
        coordinators,
        metrics,
    })
}
