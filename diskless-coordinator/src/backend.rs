//! What makes a SQL backend a [`crate::BatchCoordinator`]: each operation is served by the
//! backend's inherent `write_x` (a write: one transaction, or attempts of one) or `read_x` (a
//! query) named in the table of operations (`ops.rs`), in the backend's file for that part
//! (`topics.rs`, `commit.rs`, `reads.rs`, `lifecycle.rs`, `tiering.rs`). Both backends serve
//! every capability.

/// `impl BatchCoordinator for $ty` (with the given docs) by the backend's `write_*`/`read_*`
/// methods, generated from the table of operations.
macro_rules! sql_batch_coordinator {
    ($(#[$attr:meta])* $ty:ty) => {
        crate::ops::coordinator_ops!(crate::backend::sql_dispatch { $(#[$attr])* $ty });
    };
}
pub(crate) use sql_batch_coordinator;

/// The callback of [`sql_batch_coordinator`]: one method per operation, calling the backend
/// method the table names.
macro_rules! sql_dispatch {
    (
        { $(#[$attr:meta])* $ty:ty }
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
                    fn $name:ident($($arg:ident: $ty2:ty),*) -> $ret:ty;
                )*
            }
        )*
    ) => {
        $(#[$attr])*
        #[async_trait::async_trait]
        impl $crate::BatchCoordinator for $ty {
            fn capabilities(&self) -> $crate::Capabilities {
                $crate::Capabilities::ALL
            }
            $(
                async fn $rname(&self, $($rarg: $rty),*) -> $rret {
                    $crate::backend::sql_call!($rkind self, self.$rbackend($($rarg),*))
                }
            )*
            $($(
                async fn $name(&self, $($arg: $ty2),*) -> $ret {
                    $crate::backend::sql_call!($kind self, self.$backend($($arg),*))
                }
            )*)*
        }
    };
}
pub(crate) use sql_dispatch;

/// One operation's call: a write once (its attempts are the backend's business: `retrying`); a
/// read again, up to `read_retries` times, while the backend says it failed only because its
/// connection broke under it (`retry_read`: a read changes nothing, so asking again on another
/// connection is safe; each broken connection leaves the pool, so a few retries get past every
/// pooled connection a server restart broke).
macro_rules! sql_call {
    (write $this:tt, $call:expr) => {
        $call.await
    };
    (read $this:tt, $call:expr) => {{
        let mut left = $crate::backend::RetryRead::read_retries($this);
        loop {
            match $call.await {
                Err(e) if left > 0 && $crate::backend::RetryRead::retry_read($this, &e) => {
                    left -= 1;
                    tracing::debug!(error = %e, "a read's connection broke; reading again");
                }
                other => break other,
            }
        }
    }};
}
pub(crate) use sql_call;

/// Whether a SQL backend asks a failed read once more (see [`sql_call`]).
pub(crate) trait RetryRead {
    /// Whether `e`, a read's failure, says only that its connection broke.
    fn retry_read(&self, e: &crate::CoordinatorError) -> bool;
    /// How many times a read is asked again at most.
    fn read_retries(&self) -> u32;
}
