//! The single-process demo of diskless-rs on embedded defaults: objects on the local filesystem and
//! the SQLite batch coordinator, in a temporary directory (or `--dir DIR`).
//!
//! Several "brokers" (one `WalWriter` each) produce concurrently to the partitions of one diskless
//! topic; then consumers read every partition back through a `Fetcher` and check that each
//! acknowledged batch comes back exactly once, in offset order, with the offsets the coordinator
//! assigned and the bytes that were produced. It prints what a user wants to see and exits non-zero
//! if anything read back differs from what was acknowledged.
//!
//! ```text
//! cargo run --release -p diskless-examples --bin demo -- [--dir DIR] [--brokers N] [--partitions N]
//!     [--batches N] [--records N] [--commit-interval-ms MS] [--coordinator URL]
//! ```
//!
//! `--coordinator` takes `sqlite://PATH` (default: `coordinator.db` in the data directory) or
//! `postgres://user@host:port/db` for the PostgreSQL coordinator (tables in schema `diskless`).

// A command-line program: what it prints is its output.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use diskless_common::entropy_seed;
use diskless_coordinator::postgres::PostgresCoordinator;
use diskless_coordinator::sqlite::{SqliteCoordinator, SqliteOptions};
use diskless_coordinator::{
    BatchCoordinator, Clock, CreateTopicRequest, ErrorCode, SystemClock, TopicConfig,
    TopicIdPartition,
};
use diskless_core::{
    Compression, DisklessNode, FetchPartition, Fetcher, NodeConfig, NodeLifecycleConfig,
    ProducePartition, RecordBatchBuilder, WalWriterConfig, split_batches, verify_stored_batch,
};
use diskless_storage::{ObjectStorage, ObjectStoreStorage};
use futures::TryStreamExt;

struct Args {
    dir: Option<std::path::PathBuf>,
    brokers: i32,
    partitions: i32,
    batches: i32,
    records: i32,
    commit_interval_ms: u64,
    coordinator: Option<String>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        dir: None,
        brokers: 3,
        partitions: 8,
        batches: 50,
        records: 10,
        commit_interval_ms: 50,
        coordinator: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        let number = |v: String| v.parse::<i64>().map_err(|e| format!("{flag}: {e}"));
        match flag.as_str() {
            "--dir" => args.dir = Some(value()?.into()),
            "--brokers" => args.brokers = number(value()?)?.clamp(1, 64) as i32,
            "--partitions" => args.partitions = number(value()?)?.clamp(1, 10_000) as i32,
            "--batches" => args.batches = number(value()?)?.clamp(1, 100_000) as i32,
            "--records" => args.records = number(value()?)?.clamp(1, 10_000) as i32,
            "--commit-interval-ms" => {
                args.commit_interval_ms = number(value()?)?.clamp(1, 60_000) as u64
            }
            "--coordinator" => args.coordinator = Some(value()?),
            "-h" | "--help" => {
                return Err(
                    "usage: demo [--dir DIR] [--brokers N] [--partitions N] [--batches N] \
                            [--records N] [--commit-interval-ms MS] [--coordinator URL]"
                        .into(),
                );
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(args)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    match run(args).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("demo failed: {e}");
            ExitCode::FAILURE
        }
    }
}

type Error = Box<dyn std::error::Error + Send + Sync>;

