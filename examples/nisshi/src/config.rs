//! The command line of `nisshi-diskless`: Nisshi's broker options (same names as `tansu broker`)
//! plus the diskless ones.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use diskless_core::NodeLifecycleConfig;
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
    /// How often the diskless lifecycle workers look for objects uploaded but never committed
    /// (orphan collection) and delete objects with nothing live (the cleaner), in ms. Default: the
    /// library's (`NodeLifecycleConfig`: every minute).
    #[arg(long = "diskless-lifecycle-check-ms", value_parser = clap::value_parser!(u64).range(1..))]
    pub lifecycle_check_ms: Option<u64>,
    /// Orphan collection leaves objects younger than this alone, in ms (the library's
    /// `OrphanConfig::max_commit_age`, 15 minutes by default). Below the commit deadline it may
    /// fence an upload whose commit is merely slow: that produce request fails and is retried.
    #[arg(long = "diskless-orphan-min-age-ms")]
    pub orphan_min_age_ms: Option<u64>,
    /// How long an unknown object stays a suspect before orphan collection fences and deletes
    /// it, in ms (`OrphanConfig::recheck_delay`, 5 minutes by default).
    #[arg(long = "diskless-orphan-recheck-ms")]
    pub orphan_recheck_ms: Option<u64>,
    /// How long an object with nothing live stays in storage before the cleaner deletes it, in
    /// ms (`CleanerConfig::grace`).
    #[arg(long = "diskless-cleaner-grace-ms")]
    pub cleaner_grace_ms: Option<u64>,
    /// Nisshi's maintenance tick (its engine's housekeeping; pending transaction markers).
    #[arg(long = "maintenance-interval-ms", default_value_t = 10_000)]
    pub maintenance_interval_ms: u64,
}

impl Config {
    /// The diskless lifecycle workers: the library's defaults, with the options given.
    pub fn lifecycle(&self) -> NodeLifecycleConfig {
        let ms = Duration::from_millis;
        let mut lifecycle = NodeLifecycleConfig::default();
        if let Some(check) = self.lifecycle_check_ms {
            lifecycle = lifecycle
                .with_orphans_interval(Some(ms(check)))
                .with_cleaner_interval(Some(ms(check)));
        }
        let mut orphans = lifecycle.orphans.clone();
        if let Some(age) = self.orphan_min_age_ms {
            orphans = orphans.with_max_commit_age(ms(age));
        }
        if let Some(delay) = self.orphan_recheck_ms {
            orphans = orphans.with_recheck_delay(ms(delay));
        }
        let mut cleaner = lifecycle.cleaner.clone();
        if let Some(grace) = self.cleaner_grace_ms {
            cleaner = cleaner.with_grace(ms(grace));
        }
        lifecycle.with_orphans(orphans).with_cleaner(cleaner)
    }

    /// The maintenance tick.
    pub fn maintenance_interval(&self) -> Duration {
        Duration::from_millis(self.maintenance_interval_ms.max(1))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn lifecycle_options_reach_the_node_and_default_to_the_librarys() {
        let defaults = NodeLifecycleConfig::default();
        let config = Config::try_parse_from(["nisshi-diskless"]).unwrap();
        let lifecycle = config.lifecycle();
        assert_eq!(lifecycle.orphans_interval, defaults.orphans_interval);
        assert_eq!(lifecycle.cleaner_interval, defaults.cleaner_interval);
        assert_eq!(
            lifecycle.orphans.max_commit_age,
            defaults.orphans.max_commit_age
        );
        assert_eq!(lifecycle.cleaner.grace, defaults.cleaner.grace);

        let config = Config::try_parse_from([
            "nisshi-diskless",
            "--diskless-lifecycle-check-ms",
            "1000",
            "--diskless-orphan-min-age-ms",
            "3000",
            "--diskless-orphan-recheck-ms",
            "1500",
            "--diskless-cleaner-grace-ms",
            "2000",
        ])
        .unwrap();
        let lifecycle = config.lifecycle();
        let ms = Duration::from_millis;
        assert_eq!(lifecycle.orphans_interval, Some(ms(1000)));
        assert_eq!(lifecycle.cleaner_interval, Some(ms(1000)));
        assert_eq!(lifecycle.orphans.max_commit_age, ms(3000));
        assert_eq!(lifecycle.orphans.recheck_delay, ms(1500));
        assert_eq!(lifecycle.cleaner.grace, ms(2000));
        // Retention and the others keep the library's timings.
        assert_eq!(lifecycle.retention_interval, defaults.retention_interval);
        assert!(
            Config::try_parse_from(["nisshi-diskless", "--diskless-lifecycle-check-ms", "0"])
                .is_err()
        );
    }
}
