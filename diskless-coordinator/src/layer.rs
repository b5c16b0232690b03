//! Wrapping a [`BatchCoordinator`] without forwarding every method by hand.
//!
//! A wrapper (fault injection, metrics, a gate in a test, a commit-deadline precheck, a mutant
//! with a known bug) implements [`CoordinatorLayer`] — only the methods it changes — and
//! [`Layered`] makes it a [`BatchCoordinator`]:
//!
//! - [`CoordinatorLayer::around`] runs around *every* call, with the call's [`CoordinatorOp`]:
//!   time it, refuse it, delay it, or run it and then report its outcome as unknown;
//! - one method per trait method, each given the inner coordinator, changes one operation's
//!   arguments or answer; the defaults pass the call through.
//!
//! The trait stays one trait (its optional capabilities default to
//! [`CoordinatorError::Unsupported`]): a host wires one `Arc<dyn BatchCoordinator>` everywhere.
//! [`CoordinatorOp`], the layer's defaults, [`Layered`] and the blanket impls for `Arc<T>` and
//! `Box<T>` are generated from the one table of operations (`ops.rs`), so a new operation is
//! written there, not here nor in any wrapper.
//!
//! ```
//! use diskless_coordinator::{BatchCoordinator, CoordinatorError, CoordinatorLayer, CoordinatorOp, Layered};
//! use futures::future::BoxFuture;
//! use std::sync::{Arc, atomic::{AtomicU64, Ordering}};
//!
//! /// Counts commits and refuses every `delete_topic`.
//! #[derive(Debug, Default)]
//! struct Guard { commits: AtomicU64 }
//!
//! impl CoordinatorLayer for Guard {
//!     fn around<'a, T: Send + 'a>(
//!         &'a self,
//!         op: CoordinatorOp,
//!         call: BoxFuture<'a, Result<T, CoordinatorError>>,
//!     ) -> BoxFuture<'a, Result<T, CoordinatorError>> {
//!         match op {
//!             CoordinatorOp::DeleteTopic => Box::pin(async {
//!                 Err(CoordinatorError::Unavailable("topic deletion is disabled".into()))
//!             }),
//!             CoordinatorOp::CommitFile => {
//!                 self.commits.fetch_add(1, Ordering::Relaxed);
//!                 call
//!             }
//!             _ => call,
//!         }
//!     }
//! }
//!
//! # async fn demo(inner: Arc<dyn BatchCoordinator>) {
//! let guarded: Arc<dyn BatchCoordinator> = Arc::new(Layered::new(inner, Guard::default()));
//! # }
//! ```

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use futures::future::BoxFuture;

use crate::{BatchCoordinator, CoordinatorError};

/// A group of [`BatchCoordinator`] operations that a coordinator serves or not
/// ([`BatchCoordinator::capabilities`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Capability {
    /// Topics, `commit_file`, `find_batches`, `list_offsets`, `producer_state`: required of every
    /// coordinator.
    Log,
    /// DeleteRecords, CreatePartitions, topic configs, producer-id blocks, DescribeProducers.
    Admin,
    /// Retention, object deletion, orphan fences, producer expiry, object queries.
    Lifecycle,
    /// Transaction markers (KIP-98, the partition leader's part).
    Transactions,
    /// Consolidated tiered segments (KIP-1163's tiered storage).
    Tiering,
}

impl Capability {
    /// Every capability.
    pub const ALL: [Capability; 5] = [
        Capability::Log,
        Capability::Admin,
        Capability::Lifecycle,
        Capability::Transactions,
        Capability::Tiering,
    ];

    /// Its name (`"lifecycle"`), as in the table of operations and in logs.
    pub fn name(self) -> &'static str {
        match self {
            Capability::Log => "log",
            Capability::Admin => "admin",
            Capability::Lifecycle => "lifecycle",
            Capability::Transactions => "transactions",
            Capability::Tiering => "tiering",
        }
    }

    const fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

/// The capability of a name in the table of operations; any other token does not compile (a typo
/// in the table must not quietly make an operation part of the log).
macro_rules! capability_named {
    (log) => {
        Capability::Log
    };
    (admin) => {
        Capability::Admin
    };
    (lifecycle) => {
        Capability::Lifecycle
    };
    (transactions) => {
        Capability::Transactions
    };
    (tiering) => {
        Capability::Tiering
    };
}

/// Whether an operation's kind in the table is `write`; only `read` and `write` compile.
macro_rules! kind_is_write {
    (read) => {
        false
    };
    (write) => {
        true
    };
}

impl std::fmt::Display for Capability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A set of [`Capability`]s; [`Capability::Log`] is always in it.
///
/// ```
/// use diskless_coordinator::{Capabilities, Capability};
/// let c = Capabilities::LOG.with(Capability::Lifecycle);
/// assert!(c.contains(Capability::Log) && c.contains(Capability::Lifecycle));
/// assert!(!c.contains(Capability::Tiering));
/// assert!(Capabilities::ALL.contains(Capability::Tiering));
/// assert_eq!(c.without(Capability::Log), c, "the log stays");
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Capabilities(u8);

