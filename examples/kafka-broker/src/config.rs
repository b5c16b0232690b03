//! The command line of the example broker (hand-rolled: no argument-parser dependency).

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

use diskless_core::SealPolicy;

/// `--help` text.
pub const USAGE: &str = "\
usage: kafka-broker [OPTIONS]

A Kafka-protocol example broker serving diskless topics (diskless-rs).

Options:
  --data-dir DIR            data directory (default ./diskless-data): objects/, coordinator.db,
                            broker.db (committed offsets, producer ids)
  --base-port PORT          run --brokers logical brokers on 127.0.0.1:PORT, PORT+1, ...
                            (default 19092)
  --brokers N               number of logical brokers with --base-port (default 3)
  --listeners LIST          instead of --base-port: comma-separated HOST:PORT, one per broker
                            (node ids 1, 2, ... or from --first-node-id)
  --first-node-id N         the node id of the first broker (Kafka's node.id; default 1); the
                            others follow: N, N+1, ...
  --racks LIST              comma-separated rack of each broker (default rack-1, rack-2, ...)
  --advertised-host HOST    host announced in Metadata (default: the listener's host, 127.0.0.1
                            for a wildcard address)
  --storage URL             object storage (default file://<data-dir>/objects); also memory:///,
                            s3://bucket/prefix (endpoint, region and credentials from the AWS_*
                            environment variables or URL parameters such as ?aws_endpoint=...)
  --coordinator URL         batch coordinator (default sqlite://<data-dir>/coordinator.db);
                            also postgres://user:pass@host/db, memory:// (nothing survives;
                            only in a build with the `testkit` feature)
  --shards N                coordinator shards (KIP-1164; default 1 = one coordinator). With N > 1:
                            SQLite files <data-dir>/coordinator-shard-<i>.db, PostgreSQL schemas
                            diskless_shard_<i>, or N in-memory coordinators, routed by the
                            partition -> shard map <data-dir>/coordinator-shards.map; Metadata then
                            names each partition's produce gateway (KIP-1163) as its leader. The map
                            is this process's: run one broker process per set of PostgreSQL shards
  --commit-interval-ms MS   WAL commit interval: the longest a batch waits (default 250)
  --storage-latency-ms P50[:P99]
                            benchmarks only: add a log-normal latency to every storage call (an
                            S3-like store is 100:400; only in a build with the `testkit` feature)
  --seal-policy POLICY      when a WAL segment is closed besides a full buffer: `interval` (the
                            commit interval after its first batch) or `adaptive` (group commit: as
                            soon as an upload slot is free, at most once per --seal-min-interval-ms)
                            (default: the library's, WalWriterConfig::default())
  --seal-min-interval-ms MS adaptive sealing with exactly this least time between two seals
                            (at most 1000/MS PUTs per second per broker; the default also spaces
                            seals by 1.5 upload times); 0 = --seal-policy interval
  --hedge-uploads-after-ms MS
                            start a second, identical upload of a segment whose first attempt
                            has not finished after MS (hedged PUT; default: never)
  --buffer-max-bytes N      WAL buffer size that closes a segment early (default 8388608)
  --cache-max-bytes N       object cache size (default 268435456)
  --retention-check-ms MS   how often retention.ms/retention.bytes are applied and deleted
                            objects removed from storage (default 30000)
  --orphan-check-ms MS      how often objects uploaded but never committed are looked for and
                            (at the next check, if still unknown) deleted; 0 = never (default
                            60000; never with a memory:// coordinator)
  --orphan-min-age-ms MS    objects younger than MS are not looked at by orphan collection
                            (default 900000; below the commit deadline, 600000, a merely slow
                            commit may be fenced: its produce fails and is retried, nothing lost)
  --orphan-recheck-ms MS    how long an unknown object stays a suspect before it is fenced and
                            deleted (default 300000)
  --cleaner-grace-ms MS     how long an object with nothing live stays in storage before it is
                            deleted, for readers still on it (default 60000)
  --segment-ms MS           Kafka's log.roll.ms for diskless topics: a partition whose oldest
                            batch was committed MS ago is consolidated into a tiered segment
                            (topics' segment.ms default; default 600000 = 10 min)
  --segment-bytes N         Kafka's log.segment.bytes for diskless topics: the largest tiered
                            segment, and the WAL bytes that make a partition due (topics'
                            segment.bytes default; default 268435456 = 256 MiB; at least 1048576).
                            Both apply to topics created from then on: a topic keeps the values
                            it was created with (the coordinator stores them)
  --tiering-interval-ms MS  how often partitions due are consolidated into tiered segments
                            (issue 15; default 30000; 0 = never). Like orphan collection, never
                            with a memory:// coordinator
  --tiering-min-age-ms MS   batches committed less than MS ago stay in the WAL tier, where tail
                            readers find them in the writers' cache (default 120000, the
                            library's TieringConfig::default())
  --tiering-builds N        partitions consolidated at once by a tiering pass, each holding its
                            own read window and upload part in memory (default 1, the library's
                            TieringConfig::default())
  --local-cache-dir DIR     a second, on-disk tier behind the object cache: verified blocks of
                            WAL objects and tiered segments kept in DIR across restarts
  --local-cache-bytes N     the most block bytes --local-cache-dir holds (default 1073741824)
  --create-topic NAME[:N]   create diskless topic NAME with N partitions (default 3) at start
                            unless it exists (repeatable; clients can use CreateTopics too)
  --auto-create-topics      Kafka's auto.create.topics.enable: Metadata for an unknown topic
                            creates it (answering LEADER_NOT_AVAILABLE until it exists), unless
                            the request says allow_auto_topic_creation=false (default: off)
  --num-partitions N        Kafka's num.partitions: partitions of an automatically created topic
                            and of CreateTopics with num_partitions=-1 (default 1)
  --cluster-id ID           cluster id announced in Metadata (default diskless-example)
  --transaction-version N   the finalized transaction.version feature (KIP-890): 2 (default:
                            clients that know it bump the epoch per transaction and add
                            partitions implicitly) or 1 (the classic flow only)
  --metrics-addr HOST:PORT  serve the library's metrics in Prometheus text format at
                            http://HOST:PORT/metrics (default: off)
  -h, --help                this text

Logging: RUST_LOG (default info).";

/// The most coordinator shards `--shards` accepts.
pub(crate) const MAX_SHARDS: u32 = 256;

/// What the command line asks for.
#[derive(Debug)]
pub enum Parsed {
    /// Run the broker.
    Run(Box<Config>),
    /// Print the usage.
    Help,
}

/// One logical broker's listener.
#[derive(Clone, Debug)]
pub(crate) struct ListenerConfig {
    /// Node id (1-based).
    pub node_id: i32,
    /// Address to bind.
    pub bind: SocketAddr,
    /// Host announced in Metadata.
    pub advertised_host: String,
    /// Rack.
    pub rack: String,
}

/// The broker's configuration.
#[derive(Clone, Debug)]
pub struct Config {
    pub(crate) data_dir: PathBuf,
    pub(crate) listeners: Vec<ListenerConfig>,
    pub(crate) storage_url: Option<String>,
    pub(crate) coordinator_url: Option<String>,
    pub(crate) commit_interval: Duration,
    /// When the writers seal a segment besides a full buffer.
    pub(crate) seal_policy: SealPolicy,
    /// `WalWriterConfig::hedge_uploads_after` (`None`: never hedge).
    pub(crate) hedge_uploads_after: Option<Duration>,
    /// Added storage latency (p50, p99), for benchmarks.
    pub(crate) storage_latency: Option<(Duration, Duration)>,
    pub(crate) buffer_max_bytes: usize,
    pub(crate) cache_max_bytes: u64,
    pub(crate) cluster_id: String,
    pub(crate) retention_check: Duration,
    /// Orphan collection interval (`None`: off).
    pub(crate) orphan_check: Option<Duration>,
    /// `OrphanConfig::max_commit_age` (`None`: the library's).
    pub(crate) orphan_min_age: Option<Duration>,
    /// `OrphanConfig::recheck_delay` (`None`: the library's).
    pub(crate) orphan_recheck: Option<Duration>,
    /// `CleanerConfig::grace` (`None`: the library's).
    pub(crate) cleaner_grace: Option<Duration>,
    /// Coordinator shards (1: one coordinator, no router).
    pub(crate) shards: u32,
    /// Topics to create at start: (name, partitions).
    pub(crate) create_topics: Vec<(String, i32)>,
    /// Where to serve Prometheus metrics (`None`: off).
    pub(crate) metrics_addr: Option<SocketAddr>,
    /// `auto.create.topics.enable`.
    pub(crate) auto_create_topics: bool,
    /// `num.partitions`.
    pub(crate) num_partitions: i32,
    /// The finalized `transaction.version` feature this cluster announces (1 or 2; KIP-890).
    pub(crate) transaction_version: i16,
    /// `log.roll.ms`: new topics' `segment.ms`.
    pub(crate) segment_ms: i64,
    /// `log.segment.bytes`: new topics' `segment.bytes`.
    pub(crate) segment_bytes: i32,
    /// Consolidation interval (`None`: off).
    pub(crate) tiering_interval: Option<Duration>,
    /// The tiering worker's least batch age (`None`: the library's default).
    pub(crate) tiering_min_age: Option<Duration>,
    /// `--tiering-builds`: `TieringConfig::max_concurrent_builds` (`None`: the library's).
    pub(crate) tiering_builds: Option<u32>,
    /// The on-disk cache tier (`None`: memory only).
    pub(crate) local_cache_dir: Option<PathBuf>,
    /// Its byte bound.
    pub(crate) local_cache_bytes: u64,
}

/// `--segment-ms`'s default: 10 minutes (the coordinator's batch rows live about this long).
pub(crate) const DEFAULT_SEGMENT_MS: i64 = 10 * 60 * 1000;
/// `--segment-bytes`'s default: 256 MiB.
pub(crate) const DEFAULT_SEGMENT_BYTES: i32 = 256 << 20;
/// Kafka's least `segment.bytes` / `log.segment.bytes` (1 MiB since KIP-1030).
pub(crate) const MIN_SEGMENT_BYTES: i32 = 1 << 20;

fn value(
    name: &str,
    inline: Option<String>,
    args: &mut impl Iterator<Item = String>,
) -> Result<String, String> {
    match inline {
        Some(v) => Ok(v),
        None => args.next().ok_or_else(|| format!("{name} needs a value")),
    }
}

/// The error of an option that needs the `testkit` feature, in a build without it.
pub(crate) fn testkit_only(option: &str) -> String {
    format!(
        "{option} needs a kafka-broker built with the `testkit` feature \
         (cargo build -p diskless-kafka-broker --features testkit)"
    )
}

fn number<T: std::str::FromStr>(name: &str, v: &str) -> Result<T, String> {
    v.parse()
        .map_err(|_| format!("{name}: {v:?} is not a valid number"))
}

impl Config {
    /// Parses the arguments (without the program name).
    pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Parsed, String> {
        let mut args = args.into_iter();
        let mut data_dir = PathBuf::from("./diskless-data");
        let mut base_port: Option<u16> = None;
        let mut brokers: usize = 3;
        let mut listeners: Option<String> = None;
        let mut racks: Option<String> = None;
        let mut advertised: Option<String> = None;
        let mut storage_url = None;
        let mut coordinator_url = None;
        let mut commit_interval_ms: u64 = 250;
        let mut seal_policy_name: Option<String> = None;
        let mut first_node_id: i32 = 1;
        let mut seal_min_interval_ms: Option<u64> = None;
        let mut storage_latency = None;
        let mut hedge_uploads_after = None;
        let mut buffer_max_bytes: usize = 8 << 20;
        let mut cache_max_bytes: u64 = 256 << 20;
        let mut cluster_id = "diskless-example".to_string();
        let mut retention_check_ms: u64 = 30_000;
        let mut orphan_check_ms: u64 = 60_000;
        let mut orphan_min_age = None;
        let mut orphan_recheck = None;
        let mut cleaner_grace = None;
        let mut shards: u32 = 1;
        let mut segment_ms: i64 = DEFAULT_SEGMENT_MS;
        let mut segment_bytes: i32 = DEFAULT_SEGMENT_BYTES;
        let mut tiering_interval_ms: u64 = 30_000;
        let mut tiering_min_age = None;
        let mut tiering_builds = None;
        let mut local_cache_dir = None;
        let mut local_cache_bytes: u64 = diskless_cache::DiskCacheConfig::DEFAULT_MAX_BYTES;
        let mut create_topics = Vec::new();
        let mut metrics_addr = None;
        let mut auto_create_topics = false;
        let mut num_partitions: i32 = 1;
        let mut transaction_version: i16 = 2;
        while let Some(arg) = args.next() {
            let (name, inline) = match arg.split_once('=') {
                Some((n, v)) if n.starts_with("--") => (n.to_string(), Some(v.to_string())),
                _ => (arg.clone(), None),
            };
            match name.as_str() {
                "-h" | "--help" => return Ok(Parsed::Help),
                "--data-dir" => data_dir = PathBuf::from(value(&name, inline, &mut args)?),
                "--base-port" => {
                    base_port = Some(number(&name, &value(&name, inline, &mut args)?)?)
                }
                "--brokers" => brokers = number(&name, &value(&name, inline, &mut args)?)?,
                "--listeners" => listeners = Some(value(&name, inline, &mut args)?),
                "--racks" => racks = Some(value(&name, inline, &mut args)?),
                "--advertised-host" => advertised = Some(value(&name, inline, &mut args)?),
                "--storage" => storage_url = Some(value(&name, inline, &mut args)?),
                "--coordinator" => coordinator_url = Some(value(&name, inline, &mut args)?),
                "--commit-interval-ms" => {
                    commit_interval_ms = number(&name, &value(&name, inline, &mut args)?)?
                }
                "--storage-latency-ms" => {
                    let v = value(&name, inline, &mut args)?;
                    let (p50, p99) = match v.split_once(':') {
                        Some((a, b)) => (number::<u64>(&name, a)?, number::<u64>(&name, b)?),
                        None => {
                            let p = number::<u64>(&name, &v)?;
                            (p, p)
                        }
                    };
                    storage_latency = Some((
                        Duration::from_millis(p50),
                        Duration::from_millis(p99.max(p50)),
                    ));
                }
                "--seal-policy" => seal_policy_name = Some(value(&name, inline, &mut args)?),
                "--first-node-id" => {
                    first_node_id = number(&name, &value(&name, inline, &mut args)?)?
                }
                "--transaction-version" => {
                    transaction_version = number(&name, &value(&name, inline, &mut args)?)?;
                    if !(1..=2).contains(&transaction_version) {
                        return Err("--transaction-version must be 1 or 2".into());
                    }
                }
                "--seal-min-interval-ms" => {
                    seal_min_interval_ms = Some(number(&name, &value(&name, inline, &mut args)?)?)
                }
                "--hedge-uploads-after-ms" => {
                    hedge_uploads_after = Some(Duration::from_millis(number(
                        &name,
                        &value(&name, inline, &mut args)?,
                    )?))
                }
                "--buffer-max-bytes" => {
                    buffer_max_bytes = number(&name, &value(&name, inline, &mut args)?)?
                }
                "--cache-max-bytes" => {
                    cache_max_bytes = number(&name, &value(&name, inline, &mut args)?)?
                }
                "--cluster-id" => cluster_id = value(&name, inline, &mut args)?,
                "--metrics-addr" => {
                    let v = value(&name, inline, &mut args)?;
                    let addr = v
                        .to_socket_addrs()
                        .map_err(|e| format!("{name}: {v:?}: {e}"))?
                        .next()
                        .ok_or_else(|| format!("{name}: {v:?} resolves to no address"))?;
                    metrics_addr = Some(addr);
                }
                "--retention-check-ms" => {
                    retention_check_ms = number(&name, &value(&name, inline, &mut args)?)?
                }
                "--orphan-check-ms" => {
                    orphan_check_ms = number(&name, &value(&name, inline, &mut args)?)?
                }
                "--orphan-min-age-ms" => {
                    let ms: u64 = number(&name, &value(&name, inline, &mut args)?)?;
                    orphan_min_age = Some(Duration::from_millis(ms));
                }
                "--orphan-recheck-ms" => {
                    let ms: u64 = number(&name, &value(&name, inline, &mut args)?)?;
                    orphan_recheck = Some(Duration::from_millis(ms));
                }
                "--cleaner-grace-ms" => {
                    let ms: u64 = number(&name, &value(&name, inline, &mut args)?)?;
                    cleaner_grace = Some(Duration::from_millis(ms));
                }
                "--auto-create-topics" => {
                    auto_create_topics = match inline.as_deref() {
                        None | Some("true") => true,
                        Some("false") => false,
                        Some(v) => {
                            return Err(format!("{name}: expected true or false, not {v:?}"));
                        }
                    }
                }
                "--num-partitions" => {
                    num_partitions = number(&name, &value(&name, inline, &mut args)?)?;
                    if num_partitions < 1 {
                        return Err(format!("{name} must be at least 1"));
                    }
                }
                "--shards" => shards = number(&name, &value(&name, inline, &mut args)?)?,
                "--segment-ms" => {
                    segment_ms = number(&name, &value(&name, inline, &mut args)?)?;
                    if segment_ms < 1 {
                        return Err(format!("{name} must be at least 1 (Kafka's log.roll.ms)"));
                    }
                }
                "--segment-bytes" => {
                    segment_bytes = number(&name, &value(&name, inline, &mut args)?)?;
                    if segment_bytes < MIN_SEGMENT_BYTES {
                        return Err(format!(
                            "{name} must be at least {MIN_SEGMENT_BYTES} (Kafka's log.segment.bytes)"
                        ));
                    }
                }
                "--tiering-interval-ms" => {
                    tiering_interval_ms = number(&name, &value(&name, inline, &mut args)?)?
                }
                "--tiering-min-age-ms" => {
                    tiering_min_age = Some(Duration::from_millis(number(
                        &name,
                        &value(&name, inline, &mut args)?,
                    )?))
                }
                "--tiering-builds" => {
                    let n: u32 = number(&name, &value(&name, inline, &mut args)?)?;
                    if n == 0 {
                        return Err("--tiering-builds must be at least 1".into());
                    }
                    tiering_builds = Some(n);
                }
                "--local-cache-dir" => {
                    local_cache_dir = Some(PathBuf::from(value(&name, inline, &mut args)?))
                }
                "--local-cache-bytes" => {
                    local_cache_bytes = number(&name, &value(&name, inline, &mut args)?)?;
                    if local_cache_bytes == 0 {
                        return Err(format!("{name} must be > 0"));
                    }
                }
                "--create-topic" => {
                    let v = value(&name, inline, &mut args)?;
                    let (topic, partitions) = match v.rsplit_once(':') {
                        Some((t, n)) => (t.to_string(), number::<i32>(&name, n)?),
                        None => (v, 3),
                    };
                    if topic.is_empty() || partitions < 1 {
                        return Err(format!("{name}: expected NAME[:PARTITIONS>0]"));
                    }
                    create_topics.push((topic, partitions));
                }
                other => return Err(format!("unknown argument {other:?}")),
            }
        }
        if retention_check_ms == 0 {
            return Err("--retention-check-ms must be > 0".into());
        }
        if !(1..=MAX_SHARDS).contains(&shards) {
            return Err(format!("--shards must be within 1..={MAX_SHARDS}"));
        }
        if commit_interval_ms == 0 {
            return Err("--commit-interval-ms must be > 0".into());
        }
        if first_node_id < 0 {
            return Err("--first-node-id must be >= 0 (Kafka's node.id)".into());
        }
        if buffer_max_bytes == 0 {
            return Err("--buffer-max-bytes must be > 0".into());
        }
        // The options served by `diskless-testkit`, which a default build does not link.
        if !cfg!(feature = "testkit") {
            if coordinator_url
                .as_deref()
                .is_some_and(|u: &str| u.starts_with("memory:"))
            {
                return Err(testkit_only("--coordinator memory://"));
            }
            if storage_latency.is_some() {
                return Err(testkit_only("--storage-latency-ms"));
            }
        }
        let seal_policy =
            SealPolicy::from_options(seal_policy_name.as_deref(), seal_min_interval_ms)
                .map_err(|e| format!("--seal-policy / --seal-min-interval-ms: {e}"))?;
        let addrs: Vec<(String, u16)> = match (listeners, base_port) {
            (Some(_), Some(_)) => return Err("give --listeners or --base-port, not both".into()),
            (Some(list), None) => list
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|hp| {
                    let (h, p) = hp
                        .rsplit_once(':')
                        .ok_or_else(|| format!("listener {hp:?} is not HOST:PORT"))?;
                    Ok((
                        h.trim_matches(['[', ']']).to_string(),
                        number("--listeners", p)?,
                    ))
                })
                .collect::<Result<_, String>>()?,
            (None, base) => {
                if brokers == 0 || brokers > 64 {
                    return Err("--brokers must be within 1..=64".into());
                }
                let base = base.unwrap_or(19092);
                (0..brokers)
                    .map(|i| {
                        u16::try_from(usize::from(base) + i)
                            .map(|p| ("127.0.0.1".to_string(), p))
                            .map_err(|_| "--base-port too high".to_string())
                    })
                    .collect::<Result<_, String>>()?
            }
        };
        if addrs.is_empty() {
            return Err("no listener".into());
        }
        let racks: Vec<String> = match racks {
            Some(list) => list.split(',').map(|s| s.trim().to_string()).collect(),
            None => (1..=addrs.len()).map(|i| format!("rack-{i}")).collect(),
        };
        if racks.len() != addrs.len() {
            return Err(format!(
                "--racks names {} racks for {} brokers",
                racks.len(),
                addrs.len()
            ));
        }
        let mut out = Vec::with_capacity(addrs.len());
        for (i, ((host, port), rack)) in addrs.into_iter().zip(racks).enumerate() {
            let bind = (host.as_str(), port)
                .to_socket_addrs()
                .map_err(|e| format!("cannot resolve {host}:{port}: {e}"))?
                .next()
                .ok_or_else(|| format!("{host}:{port} resolves to nothing"))?;
            let advertised_host = match &advertised {
                Some(h) => h.clone(),
                None if bind.ip().is_unspecified() => "127.0.0.1".to_string(),
                None => host,
            };
            out.push(ListenerConfig {
                node_id: i32::try_from(i)
                    .ok()
                    .and_then(|i| first_node_id.checked_add(i))
                    .ok_or_else(|| "--first-node-id: node ids past i32::MAX".to_string())?,
                bind,
                advertised_host,
                rack,
            });
        }
        Ok(Parsed::Run(Box::new(Config {
            data_dir,
            listeners: out,
            storage_url,
            coordinator_url,
            commit_interval: Duration::from_millis(commit_interval_ms),
            seal_policy,
            hedge_uploads_after,
            storage_latency,
            buffer_max_bytes,
            cache_max_bytes,
            cluster_id,
            retention_check: Duration::from_millis(retention_check_ms),
            orphan_check: (orphan_check_ms > 0).then(|| Duration::from_millis(orphan_check_ms)),
            orphan_min_age,
            orphan_recheck,
            cleaner_grace,
            shards,
            create_topics,
            metrics_addr,
            auto_create_topics,
            num_partitions,
            transaction_version,
            segment_ms,
            segment_bytes,
            tiering_interval: (tiering_interval_ms > 0)
                .then(|| Duration::from_millis(tiering_interval_ms)),
            tiering_min_age,
            tiering_builds,
            local_cache_dir,
            local_cache_bytes,
        })))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Config, String> {
        match Config::parse(args.iter().map(|s| s.to_string()))? {
            Parsed::Run(c) => Ok(*c),
            Parsed::Help => Err("help".into()),
        }
    }

    #[test]
    fn defaults_are_three_brokers_from_19092() {
        let c = parse(&[]).unwrap();
        let ports: Vec<u16> = c.listeners.iter().map(|l| l.bind.port()).collect();
        assert_eq!(ports, vec![19092, 19093, 19094]);
        let ids: Vec<i32> = c.listeners.iter().map(|l| l.node_id).collect();
        assert_eq!(ids, vec![1, 2, 3]);
        assert_eq!(c.listeners[1].rack, "rack-2");
        assert_eq!(c.commit_interval, Duration::from_millis(250));
        assert_eq!(c.data_dir, PathBuf::from("./diskless-data"));
        assert!(c.coordinator_url.is_none() && c.storage_url.is_none());
        assert_eq!(c.shards, 1);
        assert_eq!(c.orphan_check, Some(Duration::from_secs(60)));
        assert_eq!(
            (c.orphan_min_age, c.orphan_recheck, c.cleaner_grace),
            (None, None, None)
        );
        assert!(!c.auto_create_topics);
        assert_eq!(c.num_partitions, 1);
        assert_eq!(c.segment_ms, 600_000);
        assert_eq!(c.segment_bytes, 256 << 20);
        assert_eq!(c.tiering_interval, Some(Duration::from_secs(30)));
        assert_eq!(c.tiering_min_age, None);
        assert_eq!(c.tiering_builds, None);
        assert_eq!(c.local_cache_dir, None);
        assert_eq!(c.local_cache_bytes, 1 << 30);
    }

    #[test]
    fn segments_tiering_and_the_local_cache() {
        let c = parse(&[
            "--segment-ms",
            "2000",
            "--segment-bytes=1048576",
            "--tiering-interval-ms",
            "500",
            "--tiering-min-age-ms=0",
            "--tiering-builds",
            "3",
            "--local-cache-dir",
            "/tmp/x",
            "--local-cache-bytes",
            "4096",
        ])
        .unwrap();
        assert_eq!((c.segment_ms, c.segment_bytes), (2000, 1 << 20));
        assert_eq!(c.tiering_interval, Some(Duration::from_millis(500)));
        assert_eq!(c.tiering_min_age, Some(Duration::ZERO));
        assert_eq!(c.tiering_builds, Some(3));
        assert!(parse(&["--tiering-builds", "0"]).is_err());
        assert_eq!(c.local_cache_dir, Some(PathBuf::from("/tmp/x")));
        assert_eq!(c.local_cache_bytes, 4096);
        assert_eq!(
            parse(&["--tiering-interval-ms", "0"])
                .unwrap()
                .tiering_interval,
            None
        );
    }

    #[test]
    fn first_node_id() {
        let ids = |c: &Config| c.listeners.iter().map(|l| l.node_id).collect::<Vec<_>>();
        assert_eq!(ids(&parse(&["--brokers", "2"]).unwrap()), [1, 2]);
        let c = parse(&[
            "--listeners",
            "127.0.0.1:1,127.0.0.1:2",
            "--first-node-id",
            "0",
        ])
        .unwrap();
        assert_eq!(ids(&c), [0, 1]);
        assert!(parse(&["--first-node-id", "-1"]).is_err());
        assert!(parse(&["--brokers", "2", "--first-node-id", "2147483647"]).is_err());
    }

    #[test]
    fn seal_policy_and_hedging() {
        let c = parse(&[]).unwrap();
        assert_eq!(
            c.seal_policy,
            diskless_core::WalWriterConfig::default().seal_policy
        );
        assert_eq!(c.hedge_uploads_after, None);
        // The library's parser (`SealPolicy::from_options`) with the default in-flight bound.
        let adaptive = |ms| SealPolicy::adaptive(Duration::from_millis(ms), 4);
        let c = parse(&[
            "--seal-min-interval-ms",
            "20",
            "--hedge-uploads-after-ms=150",
        ])
        .unwrap();
        assert_eq!(c.seal_policy, adaptive(20));
        assert_eq!(c.hedge_uploads_after, Some(Duration::from_millis(150)));
        let c = parse(&["--seal-policy=adaptive", "--seal-min-interval-ms", "30"]).unwrap();
        assert_eq!(c.seal_policy, adaptive(30));
        let c = parse(&["--seal-policy", "adaptive"]).unwrap();
        assert!(matches!(c.seal_policy, SealPolicy::Adaptive { .. }));
        for interval in [
            &["--seal-policy", "interval"][..],
            &["--seal-min-interval-ms", "0"],
            &["--seal-policy=interval", "--seal-min-interval-ms=0"],
        ] {
            assert_eq!(parse(interval).unwrap().seal_policy, SealPolicy::Interval);
        }
    }

    #[test]
    fn topic_defaults() {
        let c = parse(&["--auto-create-topics", "--num-partitions", "4"]).unwrap();
        assert!(c.auto_create_topics);
        assert_eq!(c.num_partitions, 4);
        let c = parse(&["--auto-create-topics=false", "--num-partitions=2"]).unwrap();
        assert!(!c.auto_create_topics);
        assert_eq!(c.num_partitions, 2);
    }

    #[test]
    fn listeners_racks_and_topics() {
        let c = parse(&[
            "--listeners=0.0.0.0:9092,127.0.0.1:9093",
            "--racks",
            "az-a,az-b",
            "--commit-interval-ms",
            "50",
            "--create-topic",
            "orders:6",
            "--create-topic=logs",
            "--coordinator",
            "memory://",
            "--shards=4",
            "--orphan-check-ms",
            "0",
            "--orphan-min-age-ms",
            "2000",
            "--orphan-recheck-ms=1000",
            "--cleaner-grace-ms",
            "500",
        ])
        .unwrap();
        assert_eq!(c.listeners.len(), 2);
        assert_eq!(c.listeners[0].advertised_host, "127.0.0.1");
        assert_eq!(c.listeners[1].rack, "az-b");
        assert_eq!(c.commit_interval, Duration::from_millis(50));
        assert_eq!(
            c.create_topics,
            vec![("orders".to_string(), 6), ("logs".to_string(), 3)]
        );
        assert_eq!(c.coordinator_url.as_deref(), Some("memory://"));
        assert_eq!(c.shards, 4);
        assert_eq!(c.orphan_check, None);
        assert_eq!(c.orphan_min_age, Some(Duration::from_secs(2)));
        assert_eq!(c.orphan_recheck, Some(Duration::from_secs(1)));
        assert_eq!(c.cleaner_grace, Some(Duration::from_millis(500)));
    }

    #[test]
    fn bad_arguments_are_refused() {
        for bad in [
            &["--base-port", "1", "--listeners", "127.0.0.1:1"][..],
            &["--listeners", "127.0.0.1:1", "--racks", "a,b"],
            &["--commit-interval-ms", "0"],
            &["--commit-interval-ms", "x"],
            &["--brokers", "0"],
            &["--create-topic", "t:0"],
            &["--data-dir"],
            &["--shards", "0"],
            &["--shards", "257"],
            &["--shards", "-1"],
            &["--bogus"],
            &["--num-partitions", "0"],
            &["--num-partitions"],
            &["--auto-create-topics=yes"],
            &["--seal-policy", "fast"],
            &["--seal-policy", "interval", "--seal-min-interval-ms", "20"],
            &["--seal-min-interval-ms", "-1"],
            &["--hedge-uploads-after-ms", "x"],
            &["--segment-ms", "0"],
            &["--segment-bytes", "1048575"],
            &["--segment-bytes", "2147483648"],
            &["--tiering-interval-ms", "-1"],
            &["--tiering-min-age-ms", "x"],
            &["--local-cache-bytes", "0"],
            &["--local-cache-dir"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?} accepted");
        }
        assert!(matches!(
            Config::parse(["--help".to_string()]),
            Ok(Parsed::Help)
        ));
    }
}
