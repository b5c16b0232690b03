//! [`OrphanCollector`]: KIP-1164's two-phase reconciliation of storage against the coordinator,
//! streamed and paged so that its memory does not grow with the number of objects.

use super::{LifecycleError, Worker, millis, record_pass, system_ms};
use crate::ConfigError;
use diskless_coordinator::{BatchCoordinator, Clock};
use diskless_storage::{ObjectKey, ObjectStorage, validate_prefix};
use futures::TryStreamExt;
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

/// Settings of an [`OrphanCollector`]: [`OrphanConfig::new`] with the writers' prefix (or
/// [`Default`] for theirs, `wal`), then the `with_*` methods. Checked by [`OrphanCollector::new`]
/// ([`OrphanConfig::validate`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct OrphanConfig {
    /// The key prefix the writers upload under (`WalWriterConfig::object_prefix`): empty, or a
    /// valid key prefix ([`validate_prefix`]). Default `wal`, the writers' default.
    pub prefix: String,
    /// Objects younger than this (by the later of their key's UUID v7 time and their listing time)
    /// are never considered. Not a safety assumption: phase 2's fence decides (see
    /// [`OrphanCollector`]). Set it to at least the coordinators' commit deadline (their
    /// `max_commit_age`, [`diskless_coordinator::DEFAULT_MAX_COMMIT_AGE`] by default) plus the
    /// clock skew between the hosts, so that the collector only fences keys whose commits the
    /// deadline refuses anyway; below that it may fence an upload whose commit is merely slow,
    /// which costs that produce request an error (`REQUEST_TIMED_OUT`, the producer retries),
    /// never data. Below the clock difference between the store's `last_modified` dates and this
    /// collector's clock, an orphan listed just after a clean cycle may count as settled and wait
    /// for the next full sweep (`full_sweep_interval`) before it is collected. Default 15 minutes.
    pub max_commit_age: Duration,
    /// How long a suspect must have been unknown (phase 1) before it is fenced and deleted (phase
    /// 2). Not a safety assumption either: it only lets visibility lag settle — a listing that
    /// still shows an object the cleaner has just deleted, a coordinator read that does not show a
    /// commit yet — so that the collector does not fence and delete needlessly. Default 5 minutes.
    pub recheck_delay: Duration,
    /// Page size: listed candidates are checked with the coordinator, and deleted, in pages of at
    /// most this many keys (per page, one `known_objects` call for phase 1 and one `fence_orphans`
    /// call for phase 2). With the store's own listing page, this is what bounds the memory of a
    /// pass. At least 1. Default 1000.
    pub known_batch: usize,
    /// Objects listed per pass at most (listing costs time and money): a pass that reaches it stops
    /// and the next pass resumes after the greatest key it listed. Honoured only while the store
    /// lists keys in order; see [`OrphanCollector`]. At least 1. Default 100 000.
    pub max_listed_per_pass: u64,
    /// Suspects remembered at most (between phase 1 and phase 2). An unknown candidate found while
    /// the suspects are full waits for a later pass. At least 1. Default 10 000.
    pub max_suspects: usize,
    /// Deletions per pass at most. At least 1. Default 10 000.
    pub max_deletes_per_pass: usize,
    /// How often the collector asks the coordinator again about old objects it already found
    /// known (a *full sweep*); between full sweeps it only asks about objects that became
    /// candidates since its last clean cycle. Zero makes every cycle a full sweep. Default 24 hours.
    pub full_sweep_interval: Duration,
}

impl Default for OrphanConfig {
    /// The defaults, for objects under the writers' default prefix, `wal`.
    fn default() -> Self {
        OrphanConfig::new("wal")
    }
}

diskless_common::with_setters!(OrphanConfig {
    with_prefix => prefix: into [String],
    with_max_commit_age => max_commit_age: [Duration],
    with_recheck_delay => recheck_delay: [Duration],
    with_known_batch => known_batch: [usize],
    with_max_listed_per_pass => max_listed_per_pass: [u64],
    with_max_suspects => max_suspects: [usize],
    with_max_deletes_per_pass => max_deletes_per_pass: [usize],
    with_full_sweep_interval => full_sweep_interval: [Duration],
});

