//! [`Lifecycle`]: the workers as tokio tasks on intervals.

use super::{
    LifecycleError, ObjectCleaner, OrphanCollector, ProducerExpirer, RetentionEnforcer,
    TieringWorker, Worker,
};
use crate::ConfigError;
use futures::future::BoxFuture;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::task::JoinHandle;

/// Counters of one worker.
#[derive(Debug, Default)]
#[non_exhaustive]
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
#[non_exhaustive]
pub struct LifecycleStats {
    /// The retention enforcer's.
    pub retention: WorkerStats,
    /// The object cleaner's.
    pub cleaner: WorkerStats,
    /// The orphan collector's.
    pub orphans: WorkerStats,
    /// The producer expirer's.
    pub producers: WorkerStats,
    /// The tiering worker's.
    pub tiering: WorkerStats,
}

type Pass = Arc<dyn Fn() -> BoxFuture<'static, Result<(), LifecycleError>> + Send + Sync>;

/// Runs the lifecycle workers as tokio tasks, each on its own interval (first pass at once; a
/// pass that overruns its interval delays the next tick rather than bunching ticks up).
///
/// Suggested intervals: retention 30 s–5 min (Kafka's `log.retention.check.interval.ms` is 5 min),
/// cleaner 30 s, orphans 1 h (orphans are rare and listing costs money), producer expiry 10 min
/// (Kafka's `producer.id.expiration.check.interval.ms`), tiering 30 s (a pass is capped by its
/// settings; a second orphan collector on the tiering prefix collects its failed uploads). An
/// interval must not be zero
/// ([`Lifecycle::spawn`] refuses it).
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
/// let retention = RetentionEnforcer::new(coordinator, RetentionConfig::default()).unwrap();
/// let handle = Lifecycle::new()
///     .retention(retention, Duration::from_secs(30))
///     .spawn()
///     .unwrap();
/// handle.shutdown().await;
/// # });
/// ```
#[derive(Default)]
pub struct Lifecycle {
    retention: Option<(Arc<RetentionEnforcer>, Duration)>,
    cleaner: Option<(Arc<ObjectCleaner>, Duration)>,
    orphans: Option<(Arc<OrphanCollector>, Duration)>,
    producers: Option<(Arc<ProducerExpirer>, Duration)>,
    tiering: Option<(Arc<TieringWorker>, Duration)>,
}

impl std::fmt::Debug for Lifecycle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lifecycle")
            .field("retention", &self.retention.as_ref().map(|r| r.1))
            .field("cleaner", &self.cleaner.as_ref().map(|c| c.1))
            .field("orphans", &self.orphans.as_ref().map(|o| o.1))
            .field("producers", &self.producers.as_ref().map(|p| p.1))
            .field("tiering", &self.tiering.as_ref().map(|t| t.1))
            .finish()
    }
}

/// Stops the tasks of a [`Lifecycle`]. Dropping it stops them too (each after its pass in
/// progress), without waiting for them.
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
    ///
    /// # Cancel safety
    ///
    /// Once polled, the workers are told to stop; dropping the future then only stops the
    /// waiting: each worker still finishes its pass in progress and ends.
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

    /// Runs `worker` every `interval`.
    pub fn tiering(mut self, worker: TieringWorker, interval: Duration) -> Self {
        self.tiering = Some((Arc::new(worker), interval));
        self
    }

    /// Spawns the tasks on the current tokio runtime. Fails with [`ConfigError::NoRuntime`]
    /// outside one, and with [`ConfigError::Invalid`] for a zero interval.
    pub fn spawn(self) -> Result<LifecycleHandle, ConfigError> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| ConfigError::NoRuntime)?;
        let intervals = [
            ("retention", self.retention.as_ref().map(|w| w.1)),
            ("cleaner", self.cleaner.as_ref().map(|w| w.1)),
            ("orphans", self.orphans.as_ref().map(|w| w.1)),
            ("producer_expiry", self.producers.as_ref().map(|w| w.1)),
            ("tiering", self.tiering.as_ref().map(|w| w.1)),
        ];
        if let Some((worker, _)) = intervals
            .iter()
            .find(|(_, interval)| *interval == Some(Duration::ZERO))
        {
            return Err(ConfigError::invalid(
                worker,
                "the interval between passes must not be zero",
            ));
        }
        let (shutdown, _) = tokio::sync::watch::channel(false);
        let stats = Arc::new(LifecycleStats::default());
        let mut tasks = Vec::new();
        let mut spawn = |worker: Worker, interval: Duration, pass: Pass| {
            tasks.push(spawn_loop(
                &runtime, worker, interval, pass, &shutdown, &stats,
            ));
        };
        if let Some((worker, interval)) = self.retention {
            spawn(
                Worker::Retention,
                interval,
                Arc::new(move || {
                    let w = worker.clone();
                    Box::pin(async move { w.run_pass().await.map(|_| ()) })
                }),
            );
        }
        if let Some((worker, interval)) = self.cleaner {
            spawn(
                Worker::Cleaner,
                interval,
                Arc::new(move || {
                    let w = worker.clone();
                    Box::pin(async move { w.run_pass().await.map(|_| ()) })
                }),
            );
        }
        if let Some((worker, interval)) = self.orphans {
            spawn(
                Worker::Orphans,
                interval,
                Arc::new(move || {
                    let w = worker.clone();
                    Box::pin(async move { w.run_pass().await.map(|_| ()) })
                }),
            );
        }
        if let Some((worker, interval)) = self.producers {
            spawn(
                Worker::Producers,
                interval,
                Arc::new(move || {
                    let w = worker.clone();
                    Box::pin(async move { w.run_pass().await.map(|_| ()) })
                }),
            );
        }
        if let Some((worker, interval)) = self.tiering {
            spawn(
                Worker::Tiering,
                interval,
                Arc::new(move || {
                    let w = worker.clone();
                    Box::pin(async move { w.run_pass().await.map(|_| ()) })
                }),
            );
        }
        Ok(LifecycleHandle {
            shutdown,
            tasks,
            stats,
        })
    }
}

fn spawn_loop(
    runtime: &tokio::runtime::Handle,
    worker: Worker,
    interval: Duration,
    pass: Pass,
    shutdown: &tokio::sync::watch::Sender<bool>,
    stats: &Arc<LifecycleStats>,
) -> JoinHandle<()> {
    let select: fn(&LifecycleStats) -> &WorkerStats = match worker {
        Worker::Retention => |s| &s.retention,
        Worker::Cleaner => |s| &s.cleaner,
        Worker::Orphans => |s| &s.orphans,
        Worker::Producers => |s| &s.producers,
        Worker::Tiering => |s| &s.tiering,
    };
    let mut stop = shutdown.subscribe();
    let stats = stats.clone();
    let name = worker.name();
    let passes = runtime.clone();
    runtime.spawn(async move {
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                _ = stop.wait_for(|s| *s) => break,
                _ = ticks.tick() => {}
            }
            // Each pass runs as its own task, so that a panic in one (a bug) is logged and counted
            // as a failure instead of silently ending this worker for good.
            match passes.spawn(pass()).await {
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
