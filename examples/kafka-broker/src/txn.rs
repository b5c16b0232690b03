//! The transaction coordinator (KIP-98, transaction version 1: the classic flow librdkafka and
//! `kafka-clients` without KIP-890 part 2 speak): InitProducerId with a transactional id,
//! AddPartitionsToTxn (v0-3), AddOffsetsToTxn, TxnOffsetCommit, EndTxn (v0-4), the verification of
//! transactional Produce batches, transaction timeouts, DescribeTransactions and ListTransactions.
//!
//! The rules are Kafka's `TransactionCoordinator` / `TransactionMetadata` (docs/transactions.md
//! §1.4): one [`TxnMeta`] per transactional id, moved through the states of [`TxnState`] by the
//! pure `*_step` functions of [`crate::txn_coordinator`] (unit-tested as tables), each new state
//! written to `broker.db` ([`crate::store`]) before it is acted on or answered — the equivalent of
//! Kafka's append to `__transaction_state`.
//!
//! The partition leader's part is the batch coordinator's: markers go straight to
//! [`diskless_coordinator::BatchCoordinator::write_txn_markers`] (no WriteTxnMarkers round trip).
//! Every entry into `Ongoing` takes the next *transaction number* (`txn_seq`) of the transactional
//! id; a Produce batch verified to be in the ongoing transaction carries it
//! ([`diskless_core::ProducePartition::with_txn_seq`]) and so do the transaction's markers, which
//! makes markers idempotent and stops a late batch of an ended transaction from opening a new one.
//!
//! EndTxn: `Ongoing` → `Prepare{Commit,Abort}` (durable) → markers on every partition (retried
//! with backoff until written, the partition dropped if its topic is gone) → the group offsets of
//! the transaction installed (commit) or dropped (abort) together with `Complete{Commit,Abort}` in
//! one SQLite transaction. The answer is sent once the markers are written, or after
//! [`END_WAIT`] with the outcome already decided (the `Prepare*` row), as Kafka answers once its
//! prepare record is durable. A restarted broker completes every `Prepare*` transaction it finds
//! and the timeout sweeper aborts every `Ongoing` one whose timeout (counted from its persisted
//! start) has passed, so no transaction is left hanging. The coordinator epoch is bumped on every
//! start; markers carry it.
//!
//! Transactions belong to this process (as consumer groups do): several broker processes on one
//! PostgreSQL coordinator would each coordinate the transactional ids their clients bring.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use diskless_coordinator::{ErrorCode, TopicIdPartition, TxnMarker};
use kafka_protocol::messages::add_partitions_to_txn_response::{
    AddPartitionsToTxnPartitionResult, AddPartitionsToTxnTopicResult,
};
use kafka_protocol::messages::txn_offset_commit_response::{
    TxnOffsetCommitResponsePartition, TxnOffsetCommitResponseTopic,
};
use kafka_protocol::messages::{
    AddOffsetsToTxnRequest, AddOffsetsToTxnResponse, AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse, DescribeTransactionsRequest, DescribeTransactionsResponse,
    EndTxnRequest, EndTxnResponse, InitProducerIdRequest, InitProducerIdResponse,
    ListTransactionsRequest, ListTransactionsResponse, ProducerId, TopicName,
    TxnOffsetCommitRequest, TxnOffsetCommitResponse, describe_transactions_response,
    list_transactions_response,
};
use kafka_protocol::protocol::StrBytes;
use tracing::{debug, error, info, warn};

use crate::broker::Broker;
use crate::codes;
use crate::ctx::Ctx;
use crate::offsets::{OffsetToCommit, check_offsets, stored_code};
use crate::txn_coordinator::{
    CONCURRENT_TRANSACTIONS, EndV2, Entry, INVALID_PRODUCER_EPOCH, INVALID_PRODUCER_ID_MAPPING,
    INVALID_TRANSACTION_TIMEOUT, InitStep, MAX_TRANSACTION_TIMEOUT_MS, NO_EPOCH, NO_PRODUCER_ID,
    NOT_ENOUGH_REPLICAS, OPERATION_NOT_ATTEMPTED, PRODUCER_FENCED, TRANSACTIONAL_ID_NOT_FOUND,
    TxnMeta, TxnPartitions, TxnState, add_step, complete_step, end_step, end_step_v2,
    epoch_exhausted, fence_needs_new_producer_id, fence_step, fenced_for, init_step,
    needs_new_producer_id, offsets_step, timed_out,
};

