//! The simulation in CI, replays and soaks. See the crate docs for what is simulated.
//!
//! CI runs the seeds below (about two minutes in a debug build on two cores, transactions and
//! tiered segments included). A soak:
//! `DISKLESS_SIM_SEEDS=1000 DISKLESS_SIM_START_SEED=5000 DISKLESS_SIM_VARIANT=sharded
//! DISKLESS_SIM_KEEP_GOING=1 cargo test --release -p diskless-sim --test sim sharded -- --nocapture`
//! (`KEEP_GOING` lists every failing seed instead of stopping at the first;
//! `DISKLESS_SIM_DISABLE=<kind>,...` switches fault kinds off, see `Faults::NAMES`). A replay
//! with the whole trace: `DISKLESS_SIM_SEED=<seed> DISKLESS_SIM_VARIANT=<variant> cargo test -p
//! diskless-sim --test sim replay -- --nocapture`.
#![allow(clippy::print_stderr)] // A soak reports each seed and each failure.

use std::time::Instant;

use diskless_sim::{Faults, SimConfig, Variant, run};

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

fn faults_from_env() -> Faults {
    let mut faults = Faults::default();
    if let Ok(list) = std::env::var("DISKLESS_SIM_DISABLE") {
        for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            assert!(
                faults.set(name, false),
                "unknown fault kind {name:?}; known: {:?}",
                Faults::NAMES
            );
        }
    }
    faults
}

/// Seeds run per variant in CI.
const CI_SEEDS_MODEL: u64 = 70;
const CI_SEEDS_SHARDED: u64 = 50;
const CI_SEEDS_SQLITE: u64 = 25;

/// Runs `DISKLESS_SIM_SEEDS` (default `default_count`) seeds from `DISKLESS_SIM_START_SEED`
/// (default 1) of `variant`, unless `DISKLESS_SIM_VARIANT` names another; panics with the first
/// violation (or, with `DISKLESS_SIM_KEEP_GOING`, all of them at the end).
fn run_seeds(variant: Variant, default_count: u64) {
    if let Ok(only) = std::env::var("DISKLESS_SIM_VARIANT")
        && Variant::parse(&only) != Some(variant)
    {
        return;
    }
    let count = env_u64("DISKLESS_SIM_SEEDS").unwrap_or(default_count);
    let start = env_u64("DISKLESS_SIM_START_SEED").unwrap_or(1);
    let faults = faults_from_env();
    let keep_going = std::env::var_os("DISKLESS_SIM_KEEP_GOING").is_some();
    let began = Instant::now();
    let mut failures = Vec::new();
    // Whether data was read across tiers at all: the tiering worker ran and consumers were
    // served from segments (the final scan reads every batch from them, after the drain).
    let (mut segments, mut tiered_reads) = (0u64, 0u64);
    for seed in start..start + count {
        let mut config = SimConfig::new(seed, variant);
        config.faults = faults.clone();
        let t = Instant::now();
        match run(&config) {
            Ok(report) => {
                segments += report.stats.segments_registered;
                tiered_reads += report.stats.consumer_tiered_bytes;
                eprintln!(
                    "{variant} seed {seed}: ok in {:?} ({} virtual s, {} events) {:?}",
                    t.elapsed(),
                    report.virtual_ms / 1000,
                    report.events,
                    report.stats
                )
            }
            Err(v) if keep_going => {
                eprintln!("{variant} seed {seed}: FAILED\n{v}");
                failures.push(v);
            }
            Err(v) => panic!("{v}"),
        }
    }
    eprintln!(
        "{variant}: {count} seeds from {start} in {:?}, {} failed; {segments} segments registered, {tiered_reads} bytes served to readers from segments",
        began.elapsed(),
        failures.len()
    );
    if let Some(first) = failures.first() {
        let seeds: Vec<String> = failures
            .iter()
            .map(|v| format!("{} ({})", v.seed, v.invariant))
            .collect();
        panic!("failing seeds: {}\nfirst:\n{first}", seeds.join(", "));
    }
    if count >= 5 {
        assert!(
            segments > 0 && tiered_reads > 0,
            "{variant}: {count} seeds registered {segments} segments and served {tiered_reads} bytes from them: tiering is not exercised"
        );
    }
}

#[test]
fn model() {
    run_seeds(Variant::Model, CI_SEEDS_MODEL);
}

#[test]
fn sqlite() {
    run_seeds(Variant::Sqlite, CI_SEEDS_SQLITE);
}

#[test]
fn sharded() {
    run_seeds(Variant::Sharded, CI_SEEDS_SHARDED);
}

/// Replays one seed with its trace printed: `DISKLESS_SIM_SEED=<seed> DISKLESS_SIM_VARIANT=<variant>
/// cargo test -p diskless-sim --test sim replay -- --nocapture` (does nothing without the seed).
#[test]
fn replay() {
    let Some(seed) = env_u64("DISKLESS_SIM_SEED") else {
        return;
    };
    let name = std::env::var("DISKLESS_SIM_VARIANT").unwrap_or_else(|_| "model".into());
    let variant = Variant::parse(&name).unwrap_or_else(|| panic!("unknown variant {name:?}"));
    let mut config = SimConfig::new(seed, variant);
    config.faults = faults_from_env();
    config.echo = true;
    match run(&config) {
        Ok(report) => eprintln!(
            "seed {seed} {variant}: ok, trace hash {:016x}, {:?}",
            report.trace_hash, report.stats
        ),
        Err(v) => panic!("{v}"),
    }
}

/// A run is reproducible: the same seed gives the same trace, event for event.
#[test]
fn same_seed_same_trace() {
    for variant in Variant::ALL {
        let config = SimConfig::new(3, variant);
        let a = run(&config).unwrap_or_else(|v| panic!("{v}"));
        let b = run(&config).unwrap_or_else(|v| panic!("{v}"));
        assert_eq!(
            (a.trace_hash, a.events, &a.stats),
            (b.trace_hash, b.events, &b.stats),
            "{variant} seed 3 is not reproducible"
        );
        let other = run(&SimConfig::new(4, variant)).unwrap_or_else(|v| panic!("{v}"));
        assert_ne!(a.trace_hash, other.trace_hash, "the seed must matter");
    }
}