impl OrphanConfig {
    /// The defaults, for objects under `prefix`.
    pub fn new(prefix: impl Into<String>) -> Self {
        OrphanConfig {
            prefix: prefix.into(),
            max_commit_age: Duration::from_secs(15 * 60),
            recheck_delay: Duration::from_secs(5 * 60),
            known_batch: 1000,
            max_listed_per_pass: 100_000,
            max_suspects: 10_000,
            max_deletes_per_pass: 10_000,
            full_sweep_interval: Duration::from_secs(24 * 3600),
        }
    }

    /// Checks every setting: the first one out of range, as a [`ConfigError::Invalid`] naming it.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !self.prefix.is_empty() {
            validate_prefix(&self.prefix)
                .map_err(|e| ConfigError::invalid("prefix", e.to_string()))?;
        }
        let at_least_one = [
            ("known_batch", self.known_batch == 0),
            ("max_listed_per_pass", self.max_listed_per_pass == 0),
            ("max_suspects", self.max_suspects == 0),
            ("max_deletes_per_pass", self.max_deletes_per_pass == 0),
        ];
        if let Some((field, _)) = at_least_one.iter().find(|(_, zero)| *zero) {
            return Err(ConfigError::invalid(field, "must be at least 1"));
        }
        Ok(())
    }
}

/// What one orphan pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct OrphanPassReport {
    /// Objects listed under the prefix.
    pub listed: u64,
    /// Listed objects too young to be considered.
    pub too_young: u64,
    /// Listed objects whose key has no UUID v7 time (never collected).
    pub undatable: u64,
    /// Old enough objects not asked about: a clean cycle since the last full sweep found them known.
    pub settled: u64,
    /// Old enough objects the coordinator knows (committed): left alone.
    pub known: u64,
    /// Objects unknown to every shard for the first time in this pass (phase 1).
    pub new_suspects: u64,
    /// Unknown objects not remembered because the suspects were full (`max_suspects`).
    pub deferred: u64,
    /// Suspects still waiting for their second check after this pass.
    pub waiting: u64,
    /// Suspects fenced and deleted (phase 2).
    pub deleted: u64,
    /// Suspects fenced whose deletion storage did not confirm (retried in a later pass).
    pub not_deleted: u64,
    /// Suspects forgotten because the cycle that ended in this pass did not list them.
    pub dropped: u64,
    /// This pass listed to the end: the next pass starts a new cycle from the first key.
    pub cycle_complete: bool,
}

