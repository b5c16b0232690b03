//! Helpers of the integration tests: a node on a temporary directory, topics, batches, reads.

#![allow(clippy::unwrap_used, clippy::expect_used, dead_code, unreachable_pub)]

use std::path::Path;

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
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let config = Config::parse_from([
        "nisshi-diskless",
        "--data-dir",
        dir.to_str().unwrap(),
        "--kafka-advertised-listener-url",
        "tcp://127.0.0.1:0",
        "--maintenance-interval-ms",
        "3600000",
        "--diskless-linger-ms",
        "20",
    ]);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    start(&config, Some(listener)).await.unwrap()
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
