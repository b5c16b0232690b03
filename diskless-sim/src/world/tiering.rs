//! Tiered segments (issue #15): the consolidation worker's host (its own schedule, crashes that
//! cancel a pass and lose the worker's state), the orphan collector of segment keys, and the
//! `tiered` checks (segments contiguous, below the high watermark, disjoint from the WAL
//! batches, their objects stored; every WAL batch consolidated in the quiet phase).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use diskless_coordinator::{
    BatchCoordinator, ErrorCode, LATEST_TIMESTAMP, Layered, ListOffsetsRequest, TieredSegment,
    TopicIdPartition,
};
use diskless_core::lifecycle::{OrphanCollector, TieringWorker};
use diskless_core::{FetchPartition, Fetcher, split_batches};
use diskless_storage::{ObjectRemoteStorage, ObjectStorage, SeededKeys};
use tokio::time::sleep;

use super::{CALM, DONE, FAULTY, LEADER_EPOCH, QUIET, World};
use crate::cache::SimCache;
use crate::oracle::{BOUNDS, CONSUMER, Fail, ReadOrder, SETUP, TIERED};
use crate::sync::Flag;
use crate::wrappers::{Gate, GatedCoordinator, GatedStorage};

/// ListOffsets' EARLIEST_LOCAL_TIMESTAMP (KIP-405): the first offset not in a tiered segment.
const EARLIEST_LOCAL: i64 = -4;

/// The broker id the tiering host uploads segments as.
const TIERING_BROKER: i32 = 100;

/// One incarnation of the host running the tiering worker. A crash closes its gate (calls not
/// yet started fail), cancels the pass it runs (the pass future is dropped) and loses the
/// worker's state (its candidate cursor, its cache).
pub(super) struct TierHost {
    incarnation: u64,
    gate: Arc<Gate>,
    crashed: Flag,
    worker: TieringWorker,
}

/// The registered segments of each partition.
pub(super) type Listed = BTreeMap<TopicIdPartition, Vec<TieredSegment>>;

/// What the checker's walk over the partitions found.
#[derive(Debug, Default)]
pub(super) struct Walked {
    /// Each partition's high watermark, as the walk read it.
    pub(super) high_watermarks: BTreeMap<TopicIdPartition, i64>,
    /// WAL batches (transaction markers included).
    pub(super) wal_batches: u64,
    /// Tiered segments.
    pub(super) segments: u64,
}

impl World {
    pub(super) fn new_tier_host(&self) -> Option<Arc<TierHost>> {
        let incarnation = self.tier_incarnations.fetch_add(1, Ordering::SeqCst);
        let mut rng = self.rng("tier-host", incarnation);
        let gate = Gate::new();
        let storage: Arc<dyn ObjectStorage> = Arc::new(GatedStorage {
            gate: gate.clone(),
            inner: self.storage.clone(),
        });
        let coordinator: Arc<dyn BatchCoordinator> = Arc::new(Layered::new(
            self.faulty.clone(),
            GatedCoordinator {
                gate: gate.clone(),
                link: None,
            },
        ));
        let fetcher = Fetcher::builder(storage.clone(), coordinator.clone())
            .with_config(self.p.fetcher.clone())
            .with_cache(Arc::new(SimCache::new(self.p.cache_capacity)))
            .build();
        let fetcher = match fetcher {
            Ok(f) => f,
            Err(e) => {
                self.fail((SETUP, format!("tiering worker's fetcher: {e}")));
                return None;
            }
        };
        let worker = TieringWorker::new(
            coordinator,
            Arc::new(ObjectRemoteStorage::new(storage)),
            fetcher,
            self.lifecycle_clock.clone(),
            Arc::new(SeededKeys::new(rng.u64(..))),
            TIERING_BROKER,
            self.p.tiering.clone(),
        );
        match worker {
            Ok(worker) => Some(Arc::new(TierHost {
                incarnation,
                gate,
                crashed: Flag::default(),
                worker,
            })),
            Err(e) => {
                self.fail((SETUP, format!("tiering worker: {e}")));
                None
            }
        }
    }

    /// The tiering host crashes: its pass is dropped mid-way and a new incarnation, with none of
    /// its state, takes over at the next pass.
    pub(super) fn crash_tier_host(&self) {
        let Some(fresh) = self.new_tier_host() else {
            return;
        };
        let Some(old) = self.tier_host.lock().replace(fresh) else {
            return;
        };
        old.gate.close();
        old.crashed.set();
        ev!(
            self,
            "fault: tiering host crashed (incarnation {})",
            old.incarnation
        );
        self.stat(|s| s.tiering_crashes += 1);
    }

