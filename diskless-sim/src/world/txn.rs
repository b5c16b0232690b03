//! Transactions (issue #14): a fake transaction coordinator (Kafka's, reduced to what a partition
//! sees: transaction numbers, verification, EndTxn, timeouts, markers written with retries),
//! transactional producers (TV1-like: one epoch across transactions; TV2-like: an epoch bump per
//! transaction), zombies of fenced producers, and `read_committed` consumers applying Kafka's
//! client algorithm.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use diskless_coordinator::{
    AbortedTxn, BatchCoordinator, Clock, ErrorCode, IsolationLevel, ListOffsetsRequest,
    TopicConfig, TopicIdPartition, TxnMarker,
};
use diskless_core::{FetchPartition, ListOffsetsPartition, RecordBatchBuilder, split_batches};
use std::sync::atomic::Ordering;

use tokio::time::{Instant, sleep};

use super::{Delivery, LEADER_EPOCH, ProducerSpec, QUIET, World};
use crate::oracle::{
    ATOMIC, BatchId, CONSUMER, LSO, MarkerInfo, OFFSETS, ReadOrder, SETUP, Sent, TxnKey,
    record_value,
};
use crate::params::rng_for;

/// The run's transaction settings (drawn from their own generator: the other draws keep theirs).
#[derive(Clone, Debug)]
pub(crate) struct TxnParams {
    /// Transactional producers.
    pub(crate) producers: u32,
    /// Share of them that bump their epoch per transaction (TV2).
    pub(crate) tv2_share: f64,
    /// The transaction coordinator aborts (and fences) a transaction open this long.
    pub(crate) timeout: Duration,
    /// Share of transactions committed (when every batch was acknowledged).
    pub(crate) commit_share: f64,
    /// One transaction in this many is abandoned by its producer (which restarts later).
    pub(crate) abandon_one_in: u32,
    /// One decided transaction in this many is released early (0: never): the transaction
    /// coordinator lets the producer begin its next transaction before this one's markers are
    /// written, and writes them after a delay, as a host that lost the pending ending and found
    /// it again (issue #31).
    pub(crate) release_early_one_in: u32,
}

impl TxnParams {
    pub(crate) fn derive(seed: u64) -> TxnParams {
        let mut r = rng_for(seed, "txn-params", 0);
        TxnParams {
            producers: r.u32(1..=3),
            tv2_share: r.f64(),
            timeout: Duration::from_millis(r.u64(3_000..=15_000)),
            commit_share: 0.5 + r.f64() * 0.4,
            abandon_one_in: r.u32(8..=30),
            release_early_one_in: if r.bool() { r.u32(2..=8) } else { 0 },
        }
    }
}

/// Why the transaction coordinator refused a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TcError {
    /// Markers of the producer's previous transaction are still being written (Kafka's
    /// `CONCURRENT_TRANSACTIONS`): retry.
    Concurrent,
    /// The epoch is not the producer's (`PRODUCER_FENCED`).
    Fenced,
    /// The transaction is no longer open (`TRANSACTION_ABORTABLE` / `INVALID_TXN_STATE`).
    Abortable,
}

#[derive(Debug)]
struct TcTxn {
    seq: i64,
    partitions: BTreeSet<TopicIdPartition>,
    started: Instant,
    /// Decided; its markers are being written.
    ending: bool,
}

#[derive(Debug)]
struct TcProducer {
    epoch: i16,
    tv2: bool,
    next_seq: i64,
    txn: Option<TcTxn>,
}

/// The transaction coordinator's state.
#[derive(Debug, Default)]
pub(crate) struct Tc {
    producers: BTreeMap<i64, TcProducer>,
    /// Transactions whose markers are being written.
    pending: usize,
}

impl Tc {
    /// No transaction open or ending.
    fn idle(&self) -> bool {
        self.pending == 0 && self.producers.values().all(|p| p.txn.is_none())
    }
}

impl World {
    // ---------------------------------------------------------------------------------------
    // The transaction coordinator

    pub(super) fn tc_idle(&self) -> bool {
        self.tc.lock().idle()
    }