/// How often Ongoing transactions are checked against their timeout (Kafka's
/// `transaction.abort.timed.out.transaction.cleanup.interval.ms` is 10 s; an in-memory scan is
/// cheap, and a short interval keeps a timed-out transaction's partitions unstable for less time).
const SWEEP_INTERVAL: Duration = Duration::from_secs(1);
/// How long EndTxn waits for the markers before answering (the outcome is durable already).
const END_WAIT: Duration = Duration::from_secs(5);
/// Longest pause between two attempts at writing markers.
const MAX_MARKER_BACKOFF: Duration = Duration::from_secs(5);

/// Produce v12 (transaction version 2): the partition joins the producer's transaction (one
/// is started if none is open, as AddPartitionsToTxn does), then the batch is verified.
pub(crate) async fn add_and_verify(
    broker: &Broker,
    tid: &str,
    producer_id: i64,
    epoch: i16,
    partition: TopicIdPartition,
    topic_name: &str,
    version: i16,
) -> Result<i64, i16> {
    let mut partitions = TxnPartitions::new();
    partitions.insert(
        (partition.topic_id, partition.partition),
        topic_name.to_string(),
    );
    match add_to_txn(broker, tid, producer_id, epoch, &partitions, &[]).await {
        Ok(()) => {}
        // As Kafka's `AddPartitionsToTxnManager` maps them for Produce.
        Err(PRODUCER_FENCED) => return Err(INVALID_PRODUCER_EPOCH),
        Err(CONCURRENT_TRANSACTIONS) | Err(codes::COORDINATOR_NOT_AVAILABLE) => {
            return Err(NOT_ENOUGH_REPLICAS);
        }
        Err(code) => return Err(code),
    }
    broker
        .txns
        .verify(tid, producer_id, epoch, partition, version)
        .await
}

/// Loads the transactions of `broker.db` (bumping the coordinator epoch) and finishes every
/// transaction that was being ended when the last process stopped. Ongoing ones are left to the
/// timeout sweeper.
pub(crate) async fn load(broker: &Arc<Broker>) -> Result<(), String> {
    let epoch = broker
        .store
        .bump_coordinator_epoch()
        .await
        .map_err(|e| e.to_string())?;
    broker.txns.set_epoch(epoch);
    let loaded = broker.store.load_txns().await.map_err(|e| e.to_string())?;
    let resume = broker.txns.install(loaded);
    info!(
        coordinator_epoch = epoch,
        transactional_ids = broker.txns.count(),
        resumed = resume.len(),
        "transaction coordinator loaded"
    );
    for (meta, entry) in resume {
        info!(transactional_id = %meta.transactional_id, state = meta.state.name(), "completing a transaction of the previous process");
        tokio::spawn(complete(broker.clone(), entry));
    }
    Ok(())
}

/// Aborts, every [`SWEEP_INTERVAL`], the Ongoing transactions past their timeout (Kafka's
/// `abortTimedOutTransactions`: the producer is fenced, see [`fence_step`]). A transaction whose
/// new producer id cannot be allocated is left for the next pass, as Kafka's is.
pub(crate) async fn run_sweeper(broker: Arc<Broker>) {
    let mut tick = tokio::time::interval(SWEEP_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        for entry in broker.txns.entries() {
            let mut meta = entry.lock().await;
            if !timed_out(&meta, broker.clock.now_ms()) {
                continue;
            }
            let fresh = if fence_needs_new_producer_id(&meta, broker.transaction_version) {
                match new_producer_id(&broker).await {
                    Ok(pid) => Some(pid),
                    Err(_) => continue,
                }
            } else {
                None
            };
            let now = broker.clock.now_ms();
            let next = match fence_step(
                &meta,
                now,
                broker.txns.epoch(),
                broker.transaction_version,
                fresh,
            ) {
                Ok(next) => next,
                Err(code) => {
                    warn!(transactional_id = %meta.transactional_id, error_code = code, "cannot abort a timed-out transaction");
                    continue;
                }
            };
            if let Err(e) = broker.store.save_txn(&next).await {
                warn!(transactional_id = %meta.transactional_id, error = %e, "cannot store the abort of a timed-out transaction");
                continue;
            }
            log_fence_at_max_epoch(&meta);
            info!(
                transactional_id = %meta.transactional_id,
                producer_id = meta.producer_id,
                timeout_ms = meta.timeout_ms,
                epoch = next.producer_epoch,
                next_producer_id = next.next_producer_id,
                "transaction timed out: aborting it and fencing its producer"
            );
            *meta = next;
            drop(meta);
            tokio::spawn(complete(broker.clone(), entry.clone()));
        }
    }
}

