//! Figure 8: peak RSS while storage stalls, vs the configured pending-bytes bound.
//!
//! Each scenario runs in a child process (this binary with `--mem-child <bound>`), so that its peak
//! RSS (`VmHWM` of /proc/self/status) is its own. The child stalls every upload, lets producers with
//! fresh 1 MiB requests push until the writer's bound stops them, holds there, reads VmHWM, then
//! releases the store and checks that every request is answered.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use diskless_coordinator::{ErrorCode, SystemClock, TopicConfig, TopicIdPartition};
use diskless_core::{ProducePartition, WalWriter, WalWriterConfig};
use diskless_storage::ObjectStorage;
use diskless_testkit::coordinator::InMemoryCoordinator;
use diskless_testkit::storage::{FaultConfig, FaultyStorage};

use crate::report::{Row, Status};
use crate::util::{NullStorage, create_topic, make_batch, now_ms, rss, runtime};

/// RSS allowed above the bound: allocator slack, the producers' waiting requests, runtime.
pub(crate) const MARGIN: u64 = 32 << 20;
const PRODUCERS: usize = 4;
const REQUEST: usize = 1 << 20;
const MIB: f64 = (1u64 << 20) as f64;

/// Runs figure 8 (spawns one child per scenario).
pub(crate) fn run(quick: bool) -> Vec<Row> {
    let bounds: &[u64] = if quick {
        &[8 << 20, 32 << 20]
    } else {
        &[64 << 20, 256 << 20]
    };
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            return vec![Row::not_measured(
                8,
                "peak RSS",
                format!("no executable path: {e}"),
            )];
        }
    };
    let mut rows = Vec::new();
    for &bound in bounds {
        let out = std::process::Command::new(&exe)
            .arg("--mem-child")
            .arg(bound.to_string())
            .output();
        let parsed = out.ok().and_then(|o| {
            let text = String::from_utf8_lossy(&o.stdout).to_string();
            let line = text.lines().find(|l| l.starts_with("MEM "))?.to_string();
            let get = |k: &str| -> Option<u64> {
                line.split_whitespace()
                    .find_map(|kv| kv.strip_prefix(&format!("{k}=")).map(str::to_string))
                    .and_then(|v| v.parse().ok())
            };
            Some((
                get("base")?,
                get("peak")?,
                get("pending")?,
                get("attempted")?,
            ))
        });
        let Some((base, peak, pending, attempted)) = parsed else {
            rows.push(Row::not_measured(8, "peak RSS", "the child process failed"));
            continue;
        };
        let growth = peak.saturating_sub(base);
        let ratio = growth as f64 / bound as f64;
        rows.push(
            Row::new(
                8,
                format!(
                    "peak RSS growth, uploads stalled, bound {} MiB",
                    bound >> 20
                ),
                format!("{:.1} MiB", growth as f64 / MIB),
            )
            .baseline(format!(
                "bound {} MiB (pending at stall {:.1} MiB; {:.0} MiB offered; base RSS {:.1} MiB)",
                bound >> 20,
                pending as f64 / MIB,
                attempted as f64 / MIB,
                base as f64 / MIB
            ))
            .ratio(format!("{ratio:.2}x bound"))
            .target(
                format!("<= bound + {} MiB", MARGIN >> 20),
                Status::from_bool(growth <= bound + MARGIN),
            )
            .numbers(&[growth as f64, bound as f64, ratio]),
        );
    }
    rows
}

/// The child: prints `MEM base=<bytes> peak=<bytes> pending=<bytes> attempted=<bytes>`.
pub(crate) fn child(bound: u64) {
    let rt = runtime();
    rt.block_on(async move {
        let clock = Arc::new(SystemClock);
        let coordinator = Arc::new(InMemoryCoordinator::new(clock.clone()));
        let topic = create_topic(coordinator.as_ref(), "bench", 64).await;
        // The store keeps nothing, so that only the writer's memory shows.
        let faulty = Arc::new(FaultyStorage::new(
            NullStorage::default(),
            FaultConfig::default(),
        ));
        faulty.stall_uploads();
        let storage: Arc<dyn ObjectStorage> = faulty.clone();
        let writer = match WalWriter::builder(storage, coordinator)
            .with_config(
                WalWriterConfig::default()
                    .with_buffer_max_bytes((bound / 8) as usize)
                    .with_max_pending_bytes(bound as usize)
                    .with_max_concurrent_uploads(4),
            )
            .with_clock(clock)
            .build()
        {
            Ok(w) => Arc::new(w),
            Err(e) => panic!("writer: {e}"),
        };
        let template = make_batch(64 << 10, now_ms(), 1);
        let config = Arc::new(TopicConfig::default());
        // Reset the peak to the current RSS (Linux >= 4.0), then read the base.
        let _ = std::fs::write("/proc/self/clear_refs", "5");
        let base = rss().map(|(_, cur)| cur).unwrap_or(0);
        let offered = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let mut tasks = Vec::new();
        for w in 0..PRODUCERS {
            let writer = writer.clone();
            let template = template.clone();
            let config = config.clone();
            let offered = offered.clone();
            tasks.push(tokio::spawn(async move {
                let mut pending = Vec::new();
                let mut i = w;
                // Offer four times the bound; the writer blocks us at the bound.
                while offered.load(std::sync::atomic::Ordering::Relaxed) < 4 * bound {
                    let request: Vec<ProducePartition> = (0..REQUEST / template.len())
                        .map(|j| ProducePartition {
                            partition: TopicIdPartition::new(topic, ((i + j) % 64) as i32),
                            config: config.clone(),
                            // A fresh allocation per batch, as a network layer would make.
                            records: Bytes::copy_from_slice(&template),
                            txn_seq: None,
                        })
                        .collect();
                    i += PRODUCERS;
                    offered.fetch_add(REQUEST as u64, std::sync::atomic::Ordering::Relaxed);
                    pending.push(writer.append(request).await);
                }
                let mut ok = true;
                for p in pending {
                    ok &= p.await.iter().all(|a| a.error == ErrorCode::None);
                }
                ok
            }));
        }
        // Wait until the writer is full and every upload slot is stalled, then hold a little.
        for _ in 0..400 {
            tokio::time::sleep(Duration::from_millis(25)).await;
            let pending = writer.stats().pending_bytes;
            if faulty.stalled_uploads() >= 4 && pending + (REQUEST as u64) * 2 > bound {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let pending = writer.stats().pending_bytes;
        let peak = rss().map(|(hwm, _)| hwm).unwrap_or(0);
        let attempted = offered.load(std::sync::atomic::Ordering::Relaxed);
        // Let the stall go; every request must then be answered.
        faulty.release_uploads();
        let mut all_ok = true;
        for t in tasks {
            all_ok &= t.await.unwrap_or(false);
        }
        writer.close().await;
        if !all_ok {
            eprintln!("some requests failed after the stall was released");
        }
        println!("MEM base={base} peak={peak} pending={pending} attempted={attempted} ok={all_ok}");
    });
}