    /// InitProducerId: a new epoch (a transaction still open is aborted with it first: the answer
    /// is then `Concurrent`, and the caller retries once its markers are written).
    fn tc_init(self: &Arc<Self>, pid: i64, tv2: bool) -> Result<i16, TcError> {
        let mut tc = self.tc.lock();
        let p = tc.producers.entry(pid).or_insert(TcProducer {
            epoch: -1,
            tv2,
            next_seq: 0,
            txn: None,
        });
        match &p.txn {
            Some(t) if t.ending => Err(TcError::Concurrent),
            Some(_) => {
                p.epoch += 1;
                ev!(
                    self,
                    "txn coordinator: producer {pid} re-initialised, open transaction fenced (epoch {})",
                    p.epoch
                );
                self.tc_decide(&mut tc, pid, false);
                Err(TcError::Concurrent)
            }
            None => {
                p.epoch += 1;
                Ok(p.epoch)
            }
        }
    }

    fn tc_begin(self: &Arc<Self>, pid: i64, epoch: i16) -> Result<i64, TcError> {
        let mut tc = self.tc.lock();
        let Some(p) = tc.producers.get_mut(&pid) else {
            return Err(TcError::Fenced);
        };
        if p.epoch != epoch {
            return Err(TcError::Fenced);
        }
        if p.txn.is_some() {
            return Err(TcError::Concurrent);
        }
        let seq = p.next_seq;
        p.next_seq += 1;
        p.txn = Some(TcTxn {
            seq,
            partitions: BTreeSet::new(),
            started: Instant::now(),
            ending: false,
        });
        self.oracle.lock().txns.entry((pid, seq)).or_default();
        Ok(seq)
    }

    /// AddPartitionsToTxn + the partition's verification: `partition` is in transaction `seq`.
    fn tc_add(
        &self,
        pid: i64,
        epoch: i16,
        seq: i64,
        partition: TopicIdPartition,
    ) -> Result<(), TcError> {
        let mut tc = self.tc.lock();
        let Some(p) = tc.producers.get_mut(&pid) else {
            return Err(TcError::Fenced);
        };
        if p.epoch != epoch {
            return Err(TcError::Fenced);
        }
        match &mut p.txn {
            Some(t) if t.seq == seq && !t.ending => {
                t.partitions.insert(partition);
                Ok(())
            }
            _ => Err(TcError::Abortable),
        }
    }

    /// EndTxn: decides the transaction and starts writing its markers; answers the producer's
    /// epoch from now on (bumped for TV2).
    fn tc_end(
        self: &Arc<Self>,
        pid: i64,
        epoch: i16,
        seq: i64,
        commit: bool,
    ) -> Result<i16, TcError> {
        let mut tc = self.tc.lock();
        let Some(p) = tc.producers.get_mut(&pid) else {
            return Err(TcError::Fenced);
        };
        if p.epoch != epoch {
            return Err(TcError::Fenced);
        }
        if !p.txn.as_ref().is_some_and(|t| t.seq == seq && !t.ending) {
            return Err(TcError::Abortable);
        }
        if p.tv2 {
            p.epoch += 1;
        }
        let epoch = p.epoch;
        self.tc_decide(&mut tc, pid, commit);
        Ok(epoch)
    }

    /// Decides the open transaction of `pid` and starts writing its markers, with the producer's
    /// current epoch.
    fn tc_decide(self: &Arc<Self>, tc: &mut Tc, pid: i64, commit: bool) {
        let Some(p) = tc.producers.get_mut(&pid) else {
            return;
        };
        let epoch = p.epoch;
        let Some(t) = p.txn.as_mut() else {
            return;
        };
        t.ending = true;
        let seq = t.seq;
        let partitions: Vec<TopicIdPartition> = t.partitions.iter().copied().collect();
        tc.pending += 1;
        let mut rng = self.rng("release-early", (pid as u64) << 32 | seq as u64);
        let delay = (self.config.faults.lost_txn_endings
            && self.txn.release_early_one_in > 0
            && rng.u32(0..self.txn.release_early_one_in) == 0)
            .then(|| Duration::from_millis(rng.u64(200..=5_000)));
        if delay.is_some() {
            // The producer may begin its next transaction (and be fenced, re-initialised) before
            // any of this one's markers is written.
            p.txn = None;
        }
        if let Err(f) = self.oracle.lock().decide((pid, seq), commit) {
            self.fail(f);
        }
        ev!(
            self,
            "txn coordinator: producer {pid} transaction {seq} {} (epoch {epoch}, {} partitions)",
            if commit { "COMMIT" } else { "ABORT" },
            partitions.len()
        );
        self.stat(|s| {
            if commit {
                s.txns_committed += 1;
            } else {
                s.txns_aborted += 1;
            }
        });
        if let Some(delay) = delay {
            ev!(
                self,
                "txn coordinator: transaction {pid}/{seq} released early; markers in {delay:?}"
            );
            self.stat(|s| s.txns_released_early += 1);
        }
        let world = self.clone();
        tokio::spawn(async move {
            if let Some(delay) = delay {
                sleep(delay).await;
            }
            world
                .write_markers(pid, seq, epoch, commit, partitions, delay.is_some())
                .await
        });
    }

