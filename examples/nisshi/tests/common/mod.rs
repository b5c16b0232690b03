//! Helpers of the integration tests: a node on a temporary directory, topics, batches, reads.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stderr,
    dead_code,
    unreachable_pub
)]

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Parser;
use diskless_core::RecordBatchBuilder;
use diskless_nisshi::config::Config;
use diskless_nisshi::run::{Running, start};
use tansu_sans_io::{
    IsolationLevel,
    create_topics_request::{CreatableTopic, CreatableTopicConfig},
    record::deflated,
};
use tansu_storage::{Storage, Topition};

pub async fn node(dir: &Path) -> Running {
    node_with_args(dir, &[]).await
}

/// A node on `dir` with `extra` command-line options besides the tests' usual ones.
pub async fn node_with_args(dir: &Path, extra: &[&str]) -> Running {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let config = Config::parse_from(
        [
            "nisshi-diskless",
            "--data-dir",
            dir.to_str().unwrap(),
            "--kafka-advertised-listener-url",
            "tcp://127.0.0.1:0",
            "--maintenance-interval-ms",
            "3600000",
        ]
        .into_iter()
        // The tests' linger unless `extra` sets one.
        .chain(
            (!extra.contains(&"--diskless-linger-ms"))
                .then_some(["--diskless-linger-ms", "20"])
                .into_iter()
                .flatten(),
        )
        .chain(extra.iter().copied()),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    start(&config, Some(listener)).await.unwrap()
}

/// A node on a fresh directory with a classic topic `c` (1 partition) and a diskless topic `d`
/// (`diskless` partitions); the directory goes when the returned guard does.
pub async fn node_with_c_and_d(diskless: i32) -> (tempfile::TempDir, Running) {
    let dir = tempfile::tempdir().unwrap();
    let running = node(dir.path()).await;
    let s = &running.storage;
    s.create_topic(topic("c", 1, Some(false)), false)
        .await
        .unwrap();
    s.create_topic(topic("d", diskless, Some(true)), false)
        .await
        .unwrap();
    (dir, running)
}

/// Starts a transaction of `tid` (InitProducerId, AddPartitionsToTxn of `partitions`, each
/// `(topic, partition)`); its producer.
pub async fn begin_txn<S: Storage>(
    s: &S,
    tid: &str,
    partitions: &[(&str, i32)],
) -> tansu_storage::ProducerIdResponse {
    let producer = s
        .init_producer(Some(tid), 60_000, Some(-1), Some(-1))
        .await
        .unwrap();
    assert_eq!(producer.error, tansu_sans_io::ErrorCode::None);
    add_to_txn(s, tid, &producer, partitions).await;
    producer
}

/// AddPartitionsToTxn of `partitions` (each `(topic, partition)`) to `producer`'s transaction.
pub async fn add_to_txn<S: Storage>(
    s: &S,
    tid: &str,
    producer: &tansu_storage::ProducerIdResponse,
    partitions: &[(&str, i32)],
) {
    let topics = partitions
        .iter()
        .map(|(t, p)| {
            tansu_sans_io::add_partitions_to_txn_request::AddPartitionsToTxnTopic::default()
                .name((*t).into())
                .partitions(Some(vec![*p]))
        })
        .collect();
    let added = s
        .txn_add_partitions(tansu_storage::TxnAddPartitionsRequest::VersionZeroToThree {
            transaction_id: tid.into(),
            producer_id: producer.id,
            producer_epoch: producer.epoch,
            topics,
        })
        .await;
    assert!(added.is_ok(), "{added:?}");
}

/// One transactional batch of `producer` holding `values`.
pub fn txn_batch(producer: &tansu_storage::ProducerIdResponse, values: &[&str]) -> deflated::Batch {
    batch_from(
        RecordBatchBuilder::new()
            .transactional(true)
            .producer(producer.id, producer.epoch, 0),
        values,
    )
}

pub fn topic(name: &str, partitions: i32, diskless: Option<bool>) -> CreatableTopic {
    let configs = diskless.map(|d| {
        vec![
            CreatableTopicConfig::default()
                .name("diskless.enable".into())
                .value(Some(d.to_string())),
        ]
    });
    CreatableTopic::default()
        .name(name.into())
        .num_partitions(partitions)
        .replication_factor(1)
        .assignments(Some(vec![]))
        .configs(configs)
}

/// The first record timestamp of every batch: a minute before the test started (recent: with
/// 1970 or 2023 timestamps the default `retention.ms` of 7 days deletes what the test reads).
pub fn base_timestamp() -> i64 {
    static BASE: std::sync::OnceLock<i64> = std::sync::OnceLock::new();
    *BASE.get_or_init(|| {
        use diskless_coordinator::Clock;
        diskless_coordinator::SystemClock.now_ms() - 60_000
    })
}

pub fn batch(values: &[&str]) -> deflated::Batch {
    batch_from(RecordBatchBuilder::new(), values)
}

pub fn batch_from(builder: RecordBatchBuilder, values: &[&str]) -> deflated::Batch {
    let mut b = builder;
    for (i, v) in values.iter().enumerate() {
        b = b.record(base_timestamp() + i as i64, None, Some(v.as_bytes()));
    }
    let bytes: Bytes = b.build().unwrap().into_bytes();
    deflated::Batch::try_from(bytes).unwrap()
}

/// The values of every record in `batches`, in order (control batches skipped).
pub fn values(batches: &[deflated::Batch]) -> Vec<String> {
    let mut out = Vec::new();
    for b in batches {
        if b.is_control() {
            continue;
        }
        let parsed = diskless_core::RecordBatch::parse(Bytes::from(b.clone())).unwrap();
        let bytes = parsed.records_bytes();
        let count = usize::try_from(b.record_count).unwrap();
        for r in diskless_core::RecordIter::new(&bytes, count) {
            let r = r.unwrap();
            out.push(String::from_utf8(r.value.unwrap().to_vec()).unwrap());
        }
    }
    out
}

pub async fn read_all<S: Storage>(
    s: &S,
    tp: &Topition,
    isolation: IsolationLevel,
) -> Vec<deflated::Batch> {
    // Up to the high watermark (read_uncommitted) or the last stable offset (read_committed):
    // Nisshi's own engine answers a fetch at the end with an empty batch rather than nothing.
    let stage = s.offset_stage(tp).await.unwrap();
    let end = match isolation {
        IsolationLevel::ReadCommitted => stage.last_stable(),
        IsolationLevel::ReadUncommitted => stage.high_watermark(),
    };
    let mut out = Vec::new();
    let mut offset = stage.log_start();
    while offset < end {
        let got = s.fetch(tp, offset, 1, 1 << 20, isolation).await.unwrap();
        let before = offset;
        for b in got.into_iter().filter(|b| b.record_count > 0) {
            offset = offset.max(b.base_offset + i64::from(b.last_offset_delta) + 1);
            out.push(b);
        }
        if offset == before {
            // Nothing more below `end` (read_committed: the rest was aborted and left out).
            return out;
        }
    }
    out
}

pub fn clients_available() -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import confluent_kafka"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        assert!(
            std::env::var("DISKLESS_REQUIRE_KAFKA_CLIENTS").as_deref() != Ok("1"),
            "DISKLESS_REQUIRE_KAFKA_CLIENTS=1 but python3 with confluent_kafka is missing"
        );
        eprintln!("skipped: python3 with confluent_kafka not found (pip install confluent-kafka)");
    }
    ok
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A `nisshi-diskless` process, killed on drop.
pub struct Broker(pub std::process::Child);

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `nisshi-diskless` on `dir` and `port` with `args` added and `env` set, and waits
/// until it listens.
pub fn start_process(
    dir: &std::path::Path,
    port: u16,
    args: &[String],
    env: &[(String, String)],
) -> Broker {
    let child = Command::new(env!("CARGO_BIN_EXE_nisshi-diskless"))
        .args([
            "--data-dir",
            dir.to_str().unwrap(),
            "--kafka-listener-url",
            &format!("tcp://127.0.0.1:{port}"),
            "--kafka-advertised-listener-url",
            &format!("tcp://127.0.0.1:{port}"),
        ])
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env("RUST_LOG", "warn")
        .spawn()
        .unwrap();
    let mut broker = Broker(child);
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Ok(Some(status)) = broker.0.try_wait() {
            panic!("nisshi-diskless exited before listening: {status}");
        }
        assert!(Instant::now() < deadline, "nisshi-diskless did not listen");
        std::thread::sleep(Duration::from_millis(100));
    }
    broker
}