async fn run(args: Args) -> Result<bool, Error> {
    let temp;
    let dir = match &args.dir {
        Some(d) => {
            std::fs::create_dir_all(d)?;
            d.clone()
        }
        None => {
            temp = tempfile::tempdir()?;
            temp.path().to_path_buf()
        }
    };
    println!("diskless-rs demo");
    println!("  data directory   {}", dir.display());
    println!(
        "  workload         {} brokers x {} partitions x {} batches of {} records",
        args.brokers, args.partitions, args.batches, args.records
    );

    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let storage = Arc::new(ObjectStoreStorage::local_fs(dir.join("objects"))?);
    let coordinator: Arc<dyn BatchCoordinator> = match args.coordinator.as_deref() {
        None => Arc::new(
            SqliteCoordinator::open(
                dir.join("coordinator.db"),
                SqliteOptions::default(),
                clock.clone(),
            )
            .await?,
        ),
        Some(url) if url.starts_with("sqlite:") => Arc::new(
            SqliteCoordinator::open_url(url, SqliteOptions::default(), clock.clone()).await?,
        ),
        Some(url) if url.starts_with("postgres:") || url.starts_with("postgresql:") => {
            Arc::new(PostgresCoordinator::connect_url(url, clock.clone()).await?)
        }
        Some(url) => return Err(format!("unsupported coordinator URL {url}").into()),
    };
    println!(
        "  coordinator      {}",
        args.coordinator
            .as_deref()
            .unwrap_or("sqlite (coordinator.db in the data directory)")
    );
    // A fresh topic per run; the id only has to be unique.
    let topic_id = uuid::Uuid::from_u128(fastrand::Rng::with_seed(entropy_seed()).u128(..));
    let config = TopicConfig::default();
    coordinator
        .create_topic(CreateTopicRequest {
            topic_id,
            name: format!("demo-{topic_id}"),
            partitions: args.partitions,
            config: config.clone(),
        })
        .await?;
    let config = Arc::new(config);

    // Produce: one WalWriter per broker (the node's, sharing its cache), each with an idempotent
    // producer per partition, all at once. The demo is short: no lifecycle workers.
    let node = DisklessNode::builder(
        storage.clone() as Arc<dyn ObjectStorage>,
        coordinator.clone(),
    )
    .with_clock(clock.clone())
    .with_config(
        NodeConfig::default()
            .with_broker_ids((0..args.brokers).collect())
            .with_writer(
                WalWriterConfig::default()
                    .with_commit_interval(Duration::from_millis(args.commit_interval_ms)),
            )
            .with_lifecycle(NodeLifecycleConfig::none()),
    )
    .build()?;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for broker in 0..args.brokers {
        let writer = node
            .writer(broker)
            .ok_or("the node writes for every broker id")?
            .clone();
        let config = config.clone();
        let (partitions, batches, records) = (args.partitions, args.batches, args.records);
        tasks.push(tokio::spawn(async move {
            let mut acked = Vec::new();
            let mut latencies = Vec::new();
            for seq in 0..batches {
                let mut parts = Vec::with_capacity(partitions as usize);
                for p in 0..partitions {
                    let mut b = RecordBatchBuilder::new()
                        .producer(
                            i64::from(broker) * 1_000_000 + i64::from(p),
                            0,
                            seq * records,
                        )
                        .compression(Compression::ALL[(seq as usize) % Compression::ALL.len()]);
                    let now = SystemClock.now_ms();
                    for r in 0..records {
                        let value = format!("broker {broker} partition {p} batch {seq} record {r}");
                        b = b.record(
                            now,
                            Some(format!("key-{r}").as_bytes()),
                            Some(value.as_bytes()),
                        );
                    }
                    let batch = b.build().map_err(|e| e.to_string())?;
                    parts.push(ProducePartition {
                        partition: TopicIdPartition::new(topic_id, p),
                        config: config.clone(),
                        records: batch.into_bytes(),
                        txn_seq: None,
                    });
                }
                let sent: Vec<Bytes> = parts.iter().map(|p| p.records.clone()).collect();
                let t = Instant::now();
                let answers = writer.produce(parts).await;
                latencies.push(t.elapsed());
                for (answer, bytes) in answers.into_iter().zip(sent) {
                    if answer.error != ErrorCode::None {
                        return Err(format!(
                            "broker {broker}: produce to {} failed: {} {:?}",
                            answer.partition, answer.error, answer.error_message
                        ));
                    }
                    acked.push((answer.partition.partition, answer.base_offset, bytes));
                }
            }
            Ok::<_, String>((acked, latencies, writer))
        }));
    }
    let mut acked: BTreeMap<(i32, i64), Bytes> = BTreeMap::new();
    let mut latencies = Vec::new();
    let mut produced_bytes = 0usize;
    let mut writers = Vec::new();
    for task in tasks {
        let (batches, lat, writer) = task.await??;
        writers.push(writer);
        latencies.extend(lat);
        for (p, offset, bytes) in batches {
            produced_bytes += bytes.len();
            if acked.insert((p, offset), bytes).is_some() {
                println!("FAIL: offset {offset} of partition {p} was acknowledged twice");
                return Ok(false);
            }
        }
    }
    let produce_time = started.elapsed();
    node.close().await;
    let segments: u64 = writers.iter().map(|w| w.stats().segments_committed).sum();
    let puts = storage.counters().snapshot();

    // Consume: like a consumer of the whole topic, fetch every partition in each request, with a
    // cold fetcher of its own (not the node's, whose cache holds what was just written), so each
    // object touched costs one ranged GET.
    let fetcher = Fetcher::builder(storage.clone(), coordinator.clone()).build()?;
    let mut ok = true;
    let mut offsets: BTreeMap<i32, i64> = (0..args.partitions).map(|p| (p, 0)).collect();
    let mut per_partition: BTreeMap<i32, (i64, i64)> = BTreeMap::new();
    let mut fetches = 0;
    loop {
        let requests: Vec<FetchPartition> = offsets
            .iter()
            .map(|(&p, &offset)| FetchPartition {
                partition: TopicIdPartition::new(topic_id, p),
                fetch_offset: offset,
                partition_max_bytes: 1 << 20,
                leader_epoch: 0,
                isolation: Default::default(),
            })
            .collect();
        let answers = fetcher.fetch(&requests, 50 << 20).await?;
        fetches += 1;
        let mut progress = false;
        for got in answers {
            let p = got.partition.partition;
            if got.error != ErrorCode::None {
                println!("FAIL: fetch of partition {p}: {}", got.error);
                return Ok(false);
            }
            let entry = per_partition.entry(p).or_insert((0, 0));
            entry.1 = got.high_watermark;
            for b in split_batches(got.records_bytes())? {
                let offset = offsets.get_mut(&p).ok_or("unknown partition")?;
                let expected = acked.remove(&(p, b.base_offset()));
                let matches = verify_stored_batch(&b).is_ok()
                    && b.base_offset() == *offset
                    && expected.as_ref().is_some_and(|sent| {
                        sent.len() == b.len() && sent[16..] == b.as_bytes()[16..]
                    });
                if !matches {
                    println!(
                        "FAIL: partition {p} offset {}: not what was acknowledged",
                        b.base_offset()
                    );
                    ok = false;
                }
                *offset = b.last_offset() + 1;
                entry.0 += 1;
                progress = true;
            }
        }
        if !progress {
            break;
        }
    }
    if !acked.is_empty() {
        println!(
            "FAIL: {} acknowledged batches were not read back",
            acked.len()
        );
        ok = false;
    }
    let costs = storage.counters().snapshot();
    let objects: Vec<_> = storage.list("").try_collect().await?;

    latencies.sort();
    println!();
    println!("  partition   batches   records (high watermark)");
    for (p, (batches, hwm)) in &per_partition {
        println!("  {p:>9}   {batches:>7}   {hwm:>7}");
    }
    println!();
    println!(
        "  produced         {} batches, {:.1} MiB in {:.2?}",
        per_partition.values().map(|(b, _)| b).sum::<i64>(),
        produced_bytes as f64 / (1 << 20) as f64,
        produce_time
    );
    println!(
        "  WAL segments     {segments} committed, {} objects in storage",
        objects.len()
    );
    println!(
        "  object storage   {} PUTs ({:.1} MiB); {} GETs ({:.1} MiB) in {fetches} fetches to read \
         everything back",
        puts.put_requests,
        puts.put_bytes as f64 / (1 << 20) as f64,
        costs.get_requests - puts.get_requests,
        (costs.get_bytes - puts.get_bytes) as f64 / (1 << 20) as f64,
    );
    println!(
        "  produce latency  p50 {:.1?}  p99 {:.1?}  max {:.1?}",
        percentile(&latencies, 0.50),
        percentile(&latencies, 0.99),
        percentile(&latencies, 1.0)
    );
    println!();
    if ok {
        println!(
            "OK: every acknowledged batch was read back exactly once, in order, byte for byte"
        );
    } else {
        println!("FAILED: what was read back differs from what was acknowledged");
    }
    Ok(ok)
}