    /// Writes the markers of one transaction until every partition has its own (or its topic is
    /// gone); refused, lost and stalled calls are retried (markers with a `txn_seq` are
    /// idempotent), a stalled one is given up after a while and may land later. A marker refused
    /// `CONCURRENT_TRANSACTIONS` (an earlier transaction of the producer, released early, is still
    /// open in the partition) is retried until that one's marker is written.
    async fn write_markers(
        self: Arc<Self>,
        pid: i64,
        seq: i64,
        epoch: i16,
        commit: bool,
        partitions: Vec<TopicIdPartition>,
        released_early: bool,
    ) {
        let mut rng = self.rng("markers", (pid as u64) << 32 | seq as u64);
        let mut left = partitions;
        let mut attempt = 0u32;
        while !left.is_empty() {
            if self.failed() {
                return;
            }
            attempt += 1;
            let markers: Vec<TxnMarker> = left
                .iter()
                .map(|p| TxnMarker {
                    partition: *p,
                    producer_id: pid,
                    producer_epoch: epoch,
                    coordinator_epoch: 0,
                    commit,
                    txn_seq: Some(seq),
                })
                .collect();
            let call = self.faulty.write_txn_markers(&markers);
            match tokio::time::timeout(Duration::from_secs(5), call).await {
                Ok(Ok(results)) if results.len() == markers.len() => {
                    // Every marker is written, waits for an earlier transaction's, or its topic
                    // is gone; anything else is fatal.
                    let mut retry = Vec::new();
                    for (m, r) in markers.iter().zip(results) {
                        match r.error {
                            ErrorCode::None => {
                                let info = MarkerInfo {
                                    producer_id: pid,
                                    producer_epoch: epoch,
                                    commit,
                                };
                                // A repeat names this transaction's own marker, unless it was
                                // released early: a later one may have ended in the partition.
                                // Otherwise no later transaction can have begun, so a repeat
                                // naming no marker says the transaction cannot end there.
                                let written = if r.duplicate && !released_early && r.offset < 0 {
                                    Err((
                                        ATOMIC,
                                        format!(
                                            "marker {m:?} of transaction {pid}/{seq} answered as a repeat of no marker"
                                        ),
                                    ))
                                } else if r.duplicate && released_early {
                                    self.oracle
                                        .lock()
                                        .marker_repeated(m.partition, r.offset, pid)
                                } else {
                                    self.oracle
                                        .lock()
                                        .marker_written(m.partition, r.offset, info)
                                };
                                if let Err(f) = written {
                                    self.fail(f);
                                    return;
                                }
                                ev!(
                                    self,
                                    "marker of {pid}/{seq} at {} offset {} (duplicate {})",
                                    m.partition,
                                    r.offset,
                                    r.duplicate
                                );
                                self.stat(|s| s.markers_written += u64::from(!r.duplicate));
                            }
                            ErrorCode::UnknownTopicOrPartition
                                if !self.topic_live(m.partition.topic_id) => {}
                            ErrorCode::ConcurrentTransactions => {
                                ev!(
                                    self,
                                    "marker of {pid}/{seq} at {} waits for an earlier transaction",
                                    m.partition
                                );
                                retry.push(m.partition);
                            }
                            code => {
                                self.fail((
                                    ATOMIC,
                                    format!(
                                        "marker {m:?} of transaction {pid}/{seq} refused: {code:?} (the transaction cannot end)"
                                    ),
                                ));
                                return;
                            }
                        }
                    }
                    left = retry;
                }
                Ok(Ok(results)) => {
                    self.fail((
                        ATOMIC,
                        format!(
                            "write_txn_markers of {} markers answered {}",
                            markers.len(),
                            results.len()
                        ),
                    ));
                    return;
                }
                Ok(Err(e)) => ev!(self, "markers of {pid}/{seq} attempt {attempt}: {e}"),
                Err(_) => ev!(self, "markers of {pid}/{seq} attempt {attempt}: timed out"),
            }
            if !left.is_empty() {
                sleep(Duration::from_millis(rng.u64(50..=500))).await;
            }
        }
        let mut tc = self.tc.lock();
        tc.pending -= 1;
        if let Some(p) = tc.producers.get_mut(&pid)
            && p.txn.as_ref().is_some_and(|t| t.seq == seq)
        {
            p.txn = None;
        }
        drop(tc);
        self.oracle.lock().txns.entry((pid, seq)).or_default().done = true;
        ev!(self, "txn coordinator: transaction {pid}/{seq} complete");
    }