    pub(super) async fn tiering_loop(self: Arc<Self>) {
        let Some(first) = self.new_tier_host() else {
            return;
        };
        *self.tier_host.lock() = Some(first);
        while self.phase() < DONE && !self.failed() {
            // Once the WAL tier drained in the quiet period nothing is left to tier: passes
            // come seldom (each still runs, finding nothing).
            if self.drained.is_set() {
                sleep(self.p.tiering_every.max(Duration::from_secs(10))).await;
            } else {
                sleep(self.p.tiering_every).await;
            }
            let Some(host) = self.tier_host.lock().clone() else {
                return;
            };
            // During the faults the host gives up on a pass that runs too long (the pass is
            // dropped: cancelled); later a pass may take as long as it needs.
            let limit = if self.phase() == FAULTY {
                self.p.tiering_pass_timeout
            } else {
                Duration::from_secs(24 * 3_600)
            };
            let outcome = tokio::select! {
                biased;
                _ = host.crashed.wait() => None,
                r = tokio::time::timeout(limit, host.worker.run_pass()) => Some(r),
            };
            let outcome = match outcome {
                None => {
                    ev!(self, "tiering: pass cancelled by the host's crash");
                    continue;
                }
                Some(Err(_)) => {
                    ev!(self, "tiering: pass cancelled after {limit:?}");
                    self.stat(|s| s.tiering_cancelled += 1);
                    continue;
                }
                Some(Ok(outcome)) => outcome,
            };
            self.stat(|s| s.tiering_passes += 1);
            match outcome {
                Ok(r) => {
                    if r.candidates > 0 {
                        ev!(self, "tiering: {r:?}");
                    }
                    self.stat(|s| {
                        s.segments_registered += r.segments;
                        s.batches_tiered += r.batches_tiered;
                        s.segments_stale += r.stale;
                        s.segments_failed += r.failed;
                        s.segments_discarded += r.fenced_and_deleted;
                    });
                }
                Err(e) => ev!(self, "tiering pass failed: {e}"),
            }
        }
    }

    pub(super) fn new_tiered_collector(&self) -> Option<Arc<OrphanCollector>> {
        match OrphanCollector::new(
            self.faulty.clone(),
            self.storage.clone(),
            self.lifecycle_clock.clone(),
            self.p.tiered_orphan.clone(),
        ) {
            Ok(c) => Some(Arc::new(c)),
            Err(e) => {
                self.fail((SETUP, format!("orphan collector of segments: {e}")));
                None
            }
        }
    }

    pub(super) async fn tiered_orphan_loop(self: Arc<Self>) {
        let first = self.new_tiered_collector();
        let Some(first) = first else {
            return;
        };
        *self.tiered_collector.lock() = Some(first);
        while self.phase() < DONE && !self.failed() {
            sleep(self.p.tiered_orphan_every).await;
            let Some(collector) = self.tiered_collector.lock().clone() else {
                return;
            };
            match collector.run_pass().await {
                Ok(r) => {
                    if r.new_suspects > 0
                        || r.deleted > 0
                        || r.not_deleted > 0
                        || r.deferred > 0
                        || r.dropped > 0
                    {
                        ev!(self, "segment orphans: {r:?}");
                        self.stat(|s| s.tiered_orphans_deleted += r.deleted);
                    }
                }
                Err(e) => ev!(self, "segment orphan pass failed: {e}"),
            }
        }
    }

    /// The registered segments of every live partition, listed before the checker's walk
    /// ([`World::referenced`]), whose high watermarks, read after, bound them.
    pub(super) async fn listed_segments(&self) -> Result<Listed, Fail> {
        let mut out = Listed::new();
        for p in self.live_partitions() {
            out.insert(p, self.all_segments(p).await?);
        }
        Ok(out)
    }

