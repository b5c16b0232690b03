//! Layers about [`Capability`]: one that serves only some capabilities of the coordinator it
//! wraps ([`OnlyCapabilities`], to run the conformance suite as a smaller coordinator would), and
//! one that records which capabilities the calls through it used ([`CapabilityRecorder`], to
//! check what a conformance case needs).

use std::collections::BTreeSet;

use diskless_coordinator::{
    BatchCoordinator, Capabilities, Capability, CoordinatorError, CoordinatorLayer, CoordinatorOp,
    Layered,
};
use futures::future::BoxFuture;
use parking_lot::Mutex;

/// Serves only `capabilities` of the wrapped coordinator (and what it serves itself): the other
/// operations answer [`CoordinatorError::Unsupported`] without reaching it, and
/// `capabilities()` says so.
///
/// ```
/// use diskless_coordinator::{BatchCoordinator, Capabilities, Capability, CoordinatorError, Layered, ManualClock};
/// use diskless_testkit::coordinator::{InMemoryCoordinator, OnlyCapabilities};
/// use std::sync::Arc;
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let model = Arc::new(InMemoryCoordinator::new(ManualClock::new(0)));
/// let log_only = Layered::new(model, OnlyCapabilities(Capabilities::LOG));
/// assert_eq!(log_only.capabilities(), Capabilities::LOG);
/// assert!(matches!(
///     log_only.enforce_retention(10).await,
///     Err(CoordinatorError::Unsupported(_))
/// ));
/// # });
/// ```
#[derive(Clone, Copy, Debug)]
pub struct OnlyCapabilities(pub Capabilities);

impl CoordinatorLayer for OnlyCapabilities {
    fn around<'a, T: Send + 'a>(
        &'a self,
        op: CoordinatorOp,
        call: BoxFuture<'a, Result<T, CoordinatorError>>,
    ) -> BoxFuture<'a, Result<T, CoordinatorError>> {
        if self.0.contains(op.capability()) {
            call
        } else {
            Box::pin(async move { Err(CoordinatorError::Unsupported(op)) })
        }
    }

    fn capabilities(&self, inner: &dyn BatchCoordinator) -> Capabilities {
        inner.capabilities().intersection(self.0)
    }
}

/// Records the capability of every call through it.
#[derive(Debug, Default)]
pub struct CapabilityRecorder {
    used: Mutex<BTreeSet<Capability>>,
}

impl CapabilityRecorder {
    /// The capabilities used so far.
    pub fn used(&self) -> Capabilities {
        self.used
            .lock()
            .iter()
            .fold(Capabilities::LOG, |all, c| all.with(*c))
    }
}

impl CoordinatorLayer for CapabilityRecorder {
    fn around<'a, T: Send + 'a>(
        &'a self,
        op: CoordinatorOp,
        call: BoxFuture<'a, Result<T, CoordinatorError>>,
    ) -> BoxFuture<'a, Result<T, CoordinatorError>> {
        self.used.lock().insert(op.capability());
        call
    }
}

/// A coordinator recording its calls' capabilities ([`CapabilityRecorder`]).
pub type Recorded = Layered<CapabilityRecorder>;