    /// Aborts (and fences) transactions open longer than the timeout.
    pub(super) async fn tc_sweeper(self: Arc<Self>) {
        while self.phase() < super::DONE && !self.failed() {
            sleep(Duration::from_millis(500)).await;
            let mut tc = self.tc.lock();
            let expired: Vec<i64> = tc
                .producers
                .iter()
                .filter(|(_, p)| {
                    p.txn
                        .as_ref()
                        .is_some_and(|t| !t.ending && t.started.elapsed() > self.txn.timeout)
                })
                .map(|(pid, _)| *pid)
                .collect();
            for pid in expired {
                if let Some(p) = tc.producers.get_mut(&pid) {
                    p.epoch += 1;
                }
                ev!(
                    self,
                    "txn coordinator: producer {pid} transaction timed out"
                );
                self.stat(|s| s.txn_timeouts += 1);
                self.tc_decide(&mut tc, pid, false);
            }
        }
    }

    // ---------------------------------------------------------------------------------------
    // Transactional producers

    fn partition_config(&self, p: TopicIdPartition) -> Option<Arc<TopicConfig>> {
        self.topics
            .lock()
            .get(&p.topic_id)
            .filter(|t| !t.deleted)
            .map(|t| t.config.clone())
    }

    /// InitProducerId until it answers (a fenced open transaction ends first); `None` once the
    /// run is over.
    async fn tc_init_wait(self: &Arc<Self>, pid: i64, tv2: bool) -> Option<i16> {
        loop {
            if self.failed() || self.phase() >= super::DONE {
                return None;
            }
            match self.tc_init(pid, tv2) {
                Ok(epoch) => return Some(epoch),
                Err(_) => sleep(Duration::from_millis(100)).await,
            }
        }
    }