    /// Invariant `tiered`, per live partition: its registered segments (`listed` before the walk)
    /// ascend without gap or overlap, end below the high watermark the walk read after them (it
    /// never goes back), and their objects are in the store (`stored`, listed after them: a
    /// registered segment's object exists before its registration, and once deleted it never
    /// comes back). Disjointness from the WAL batches is the walk's.
    pub(super) fn check_tiered(
        &self,
        listed: &Listed,
        walked: &Walked,
        stored: &BTreeSet<String>,
    ) -> Result<u64, Fail> {
        let mut count = 0u64;
        for (p, segments) in listed {
            let Some(&hw) = walked.high_watermarks.get(p) else {
                continue;
            };
            let mut previous: Option<i64> = None;
            for s in segments {
                if s.base_offset > s.end_offset || s.end_offset >= hw {
                    return Err((
                        TIERED,
                        format!(
                            "{p}: segment {} holds {}..={} (high watermark {hw})",
                            s.object_key, s.base_offset, s.end_offset
                        ),
                    ));
                }
                if let Some(end) = previous
                    && s.base_offset != end + 1
                {
                    return Err((
                        TIERED,
                        format!(
                            "{p}: segment {} starts at {} after a segment ending at {end}",
                            s.object_key, s.base_offset
                        ),
                    ));
                }
                previous = Some(s.end_offset);
                if !stored.contains(&s.object_key) {
                    return Err((
                        TIERED,
                        format!(
                            "{p}: segment {}..={} is registered but its object {} is not in the store",
                            s.base_offset, s.end_offset, s.object_key
                        ),
                    ));
                }
            }
            count += segments.len() as u64;
        }
        Ok(count)
    }

    /// Every registered segment of `p`, in offset order (none when its topic went meanwhile).
    async fn all_segments(&self, p: TopicIdPartition) -> Result<Vec<TieredSegment>, Fail> {
        const PAGE: u32 = 1_000;
        let mut out: Vec<TieredSegment> = Vec::new();
        let mut from = 0i64;
        loop {
            let page = match self.raw.list_tiered_segments(p, from, PAGE).await {
                Ok(page) => page,
                Err(_) if !self.topic_live(p.topic_id) => return Ok(Vec::new()),
                Err(e) => {
                    return Err((TIERED, format!("list_tiered_segments of {p}: {e}")));
                }
            };
            let full = page.len() == PAGE as usize;
            let Some(last) = page.last().map(|s| s.end_offset) else {
                return Ok(out);
            };
            out.extend(page);
            if !full {
                return Ok(out);
            }
            from = last + 1;
        }
    }

    /// The offsets of the live partitions still in the WAL tier: per partition, from its first
    /// offset not tiered (ListOffsets `-4`, EARLIEST_LOCAL: the log start or the first offset no
    /// segment holds, whichever is larger) to its high watermark.
    async fn wal_offsets_left(&self) -> Result<u64, Fail> {
        let mut left = 0u64;
        for p in self.live_partitions() {
            let asks = [
                ListOffsetsRequest {
                    partition: p,
                    timestamp: EARLIEST_LOCAL,
                    isolation: Default::default(),
                },
                ListOffsetsRequest {
                    partition: p,
                    timestamp: LATEST_TIMESTAMP,
                    isolation: Default::default(),
                },
            ];
            match self.raw.list_offsets(&asks).await.as_deref() {
                Ok([local, hw]) if local.error.is_ok() && hw.error.is_ok() => {
                    left += u64::try_from(hw.offset - local.offset).unwrap_or(0);
                }
                Ok(_) | Err(_) if !self.topic_live(p.topic_id) => {}
                other => {
                    return Err((BOUNDS, format!("ListOffsets -4/-1 of {p}: {other:?}")));
                }
            }
        }
        Ok(left)
    }

    /// Invariant `bounds` of the WAL tier: once nothing is produced and every transaction
    /// ended, the tiering worker consolidates every WAL batch of the live partitions (each is
    /// due after `segment.ms` + `min_age`). Progress is required, not a deadline: a window in
    /// which every partition was due and the worker had several passes without the offsets left
    /// in the WAL tier reaching a new low is a violation.
    pub(super) async fn drain_wal_tier(&self) -> Result<(), Fail> {
        let p = &self.p;
        let segment_ms = self
            .p
            .topics
            .iter()
            .map(|t| t.config.segment_ms)
            .max()
            .unwrap_or(0);
        let window = Duration::from_millis(u64::try_from(segment_ms).unwrap_or(0))
            + p.tiering.min_age
            + Duration::from_millis(2 * p.max_skew_ms as u64)
            + p.tiering_every * 5
            + Duration::from_secs(10);
        let window_ms = window.as_millis() as i64;
        let started = self.clock.elapsed_ms();
        let give_up = started + 12 * 3_600_000;
        let mut best = u64::MAX;
        let mut progress_at = started;
        loop {
            let left = self.wal_offsets_left().await?;
            let now = self.clock.elapsed_ms();
            if best == u64::MAX {
                self.stat(|s| s.wal_offsets_at_quiet = left);
            }
            if left == 0 {
                ev!(
                    self,
                    "tiering: every WAL batch consolidated {} ms into the drain",
                    now - started
                );
                self.stat(|s| s.drain_ms = u64::try_from(now - started).unwrap_or(0));
                self.drained.set();
                return Ok(());
            }
            if left < best {
                best = left;
                progress_at = now;
            }
            if now - progress_at > window_ms || now >= give_up {
                return Err((
                    BOUNDS,
                    format!(
                        "{left} offsets left in the WAL tier {} s into the quiet period, none consolidated in the last {} s",
                        (now - started) / 1000,
                        window_ms / 1000
                    ),
                ));
            }
            if !self.wait_until(now + 5_000).await {
                return Ok(());
            }
        }
    }

