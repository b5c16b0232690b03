//! The adapter's transaction state on disk: the open transactions' diskless partitions and
//! numbers, and the markers still to write, so that a restarted node finishes what it started.
//!
//! Written whole (a small JSON file: one entry per open transactional id) to a temporary file,
//! synced and renamed over the old one after every change, before the change is acted on: an
//! AddPartitionsToTxn is answered only once its partitions are on disk, and the markers of an
//! ended transaction are on disk before they are written to the coordinator (a marker written
//! twice is answered as a duplicate: it carries its transaction's number).

use std::collections::{BTreeSet, HashMap};
use std::io::Write as _;
use std::path::{Path, PathBuf};

use diskless_coordinator::{TopicIdPartition, TxnMarker};
use serde_json::{Value, json};
use uuid::Uuid;

/// Kafka's `transaction.max.timeout.ms` default: the timeout of a transaction whose producer's own
/// is not known.
pub(crate) const MAX_TIMEOUT_MS: i64 = crate::storage::TRANSACTION_MAX_TIMEOUT_MS as i64;

/// The transaction of one transactional id as far as its diskless partitions go.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct OpenTxn {
    pub(crate) producer_id: i64,
    pub(crate) producer_epoch: i16,
    /// The transaction's number for the batch coordinator (`ProducePartition::with_txn_seq`,
    /// `TxnMarker::txn_seq`): the coordinator opens a transaction in a partition only for a
    /// number above every transaction a marker already ended there (KIP-890's verification).
    pub(crate) txn_seq: i64,
    pub(crate) partitions: BTreeSet<TopicIdPartition>,
    /// When its first diskless partition was added (ms since the epoch, the node's clock).
    pub(crate) started_ms: i64,
    /// The producer's `transaction.timeout.ms` (InitProducerId's); the transaction is aborted once
    /// it has been open longer, as Kafka's transaction coordinator does.
    pub(crate) timeout_ms: i64,
}

/// A transaction whose EndTxn was asked and saved, and not yet known to be decided by Nisshi's
/// engine: the adapter drives it to that end (the engine's `txn_end`, then these markers) before
/// anything else touches its transactional id, after a restart included. Saved before the engine
/// is asked, so no crash can leave the engine's decision unknown to the adapter.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct EndingTxn {
    pub(crate) producer_id: i64,
    pub(crate) producer_epoch: i16,
    pub(crate) commit: bool,
    /// The markers of the transaction's diskless partitions not yet written; written once the
    /// engine decided.
    pub(crate) markers: Vec<TxnMarker>,
    /// Whether Nisshi's engine is known to have decided (its `txn_end` answered `NONE`).
    pub(crate) decided: bool,
}

/// What is kept: the open transactions by transactional id, the transactions being ended and the
/// markers still to write.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct TxnState {
    pub(crate) txns: HashMap<String, OpenTxn>,
    pub(crate) ending: HashMap<String, EndingTxn>,
    pub(crate) pending: Vec<TxnMarker>,
    /// Transactional ids whose transaction was aborted for its timeout, with the producer id and
    /// epoch it had: that producer is fenced (Kafka bumps the epoch) until its next InitProducerId.
    pub(crate) timed_out: HashMap<String, (i64, i16)>,
}

fn partition_json(p: &TopicIdPartition) -> Value {
    json!([p.topic_id.to_string(), p.partition])
}

fn partition_from(v: &Value) -> Option<TopicIdPartition> {
    let id = Uuid::parse_str(v.get(0)?.as_str()?).ok()?;
    let partition = i32::try_from(v.get(1)?.as_i64()?).ok()?;
    Some(TopicIdPartition::new(id, partition))
}

fn marker_json(m: &TxnMarker) -> Value {
    json!({
        "partition": partition_json(&m.partition),
        "producer_id": m.producer_id,
        "producer_epoch": m.producer_epoch,
        "coordinator_epoch": m.coordinator_epoch,
        "commit": m.commit,
        "txn_seq": m.txn_seq,
    })
}

fn marker_from(m: &Value) -> Option<TxnMarker> {
    Some(TxnMarker {
        partition: partition_from(m.get("partition")?)?,
        producer_id: m.get("producer_id")?.as_i64()?,
        producer_epoch: i16::try_from(m.get("producer_epoch")?.as_i64()?).ok()?,
        coordinator_epoch: i32::try_from(m.get("coordinator_epoch")?.as_i64()?).ok()?,
        commit: m.get("commit")?.as_bool()?,
        txn_seq: match m.get("txn_seq")? {
            Value::Null => None,
            n => Some(n.as_i64()?),
        },
    })
}

impl TxnState {
    fn to_json(&self) -> Value {
        let txns: serde_json::Map<String, Value> = self
            .txns
            .iter()
            .map(|(tid, t)| {
                (
                    tid.clone(),
                    json!({
                        "producer_id": t.producer_id,
                        "producer_epoch": t.producer_epoch,
                        "txn_seq": t.txn_seq,
                        "partitions": t.partitions.iter().map(partition_json).collect::<Vec<_>>(),
                        "started_ms": t.started_ms,
                        "timeout_ms": t.timeout_ms,
                    }),
                )
            })
            .collect();
        let pending: Vec<Value> = self.pending.iter().map(marker_json).collect();
        let ending: serde_json::Map<String, Value> = self
            .ending
            .iter()
            .map(|(tid, e)| {
                (
                    tid.clone(),
                    json!({
                        "producer_id": e.producer_id,
                        "producer_epoch": e.producer_epoch,
                        "commit": e.commit,
                        "decided": e.decided,
                        "markers": e.markers.iter().map(marker_json).collect::<Vec<_>>(),
                    }),
                )
            })
            .collect();
        let timed_out: serde_json::Map<String, Value> = self
            .timed_out
            .iter()
            .map(|(tid, (id, epoch))| (tid.clone(), json!([id, epoch])))
            .collect();
        json!({
            "version": 1,
            "txns": txns,
            "ending": ending,
            "pending": pending,
            "timed_out": timed_out,
        })
    }