impl Capabilities {
    /// The log alone: the smallest correct coordinator.
    pub const LOG: Capabilities = Capabilities(Capability::Log.bit());
    /// Every capability.
    pub const ALL: Capabilities = Capabilities(0b1_1111);

    /// This set and `capability`.
    #[must_use]
    pub const fn with(self, capability: Capability) -> Capabilities {
        Capabilities(self.0 | capability.bit())
    }

    /// This set without `capability` (never without [`Capability::Log`]).
    #[must_use]
    pub fn without(self, capability: Capability) -> Capabilities {
        if capability == Capability::Log {
            return self;
        }
        Capabilities(self.0 & !capability.bit())
    }

    /// The capabilities in both sets.
    #[must_use]
    pub const fn intersection(self, other: Capabilities) -> Capabilities {
        Capabilities((self.0 & other.0) | Capability::Log.bit())
    }

    /// Whether `capability` is in the set.
    pub fn contains(self, capability: Capability) -> bool {
        self.0 & capability.bit() != 0
    }

    /// The capabilities in the set, in [`Capability::ALL`]'s order.
    pub fn iter(self) -> impl Iterator<Item = Capability> {
        Capability::ALL
            .into_iter()
            .filter(move |c| self.contains(*c))
    }
}

impl std::fmt::Debug for Capabilities {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

/// Defines [`CoordinatorOp`], [`CoordinatorLayer`] and [`Layered`]'s [`BatchCoordinator`] impl
/// from the table of operations (`ops.rs`).
macro_rules! define_layering {
    (
        {}
        required $rcap:ident {
            $(
                $(#[$rmeta:meta])*
                [$ROp:ident $rkind:ident $rbackend:ident]
                fn $rname:ident($($rarg:ident: $rty:ty),*) -> $rret:ty;
            )*
        }
        $(
            optional $cap:ident {
                $(
                    $(#[$meta:meta])*
                    [$Op:ident $kind:ident $backend:ident]
                    fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty;
                )*
            }
        )*
    ) => {
        /// One operation of [`BatchCoordinator`], as a [`CoordinatorLayer`] sees it.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[non_exhaustive]
        pub enum CoordinatorOp {
            $(
                #[doc = concat!("[`BatchCoordinator::", stringify!($rname), "`].")]
                $ROp,
            )*
            $($(
                #[doc = concat!("[`BatchCoordinator::", stringify!($name), "`].")]
                $Op,
            )*)*
        }

        impl CoordinatorOp {
            /// Every operation, in the order of the table (capability by capability).
            pub const ALL: &'static [CoordinatorOp] = &[
                $(CoordinatorOp::$ROp,)*
                $($(CoordinatorOp::$Op,)*)*
            ];

            /// The method's name (`"commit_file"`), as used in metric labels and logs.
            pub fn name(self) -> &'static str {
                match self {
                    $(CoordinatorOp::$ROp => stringify!($rname),)*
                    $($(CoordinatorOp::$Op => stringify!($name),)*)*
                }
            }

            /// Whether the operation changes the coordinator's state (a retry of it after an
            /// unknown outcome may find it applied).
            pub fn is_write(self) -> bool {
                match self {
                    $(CoordinatorOp::$ROp => kind_is_write!($rkind),)*
                    $($(CoordinatorOp::$Op => kind_is_write!($kind),)*)*
                }
            }

            /// The capability the operation belongs to.
            pub fn capability(self) -> Capability {
                match self {
                    $(CoordinatorOp::$ROp => capability_named!($rcap),)*
                    $($(CoordinatorOp::$Op => capability_named!($cap),)*)*
                }
            }
        }

        /// What a wrapper of a [`BatchCoordinator`] changes; [`Layered`] applies it. Every method
        /// has a default that passes the call through, so a layer implements only what it changes.
        ///
        /// For each call, [`Layered`] runs `around(op, typed)`, where `typed` is the future of the
        /// layer's method of the same name (called with the inner coordinator, not yet polled). So
        /// `around` sees every call and may run it, skip it, or wrap it; its own code before it
        /// awaits `call` runs before the typed method's body.
        #[async_trait]
        pub trait CoordinatorLayer: Send + Sync + Debug {
            /// Runs around every call: return `call` to pass through, or a future that does
            /// something before or after awaiting it (time it, delay it, fail it without running
            /// it, run it and answer [`CoordinatorError::OutcomeUnknown`]).
            fn around<'a, T: Send + 'a>(
                &'a self,
                op: CoordinatorOp,
                call: BoxFuture<'a, Result<T, CoordinatorError>>,
            ) -> BoxFuture<'a, Result<T, CoordinatorError>> {
                let _ = op;
                call
            }

            /// [`BatchCoordinator::capabilities`] of the layered coordinator: `inner`'s.
            fn capabilities(&self, inner: &dyn BatchCoordinator) -> Capabilities {
                inner.capabilities()
            }

            $(
                #[doc = concat!("[`BatchCoordinator::", stringify!($rname), "`] on `inner`.")]
                async fn $rname(&self, inner: &dyn BatchCoordinator, $($rarg: $rty),*) -> $rret {
                    inner.$rname($($rarg),*).await
                }
            )*
            $($(
                #[doc = concat!("[`BatchCoordinator::", stringify!($name), "`] on `inner`.")]
                async fn $name(&self, inner: &dyn BatchCoordinator, $($arg: $ty),*) -> $ret {
                    inner.$name($($arg),*).await
                }
            )*)*
        }

        #[async_trait]
        impl<L: CoordinatorLayer> BatchCoordinator for Layered<L> {
            fn capabilities(&self) -> Capabilities {
                self.layer.capabilities(&*self.inner)
            }

            $(
                async fn $rname(&self, $($rarg: $rty),*) -> $rret {
                    let call = self.layer.$rname(&*self.inner, $($rarg),*);
                    self.layer.around(CoordinatorOp::$ROp, call).await
                }
            )*
            $($(
                async fn $name(&self, $($arg: $ty),*) -> $ret {
                    let call = self.layer.$name(&*self.inner, $($arg),*);
                    self.layer.around(CoordinatorOp::$Op, call).await
                }
            )*)*
        }
    };
}