/// Deletes objects that were uploaded but never committed.
///
/// # The two phases
///
/// An object is a *candidate* when the later of its key's UUID v7 time and its listing
/// `last_modified` is older than `now - max_commit_age` (objects without a v7 time are never
/// candidates). Phase 1, a read: candidates that no shard knows
/// ([`BatchCoordinator::known_objects`]; pass a `ShardedCoordinator` to ask every shard) become
/// *suspects*, remembered with the time `t1` of that check. Phase 2, the decision, when a suspect
/// is listed again at `t2 ≥ t1 + recheck_delay`: [`BatchCoordinator::fence_orphans`] fences it
/// unless the coordinator knows it, and only the keys that call returns are deleted. Suspects it
/// does not return are known (committed: the [`super::ObjectCleaner`] owns them) and dropped. A
/// suspect is only due `recheck_delay` after it was suspected, so no object is ever deleted in the
/// pass that first suspected it.
///
/// # Streaming, paging, resuming
///
/// A pass consumes the storage listing as a stream and handles it in pages of at most
/// `known_batch` candidates (phase 2 for the page's due suspects, then phase 1 for the others); it
/// never holds the listing. A pass lists at most `max_listed_per_pass` objects; one that stops there
/// keeps a cursor, the greatest key it handled, and the next pass lists the keys after it
/// ([`ObjectStorage::list_with_offset`]). A *cycle* is the run of passes from the first key to the
/// end of a listing; when it ends, the cursor goes back to the start and the suspects that the cycle
/// did not list are forgotten (the object is gone, or will be suspected again). What the collector
/// remembers between passes is bounded: at most `max_suspects` suspects, a cursor and a few numbers.
///
/// Stores need not list in key order (object_store's local filesystem does not). When a pass sees a
/// key not greater than the previous one, the collector stops honouring `max_listed_per_pass`, for
/// good: every later pass lists to the end, since a cursor cannot resume an unordered listing
/// without skipping keys (memory stays bounded; only the pass gets longer). A cycle that resumed an
/// unordered listing is not clean (below).
///
/// # Not asking twice
///
/// An object the coordinator knows stays known until the cleaner has deleted it from storage, so
/// the collector need not ask about it again. It remembers no keys for that (memory), but a
/// *floor*: when a cycle ends *clean* — it skipped no key (it listed in key order, or in one pass)
/// and deferred no suspect — every object it listed whose candidate time was below the cutoff of
/// its first pass was asked about and is known or a suspect. The floor becomes that cutoff, and
/// later cycles only ask about candidates at or above it (and about suspects). Objects below the
/// floor are counted as `settled`. This relies on the store dating an object (`last_modified`) by
/// its upload, on a clock within `max_commit_age` of the collector's: an object uploaded after a
/// cycle passed its place in the listing is then dated above that cycle's cutoff, and on this
/// collector's clock not going back (a pass that finds it went back starts over with a full
/// sweep: `pass`, chaos seed 30). Every
/// `full_sweep_interval` (and after a restart; until a full sweep ends clean) a cycle starts
/// without a floor and asks about everything, which also finds what that reasoning misses: an
/// object a listing showed more than `max_commit_age` late, a store whose clock is that far off,
/// an object whose commit a coordinator restored from a backup forgot. The floor only ever spares
/// the coordinator questions; it never makes the collector delete anything.
///
/// # Why an object whose commit is in flight is never deleted
///
/// The collector deletes a key `K` only after [`BatchCoordinator::fence_orphans`] returned it
/// (`handle_page`, phase 2). The coordinator serializes that call with every `commit_file` of `K`,
/// each atomic (one writer in SQLite, a per-key lock in PostgreSQL, one mutex in the in-memory
/// model; a `ShardedCoordinator` fences on every shard). So a commit of `K` either
///
/// - was applied before the fence: then `K` was known, `fence_orphans` did not return it, and the
///   collector did not delete it; or
/// - comes after the fence: the coordinator refuses it with
///   [`diskless_coordinator::CoordinatorError::ObjectFenced`], certainly not applied, and the
///   writer answers its producers with an error instead of acknowledging records in a deleted
///   object.
///
/// No clock and no bound on how long a commit call takes (lock waits, retries, a stalled network)
/// is assumed, nor any relation between this collector's `max_commit_age` and the coordinators'.
/// If the cleaner had already confirmed `K` deleted, `K` was dead: fencing and deleting it again
/// is harmless. An upload that lands after the deletion (a late retry of an ambiguous upload) is
/// just a new orphan, whose commit the fence refuses. The coordinators' commit deadline (a key
/// older than their `max_commit_age` is refused inside the commit transaction) now only bounds how
/// long they must keep a fence: past it, the deadline refuses every commit of the key anyway.
///
/// Listing is only a source of candidates: an object missing from an (eventually consistent) listing
/// is simply not deleted this pass.
#[derive(Debug)]
pub struct OrphanCollector {
    coordinator: Arc<dyn BatchCoordinator>,
    storage: Arc<dyn ObjectStorage>,
    clock: Arc<dyn Clock>,
    config: OrphanConfig,
    /// Held for the whole pass, so passes never overlap.
    state: tokio::sync::Mutex<State>,
}

/// What the collector remembers between passes (bounded).
#[derive(Debug, Default)]
struct State {
    /// Suspects (at most `max_suspects`).
    suspects: BTreeMap<ObjectKey, Suspect>,
    /// The greatest key the current cycle handled, if it stopped early.
    cursor: Option<ObjectKey>,
    /// The current cycle, once started.
    cycle: Option<Cycle>,
    /// The number of the last cycle started.
    cycles: u64,
    /// Candidates dated below it that are not suspects were found known (see the type's docs).
    floor: Option<i64>,
    /// When the last full sweep that ended clean started.
    last_full_sweep: Option<i64>,
    /// The store listed a key out of order once: every pass lists to the end.
    unordered: bool,
    /// The clock's now at the last pass: a clock that went back starts a full sweep.
    last_now: Option<i64>,
}

/// A suspect: found unknown at `since` (phase 1), last listed in cycle `seen`.
#[derive(Clone, Copy, Debug)]
struct Suspect {
    since: i64,
    seen: u64,
}

