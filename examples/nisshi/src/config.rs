//! The command line of `nisshi-diskless`: Nisshi's broker options (same names as `tansu broker`)
//! plus the diskless ones.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use url::Url;

/// Nisshi (tansu 0.6.0) serving classic and diskless topics side by side.
#[derive(Clone, Debug, Parser)]
#[command(name = "nisshi-diskless", version)]
#[non_exhaustive]
pub struct Config {
    /// The cluster id (as `tansu broker --kafka-cluster-id`).
    #[arg(
        long = "kafka-cluster-id",
        env = "CLUSTER_ID",
        default_value = "tansu_cluster"
    )]
    pub cluster_id: String,
    /// This node's broker id; also the diskless writer's broker id.
    #[arg(long = "kafka-node-id", env = "NODE_ID", default_value_t = tansu_broker::NODE_ID)]
    pub node_id: i32,
    /// Where to listen for Kafka clients.
    #[arg(
        long = "kafka-listener-url",
        env = "LISTENER_URL",
        default_value = "tcp://[::]:9092"
    )]
    pub listener: Url,
    /// The address announced to clients in Metadata.
    #[arg(
        long = "kafka-advertised-listener-url",
        env = "ADVERTISED_LISTENER_URL",
        default_value = "tcp://localhost:9092"
    )]
    pub advertised_listener: Url,
    /// Nisshi's own engine, for everything but diskless data: `sqlite://FILE`,
    /// `postgres://...` (its schema provisioned from Nisshi's repository) or `s3://BUCKET` (its
    /// state as objects; several nodes can share it; `AWS_*` variables as for the diskless
    /// storage). Default: `sqlite://<data-dir>/nisshi.db`.
    #[arg(long = "storage-engine", env = "STORAGE_ENGINE")]
    pub storage_engine: Option<Url>,
    /// Where local state lives (Nisshi's SQLite file, diskless objects and coordinator by default).
    #[arg(long, env = "DATA_DIR", default_value = "nisshi-data")]
    pub data_dir: PathBuf,
    /// Object storage of WAL segments: `file:///abs/path`, `s3://bucket/prefix`, `memory:///`.
    /// Default: `<data-dir>/objects` on the local filesystem.
    #[arg(long = "diskless-storage", env = "DISKLESS_STORAGE")]
    pub diskless_storage: Option<String>,
    /// The batch coordinator: `sqlite://FILE` or `postgres://...`. Default: SQLite at
    /// `<data-dir>/coordinator.db`.
    #[arg(long = "diskless-coordinator", env = "DISKLESS_COORDINATOR")]
    pub diskless_coordinator: Option<String>,
    /// The PostgreSQL schema of the coordinator (several clusters can share one database).
    #[arg(
        long = "diskless-coordinator-schema",
        env = "DISKLESS_COORDINATOR_SCHEMA",
        default_value = "diskless"
    )]
    pub coordinator_schema: String,
    /// Coordinator shards (each its own SQLite file or PostgreSQL schema).
    #[arg(long = "diskless-shards", default_value_t = 1)]
    pub shards: u32,
    /// Topics created without `diskless.enable` are diskless.
    #[arg(long = "diskless-default")]
    pub diskless_default: bool,
    /// Create a topic that a Metadata request names and allows to create (Kafka's
    /// `auto.create.topics.enable`; tansu 0.6.0 has no automatic creation).
    #[arg(long = "auto-create-topics", env = "AUTO_CREATE_TOPICS")]
    pub auto_create_topics: bool,
    /// The partition count of automatically created topics (Kafka's `num.partitions`).
    #[arg(long = "num-partitions", default_value_t = 1, value_parser = clap::value_parser!(i32).range(1..))]
    pub num_partitions: i32,
    /// Seal a WAL segment at this many bytes (the writer's default when not given).
    #[arg(long = "diskless-segment-bytes")]
    pub segment_bytes: Option<u64>,
    /// Upper bound on how long a batch waits in the writer's buffer, in ms (the writer's default
    /// when not given).
    #[arg(long = "diskless-linger-ms")]
    pub linger_ms: Option<u64>,
    /// When a WAL segment is sealed besides a full buffer: `interval` (after the linger) or
    /// `adaptive` (as soon as an upload slot is free, at most once per
    /// --diskless-seal-min-interval-ms). Default: the library's (adaptive, seals at least 5 ms
    /// and 1.5 upload times apart).
    #[arg(long = "diskless-seal-policy")]
    pub seal_policy: Option<String>,
    /// The least time between two seals of the adaptive policy, in ms (0: `interval`).
    #[arg(long = "diskless-seal-min-interval-ms")]
    pub seal_min_interval_ms: Option<u64>,
    /// The memory cache of object blocks, in bytes.
    #[arg(long = "diskless-cache-bytes", default_value_t = 256 << 20)]
    pub cache_bytes: u64,
    /// Serve the library's metrics in Prometheus text format on this address (e.g.
    /// `127.0.0.1:9464`; `curl http://127.0.0.1:9464/metrics`). Default: no endpoint.
    #[arg(long = "metrics-addr", env = "METRICS_ADDR")]
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Nisshi's maintenance tick (its engine's housekeeping; pending transaction markers).
    #[arg(long = "maintenance-interval-ms", default_value_t = 10_000)]
    pub maintenance_interval_ms: u64,
}

impl Config {
    /// The maintenance tick.
    pub fn maintenance_interval(&self) -> Duration {
        Duration::from_millis(self.maintenance_interval_ms.max(1))
    }
}