    fn from_json(v: &Value) -> Option<TxnState> {
        if v.get("version")?.as_i64()? != 1 {
            return None;
        }
        let mut state = TxnState::default();
        for (tid, t) in v.get("txns")?.as_object()? {
            let partitions = t
                .get("partitions")?
                .as_array()?
                .iter()
                .map(partition_from)
                .collect::<Option<BTreeSet<_>>>()?;
            state.txns.insert(
                tid.clone(),
                OpenTxn {
                    producer_id: t.get("producer_id")?.as_i64()?,
                    producer_epoch: i16::try_from(t.get("producer_epoch")?.as_i64()?).ok()?,
                    txn_seq: t.get("txn_seq")?.as_i64()?,
                    partitions,
                    // Absent in files of earlier versions: open since ever, Kafka's longest timeout.
                    started_ms: t.get("started_ms").map_or(Some(0), Value::as_i64)?,
                    timeout_ms: t
                        .get("timeout_ms")
                        .map_or(Some(MAX_TIMEOUT_MS), Value::as_i64)?,
                },
            );
        }
        for m in v.get("pending")?.as_array()? {
            state.pending.push(marker_from(m)?);
        }
        if let Some(timed_out) = v.get("timed_out") {
            for (tid, t) in timed_out.as_object()? {
                let id = t.get(0)?.as_i64()?;
                let epoch = i16::try_from(t.get(1)?.as_i64()?).ok()?;
                state.timed_out.insert(tid.clone(), (id, epoch));
            }
        }
        // Absent in files written before EndTxn was saved ahead of the engine's decision.
        if let Some(ending) = v.get("ending") {
            for (tid, e) in ending.as_object()? {
                state.ending.insert(
                    tid.clone(),
                    EndingTxn {
                        producer_id: e.get("producer_id")?.as_i64()?,
                        producer_epoch: i16::try_from(e.get("producer_epoch")?.as_i64()?).ok()?,
                        commit: e.get("commit")?.as_bool()?,
                        decided: e.get("decided")?.as_bool()?,
                        markers: e
                            .get("markers")?
                            .as_array()?
                            .iter()
                            .map(marker_from)
                            .collect::<Option<Vec<_>>>()?,
                    },
                );
            }
        }
        Some(state)
    }

    /// The state saved at `path`: empty when there is no file yet; an error for a file that is
    /// not one this crate wrote.
    pub(crate) fn load(path: &Path) -> Result<TxnState, String> {
        let bytes = match std::fs::read(path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(TxnState::default()),
            Err(e) => return Err(format!("{}: {e}", path.display())),
        };
        let value: Value = serde_json::from_slice(&bytes)
            .map_err(|e| format!("{}: not JSON: {e}", path.display()))?;
        TxnState::from_json(&value)
            .ok_or_else(|| format!("{}: not a transaction state file", path.display()))
    }

    /// Replaces the file at `path` with this state (temporary file, sync, rename, sync of the
    /// directory).
    pub(crate) fn save(&self, path: &Path) -> std::io::Result<()> {
        let tmp: PathBuf = path.with_extension("tmp");
        let bytes = serde_json::to_vec(&self.to_json()).map_err(std::io::Error::other)?;
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(&bytes)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)?;
        if let Some(dir) = path.parent() {
            std::fs::File::open(dir)?.sync_all()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_saved_state_loads_as_it_was_and_garbage_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("txns.json");
        assert_eq!(TxnState::load(&path).unwrap(), TxnState::default());
        let p = TopicIdPartition::new(Uuid::from_u128(7), 3);
        let mut state = TxnState::default();
        state.txns.insert(
            "tx".into(),
            OpenTxn {
                producer_id: 5,
                producer_epoch: 2,
                txn_seq: 1_796_000_000_000_123,
                partitions: [p].into(),
                started_ms: 1_796_000_000_000,
                timeout_ms: 60_000,
            },
        );
        state.timed_out.insert("tx-old".into(), (3, 7));
        let marker = TxnMarker {
            partition: p,
            producer_id: 4,
            producer_epoch: 1,
            coordinator_epoch: 0,
            commit: true,
            txn_seq: Some(9),
        };
        state.pending.push(marker);
        state.ending.insert(
            "tx-ending".into(),
            EndingTxn {
                producer_id: 4,
                producer_epoch: 1,
                commit: false,
                decided: true,
                markers: vec![TxnMarker {
                    commit: false,
                    txn_seq: None,
                    ..marker
                }],
            },
        );
        state.save(&path).unwrap();
        assert_eq!(TxnState::load(&path).unwrap(), state);
        // A file from before `ending` was saved still loads.
        std::fs::write(&path, br#"{"version": 1, "txns": {}, "pending": []}"#).unwrap();
        assert_eq!(TxnState::load(&path).unwrap(), TxnState::default());
        std::fs::write(&path, b"{\"version\": 2}").unwrap();
        assert!(TxnState::load(&path).is_err());
        std::fs::write(&path, b"\xff").unwrap();
        assert!(TxnState::load(&path).is_err());
    }
}
