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
                    self.$rbackend($($rarg),*).await
                }
            )*
            $($(
                async fn $name(&self, $($arg: $ty2),*) -> $ret {
                    self.$backend($($arg),*).await
                }
            )*)*
        }
    };
}
pub(crate) use sql_dispatch;