crate::ops::coordinator_ops!(define_layering {});

/// `impl BatchCoordinator for $pointer<T>` (`Arc`, `Box`) from the table of operations: a
/// pointer to a coordinator is a coordinator.
macro_rules! define_pointer_impl {
    (
        { $pointer:ident }
        required $rcap:ident {
            $(
                $(#[$rmeta:meta])*
                [$ROp:ident $rkind:ident $rbackend:ident]
                fn $rname:ident($($rarg:ident: $rty:ty),*) -> $rret:ty;
            )*
        }
        $(
            optional $cap:ident {
                $(
                    $(#[$meta:meta])*
                    [$Op:ident $kind:ident $backend:ident]
                    fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty;
                )*
            }
        )*
    ) => {
        #[doc = concat!("`", stringify!($pointer), "<T>` of a coordinator is a coordinator.")]
        #[async_trait]
        impl<T: BatchCoordinator + ?Sized> BatchCoordinator for $pointer<T> {
            fn capabilities(&self) -> Capabilities {
                (**self).capabilities()
            }
            $(
                async fn $rname(&self, $($rarg: $rty),*) -> $rret {
                    (**self).$rname($($rarg),*).await
                }
            )*
            $($(
                async fn $name(&self, $($arg: $ty),*) -> $ret {
                    (**self).$name($($arg),*).await
                }
            )*)*
        }
    };
}

crate::ops::coordinator_ops!(define_pointer_impl { Arc });
crate::ops::coordinator_ops!(define_pointer_impl { Box });

impl std::fmt::Display for CoordinatorOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A [`BatchCoordinator`] made of an inner coordinator and a [`CoordinatorLayer`].
#[derive(Debug)]
pub struct Layered<L> {
    inner: Arc<dyn BatchCoordinator>,
    layer: L,
}

impl<L: CoordinatorLayer> Layered<L> {
    /// `inner` with `layer` around it.
    pub fn new(inner: Arc<dyn BatchCoordinator>, layer: L) -> Self {
        Layered { inner, layer }
    }

    /// The wrapped coordinator.
    pub fn inner(&self) -> &Arc<dyn BatchCoordinator> {
        &self.inner
    }

    /// The layer.
    pub fn layer(&self) -> &L {
        &self.layer
    }
}

/// A `Layered` derefs to its layer, so a layer's own controls (a fault switch, a counter) are
/// called on the wrapper directly: `faulty.fail_next_commits(1)`.
impl<L> std::ops::Deref for Layered<L> {
    type Target = L;

    fn deref(&self) -> &L {
        &self.layer
    }
}

/// The metrics layer: records [`diskless_common::metrics::COORDINATOR_SECONDS`] for every call,
/// labelled with the operation and its outcome. Wrap the coordinator once, where the host wires
/// it, and share the result; see [`MeteredCoordinator`].
#[derive(Clone, Copy, Debug, Default)]
pub struct CoordinatorMetrics;

impl CoordinatorLayer for CoordinatorMetrics {
    fn around<'a, T: Send + 'a>(
        &'a self,
        op: CoordinatorOp,
        call: BoxFuture<'a, Result<T, CoordinatorError>>,
    ) -> BoxFuture<'a, Result<T, CoordinatorError>> {
        use diskless_common::metrics as m;
        Box::pin(async move {
            let start = Instant::now();
            let result = call.await;
            let outcome = if result.is_ok() { m::OK } else { m::ERROR };
            metrics::histogram!(m::COORDINATOR_SECONDS, m::OP => op.name(), m::OUTCOME => outcome)
                .record(start.elapsed().as_secs_f64());
            result
        })
    }
}

/// A coordinator that records [`diskless_common::metrics::COORDINATOR_SECONDS`] per call.
///
/// ```
/// # fn wire(coordinator: std::sync::Arc<dyn diskless_coordinator::BatchCoordinator>) {
/// use diskless_coordinator::MeteredCoordinator;
/// let coordinator = std::sync::Arc::new(MeteredCoordinator::new(coordinator, Default::default()));
/// # }
/// ```
pub type MeteredCoordinator = Layered<CoordinatorMetrics>;
