//! The benchmark harness of diskless-rs (issue 8): every figure next to a baseline measured in the
//! same run, as a markdown table.
//!
//! ```text
//! cargo run --release -p diskless-bench -- [--quick] [--only 1,4,...]
//! ```
//!
//! `--quick` is the smoke mode CI runs (seconds, also in a debug build); figures 5 and 6 run on
//! tokio's paused clock (simulated time), as does figure 13; figure 12 advances a manual clock.
//! See BENCHMARKS.md at the repository root.

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a command-line tool: the results table goes to stdout, progress and usage to stderr, \
              and a --mem-child process answers its parent on stdout"
)]

mod fig10_scale;
mod fig11_transactions;
mod fig12_bounded_state;
mod fig13_tier_reads;
mod fig14_concurrent_builds;
mod fig14_consolidation_cost;
mod fig15_recompression;
mod fig1_produce;
mod fig2_sqlite;
mod fig3_postgres;
mod fig4_fetch;
mod fig5_latency;
mod fig6_pipeline;
mod fig7_cost;
mod fig8_memory;
mod fig9_timestamp_lookup;
mod raw;
mod report;
mod tiered;
mod util;

use std::time::Instant;

/// A figure: runs in quick or full mode, returns its rows.
type Figure = fn(bool) -> Vec<report::Row>;

fn usage() -> ! {
    eprintln!("usage: diskless-bench [--quick] [--only N[,N...]]   (N in 1..=15)");
    std::process::exit(2);
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--mem-child") {
        let bound = args
            .get(1)
            .and_then(|b| b.parse().ok())
            .unwrap_or_else(|| usage());
        fig8_memory::child(bound);
        return;
    }
    let mut quick = false;
    let mut only: Option<Vec<u8>> = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--quick" => quick = true,
            "--only" => {
                let list = it.next().unwrap_or_else(|| usage());
                let figures: Result<Vec<u8>, _> =
                    list.split(',').map(|s| s.trim().parse()).collect();
                match figures {
                    Ok(f) if f.iter().all(|n| (1..=15).contains(n)) => only = Some(f),
                    _ => usage(),
                }
            }
            _ => usage(),
        }
    }
    let wanted = |n: u8| only.as_ref().is_none_or(|o| o.contains(&n));
    let figures: [(u8, Figure); 15] = [
        (1, fig1_produce::run),
        (2, fig2_sqlite::run),
        (3, fig3_postgres::run),
        (4, fig4_fetch::run),
        (5, fig5_latency::run),
        (6, fig6_pipeline::run),
        (7, fig7_cost::run),
        (8, fig8_memory::run),
        (9, fig9_timestamp_lookup::run),
        (10, fig10_scale::run),
        (11, fig11_transactions::run),
        (12, fig12_bounded_state::run),
        (13, fig13_tier_reads::run),
        (14, fig14_consolidation_cost::run),
        (15, fig15_recompression::run),
    ];
    println!(
        "diskless-bench {} mode, {} build",
        if quick { "quick (smoke)" } else { "full" },
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
    );
    let mut all = Vec::new();
    for (n, run) in figures {
        if !wanted(n) {
            continue;
        }
        let start = Instant::now();
        let rows = run(quick);
        eprintln!("figure {n}: {:.1} s", start.elapsed().as_secs_f64());
        // Print each figure as it completes, so long runs show progress.
        for r in &rows {
            eprintln!("{}", report::line(r));
        }
        all.extend(rows);
    }
    println!();
    println!("{}", report::header());
    for r in &all {
        println!("{}", report::line(r));
    }
    let mut produced: Vec<u8> = all.iter().map(|r| r.figure).collect();
    produced.dedup();
    let non_finite = all
        .iter()
        .filter(|r| r.numbers.iter().any(|x| !x.is_finite()))
        .count();
    let below = all
        .iter()
        .filter(|r| r.status == report::Status::Below)
        .count();
    let pass = all
        .iter()
        .filter(|r| r.status == report::Status::Pass)
        .count();
    println!();
    println!("targets: {pass} PASS, {below} BELOW");
    println!(
        "figures produced: {}",
        produced
            .iter()
            .map(u8::to_string)
            .collect::<Vec<_>>()
            .join(",")
    );
    println!("rows with non-finite numbers: {non_finite}");
}
