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
}

/// What is kept: the open transactions by transactional id and the markers still to write.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct TxnState {
    pub(crate) txns: HashMap<String, OpenTxn>,
    pub(crate) pending: Vec<TxnMarker>,
}

fn partition_json(p: &TopicIdPartition) -> Value {
    json!([p.topic_id.to_string(), p.partition])
}

fn partition_from(v: &Value) -> Option<TopicIdPartition> {
    let id = Uuid::parse_str(v.get(0)?.as_str()?).ok()?;
    let partition = i32::try_from(v.get(1)?.as_i64()?).ok()?;
    Some(TopicIdPartition::new(id, partition))
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
                    }),
                )
            })
            .collect();
        let pending: Vec<Value> = self
            .pending
            .iter()
            .map(|m| {
                json!({
                    "partition": partition_json(&m.partition),
                    "producer_id": m.producer_id,
                    "producer_epoch": m.producer_epoch,
                    "coordinator_epoch": m.coordinator_epoch,
                    "commit": m.commit,
                    "txn_seq": m.txn_seq,
                })
            })
            .collect();
        json!({ "version": 1, "txns": txns, "pending": pending })
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
                },
            );
        }
        for m in v.get("pending")?.as_array()? {
            state.pending.push(TxnMarker {
                partition: partition_from(m.get("partition")?)?,
                producer_id: m.get("producer_id")?.as_i64()?,
                producer_epoch: i16::try_from(m.get("producer_epoch")?.as_i64()?).ok()?,
                coordinator_epoch: i32::try_from(m.get("coordinator_epoch")?.as_i64()?).ok()?,
                commit: m.get("commit")?.as_bool()?,
                txn_seq: match m.get("txn_seq")? {
                    Value::Null => None,
                    n => Some(n.as_i64()?),
                },
            });
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
            },
        );
        state.pending.push(TxnMarker {
            partition: p,
            producer_id: 4,
            producer_epoch: 1,
            coordinator_epoch: 0,
            commit: true,
            txn_seq: Some(9),
        });
        state.save(&path).unwrap();
        assert_eq!(TxnState::load(&path).unwrap(), state);
        std::fs::write(&path, b"{\"version\": 2}").unwrap();
        assert!(TxnState::load(&path).is_err());
        std::fs::write(&path, b"\xff").unwrap();
        assert!(TxnState::load(&path).is_err());
    }
}
