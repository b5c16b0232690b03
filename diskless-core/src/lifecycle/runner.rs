//! [`Lifecycle`]: the workers as tokio tasks on intervals.

use super::{
    CompactionWorker, LifecycleError, ObjectCleaner, OrphanCollector, ProducerExpirer,
    RetentionEnforcer, TieringWorker, Worker,
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
    /// The orphan collectors', summed: every pass of every collector counts here once (with a
    /// collector on the WAL prefix and one on the tiered prefix, each interval adds two passes).
    /// [`LifecycleStats::orphans_on`] has each collector's own.
    pub orphans: WorkerStats,
    /// The producer expirer's.
    pub producers: WorkerStats,
    /// The tiering worker's.
    pub tiering: WorkerStats,
    /// The compaction worker's.
    pub compaction: WorkerStats,
    /// Each orphan collector's, by its prefix, in the order they were added.
    orphans_by_prefix: Vec<(String, WorkerStats)>,
}

impl LifecycleStats {
    /// The counters of the orphan collector on `prefix` (its [`OrphanConfig::prefix`]), if the
    /// [`Lifecycle`] runs one.
    ///
    /// [`OrphanConfig::prefix`]: super::OrphanConfig::prefix
    pub fn orphans_on(&self, prefix: &str) -> Option<&WorkerStats> {
        self.orphans_by_prefix
            .iter()
            .find(|(p, _)| p == prefix)
            .map(|(_, stats)| stats)
    }
}

type Pass = Arc<dyn Fn() -> BoxFuture<'static, Result<(), LifecycleError>> + Send + Sync>;

/// Runs the lifecycle workers as tokio tasks, each on its own interval (first pass at once; a
/// pass that overruns its interval delays the next tick rather than bunching ticks up).
///
/// Suggested intervals: retention 30 s–5 min (Kafka's `log.retention.check.interval.ms` is 5 min),
/// cleaner 30 s, orphans 1 min–1 h (orphans are rare; a pass lists the prefix, one LIST request per
/// 1,000 keys), producer expiry 10 min
/// (Kafka's `producer.id.expiration.check.interval.ms`), tiering 30 s (a pass is capped by its
/// settings). An interval must not be zero ([`Lifecycle::spawn`] refuses it).
///
/// There is one orphan collector per key prefix: [`Lifecycle::orphans`] adds one each time it is
/// called, so a host that runs a [`TieringWorker`] adds a second collector, on the tiering prefix
/// (`tiered`), beside the one on its writers' prefix (`wal`); it collects the segments whose
/// registration failed.
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
///
/// With tiering, an orphan collector per prefix:
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// use diskless_core::lifecycle::{Lifecycle, OrphanCollector, OrphanConfig, TieringConfig};
/// use diskless_coordinator::{BatchCoordinator, ManualClock};
/// use diskless_storage::{ObjectStorage, ObjectStoreStorage};
/// use diskless_testkit::coordinator::InMemoryCoordinator;
/// use std::{sync::Arc, time::Duration};
///
/// let clock = ManualClock::new(1_700_000_000_000);
/// let coordinator: Arc<dyn BatchCoordinator> = Arc::new(InMemoryCoordinator::new(clock.clone()));
/// let storage: Arc<dyn ObjectStorage> = Arc::new(ObjectStoreStorage::in_memory());
/// let collector = |prefix: &str| {
///     let config = OrphanConfig::new(prefix);
///     OrphanCollector::new(coordinator.clone(), storage.clone(), clock.clone(), config).unwrap()
/// };
/// let hour = Duration::from_secs(3600);
/// let handle = Lifecycle::new()
///     .orphans(collector("wal"), hour)
///     .orphans(collector(&TieringConfig::default().prefix), hour)
///     .spawn()
///     .unwrap();
/// assert!(handle.stats().orphans_on("tiered").is_some());
/// handle.shutdown().await;
/// # });
/// ```
#[derive(Default)]
pub struct Lifecycle {
    retention: Option<(Arc<RetentionEnforcer>, Duration)>,
    cleaner: Option<(Arc<ObjectCleaner>, Duration)>,
    /// One per prefix, in the order they were added.
    orphans: Vec<(Arc<OrphanCollector>, Duration)>,
    producers: Option<(Arc<ProducerExpirer>, Duration)>,
    tiering: Option<(Arc<TieringWorker>, Duration)>,
    compaction: Option<(Arc<CompactionWorker>, Duration)>,
}

