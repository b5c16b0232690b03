//! The one library metric the simulation reads: the batch bytes fetchers served from tiered
//! segments (`FETCH_TIERED_BYTES`), counted by a recorder installed for the run's thread (the
//! runtime is current-thread, so every fetch of the run records into it).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use diskless_common::metrics::FETCH_TIERED_BYTES;
use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};

/// Counts `FETCH_TIERED_BYTES`; every other metric goes nowhere.
#[derive(Debug, Default)]
pub(crate) struct TieredBytes {
    bytes: Arc<AtomicU64>,
}

impl TieredBytes {
    /// The bytes counted so far.
    pub(crate) fn handle(&self) -> Arc<AtomicU64> {
        self.bytes.clone()
    }
}

/// Reads a [`TieredBytes`] count.
pub(crate) fn read(bytes: &AtomicU64) -> u64 {
    bytes.load(Ordering::SeqCst)
}

impl Recorder for TieredBytes {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        if key.name() == FETCH_TIERED_BYTES {
            Counter::from_arc(self.bytes.clone())
        } else {
            Counter::noop()
        }
    }

    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }

    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}