    pub(super) async fn txn_producer(self: Arc<Self>, index: u32, pid: i64, tv2: bool) {
        let mut rng = self.rng("txn-producer", u64::from(index));
        let Some(mut epoch) = self.tc_init_wait(pid, tv2).await else {
            return;
        };
        ev!(
            self,
            "transactional producer {index}: id {pid}, {}",
            if tv2 { "TV2" } else { "TV1" }
        );
        let mut sequences: BTreeMap<TopicIdPartition, i32> = BTreeMap::new();
        let mut batch_no: u32 = 0;
        loop {
            sleep(Duration::from_millis(
                rng.u64(self.p.think.0..=self.p.think.1),
            ))
            .await;
            if self.phase() >= QUIET || self.failed() {
                return;
            }
            let seq = match self.tc_begin(pid, epoch) {
                Ok(seq) => seq,
                Err(TcError::Concurrent) => continue,
                Err(_) => {
                    let Some(e) = self.tc_init_wait(pid, tv2).await else {
                        return;
                    };
                    epoch = e;
                    sequences.clear();
                    continue;
                }
            };
            let mut live = self.live_partitions();
            rng.shuffle(&mut live);
            live.truncate(rng.usize(2..=3));
            // The partitions the transaction coordinator has in the transaction: the only ones a
            // host can have verified a batch of it for (a zombie's verified batches go there).
            let mut added: Vec<TopicIdPartition> = Vec::new();
            let mut ok = true;
            let rounds = rng.usize(1..=3);
            'send: for round in 0..rounds {
                for &p in &live {
                    if round > 0 && rng.bool() {
                        continue;
                    }
                    if self.phase() >= QUIET || self.failed() {
                        ok = false;
                        break 'send;
                    }
                    let Some(config) = self.partition_config(p) else {
                        ok = false;
                        break 'send;
                    };
                    if let Err(e) = self.tc_add(pid, epoch, seq, p) {
                        ev!(
                            self,
                            "transactional producer {index}: add {p} to {pid}/{seq}: {e:?}"
                        );
                        ok = false;
                        break 'send;
                    }
                    if !added.contains(&p) {
                        added.push(p);
                    }
                    batch_no += 1;
                    let id: BatchId = (index, batch_no);
                    let sequence = sequences.get(&p).copied().unwrap_or(0);
                    let Some((bytes, records)) = self.txn_batch(
                        &mut rng,
                        id,
                        p,
                        (pid, epoch, sequence),
                        &config,
                        (pid, seq),
                    ) else {
                        return;
                    };
                    let spec = ProducerSpec {
                        index,
                        partition: p,
                        config,
                        producer_id: Some(pid),
                        skew_ms: 0,
                        compression: diskless_core::Compression::None,
                    };
                    let delivery = self
                        .deliver(&spec, &mut rng, id, bytes, epoch, sequence, Some(seq))
                        .await;
                    match delivery {
                        Delivery::Acked { .. } => {
                            sequences
                                .insert(p, diskless_core::increment_sequence(sequence, records));
                        }
                        Delivery::GaveUp | Delivery::Failed(_) | Delivery::TopicGone => {
                            if let Delivery::Failed(code) = &delivery {
                                ev!(
                                    self,
                                    "transactional producer {index} batch {batch_no} failed: {code:?}"
                                );
                            }
                            ok = false;
                            break 'send;
                        }
                    }
                }
            }
            if self.phase() < QUIET
                && self.txn.abandon_one_in > 0
                && rng.u32(0..self.txn.abandon_one_in) == 0
            {
                // The producer dies with its transaction open; a zombie of it may go on sending;
                // a new instance starts later (InitProducerId fences the old one), unless the
                // transaction coordinator's timeout aborted the transaction first.
                ev!(self, "transactional producer {index} abandons {pid}/{seq}");
                self.stat(|s| s.txns_abandoned += 1);
                if rng.bool() && !added.is_empty() {
                    let zombie_index = self.next_producer.fetch_add(1, Ordering::SeqCst);
                    let world = self.clone();
                    let zombie = Zombie {
                        index: zombie_index,
                        pid,
                        epoch,
                        seq,
                        partitions: added.clone(),
                        sequences: sequences.clone(),
                    };
                    tokio::spawn(async move { world.zombie(zombie).await });
                }
                sleep(self.txn.timeout.mul_f64(rng.f64() * 2.0)).await;
                let Some(e) = self.tc_init_wait(pid, tv2).await else {
                    return;
                };
                epoch = e;
                sequences.clear();
                continue;
            }
            let commit = ok && rng.f64() < self.txn.commit_share;
            match self.tc_end(pid, epoch, seq, commit) {
                Ok(e) => {
                    if e != epoch {
                        sequences.clear();
                    }
                    epoch = e;
                }
                Err(e) => {
                    ev!(
                        self,
                        "transactional producer {index}: end {pid}/{seq}: {e:?}"
                    );
                    ok = false;
                }
            }
            if !ok {
                // A batch whose fate is unknown (or a fence): a new epoch before the next
                // transaction (KIP-360), so that a late copy of it cannot join that one.
                let Some(e) = self.tc_init_wait(pid, tv2).await else {
                    return;
                };
                epoch = e;
                sequences.clear();
            }
        }
    }

    /// A transactional batch of transaction `txn` to `p` from producer `(id, epoch, sequence)`,
    /// recorded as sent; with its record count.
    fn txn_batch(
        &self,
        rng: &mut fastrand::Rng,
        id: BatchId,
        p: TopicIdPartition,
        (pid, epoch, sequence): (i64, i16, i32),
        config: &TopicConfig,
        txn: TxnKey,
    ) -> Option<(bytes::Bytes, i32)> {
        let records = rng.usize(1..=4);
        let now = self.clock.now_ms();
        let mut builder = RecordBatchBuilder::new()
            .transactional(true)
            .producer(pid, epoch, sequence);
        for r in 0..records {
            let value = record_value(id, r, rng.usize(0..=80));
            builder = builder.record(now + r as i64, None, Some(&value));
        }
        let bytes = match builder.build() {
            Ok(b) => b.into_bytes(),
            Err(e) => {
                self.fail((SETUP, format!("building a transactional batch: {e}")));
                return None;
            }
        };
        self.oracle.lock().sent.insert(
            id,
            Sent {
                partition: p,
                bytes: bytes.clone(),
                idempotent: true,
                log_append_time: config.timestamp_type
                    == diskless_coordinator::TimestampType::LogAppendTime,
                acked: None,
                seen_at: BTreeSet::new(),
                txn: Some(txn),
            },
        );
        self.stat(|s| s.batches_sent += 1);
        Some((bytes, records as i32))
    }

    /// A fenced (or dead) instance of a transactional producer that goes on sending batches of
    /// its old transaction with its old epoch: verified for it (a request the host verified before
    /// the fence) to the transaction's partitions, or unverified anywhere. Each must be refused,
    /// or land inside that transaction before its ABORT marker. Like a real client, a zombie whose
    /// request went unanswered or failed retriably sends the same batch again (same sequence, same
    /// bytes) rather than a new one under that sequence, which the coordinator would answer as
    /// the duplicate of the first.
    async fn zombie(self: Arc<Self>, z: Zombie) {
        let mut rng = self.rng("zombie", u64::from(z.index));
        let mut sequences = z.sequences;
        // The batch whose outcome is unknown: sent again next.
        let mut unsettled: Option<ZombieBatch> = None;
        let mut batch_no = 0u32;
        for _ in 1..=rng.u32(1..=3) {
            sleep(self.txn.timeout.mul_f64(rng.f64() * 1.5)).await;
            if self.phase() >= QUIET || self.failed() {
                return;
            }
            let b = match unsettled.take() {
                Some(b) => b,
                None => {
                    let verified = rng.bool();
                    let p = if verified || rng.bool() {
                        z.partitions[rng.usize(0..z.partitions.len())]
                    } else {
                        let live = self.live_partitions();
                        if live.is_empty() {
                            return;
                        }
                        live[rng.usize(0..live.len())]
                    };
                    let Some(config) = self.partition_config(p) else {
                        continue;
                    };
                    batch_no += 1;
                    let id: BatchId = (z.index, batch_no);
                    let sequence = sequences.get(&p).copied().unwrap_or(0);
                    let Some((bytes, records)) = self.txn_batch(
                        &mut rng,
                        id,
                        p,
                        (z.pid, z.epoch, sequence),
                        &config,
                        (z.pid, z.seq),
                    ) else {
                        return;
                    };
                    let spec = ProducerSpec {
                        index: z.index,
                        partition: p,
                        config,
                        producer_id: Some(z.pid),
                        skew_ms: 0,
                        compression: diskless_core::Compression::None,
                    };
                    ZombieBatch {
                        id,
                        spec,
                        bytes,
                        records,
                        sequence,
                        verified,
                    }
                }
            };
            let Some(node) = self.pick_node(&mut rng, None) else {
                unsettled = Some(b);
                continue;
            };
            self.stat(|s| s.zombie_batches += 1);
            let answer = self.submit(&node, &b.spec, b.bytes.clone(), b.verified.then_some(z.seq));
            let answer = tokio::select! {
                biased;
                a = answer => a.ok().flatten(),
                _ = node.crashed.wait() => None,
                _ = sleep(self.p.request_timeout) => None,
            };
            let Some(answer) = answer else {
                unsettled = Some(b);
                continue;
            };
            let p = b.spec.partition;
            ev!(
                self,
                "zombie {} of {}/{} (epoch {}, verified {}) batch {} to {p}: {:?} offset {}",
                z.index,
                z.pid,
                z.seq,
                z.epoch,
                b.verified,
                b.id.1,
                answer.error,
                answer.base_offset
            );
            if answer.error.is_ok() {
                sequences.insert(p, diskless_core::increment_sequence(b.sequence, b.records));
                let acked =
                    self.oracle
                        .lock()
                        .ack(b.id, answer.base_offset, answer.log_append_time);
                if let Err(f) = acked {
                    self.fail(f);
                    return;
                }
            } else if answer.error.is_retriable() {
                unsettled = Some(b);
            }
        }
    }

    // ---------------------------------------------------------------------------------------
    // read_committed consumers

    /// A `read_committed` consumer of one partition, as Kafka's client: per fetch it keeps the
    /// aborted transactions of the answer (by first offset), skips a transactional batch of a
    /// producer from its aborted transaction's first offset until that producer's ABORT marker,
    /// and skips control batches.
    pub(super) async fn rc_consumer(self: Arc<Self>, partition: TopicIdPartition, index: u64) {
        let mut rng = self.rng("rc-consumer", index);
        let mut position = 0i64;
        let mut jumped = true;
        let mut order = ReadOrder::default();
        let (mut last_hw, mut last_stable) = (-1i64, -1i64);
        let mut last_final = false;
        let max_bytes = rng.u32(200..=20_000);
        loop {
            if self.failed() || self.phase() == super::DONE || !self.topic_live(partition.topic_id)
            {
                return;
            }
            // Caught up: an answer to a fetch sent once nothing could be appended any more
            // (every producer returned, every transaction ended) showed the end of the log.
            if last_final && position >= last_hw && last_stable == last_hw {
                ev!(
                    self,
                    "read_committed consumer of {partition} caught up at {position}"
                );
                self.oracle.lock().rc_caught_up(partition);
                return;
            }
            sleep(Duration::from_millis(
                rng.u64(self.p.poll.0..=self.p.poll.1),
            ))
            .await;
            let Some(node) = self.pick_node(&mut rng, None) else {
                continue;
            };
            let (floors, stable_floor) = {
                let oracle = self.oracle.lock();
                (oracle.floors(partition), oracle.stable_floor(partition))
            };
            let is_final = self.producers_done.is_set() && self.tc_idle();
            self.stat(|s| s.fetches += 1);
            let request = FetchPartition {
                partition,
                fetch_offset: position,
                partition_max_bytes: max_bytes,
                leader_epoch: LEADER_EPOCH,
                isolation: IsolationLevel::ReadCommitted,
            };
            let answer = match node
                .fetcher
                .fetch(&[request], max_bytes.saturating_mul(2))
                .await
            {
                Ok(mut v) if v.len() == 1 => v.remove(0),
                Ok(v) => {
                    self.fail((
                        CONSUMER,
                        format!("a fetch of one partition got {} answers", v.len()),
                    ));
                    return;
                }
                Err(e) => {
                    ev!(self, "rc consumer {partition} fetch at {position}: {e}");
                    continue;
                }
            };
            if !self.topic_live(partition.topic_id) {
                return;
            }
            match answer.error {
                ErrorCode::None => {}
                ErrorCode::OffsetOutOfRange => {
                    self.stat(|s| s.out_of_range += 1);
                    let listed = node
                        .fetcher
                        .list_offsets(&[ListOffsetsPartition {
                            partition,
                            timestamp: diskless_coordinator::EARLIEST_TIMESTAMP,
                            leader_epoch: LEADER_EPOCH,
                            isolation: IsolationLevel::ReadCommitted,
                        }])
                        .await;
                    let start = match listed.as_deref() {
                        Ok([one]) if one.error.is_ok() => one.offset,
                        _ => continue,
                    };
                    ev!(
                        self,
                        "rc consumer {partition} out of range at {position}, log start {start}"
                    );
                    if start > position {
                        self.oracle.lock().rc_jumped(partition, position, start);
                        position = start;
                        jumped = true;
                    }
                    continue;
                }
                code => {
                    ev!(
                        self,
                        "rc consumer {partition} fetch at {position}: {code:?}"
                    );
                    self.stat(|s| s.fetch_errors += 1);
                    continue;
                }
            }
            let observed = {
                let mut oracle = self.oracle.lock();
                oracle
                    .observe(
                        partition,
                        answer.high_watermark,
                        answer.log_start_offset,
                        floors,
                        "read_committed fetch",
                    )
                    .and_then(|()| {
                        oracle.observe_stable(
                            partition,
                            answer.last_stable_offset,
                            answer.high_watermark,
                            answer.log_start_offset,
                            stable_floor,
                            "read_committed fetch",
                        )
                    })
            };
            if let Err(f) = observed {
                self.fail(f);
                return;
            }
            let Some(aborted) = answer.aborted_transactions.clone() else {
                self.fail((
                    LSO,
                    format!("read_committed fetch of {partition} at {position}: no aborted list"),
                ));
                return;
            };
            (last_hw, last_stable, last_final) =
                (answer.high_watermark, answer.last_stable_offset, is_final);
            let batches = match split_batches(answer.records_bytes()) {
                Ok(b) => b,
                Err(e) => {
                    self.fail((
                        CONSUMER,
                        format!("fetch of {partition} at {position}: records do not frame: {e}"),
                    ));
                    return;
                }
            };
            ev!(
                self,
                "rc consumer {partition} fetched {} batches at {position} (hw {}, stable {}, {} aborted)",
                batches.len(),
                answer.high_watermark,
                answer.last_stable_offset,
                aborted.len()
            );
            let mut aborted: Vec<AbortedTxn> = aborted;
            aborted.sort_by_key(|a| a.first_offset);
            let mut aborted: VecDeque<AbortedTxn> = aborted.into();
            let mut aborting: BTreeSet<i64> = BTreeSet::new();
            for batch in batches {
                let (base, last) = (batch.base_offset(), batch.last_offset());
                let contiguous = if jumped {
                    base <= position && position <= last
                } else {
                    base == position
                };
                if !contiguous {
                    let invariant = if base < position { CONSUMER } else { OFFSETS };
                    self.fail((
                        invariant,
                        format!(
                            "read_committed consumer of {partition} at {position} (after a jump: {jumped}) was served {base}..={last}"
                        ),
                    ));
                    return;
                }
                if last >= answer.last_stable_offset {
                    self.fail((
                        LSO,
                        format!(
                            "read_committed fetch of {partition} served {base}..={last}, last stable offset {}",
                            answer.last_stable_offset
                        ),
                    ));
                    return;
                }
                // Kafka's `CompletedFetch.nextFetchedRecord`: the aborted transactions starting
                // up to this batch's end first, then an ABORT marker ends its producer's.
                while aborted.front().is_some_and(|a| a.first_offset <= last) {
                    if let Some(a) = aborted.pop_front() {
                        aborting.insert(a.producer_id);
                    }
                }
                let checked = {
                    let mut oracle = self.oracle.lock();
                    if batch.attributes().is_control() {
                        oracle
                            .served_marker(partition, &batch, LEADER_EPOCH, "rc consumer")
                            .map(|m| {
                                if !m.commit {
                                    aborting.remove(&m.producer_id);
                                }
                            })
                    } else {
                        let skip = batch.attributes().is_transactional()
                            && aborting.contains(&batch.producer_id());
                        oracle
                            .served(partition, &batch, LEADER_EPOCH, "rc consumer")
                            .and_then(|id| {
                                if skip {
                                    self.stat(|s| s.rc_skipped += 1);
                                    oracle.rc_skipped(partition, id, base)
                                } else {
                                    self.stat(|s| s.rc_returned += 1);
                                    order.check(&oracle, id, CONSUMER)?;
                                    oracle.rc_returned(partition, id, base)
                                }
                            })
                    }
                };
                if let Err(f) = checked {
                    self.fail(f);
                    return;
                }
                position = last + 1;
                jumped = false;
            }
        }
    }

    /// Once every transaction ended: the last stable offset of every live partition is its high
    /// watermark (no transaction hangs).
    pub(super) async fn check_stable_at_end(&self) -> Result<(), crate::oracle::Fail> {
        for p in self.live_partitions() {
            let ask = |isolation| ListOffsetsRequest {
                partition: p,
                timestamp: diskless_coordinator::LATEST_TIMESTAMP,
                isolation,
            };
            let asks = [
                ask(IsolationLevel::ReadUncommitted),
                ask(IsolationLevel::ReadCommitted),
            ];
            match self.raw.list_offsets(&asks).await.as_deref() {
                Ok([hw, stable]) if hw.error.is_ok() && stable.error.is_ok() => {
                    if hw.offset != stable.offset {
                        return Err((
                            LSO,
                            format!(
                                "{p}: last stable offset {} below the high watermark {} after every transaction ended",
                                stable.offset, hw.offset
                            ),
                        ));
                    }
                }
                other => {
                    return Err((LSO, format!("{p}: ListOffsets LATEST: {other:?}")));
                }
            }
        }
        Ok(())
    }
}

/// A batch a zombie sent (or is about to send again).
struct ZombieBatch {
    id: BatchId,
    spec: ProducerSpec,
    bytes: bytes::Bytes,
    records: i32,
    sequence: i32,
    verified: bool,
}

/// What a zombie remembers of the instance it was.
struct Zombie {
    index: u32,
    pid: i64,
    epoch: i16,
    seq: i64,
    /// The partitions the transaction coordinator had in its transaction (added successfully).
    partitions: Vec<TopicIdPartition>,
    sequences: BTreeMap<TopicIdPartition, i32>,
}
