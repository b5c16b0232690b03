//! Crash durability of the whole produce path on the embedded defaults (local files + SQLite): a
//! process producing from several tasks is killed (abort, no shutdown) while requests are in flight;
//! after reopening, every acknowledged batch is there, at its acknowledged offset, byte for byte.
#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests: a failed step is a failed test.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use diskless_coordinator::sqlite::{SqliteCoordinator, SqliteOptions};
use diskless_coordinator::*;
use diskless_core::*;
use diskless_storage::ObjectStoreStorage;
use uuid::Uuid;

const CHILD_ENV: &str = "DISKLESS_CRASH_CHILD_DIR";
const TOPIC: Uuid = Uuid::from_u128(0x5eed);
const PARTITIONS: i32 = 4;

async fn open(dir: &Path) -> (Arc<ObjectStoreStorage>, Arc<SqliteCoordinator>) {
    let storage = Arc::new(ObjectStoreStorage::local_fs(dir.join("objects")).unwrap());
    let coordinator = Arc::new(
        SqliteCoordinator::open(
            dir.join("coordinator.db"),
            SqliteOptions::default(),
            Arc::new(SystemClock),
        )
        .await
        .unwrap(),
    );
    (storage, coordinator)
}

fn value(partition: i32, n: u32) -> String {
    format!("partition {partition} message {n}")
}

/// The child: produce from one task per partition, print each acknowledgement, abort mid-flight.
fn child(dir: &Path) -> ! {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (storage, coordinator) = open(dir).await;
        coordinator
            .create_topic(CreateTopicRequest {
                topic_id: TOPIC,
                name: "crash".into(),
                partitions: PARTITIONS,
                config: TopicConfig::default(),
            })
            .await
            .unwrap();
        let writer = Arc::new(
            WalWriter::builder(storage, coordinator)
                .with_config(
                    WalWriterConfig::default().with_commit_interval(Duration::from_millis(5)),
                )
                .build()
                .unwrap(),
        );
        let acked = Arc::new(std::sync::atomic::AtomicU32::new(0));
        for p in 0..PARTITIONS {
            let writer = writer.clone();
            let acked = acked.clone();
            tokio::spawn(async move {
                let config = Arc::new(TopicConfig::default());
                for n in 0.. {
                    let batch = RecordBatchBuilder::new()
                        .producer(i64::from(p) + 1, 0, n as i32)
                        .record(SystemClock.now_ms(), None, Some(value(p, n).as_bytes()))
                        .build()
                        .unwrap();
                    let answer = writer
                        .produce(vec![ProducePartition {
                            partition: TopicIdPartition::new(TOPIC, p),
                            config: config.clone(),
                            records: batch.into_bytes(),
                            txn_seq: None,
                        }])
                        .await;
                    assert_eq!(answer[0].error, ErrorCode::None);
                    let mut out = std::io::stdout().lock();
                    writeln!(out, "acked {p} {n} {}", answer[0].base_offset).unwrap();
                    out.flush().unwrap();
                    acked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
            });
        }
        // Kill the process while the producers are in full flight.
        while acked.load(std::sync::atomic::Ordering::SeqCst) < 200 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    });
    std::process::abort();
}

#[test]
fn acknowledged_produces_survive_a_kill() {
    if let Ok(dir) = std::env::var(CHILD_ENV) {
        child(Path::new(&dir));
    }
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "acknowledged_produces_survive_a_kill",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut acked: BTreeMap<(i32, i64), u32> = BTreeMap::new();
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        // libtest may have printed "test <name> ... " without a newline before the first one.
        if let Some(rest) = line.find("acked ").map(|i| &line[i + "acked ".len()..]) {
            let f: Vec<i64> = rest.split(' ').map(|x| x.parse().unwrap()).collect();
            acked.insert((f[0] as i32, f[2]), f[1] as u32);
        }
    }
    let status = child.wait().unwrap();
    assert!(!status.success(), "the child must have been killed");
    assert!(acked.len() >= 200, "only {} acknowledgements", acked.len());

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (storage, coordinator) = open(dir.path()).await;
        let fetcher = Fetcher::builder(storage, coordinator).build().unwrap();
        for p in 0..PARTITIONS {
            let partition = TopicIdPartition::new(TOPIC, p);
            let mut offset = 0;
            let mut served: BTreeMap<i64, Bytes> = BTreeMap::new();
            loop {
                let got = fetcher
                    .fetch(
                        &[FetchPartition {
                            partition,
                            fetch_offset: offset,
                            partition_max_bytes: 1 << 20,
                            leader_epoch: 0,
                            isolation: Default::default(),
                        }],
                        1 << 20,
                    )
                    .await
                    .unwrap();
                // Every committed batch is readable: no object is missing or torn.
                assert_eq!(got[0].error, ErrorCode::None, "{:?}", got[0].error_message);
                let batches = split_batches(got[0].records_bytes()).unwrap();
                if batches.is_empty() {
                    break;
                }
                for b in batches {
                    verify_stored_batch(&b).unwrap();
                    offset = b.last_offset() + 1;
                    served.insert(b.base_offset(), b.into_bytes());
                }
            }
            for ((ap, offset), n) in acked.range((p, i64::MIN)..=(p, i64::MAX)) {
                assert_eq!(*ap, p);
                let batch = served
                    .get(offset)
                    .unwrap_or_else(|| panic!("acknowledged {p}/{offset} lost"));
                let expected = value(p, *n);
                let body = &batch[batch.len() - expected.len() - 1..batch.len() - 1];
                assert_eq!(body, expected.as_bytes(), "{p}/{offset} has other bytes");
            }
        }
    });
}
