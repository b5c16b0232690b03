//! Produce latency by partitions per request, on `nisshi-diskless` with its default settings
//! (local files + SQLite, the writer's default seal policy): one partition per request (the
//! baseline, measured in the same run), eight partitions through this crate's `ProduceService`
//! (all diskless partitions of a request in one writer append), and eight through tansu 0.6.0's
//! own `ProduceService` over the same storage (one partition after another).
//!
//! `cargo run --example produce_partitions [-- ROUNDS]` (default 60 requests of each kind,
//! interleaved; the dev profile, whose dependencies are optimised: the figure is commit waits, not
//! CPU). Prints p50/p99 in ms and each p50 as a ratio of the baseline's (BENCHMARKS.md).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::time::{Duration, Instant};

use clap::Parser;
use diskless_core::RecordBatchBuilder;
use diskless_nisshi::config::Config;
use diskless_nisshi::run::start;
use diskless_nisshi::services::ProduceService;
use rama::{Context, Service};
use tansu_sans_io::{
    ProduceRequest,
    create_topics_request::{CreatableTopic, CreatableTopicConfig},
    produce_request::{PartitionProduceData, TopicProduceData},
    record::deflated::{Batch, Frame},
};
use tansu_storage::Storage;

const PARTITIONS: i32 = 8;

fn batch() -> Batch {
    use diskless_coordinator::Clock as _;
    let now = diskless_coordinator::SystemClock.now_ms();
    let mut b = RecordBatchBuilder::new();
    let value = vec![b'x'; 100];
    for i in 0..10 {
        b = b.record(now + i, None, Some(&value));
    }
    Batch::try_from(b.build().unwrap().into_bytes()).unwrap()
}

fn request(partitions: i32) -> ProduceRequest {
    ProduceRequest::default()
        .acks(-1)
        .timeout_ms(30_000)
        .topic_data(Some(vec![
            TopicProduceData::default()
                .name("bench".into())
                .partition_data(Some(
                    (0..partitions)
                        .map(|p| {
                            PartitionProduceData::default()
                                .index(p)
                                .records(Some(Frame {
                                    batches: vec![batch()],
                                }))
                        })
                        .collect(),
                )),
        ]))
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let rounds: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(60);
    let dir = tempfile::tempdir().unwrap();
    let config = Config::parse_from([
        "nisshi-diskless",
        "--data-dir",
        dir.path().to_str().unwrap(),
        "--kafka-advertised-listener-url",
        "tcp://127.0.0.1:0",
    ]);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let running = start(&config, Some(listener)).await.unwrap();
    let s = running.storage.clone();
    s.create_topic(
        CreatableTopic::default()
            .name("bench".into())
            .num_partitions(PARTITIONS)
            .replication_factor(1)
            .assignments(Some(vec![]))
            .configs(Some(vec![
                CreatableTopicConfig::default()
                    .name("diskless.enable".into())
                    .value(Some("true".into())),
            ])),
        false,
    )
    .await
    .unwrap();

    let kinds = [
        "1 partition (baseline)",
        "8 partitions, this crate",
        "8 partitions, tansu's",
    ];
    let mut times: [Vec<Duration>; 3] = Default::default();
    for round in 0..rounds + 3 {
        for (k, times) in times.iter_mut().enumerate() {
            let ctx = Context::with_state(s.clone());
            let started = Instant::now();
            let response = match k {
                0 => ProduceService.serve(ctx, request(1)).await.unwrap(),
                1 => ProduceService
                    .serve(ctx, request(PARTITIONS))
                    .await
                    .unwrap(),
                _ => tansu_storage::ProduceService
                    .serve(ctx, request(PARTITIONS))
                    .await
                    .unwrap(),
            };
            let elapsed = started.elapsed();
            for t in response.responses.unwrap_or_default() {
                for p in t.partition_responses.unwrap_or_default() {
                    assert_eq!(p.error_code, 0, "{p:?}");
                }
            }
            // The first rounds warm up (connections, caches).
            if round >= 3 {
                times.push(elapsed);
            }
        }
    }
    let p50 = |t: &mut Vec<Duration>| {
        t.sort();
        (percentile(t, 0.5), percentile(t, 0.99))
    };
    let summary: Vec<(Duration, Duration)> = times.iter_mut().map(p50).collect();
    let base = summary[0].0.as_secs_f64();
    println!(
        "produce latency by partitions per request ({rounds} requests each, default settings)"
    );
    println!("| request | p50 ms | p99 ms | p50 / baseline |");
    println!("|---|---|---|---|");
    for (kind, (p50, p99)) in kinds.iter().zip(&summary) {
        println!(
            "| {kind} | {:.1} | {:.1} | {:.2}x |",
            p50.as_secs_f64() * 1e3,
            p99.as_secs_f64() * 1e3,
            p50.as_secs_f64() / base
        );
    }
    drop(s);
    running.shutdown().await;
}