impl std::fmt::Debug for Lifecycle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lifecycle")
            .field("retention", &self.retention.as_ref().map(|r| r.1))
            .field("cleaner", &self.cleaner.as_ref().map(|c| c.1))
            .field(
                "orphans",
                &self
                    .orphans
                    .iter()
                    .map(|(o, interval)| (o.config().prefix.as_str(), *interval))
                    .collect::<Vec<_>>(),
            )
            .field("producers", &self.producers.as_ref().map(|p| p.1))
            .field("tiering", &self.tiering.as_ref().map(|t| t.1))
            .field("compaction", &self.compaction.as_ref().map(|c| c.1))
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

    /// Runs `collector` every `interval`, beside the collectors added before: one per key prefix
    /// (e.g. the writers' `wal` and the tiering worker's `tiered`), each in its own task, with its
    /// own interval and counters ([`LifecycleStats::orphans_on`]; [`LifecycleStats::orphans`] sums
    /// them). Two collectors on the same prefix are refused by [`Lifecycle::spawn`]. Collectors on
    /// overlapping prefixes (an empty one and `tiered`) are safe — a key is only deleted after the
    /// coordinator fenced it — but list and ask about the shared keys twice.
    pub fn orphans(mut self, collector: OrphanCollector, interval: Duration) -> Self {
        self.orphans.push((Arc::new(collector), interval));
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

    /// Runs `worker` every `interval` (Kafka's `log.cleaner.backoff.ms` is 15 s).
    pub fn compaction(mut self, worker: CompactionWorker, interval: Duration) -> Self {
        self.compaction = Some((Arc::new(worker), interval));
        self
    }

    /// The checks [`Lifecycle::spawn`] makes before it starts anything: no zero interval, one
    /// orphan collector per prefix.
    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        let intervals = [
            ("retention", self.retention.as_ref().map(|w| w.1)),
            ("cleaner", self.cleaner.as_ref().map(|w| w.1)),
            ("producer_expiry", self.producers.as_ref().map(|w| w.1)),
            ("tiering", self.tiering.as_ref().map(|w| w.1)),
            ("compaction", self.compaction.as_ref().map(|w| w.1)),
        ]
        .into_iter()
        .chain(self.orphans.iter().map(|w| ("orphans", Some(w.1))));
        if let Some((worker, _)) = intervals
            .clone()
            .find(|(_, interval)| *interval == Some(Duration::ZERO))
        {
            return Err(ConfigError::invalid(
                worker,
                "the interval between passes must not be zero",
            ));
        }
        let mut prefixes = std::collections::HashSet::new();
        if let Some((collector, _)) = self
            .orphans
            .iter()
            .find(|(c, _)| !prefixes.insert(c.config().prefix.as_str()))
        {
            return Err(ConfigError::invalid(
                "orphans",
                format!(
                    "two orphan collectors on the prefix `{}`",
                    collector.config().prefix
                ),
            ));
        }
        Ok(())
    }

    /// Spawns the tasks on the current tokio runtime. Fails with [`ConfigError::NoRuntime`]
    /// outside one, and with [`ConfigError::Invalid`] for a zero interval (naming the worker) or
    /// two orphan collectors on the same prefix (`orphans`).
    pub fn spawn(self) -> Result<LifecycleHandle, ConfigError> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| ConfigError::NoRuntime)?;
        self.check()?;
        let (shutdown, _) = tokio::sync::watch::channel(false);
        let stats = Arc::new(LifecycleStats {
            orphans_by_prefix: self
                .orphans
                .iter()
                .map(|(c, _)| (c.config().prefix.clone(), WorkerStats::default()))
                .collect(),
            ..LifecycleStats::default()
        });
        let mut tasks = Vec::new();
        let mut spawn = |counters: Counters, interval: Duration, pass: Pass| {
            tasks.push(spawn_loop(
                &runtime, counters, interval, pass, &shutdown, &stats,
            ));
        };
        if let Some((worker, interval)) = self.retention {
            spawn(
                Counters::Worker(Worker::Retention),
                interval,
                Arc::new(move || {
                    let w = worker.clone();
                    Box::pin(async move { w.run_pass().await.map(|_| ()) })
                }),
            );
        }
        if let Some((worker, interval)) = self.cleaner {
            spawn(
                Counters::Worker(Worker::Cleaner),
                interval,
                Arc::new(move || {
                    let w = worker.clone();
                    Box::pin(async move { w.run_pass().await.map(|_| ()) })
                }),
            );
        }
        for (index, (worker, interval)) in self.orphans.into_iter().enumerate() {
            spawn(
                Counters::Orphans(index),
                interval,
                Arc::new(move || {
                    let w = worker.clone();
                    Box::pin(async move { w.run_pass().await.map(|_| ()) })
                }),
            );
        }
        if let Some((worker, interval)) = self.producers {
            spawn(
                Counters::Worker(Worker::Producers),
                interval,
                Arc::new(move || {
                    let w = worker.clone();
                    Box::pin(async move { w.run_pass().await.map(|_| ()) })
                }),
            );
        }
        if let Some((worker, interval)) = self.tiering {
            spawn(
                Counters::Worker(Worker::Tiering),
                interval,
                Arc::new(move || {
                    let w = worker.clone();
                    Box::pin(async move { w.run_pass().await.map(|_| ()) })
                }),
            );
        }
        if let Some((worker, interval)) = self.compaction {
            spawn(
                Counters::Worker(Worker::Compaction),
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

/// Where a task counts its passes.
#[derive(Clone, Copy, Debug)]
enum Counters {
    /// The worker's counters.
    Worker(Worker),
    /// The orphan collector added `n`th: its own counters and the sum.
    Orphans(usize),
}

impl Counters {
    fn worker(self) -> Worker {
        match self {
            Counters::Worker(worker) => worker,
            Counters::Orphans(_) => Worker::Orphans,
        }
    }

    /// Counts a pass in `stats` (`failed` or not).
    fn count(self, stats: &LifecycleStats, failed: bool) {
        let bump = |s: &WorkerStats| {
            let counter = if failed { &s.failures } else { &s.passes };
            counter.fetch_add(1, Ordering::Relaxed);
        };
        match self {
            Counters::Worker(Worker::Retention) => bump(&stats.retention),
            Counters::Worker(Worker::Cleaner) => bump(&stats.cleaner),
            Counters::Worker(Worker::Orphans) => bump(&stats.orphans),
            Counters::Worker(Worker::Producers) => bump(&stats.producers),
            Counters::Worker(Worker::Tiering) => bump(&stats.tiering),
            Counters::Worker(Worker::Compaction) => bump(&stats.compaction),
            Counters::Orphans(index) => {
                bump(&stats.orphans);
                if let Some((_, own)) = stats.orphans_by_prefix.get(index) {
                    bump(own);
                }
            }
        }
    }
}

fn spawn_loop(
    runtime: &tokio::runtime::Handle,
    counters: Counters,
    interval: Duration,
    pass: Pass,
    shutdown: &tokio::sync::watch::Sender<bool>,
    stats: &Arc<LifecycleStats>,
) -> JoinHandle<()> {
    let mut stop = shutdown.subscribe();
    let stats = stats.clone();
    let name = counters.worker().name();
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
                Ok(Ok(())) => counters.count(&stats, false),
                Ok(Err(e)) => {
                    counters.count(&stats, true);
                    tracing::warn!(worker = name, error = %e, "lifecycle pass failed; retrying next interval");
                }
                Err(e) => {
                    counters.count(&stats, true);
                    tracing::error!(worker = name, error = %e, "lifecycle pass panicked; retrying next interval");
                }
            }
        }
    })
}