/// One cycle: from the first key to the end of a listing, over one or more passes.
#[derive(Clone, Copy, Debug)]
struct Cycle {
    number: u64,
    /// When its first pass started.
    started: i64,
    /// The candidate cutoff of its first pass: the floor it sets if it ends clean.
    cutoff: i64,
    /// The floor it skips below (`None`: a full sweep).
    floor: Option<i64>,
    /// A pass of it started from a cursor.
    resumed: bool,
    /// Its listing came in key order so far.
    ordered: bool,
    /// It deferred an unknown candidate (suspects full).
    deferred: bool,
}

/// What a pass works with.
struct PassCtx {
    now: i64,
    due_before: i64,
    deletes_left: usize,
}

impl OrphanCollector {
    /// A collector of the objects under `config.prefix`, or the first setting of `config` out of
    /// range.
    pub fn new(
        coordinator: Arc<dyn BatchCoordinator>,
        storage: Arc<dyn ObjectStorage>,
        clock: Arc<dyn Clock>,
        config: OrphanConfig,
    ) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(OrphanCollector {
            coordinator,
            storage,
            clock,
            config,
            state: tokio::sync::Mutex::new(State::default()),
        })
    }

    /// The settings (its `prefix` names the objects it collects).
    pub fn config(&self) -> &OrphanConfig {
        &self.config
    }

    /// The current suspects (keys found unknown once, waiting for their second check).
    pub async fn suspects(&self) -> Vec<ObjectKey> {
        self.state.lock().await.suspects.keys().cloned().collect()
    }

    /// Which of `keys` some shard knows (phase 1: a read).
    async fn known(&self, keys: &[ObjectKey]) -> Result<HashSet<String>, LifecycleError> {
        let names: Vec<String> = keys.iter().map(|k| k.as_str().to_string()).collect();
        Ok(self
            .coordinator
            .known_objects(&names)
            .await?
            .into_iter()
            .collect())
    }

    /// Which of `keys` the coordinator fenced (phase 2): only those may be deleted.
    async fn fence(&self, keys: &[ObjectKey]) -> Result<HashSet<String>, LifecycleError> {
        let names: Vec<String> = keys.iter().map(|k| k.as_str().to_string()).collect();
        Ok(self
            .coordinator
            .fence_orphans(&names)
            .await?
            .into_iter()
            .collect())
    }

    /// One pass: streams the listing from the cursor, handling it page by page (phase 2 for due
    /// suspects, phase 1 for new candidates), until the listing ends or `max_listed_per_pass`.
    /// Passes never overlap: a second call waits for the one running. Records
    /// [`LIFECYCLE_PASSES`](diskless_common::metrics::LIFECYCLE_PASSES) and
    /// [`LIFECYCLE_ITEMS`](diskless_common::metrics::LIFECYCLE_ITEMS) (the orphans deleted, also
    /// by a pass that failed after some pages) once, with `worker="orphans"`, in a
    /// `lifecycle_pass` span.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a pass dropped at any await point deletes nothing the coordinator did not
    /// fence, and the collector's memory stays consistent. The cursor moves, together with the
    /// cycle's state, only once a page has been handled, so the next pass lists again the page
    /// that was being handled; the cycle's flags (listing out of order, suspect deferred) are
    /// saved as soon as they are set, so a cancelled pass never lets a cycle that skipped keys
    /// raise the floor. A page dropped between `fence_orphans` and the storage delete leaves its
    /// fenced keys suspects: the next pass fences them again (fencing is idempotent) and deletes
    /// them. A coordinator call dropped in flight is applied or not, as the coordinator's
    /// transaction decides. A cancelled pass records no metric.
    #[tracing::instrument(level = "info", name = "lifecycle_pass", skip_all, fields(worker = Worker::Orphans.name()))]
    pub async fn run_pass(&self) -> Result<OrphanPassReport, LifecycleError> {
        let mut report = OrphanPassReport::default();
        let result = self.pass(&mut report).await;
        record_pass(Worker::Orphans, &result, report.deleted);
        result.map(|()| report)
    }

    async fn pass(&self, report: &mut OrphanPassReport) -> Result<(), LifecycleError> {
        let mut guard = self.state.lock().await;
        let state = &mut *guard;
        let now = self.clock.now_ms();
        if let Some(last) = state.last_now.filter(|last| now < *last) {
            // The clock went back (a step, or a failover to a host whose clock is behind): the
            // floor, raised by cutoffs of the later clock, may lie above objects no cycle asked
            // about, and a suspect too young again by this clock is not listed as one, so a cycle
            // forgets it (chaos seed 30: such an orphan then counted as settled until the next
            // full sweep). The cycle starts over as a full sweep; suspects keep their place,
            // dated no later than now.
            tracing::info!(
                back_ms = last - now,
                prefix = self.config.prefix,
                "the clock went back: the orphan collector starts a full sweep"
            );
            state.floor = None;
            state.last_full_sweep = None;
            state.cycle = None;
            state.cursor = None;
            for suspect in state.suspects.values_mut() {
                suspect.since = suspect.since.min(now);
            }
        }
        state.last_now = Some(now);
        let cutoff = now.saturating_sub(millis(self.config.max_commit_age));
        let mut ctx = PassCtx {
            now,
            due_before: now.saturating_sub(millis(self.config.recheck_delay)),
            deletes_left: self.config.max_deletes_per_pass,
        };
        let mut cycle = match state.cycle {
            Some(cycle) => cycle,
            None => {
                let full = state.last_full_sweep.is_none_or(|t| {
                    now.saturating_sub(t) >= millis(self.config.full_sweep_interval)
                });
                state.cycles += 1;
                Cycle {
                    number: state.cycles,
                    started: now,
                    cutoff,
                    floor: if full { None } else { state.floor },
                    resumed: false,
                    ordered: true,
                    deferred: false,
                }
            }
        };
        let offset = state.cursor.clone();
        cycle.resumed |= offset.is_some();
        // The cycle is saved now, and again whenever it changes: a pass that fails or is
        // cancelled keeps what it learnt.
        state.cycle = Some(cycle);
        let scanned = self
            .scan(state, &mut cycle, offset, cutoff, &mut ctx, report)
            .await;
        state.cycle = Some(cycle);
        let exhausted = scanned?;

        if exhausted {
            // The cycle ends: forget suspects it did not list, maybe raise the floor, start over.
            let before = state.suspects.len();
            state.suspects.retain(|_, s| s.seen == cycle.number);
            report.dropped = (before - state.suspects.len()) as u64;
            let skipped = cycle.resumed && !cycle.ordered;
            if !skipped && !cycle.deferred {
                state.floor = Some(state.floor.map_or(cycle.cutoff, |f| f.max(cycle.cutoff)));
                if cycle.floor.is_none() {
                    state.last_full_sweep = Some(cycle.started);
                }
            }
            state.cursor = None;
            state.cycle = None;
            report.cycle_complete = true;
        }
        report.waiting = state.suspects.len() as u64;
        if report.new_suspects > 0 || report.deleted > 0 || report.not_deleted > 0 {
            tracing::info!(
                listed = report.listed,
                new_suspects = report.new_suspects,
                deleted = report.deleted,
                not_deleted = report.not_deleted,
                waiting = report.waiting,
                cycle_complete = report.cycle_complete,
                "orphan pass"
            );
        }
        Ok(())
    }

    /// Lists from `offset` and handles the listing page by page; returns whether it listed to the
    /// end. Moves the cursor past every page handled.
    async fn scan(
        &self,
        state: &mut State,
        cycle: &mut Cycle,
        offset: Option<ObjectKey>,
        cutoff: i64,
        ctx: &mut PassCtx,
        report: &mut OrphanPassReport,
    ) -> Result<bool, LifecycleError> {
        let batch = self.config.known_batch;
        let limit = self.config.max_listed_per_pass;
        let mut listing = match &offset {
            Some(k) => self
                .storage
                .list_with_offset(&self.config.prefix, k.as_str()),
            None => self.storage.list(&self.config.prefix),
        };
        // The previous key of this listing (order check), and the greatest of the current page.
        let mut previous: Option<ObjectKey> = offset.clone();
        let mut page_max: Option<ObjectKey> = None;
        let mut page: Vec<ObjectKey> = Vec::with_capacity(batch.min(4096));
        let exhausted = loop {
            if report.listed >= limit && !state.unordered {
                break false;
            }
            let Some(meta) = listing.try_next().await? else {
                break true;
            };
            report.listed += 1;
            let key = meta.key;
            if previous.as_ref().is_some_and(|p| key <= *p) {
                if !state.unordered {
                    tracing::info!(
                        prefix = self.config.prefix,
                        "the store lists keys out of order: every orphan pass lists to the end"
                    );
                }
                state.unordered = true;
                cycle.ordered = false;
                state.cycle = Some(*cycle);
            }
            if page_max.as_ref().is_none_or(|m| key > *m) {
                page_max = Some(key.clone());
            }
            let Some(created) = key.created_at() else {
                report.undatable += 1;
                previous = Some(key);
                continue;
            };
            let dated = system_ms(created).max(system_ms(meta.last_modified));
            if dated >= cutoff {
                report.too_young += 1;
            } else if let Some(s) = state.suspects.get_mut(&key) {
                s.seen = cycle.number;
                page.push(key.clone());
            } else if cycle.floor.is_some_and(|f| dated < f) {
                report.settled += 1;
            } else {
                page.push(key.clone());
            }
            previous = Some(key);
            if page.len() >= batch {
                self.handle_page(state, cycle, &mut page, ctx, report)
                    .await?;
                advance(&mut state.cursor, page_max.take());
                state.cycle = Some(*cycle);
            }
        };
        drop(listing);
        self.handle_page(state, cycle, &mut page, ctx, report)
            .await?;
        advance(&mut state.cursor, page_max.take());
        state.cycle = Some(*cycle);
        Ok(exhausted)
    }

    /// Phase 2 for the page's due suspects, then phase 1 for its other keys; empties the page.
    async fn handle_page(
        &self,
        state: &mut State,
        cycle: &mut Cycle,
        page: &mut Vec<ObjectKey>,
        ctx: &mut PassCtx,
        report: &mut OrphanPassReport,
    ) -> Result<(), LifecycleError> {
        if page.is_empty() {
            return Ok(());
        }
        let mut due = Vec::new();
        let mut fresh = Vec::new();
        for key in page.drain(..) {
            match state.suspects.get(&key) {
                Some(s) if s.since <= ctx.due_before && due.len() < ctx.deletes_left => {
                    due.push(key)
                }
                Some(_) => {}
                None => fresh.push(key),
            }
        }

        // Phase 2: suspects unknown since at least `recheck_delay` are fenced; only the keys the
        // coordinator fenced are deleted (the others are known: committed after phase 1).
        if !due.is_empty() {
            let fenced = self.fence(&due).await?;
            let mut doomed = Vec::new();
            for key in due {
                if fenced.contains(key.as_str()) {
                    doomed.push(key);
                } else {
                    state.suspects.remove(&key);
                    report.known += 1;
                }
            }
            ctx.deletes_left = ctx.deletes_left.saturating_sub(doomed.len());
            if !doomed.is_empty() {
                match self.storage.delete(&doomed).await {
                    Ok(deleted) => {
                        let asked: HashSet<&ObjectKey> = doomed.iter().collect();
                        let mut confirmed = 0u64;
                        for key in deleted.iter().filter(|k| asked.contains(k)) {
                            if state.suspects.remove(key).is_some() {
                                confirmed += 1;
                                tracing::info!(object = %key, "deleted orphan object");
                            }
                        }
                        report.deleted += confirmed;
                        report.not_deleted += doomed.len() as u64 - confirmed;
                    }
                    Err(e) => {
                        report.not_deleted += doomed.len() as u64;
                        tracing::warn!(error = %e, objects = doomed.len(), "orphan delete failed; retrying next pass");
                    }
                }
            }
        }

        // Phase 1: new candidates no shard knows become suspects, while there is room.
        if !fresh.is_empty() {
            let known = self.known(&fresh).await?;
            for key in fresh {
                if known.contains(key.as_str()) {
                    report.known += 1;
                } else if state.suspects.len() < self.config.max_suspects {
                    state.suspects.insert(
                        key,
                        Suspect {
                            since: ctx.now,
                            seen: cycle.number,
                        },
                    );
                    report.new_suspects += 1;
                } else {
                    report.deferred += 1;
                    cycle.deferred = true;
                    state.cycle = Some(*cycle);
                }
            }
        }
        Ok(())
    }
}

/// Moves the cursor up to `to` (never down: an unordered listing may go back).
fn advance(cursor: &mut Option<ObjectKey>, to: Option<ObjectKey>) {
    if let Some(to) = to
        && cursor.as_ref().is_none_or(|c| to > *c)
    {
        *cursor = Some(to);
    }
}