    /// A reader that now and then reads a partition again from its log start through the
    /// brokers (their caches and faults): consumers read near the tail, which stays in the WAL
    /// tier for `min_age`; this one reads the consolidated data, across the tier boundary. Its
    /// batches are checked as a consumer's (contiguous, each one sent, at its acknowledged
    /// offset, idempotent producers in order).
    pub(super) async fn replay_loop(self: Arc<Self>) {
        let mut rng = self.rng("replay", 0);
        while self.phase() < QUIET && !self.failed() {
            sleep(Duration::from_millis(rng.u64(2_000..=8_000))).await;
            let parts = self.live_partitions();
            if parts.is_empty() {
                continue;
            }
            let p = parts[rng.usize(0..parts.len())];
            if let Err(f) = self.replay(p, &mut rng).await {
                self.fail(f);
                return;
            }
        }
    }

    async fn replay(
        &self,
        partition: TopicIdPartition,
        rng: &mut fastrand::Rng,
    ) -> Result<(), Fail> {
        let Some((start, _)) = self.watermarks(partition).await else {
            return Ok(());
        };
        let mut position = start;
        let mut jumped = true;
        let mut order = ReadOrder::default();
        let max_bytes = rng.u32(200..=20_000);
        let mut read = 0u64;
        for _ in 0..rng.u32(1..=20) {
            if self.failed() || !self.topic_live(partition.topic_id) {
                return Ok(());
            }
            let Some(node) = self.pick_node(rng, None) else {
                return Ok(());
            };
            let floors = self.oracle.lock().floors(partition);
            let request = FetchPartition {
                partition,
                fetch_offset: position,
                partition_max_bytes: max_bytes,
                leader_epoch: LEADER_EPOCH,
                isolation: Default::default(),
            };
            let answer = match node.fetcher.fetch(&[request], max_bytes).await {
                Ok(mut v) if v.len() == 1 => v.remove(0),
                _ => continue,
            };
            if !self.topic_live(partition.topic_id) {
                return Ok(());
            }
            match answer.error {
                ErrorCode::None => {}
                ErrorCode::OffsetOutOfRange => {
                    let Some((start, _)) = self.watermarks(partition).await else {
                        return Ok(());
                    };
                    if start > position {
                        position = start;
                        jumped = true;
                    }
                    continue;
                }
                _ => continue,
            }
            self.oracle.lock().observe(
                partition,
                answer.high_watermark,
                answer.log_start_offset,
                floors,
                "replay",
            )?;
            let batches = split_batches(answer.records_bytes()).map_err(|e| {
                (
                    CONSUMER,
                    format!("replay of {partition} at {position}: records do not frame: {e}"),
                )
            })?;
            for batch in &batches {
                self.consume(partition, batch, &mut position, &mut jumped, &mut order)?;
                read += 1;
            }
            if position >= answer.high_watermark {
                break;
            }
        }
        ev!(
            self,
            "replay of {partition} from {start}: {read} batches, to {position}"
        );
        self.stat(|s| s.replay_batches += read);
        Ok(())
    }

    /// Stops the register faults (calm phase).
    pub(super) fn calm_registers(&self) {
        for c in std::iter::once(&self.faulty).chain(self.shard_faults.iter()) {
            c.fail_next_registers(0);
            c.lose_next_registers(0);
            c.release_registers();
        }
        debug_assert!(self.phase() >= CALM);
    }
}
