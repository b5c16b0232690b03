//! [`Lifecycle`]: the workers as tokio tasks on intervals.

use super::{LifecycleError, ObjectCleaner, OrphanCollector, ProducerExpirer, RetentionEnforcer};
use futures::future::BoxFuture;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::task::JoinHandle;

/// Counters of one worker.
#[derive(Debug, Default)]
pub struct WorkerStats {
    passes: AtomicU64,
    failures: AtomicU64,
}

impl WorkerStats {
    /// Passes that completed.
    pub fn passes(&self) -> u64 {
        self.passes.load(Ordering::Relaxed)
    }

    /// Passes that failed (retried at the next interval).
    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }
}

/// Counters of the workers a [`Lifecycle`] runs.
#[derive(Debug, Default)]
pub struct LifecycleStats {
    /// The retention enforcer's.
    pub retention: WorkerStats,
    /// The object cleaner's.
    pub cleaner: WorkerStats,
    /// The orphan collector's.
    pub orphans: WorkerStats,
    /// The producer expirer's.
    pub producers: WorkerStats,
}

type Pass = Arc<dyn Fn() -> BoxFuture<'static, Result<(), LifecycleError>> + Send + Sync>;

/// Runs the lifecycle workers as tokio tasks, each on its own interval (first pass at once).
///
/// Suggested intervals: retention 30 s–5 min (Kafka's `log.retention.check.interval.ms` is 5 min),
/// cleaner 30 s, orphans 1 h (orphans are rare and listing costs money), producer expiry 10 min
/// (Kafka's `producer.id.expiration.check.interval.ms`).
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// use diskless_core::lifecycle::{Lifecycle, RetentionConfig, RetentionEnforcer};
/// use diskless_coordinator::{BatchCoordinator, ManualClock};
/// use diskless_testkit::coordinator::InMemoryCoordinator;
/// use std::{sync::Arc, time::Duration};
///
/// let coordinator: Arc<dyn BatchCoordinator> =
///     Arc::new(InMemoryCoordinator::new(ManualClock::new(0)));
/// let handle = Lifecycle::new()
///     .retention(RetentionEnforcer::new(coordinator, RetentionConfig::default()), Duration::from_secs(30))
///     .spawn();
/// handle.shutdown().await;
/// # });
/// ```
#[derive(Default)]
pub struct Lifecycle {
    retention: Option<(Arc<RetentionEnforcer>, Duration)>,
    cleaner: Option<(Arc<ObjectCleaner>, Duration)>,
    orphans: Option<(Arc<OrphanCollector>, Duration)>,
    producers: Option<(Arc<ProducerExpirer>, Duration)>,
}

impl std::fmt::Debug for Lifecycle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lifecycle")
            .field("retention", &self.retention.as_ref().map(|r| r.1))
            .field("cleaner", &self.cleaner.as_ref().map(|c| c.1))
            .field("orphans", &self.orphans.as_ref().map(|o| o.1))
            .field("producers", &self.producers.as_ref().map(|p| p.1))
            .finish()
    }
}

/// Stops the tasks of a [`Lifecycle`].
#[derive(Debug)]
pub struct LifecycleHandle {
    shutdown: tokio::sync::watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    stats: Arc<LifecycleStats>,
}

impl LifecycleHandle {
    /// The workers' counters.
    pub fn stats(&self) -> &Arc<LifecycleStats> {
        &self.stats
    }

    /// Stops the workers (a pass in progress finishes first) and waits for them.
    pub async fn shutdown(self) {
        self.shutdown.send_replace(true);
        for task in self.tasks {
            let _ = task.await;
        }
    }
}

impl Lifecycle {
    /// No workers yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs `enforcer` every `interval`.
    pub fn retention(mut self, enforcer: RetentionEnforcer, interval: Duration) -> Self {
        self.retention = Some((Arc::new(enforcer), interval));
        self
    }

    /// Runs `cleaner` every `interval`.
    pub fn cleaner(mut self, cleaner: ObjectCleaner, interval: Duration) -> Self {
        self.cleaner = Some((Arc::new(cleaner), interval));
        self
    }

    /// Runs `collector` every `interval`.
    pub fn orphans(mut self, collector: OrphanCollector, interval: Duration) -> Self {
        self.orphans = Some((Arc::new(collector), interval));
        self
    }

    /// Runs `expirer` every `interval`.
    pub fn producer_expiry(mut self, expirer: ProducerExpirer, interval: Duration) -> Self {
        self.producers = Some((Arc::new(expirer), interval));
        self
    }

    /// Spawns the tasks on the current tokio runtime.
    pub fn spawn(self) -> LifecycleHandle {
        let (shutdown, _) = tokio::sync::watch::channel(false);
        let stats = Arc::new(LifecycleStats::default());
        let mut tasks = Vec::new();
        if let Some((worker, interval)) = self.retention {
            let pass: Pass = Arc::new(move || {
                let w = worker.clone();
                Box::pin(async move { w.run_pass().await.map(|_| ()) })
            });
            tasks.push(spawn_loop(
                "retention",
                interval,
                pass,
                &shutdown,
                &stats,
                |s| &s.retention,
            ));
        }
        if let Some((worker, interval)) = self.cleaner {
            let pass: Pass = Arc::new(move || {
                let w = worker.clone();
                Box::pin(async move { w.run_pass().await.map(|_| ()) })
            });
            tasks.push(spawn_loop(
                "cleaner",
                interval,
                pass,
                &shutdown,
                &stats,
                |s| &s.cleaner,
            ));
        }
        if let Some((worker, interval)) = self.orphans {
            let pass: Pass = Arc::new(move || {
                let w = worker.clone();
                Box::pin(async move { w.run_pass().await.map(|_| ()) })
            });
            tasks.push(spawn_loop(
                "orphans",
                interval,
                pass,
                &shutdown,
                &stats,
                |s| &s.orphans,
            ));
        }
        if let Some((worker, interval)) = self.producers {
            let pass: Pass = Arc::new(move || {
                let w = worker.clone();
                Box::pin(async move { w.run_pass().await.map(|_| ()) })
            });
            tasks.push(spawn_loop(
                "producers",
                interval,
                pass,
                &shutdown,
                &stats,
                |s| &s.producers,
            ));
        }
        LifecycleHandle {
            shutdown,
            tasks,
            stats,
        }
    }
}

fn spawn_loop(
    name: &'static str,
    interval: Duration,
    pass: Pass,
    shutdown: &tokio::sync::watch::Sender<bool>,
    stats: &Arc<LifecycleStats>,
    select: fn(&LifecycleStats) -> &WorkerStats,
) -> JoinHandle<()> {
    let mut stop = shutdown.subscribe();
    let stats = stats.clone();
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(interval.max(Duration::from_millis(1)));
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                _ = stop.wait_for(|s| *s) => break,
                _ = ticks.tick() => {}
            }
            // Each pass runs as its own task, so that a panic in one (a bug) is logged and counted
            // as a failure instead of silently ending this worker for good.
            match tokio::spawn(pass()).await {
                Ok(Ok(())) => {
                    select(&stats).passes.fetch_add(1, Ordering::Relaxed);
                }
                Ok(Err(e)) => {
                    select(&stats).failures.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(worker = name, error = %e, "lifecycle pass failed; retrying next interval");
                }
                Err(e) => {
                    select(&stats).failures.fetch_add(1, Ordering::Relaxed);
                    tracing::error!(worker = name, error = %e, "lifecycle pass panicked; retrying next interval");
                }
            }
        }
    })
}
