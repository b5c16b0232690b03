//! `s3-server`: the testkit's S3 server (s3s + s3s-fs, `diskless_testkit::storage::S3TestServer`)
//! as a process, for benchmarks with real clients against an S3 HTTP endpoint
//! (`bench/clients/produce_throughput.py --s3`).
//!
//! It prints one line of `KEY=VALUE` pairs on stdout — `AWS_ENDPOINT`, `AWS_ACCESS_KEY_ID`,
//! `AWS_SECRET_ACCESS_KEY`, `AWS_DEFAULT_REGION`, `AWS_ALLOW_HTTP`, `BUCKET` and `ROOT` (the
//! directory holding `<bucket>/<key>`, where objects can be counted; a new bucket is a new
//! directory there) — then serves until its stdin is closed, and removes its data directory on the
//! way out. Each line `stats` read on stdin is answered with one line on stdout: `STATS` and the
//! requests received so far as `<bucket>/<KIND>=<count>` pairs (kinds as
//! `S3TestServer::request_counts`: GET, LIST, PUT, POST, HEAD, DELETE, OTHER).
//!
//! Usage: `cargo run --release -p diskless-bench --bin s3-server` (options: `--threads N`, tokio
//! worker threads, default 1; `--latency P50MS:P99MS` or `standard` (60:250) or `express` (5:20):
//! hold every request for a log-normal delay with that median and 99th percentile,
//! `diskless_testkit::storage::InjectedLatency`; `--latency-seed N`, default 1).

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a command-line tool: its endpoint goes to stdout, usage and errors to stderr"
)]

use std::io::{BufRead, Write};

use diskless_testkit::storage::{InjectedLatency, S3TestServer};

fn main() {
    let mut threads = 1usize;
    let mut latency: Option<InjectedLatency> = None;
    let mut seed = 1u64;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let value = args.next();
        match (arg.as_str(), value.as_deref()) {
            ("--threads", Some(v)) if v.parse::<usize>().is_ok_and(|n| n > 0) => {
                threads = v.parse().unwrap_or(1);
            }
            ("--latency", Some(v)) if InjectedLatency::parse(v).is_some() => {
                latency = InjectedLatency::parse(v);
            }
            ("--latency-seed", Some(v)) if v.parse::<u64>().is_ok() => {
                seed = v.parse().unwrap_or(1);
            }
            _ => {
                eprintln!(
                    "usage: s3-server [--threads N] [--latency P50MS:P99MS|standard|express] \
                     [--latency-seed N]   (serves until stdin is closed)"
                );
                std::process::exit(2);
            }
        }
    }
    let latency = latency.map(|l| InjectedLatency { seed, ..l });
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("s3-server: tokio runtime: {e}");
            std::process::exit(1);
        }
    };
    runtime.block_on(async {
        let server = match S3TestServer::start_with_latency(latency).await {
            Ok(s) => s,
            Err(e) => {
                eprintln!("s3-server: cannot start: {e}");
                std::process::exit(1);
            }
        };
        println!(
            "AWS_ENDPOINT={} AWS_ACCESS_KEY_ID={} AWS_SECRET_ACCESS_KEY={} AWS_DEFAULT_REGION={} \
             AWS_ALLOW_HTTP=true BUCKET={} ROOT={}",
            server.endpoint(),
            server.access_key(),
            server.secret_key(),
            server.region(),
            server.bucket(),
            server.root().display()
        );
        let _ = std::io::stdout().flush();
        // Serve until stdin reaches end of file (the parent closed it or exited); answer each
        // `stats` line with the request counts.
        let (tx, mut rx) = tokio::sync::mpsc::channel::<()>(1);
        std::thread::spawn(move || {
            for line in std::io::stdin().lock().lines() {
                match line {
                    Ok(line) if line.trim() == "stats" => {
                        if tx.blocking_send(()).is_err() {
                            return;
                        }
                    }
                    Ok(_) => {}
                    Err(_) => return,
                }
            }
        });
        while rx.recv().await.is_some() {
            let counts = server.request_counts();
            let pairs: Vec<String> = counts
                .iter()
                .flat_map(|(bucket, kinds)| {
                    kinds
                        .iter()
                        .map(move |(kind, n)| format!("{bucket}/{kind}={n}"))
                })
                .collect();
            println!("STATS {}", pairs.join(" "));
            let _ = std::io::stdout().flush();
        }
        server.shutdown().await;
    });
}