/// Kafka's `prepareFenceProducerEpoch` error (since KAFKA-20090) when the epoch to fence is
/// already `i16::MAX`: it is kept, and the abort goes on at that epoch (see [`fence_step`]).
fn log_fence_at_max_epoch(meta: &TxnMeta) {
    if meta.producer_epoch == i16::MAX {
        error!(
            transactional_id = %meta.transactional_id,
            producer_id = meta.producer_id,
            "fencing a producer whose epoch is already i16::MAX: the epoch is kept (this must not happen unless there is a bug)"
        );
    }
}

/// Writes the markers of a `Prepare*` transaction, then completes its offsets and stores
/// `Complete*`. Idempotent (markers by transaction number, offsets by deleting pending rows).
async fn complete(broker: Arc<Broker>, entry: Entry) {
    let snapshot = entry.lock().await.clone();
    if !snapshot.state.is_prepare() {
        return;
    }
    let commit = snapshot.state == TxnState::PrepareCommit;
    write_markers(&broker, &snapshot, commit).await;
    // Wake the long-polling read_committed fetches: the last stable offset moved.
    broker.commits.send_modify(|n| *n = n.wrapping_add(1));
    let groups: Vec<String> = snapshot.groups.iter().cloned().collect();
    let mut backoff = Duration::from_millis(50);
    let mut meta = entry.lock().await;
    if meta.state != snapshot.state || meta.txn_seq != snapshot.txn_seq {
        return;
    }
    let next = complete_step(&meta, broker.clock.now_ms());
    loop {
        match broker
            .store
            .complete_txn(&next, snapshot.producer_id, &groups, commit)
            .await
        {
            Ok(()) => break,
            Err(e) => {
                warn!(transactional_id = %snapshot.transactional_id, error = %e, "cannot store the end of a transaction; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_MARKER_BACKOFF);
            }
        }
    }
    debug!(
        transactional_id = %snapshot.transactional_id,
        producer_id = snapshot.producer_id,
        txn_seq = snapshot.txn_seq,
        commit,
        partitions = snapshot.partitions.len(),
        "transaction completed"
    );
    *meta = next;
}

/// Writes one marker per partition of the transaction, retrying what failed for a retriable
/// reason until every partition is done or dropped.
async fn write_markers(broker: &Broker, meta: &TxnMeta, commit: bool) {
    let mut remaining: Vec<TxnMarker> = meta
        .partitions
        .keys()
        .map(|&(topic_id, partition)| TxnMarker {
            partition: TopicIdPartition::new(topic_id, partition),
            producer_id: meta.producer_id,
            producer_epoch: meta.producer_epoch,
            coordinator_epoch: broker.txns.epoch(),
            commit,
            txn_seq: Some(meta.txn_seq),
        })
        .collect();
    let mut backoff = Duration::from_millis(50);
    while !remaining.is_empty() {
        match broker.coordinator.write_txn_markers(&remaining).await {
            Ok(results) if results.len() == remaining.len() => {
                let mut retry = Vec::new();
                for (marker, result) in remaining.iter().zip(results) {
                    match result.error {
                        ErrorCode::None => {}
                        ErrorCode::UnknownTopicOrPartition => {
                            debug!(partition = %marker.partition, "marker dropped: the topic is gone");
                        }
                        ErrorCode::InvalidProducerEpoch
                        | ErrorCode::TransactionCoordinatorFenced => {
                            warn!(transactional_id = %meta.transactional_id, partition = %marker.partition, error = ?result.error, "marker refused: the transaction was superseded");
                        }
                        other => {
                            debug!(partition = %marker.partition, error = ?other, "marker not written; retrying");
                            retry.push(*marker);
                        }
                    }
                }
                remaining = retry;
            }
            Ok(results) => {
                warn!(
                    markers = remaining.len(),
                    results = results.len(),
                    "the coordinator answered a different number of markers; retrying"
                );
            }
            Err(e) => {
                warn!(transactional_id = %meta.transactional_id, error = %e, "cannot write transaction markers; retrying");
            }
        }
        if !remaining.is_empty() {
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(MAX_MARKER_BACKOFF);
        }
    }
}

/// Starts the completion of a `Prepare*` transaction and waits up to [`END_WAIT`] for it.
async fn complete_and_wait(broker: &Arc<Broker>, entry: Entry) {
    let task = tokio::spawn(complete(broker.clone(), entry));
    let _ = tokio::time::timeout(END_WAIT, task).await;
}

fn expected_producer(producer_id: i64, epoch: i16) -> Option<(i64, i16)> {
    (producer_id != NO_PRODUCER_ID || epoch != NO_EPOCH).then_some((producer_id, epoch))
}

/// InitProducerId with a transactional id (v0-4).
pub(crate) async fn init_producer_id(
    broker: &Arc<Broker>,
    ctx: &Ctx,
    request: InitProducerIdRequest,
    tid: &str,
) -> InitProducerIdResponse {
    let mut response = InitProducerIdResponse::default();
    let code = init(broker, ctx, &request, tid).await;
    match code {
        Ok((pid, epoch)) => {
            response.producer_id = ProducerId(pid);
            response.producer_epoch = epoch;
        }
        Err(code) => {
            response.error_code = fenced_for(code, ctx.version, 4);
            response.producer_id = ProducerId(NO_PRODUCER_ID);
            response.producer_epoch = NO_EPOCH;
        }
    }
    response
}

async fn init(
    broker: &Arc<Broker>,
    ctx: &Ctx,
    request: &InitProducerIdRequest,
    tid: &str,
) -> Result<(i64, i16), i16> {
    if tid.is_empty() {
        return Err(codes::INVALID_REQUEST);
    }
    let timeout_ms = request.transaction_timeout_ms;
    if timeout_ms <= 0 || timeout_ms > MAX_TRANSACTION_TIMEOUT_MS {
        return Err(INVALID_TRANSACTION_TIMEOUT);
    }
    let expected = if ctx.version >= 3 {
        expected_producer(request.producer_id.0, request.producer_epoch)
    } else {
        None
    };
    let entry = broker.txns.get_or_create(tid);
    let mut meta = entry.lock().await;
    let now = broker.clock.now_ms();
    let epoch = broker.txns.epoch();
    let base = if meta.is_initialized() {
        meta.clone()
    } else {
        TxnMeta::fresh(tid, new_producer_id(broker).await?, timeout_ms, now, epoch)
    };
    let fresh = if needs_new_producer_id(&base)
        || fence_needs_new_producer_id(&base, broker.transaction_version)
    {
        Some(new_producer_id(broker).await?)
    } else {
        None
    };
    let step = init_step(
        &base,
        expected,
        timeout_ms,
        now,
        fresh,
        epoch,
        broker.transaction_version,
    )?;
    let next = match &step {
        InitStep::Ready(next) | InitStep::Fence(next) => next.clone(),
    };
    if let Err(e) = broker.store.save_txn(&next).await {
        warn!(transactional_id = %tid, error = %e, "cannot store a transactional id");
        return Err(codes::COORDINATOR_NOT_AVAILABLE);
    }
    *meta = next.clone();
    drop(meta);
    match step {
        InitStep::Ready(_) => {
            debug!(transactional_id = %tid, producer_id = next.producer_id, epoch = next.producer_epoch, "transactional producer initialized");
            Ok((next.producer_id, next.producer_epoch))
        }
        InitStep::Fence(_) => {
            log_fence_at_max_epoch(&base);
            info!(transactional_id = %tid, producer_id = next.producer_id, "InitProducerId fences the ongoing transaction of an older producer: aborting it");
            complete_and_wait(broker, entry).await;
            Err(CONCURRENT_TRANSACTIONS)
        }
    }
}

async fn new_producer_id(broker: &Broker) -> Result<i64, i16> {
    broker
        .producer_ids
        .next(broker.coordinator.as_ref())
        .await
        .map_err(|e| {
            warn!(error = %e, "cannot allocate a producer id");
            codes::COORDINATOR_NOT_AVAILABLE
        })
}

/// Applies [`add_step`] under the transactional id's lock and stores the result.
async fn add_to_txn(
    broker: &Broker,
    tid: &str,
    producer_id: i64,
    epoch: i16,
    partitions: &TxnPartitions,
    groups: &[String],
) -> Result<(), i16> {
    if tid.is_empty() {
        return Err(codes::INVALID_REQUEST);
    }
    let Some(entry) = broker.txns.get(tid) else {
        return Err(INVALID_PRODUCER_ID_MAPPING);
    };
    let mut meta = entry.lock().await;
    let now = broker.clock.now_ms();
    let Some(next) = add_step(
        &meta,
        producer_id,
        epoch,
        partitions,
        groups,
        now,
        broker.txns.epoch(),
    )?
    else {
        return Ok(());
    };
    if let Err(e) = broker.store.save_txn(&next).await {
        warn!(transactional_id = %tid, error = %e, "cannot store a transaction's partitions");
        return Err(codes::COORDINATOR_NOT_AVAILABLE);
    }
    *meta = next;
    Ok(())
}

/// AddPartitionsToTxn v0-3. Unknown topics or partitions answer UNKNOWN_TOPIC_OR_PARTITION and
/// the others OPERATION_NOT_ATTEMPTED (Kafka's `handleAddPartitionsToTxnRequest`).
pub(crate) async fn add_partitions_to_txn(
    broker: &Arc<Broker>,
    ctx: &Ctx,
    request: AddPartitionsToTxnRequest,
) -> AddPartitionsToTxnResponse {
    let tid = request.v3_and_below_transactional_id.as_str().to_string();
    let mut layout: Vec<(TopicName, Vec<(i32, bool)>)> = Vec::new();
    let mut partitions = TxnPartitions::new();
    let mut lookup_error = None;
    for topic in request.v3_and_below_topics {
        let found = broker.topics.by_name(topic.name.as_str()).await;
        let mut parts = Vec::with_capacity(topic.partitions.len());
        for p in topic.partitions {
            let known = match &found {
                Ok(Some(t)) if t.has_partition(p) => {
                    partitions.insert((t.id, p), t.name.clone());
                    true
                }
                Ok(_) => false,
                Err(e) => {
                    lookup_error = Some(e.error_code().code());
                    false
                }
            };
            parts.push((p, known));
        }
        layout.push((topic.name, parts));
    }
    let all_known = layout.iter().all(|(_, ps)| ps.iter().all(|(_, k)| *k));
    let result = match lookup_error {
        Some(code) => Err(code),
        None if all_known => add_to_txn(
            broker,
            &tid,
            request.v3_and_below_producer_id.0,
            request.v3_and_below_producer_epoch,
            &partitions,
            &[],
        )
        .await
        .map_err(|code| fenced_for(code, ctx.version, 2)),
        None => Ok(()),
    };
    let mut response = AddPartitionsToTxnResponse::default();
    for (name, parts) in layout {
        let mut t = AddPartitionsToTxnTopicResult::default();
        t.name = name;
        t.results_by_partition = parts
            .into_iter()
            .map(|(index, known)| {
                let mut r = AddPartitionsToTxnPartitionResult::default();
                r.partition_index = index;
                r.partition_error_code = match (&result, all_known, known) {
                    (Err(code), _, _) => *code,
                    (Ok(()), true, _) => codes::NONE,
                    (Ok(()), false, false) => codes::UNKNOWN_TOPIC_OR_PARTITION,
                    (Ok(()), false, true) => OPERATION_NOT_ATTEMPTED,
                };
                r
            })
            .collect();
        response.results_by_topic_v3_and_below.push(t);
    }
    response
}

/// AddOffsetsToTxn: the group joins the transaction (Kafka adds its `__consumer_offsets`
/// partition).
pub(crate) async fn add_offsets_to_txn(
    broker: &Arc<Broker>,
    ctx: &Ctx,
    request: AddOffsetsToTxnRequest,
) -> AddOffsetsToTxnResponse {
    let mut response = AddOffsetsToTxnResponse::default();
    let group = request.group_id.as_str().to_string();
    if group.is_empty() {
        response.error_code = codes::INVALID_GROUP_ID;
        return response;
    }
    response.error_code = match add_to_txn(
        broker,
        request.transactional_id.as_str(),
        request.producer_id.0,
        request.producer_epoch,
        &TxnPartitions::new(),
        &[group],
    )
    .await
    {
        Ok(()) => codes::NONE,
        Err(code) => fenced_for(code, ctx.version, 2),
    };
    response
}

/// EndTxn: v0-4 transaction version 1, v5 transaction version 2 (the epoch is bumped per
/// transaction and answered, see [`end_step_v2`]).
pub(crate) async fn end_txn(
    broker: &Arc<Broker>,
    ctx: &Ctx,
    request: EndTxnRequest,
) -> EndTxnResponse {
    let mut response = EndTxnResponse::default();
    response.producer_id = ProducerId(NO_PRODUCER_ID);
    response.producer_epoch = NO_EPOCH;
    let outcome = if ctx.version >= 5 {
        end_v2(broker, &request).await
    } else {
        end(broker, &request).await.map(|()| None)
    };
    match outcome {
        Ok(answer) => {
            response.error_code = codes::NONE;
            if let Some((pid, epoch)) = answer {
                response.producer_id = ProducerId(pid);
                response.producer_epoch = epoch;
            }
        }
        Err(code) => response.error_code = fenced_for(code, ctx.version, 2),
    }
    response
}

/// EndTxn v5: the producer id and epoch of the client's next transaction.
async fn end_v2(broker: &Arc<Broker>, request: &EndTxnRequest) -> Result<Option<(i64, i16)>, i16> {
    let tid = request.transactional_id.as_str();
    if tid.is_empty() {
        return Err(codes::INVALID_REQUEST);
    }
    let Some(entry) = broker.txns.get(tid) else {
        return Err(INVALID_PRODUCER_ID_MAPPING);
    };
    let mut meta = entry.lock().await;
    // Allocated only when the end may bump (Kafka's `generateTxnTransitMetadataForTxnCompletion`):
    // not for the CONCURRENT_TRANSACTIONS of a transaction being ended.
    let fresh = if meta.is_initialized()
        && !meta.state.is_prepare()
        && epoch_exhausted(meta.producer_epoch)
    {
        Some(new_producer_id(broker).await?)
    } else {
        None
    };
    let next = match end_step_v2(
        &meta,
        request.producer_id.0,
        request.producer_epoch,
        request.committed,
        broker.clock.now_ms(),
        broker.txns.epoch(),
        fresh,
    )? {
        EndV2::Repeat => return Ok(Some((meta.producer_id, meta.producer_epoch))),
        EndV2::Prepare(next) => next,
    };
    if let Err(e) = broker.store.save_txn(&next).await {
        warn!(transactional_id = %tid, error = %e, "cannot store the end of a transaction");
        return Err(codes::COORDINATOR_NOT_AVAILABLE);
    }
    debug!(transactional_id = %tid, state = next.state.name(), epoch = next.producer_epoch, partitions = next.partitions.len(), "transaction ending (transaction version 2)");
    let answer = if next.next_producer_id != NO_PRODUCER_ID {
        (next.next_producer_id, 0)
    } else {
        (next.producer_id, next.producer_epoch)
    };
    *meta = next;
    drop(meta);
    complete_and_wait(broker, entry).await;
    Ok(Some(answer))
}

async fn end(broker: &Arc<Broker>, request: &EndTxnRequest) -> Result<(), i16> {
    let tid = request.transactional_id.as_str();
    if tid.is_empty() {
        return Err(codes::INVALID_REQUEST);
    }
    let Some(entry) = broker.txns.get(tid) else {
        return Err(INVALID_PRODUCER_ID_MAPPING);
    };
    let mut meta = entry.lock().await;
    let Some(next) = end_step(
        &meta,
        request.producer_id.0,
        request.producer_epoch,
        request.committed,
        broker.clock.now_ms(),
        broker.txns.epoch(),
    )?
    else {
        return Ok(());
    };
    if let Err(e) = broker.store.save_txn(&next).await {
        warn!(transactional_id = %tid, error = %e, "cannot store the end of a transaction");
        return Err(codes::COORDINATOR_NOT_AVAILABLE);
    }
    debug!(transactional_id = %tid, state = next.state.name(), partitions = next.partitions.len(), "transaction ending");
    *meta = next;
    drop(meta);
    complete_and_wait(broker, entry).await;
    Ok(())
}

/// TxnOffsetCommit v0-3: the offsets are pending for the producer until its transaction ends.
pub(crate) async fn txn_offset_commit(
    broker: &Arc<Broker>,
    ctx: &Ctx,
    request: TxnOffsetCommitRequest,
) -> TxnOffsetCommitResponse {
    let group = request.group_id.as_str().to_string();
    let tid = request.transactional_id.as_str();
    // Transaction version 2 (v5): the group joins the transaction here (no AddOffsetsToTxn).
    let implicit = if ctx.version >= 5 && !group.is_empty() {
        add_to_txn(
            broker,
            tid,
            request.producer_id.0,
            request.producer_epoch,
            &TxnPartitions::new(),
            std::slice::from_ref(&group),
        )
        .await
    } else {
        Ok(())
    };
    let entry = broker.txns.get(tid);
    // The transactional id's lock is held until the offsets are stored, so an EndTxn cannot
    // complete the transaction in between.
    let meta = match &entry {
        Some(e) => Some(e.lock().await),
        None => None,
    };
    let mut error = match (&meta, implicit) {
        // As the offsets check maps it (a fenced producer gets INVALID_PRODUCER_EPOCH here).
        (_, Err(PRODUCER_FENCED)) => INVALID_PRODUCER_EPOCH,
        (_, Err(code)) => code,
        (None, Ok(())) => INVALID_PRODUCER_ID_MAPPING,
        (Some(meta), Ok(())) => match offsets_step(
            meta,
            request.producer_id.0,
            request.producer_epoch,
            &group,
            ctx.version,
        ) {
            Ok(()) => codes::NONE,
            Err(code) => code,
        },
    };
    if error == codes::NONE {
        error = match broker.groups.load(&broker.store).await {
            Err(code) => code,
            Ok(()) => {
                let (generation, member, instance) = if ctx.version >= 3 {
                    (
                        request.generation_id,
                        request.member_id.as_str().to_string(),
                        request
                            .group_instance_id
                            .as_ref()
                            .map(|s| s.as_str().to_string()),
                    )
                } else {
                    (-1, String::new(), None)
                };
                broker
                    .groups
                    .validate_txn_commit(&group, generation, &member, instance.as_deref())
            }
        };
    }
    let topics = request
        .topics
        .into_iter()
        .map(|t| {
            let partitions = t
                .partitions
                .into_iter()
                .map(|p| OffsetToCommit {
                    partition: p.partition_index,
                    offset: p.committed_offset,
                    leader_epoch: if ctx.version >= 2 {
                        p.committed_leader_epoch
                    } else {
                        -1
                    },
                    metadata: p.committed_metadata,
                })
                .collect();
            (t.name, partitions)
        })
        .collect();
    let (layout, to_store) = check_offsets(broker, error, topics).await;
    let stored = if to_store.is_empty() {
        Ok(())
    } else {
        broker
            .store
            .add_pending_offsets(
                &group,
                request.producer_id.0,
                &to_store,
                broker.clock.now_ms(),
            )
            .await
    };
    drop(meta);
    if let Err(e) = &stored {
        warn!(group = %group, error = %e, "cannot store transactional offsets");
    }
    let mut response = TxnOffsetCommitResponse::default();
    for (name, parts) in layout {
        let mut topic = TxnOffsetCommitResponseTopic::default();
        topic.name = name;
        topic.partitions = parts
            .into_iter()
            .map(|(index, code)| {
                let mut p = TxnOffsetCommitResponsePartition::default();
                p.partition_index = index;
                p.error_code = stored_code(code, stored.is_ok());
                p
            })
            .collect();
        response.topics.push(topic);
    }
    response
}

/// DescribeTransactions v0.
pub(crate) async fn describe_transactions(
    broker: &Arc<Broker>,
    _ctx: &Ctx,
    request: DescribeTransactionsRequest,
) -> DescribeTransactionsResponse {
    let mut response = DescribeTransactionsResponse::default();
    for tid in request.transactional_ids {
        let mut s = describe_transactions_response::TransactionState::default();
        let meta = match broker.txns.get(tid.as_str()) {
            Some(entry) => Some(entry.lock().await.clone()),
            None => None,
        };
        match meta.filter(TxnMeta::is_initialized) {
            None => {
                s.error_code = TRANSACTIONAL_ID_NOT_FOUND;
                s.transaction_state = StrBytes::from_static_str("");
                s.producer_id = ProducerId(NO_PRODUCER_ID);
                s.producer_epoch = NO_EPOCH;
                s.transaction_start_time_ms = -1;
            }
            Some(m) => {
                s.transaction_state = StrBytes::from_static_str(m.state.name());
                s.transaction_timeout_ms = m.timeout_ms;
                s.transaction_start_time_ms = if m.state == TxnState::Empty {
                    -1
                } else {
                    m.start_ms
                };
                s.producer_id = ProducerId(m.producer_id);
                s.producer_epoch = m.producer_epoch;
                let mut by_topic: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
                for ((_, partition), topic) in &m.partitions {
                    by_topic.entry(topic).or_default().push(*partition);
                }
                s.topics = by_topic
                    .into_iter()
                    .map(|(topic, partitions)| {
                        let mut t = describe_transactions_response::TopicData::default();
                        t.topic = TopicName(StrBytes::from_string(topic.to_string()));
                        t.partitions = partitions;
                        t
                    })
                    .collect();
            }
        }
        s.transactional_id = tid;
        response.transaction_states.push(s);
    }
    response
}

/// ListTransactions v0-1 (state, producer id and, v1, duration filters).
pub(crate) async fn list_transactions(
    broker: &Arc<Broker>,
    ctx: &Ctx,
    request: ListTransactionsRequest,
) -> ListTransactionsResponse {
    let mut response = ListTransactionsResponse::default();
    let mut states = Vec::new();
    for name in &request.state_filters {
        match TxnState::parse(name.as_str()) {
            Some(s) => states.push(s),
            None => response.unknown_state_filters.push(name.clone()),
        }
    }
    if !response.unknown_state_filters.is_empty() && states.is_empty() {
        return response;
    }
    let pids: Vec<i64> = request.producer_id_filters.iter().map(|p| p.0).collect();
    let duration = if ctx.version >= 1 {
        request.duration_filter
    } else {
        -1
    };
    let now = broker.clock.now_ms();
    let mut listed = Vec::new();
    for entry in broker.txns.entries() {
        let m = entry.lock().await.clone();
        if !m.is_initialized()
            || (!states.is_empty() && !states.contains(&m.state))
            || (!pids.is_empty() && !pids.contains(&m.producer_id))
            || (duration >= 0 && (m.state != TxnState::Ongoing || now - m.start_ms < duration))
        {
            continue;
        }
        let mut s = list_transactions_response::TransactionState::default();
        s.transactional_id = kafka_protocol::messages::TransactionalId(StrBytes::from_string(
            m.transactional_id.clone(),
        ));
        s.producer_id = ProducerId(m.producer_id);
        s.transaction_state = StrBytes::from_static_str(m.state.name());
        listed.push(s);
    }
    listed.sort_by(|a, b| a.transactional_id.as_str().cmp(b.transactional_id.as_str()));
    response.transaction_states = listed;
    response
}
