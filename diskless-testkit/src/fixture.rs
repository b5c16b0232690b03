//! What the factories of the conformance macros return, and the runtime their tests run on.
//!
//! A factory of [`coordinator_conformance!`](crate::coordinator_conformance) or
//! [`storage_conformance!`](crate::storage_conformance) returns a [`Fixture`]: the implementation
//! under test in an `Arc`, optionally paired with a value that must live as long as the case (a
//! temporary directory, an in-process server, a database schema dropped on `Drop`), or `None` to
//! skip the case (say, when a database is not reachable; print why).

use diskless_coordinator::BatchCoordinator;
use diskless_storage::ObjectStorage;
use std::sync::Arc;

/// Values a case keeps alive until it ends (they are dropped after the implementation).
pub type Guard = Box<dyn Send>;

/// What a conformance factory returns for one case: an implementation of `T` (a trait object
/// such as `dyn BatchCoordinator`), with the [`Guard`] that keeps what it needs alive, or `None`
/// to skip the case.
///
/// Implemented for `Arc<C>` (any implementation `C` of the trait), `Arc<T>` itself, a pair
/// `(fixture, guard)` with a guard of any `Send` type, and `Option<fixture>`.
pub trait Fixture<T: ?Sized> {
    /// The implementation under test and its guard; `None` skips the case.
    fn into_parts(self) -> Option<(Arc<T>, Guard)>;
}

impl<T: ?Sized + 'static> Fixture<T> for Arc<T> {
    fn into_parts(self) -> Option<(Arc<T>, Guard)> {
        Some((self, Box::new(())))
    }
}

impl<T: ?Sized, F: Fixture<T>, G: Send + 'static> Fixture<T> for (F, G) {
    fn into_parts(self) -> Option<(Arc<T>, Guard)> {
        let (implementation, inner) = self.0.into_parts()?;
        Some((implementation, Box::new((inner, self.1))))
    }
}

impl<T: ?Sized, F: Fixture<T>> Fixture<T> for Option<F> {
    fn into_parts(self) -> Option<(Arc<T>, Guard)> {
        self?.into_parts()
    }
}

impl<C: BatchCoordinator + 'static> Fixture<dyn BatchCoordinator> for Arc<C> {
    fn into_parts(self) -> Option<(Arc<dyn BatchCoordinator>, Guard)> {
        Some((self, Box::new(())))
    }
}

impl<C: ObjectStorage + 'static> Fixture<dyn ObjectStorage> for Arc<C> {
    fn into_parts(self) -> Option<(Arc<dyn ObjectStorage>, Guard)> {
        Some((self, Box::new(())))
    }
}

/// Asserts that a suite's case list names every case of its source once: every
/// `pub async fn <name><signature>` line of `source` whose signature is one of `signatures`.
#[cfg(test)]
pub(crate) fn assert_lists_every_case(cases: &[&str], source: &str, signatures: &[&str]) {
    use std::collections::BTreeSet;
    let defined: BTreeSet<&str> = source
        .lines()
        .filter_map(|line| line.strip_prefix("pub async fn "))
        .filter_map(|rest| signatures.iter().find_map(|s| rest.strip_suffix(s)))
        .collect();
    let listed: BTreeSet<&str> = cases.iter().copied().collect();
    assert_eq!(listed.len(), cases.len(), "a case is listed twice");
    assert!(
        !defined.is_empty(),
        "no case found: are the signatures right?"
    );
    assert_eq!(listed, defined, "the case list and the cases differ");
}

/// The module of a conformance macro: `mod $module { use super::*; <tests> }` with one test per
/// case not named in `skip`, each made by `$crate::$test! { { $($args)* } case [tag] }`. Called
/// back by a suite's case list; `$d` is a `$`, for the inner macro's own variables.
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_module {
    (
        {
            [$d:tt] $module:ident [$($skip:ident)*] [$($suite:ident)::+]
            $test:ident { $($args:tt)* }
        }
        $($case:ident $([$tag:ident])?),* $(,)?
    ) => {
        mod $module {
            #[allow(unused_imports)]
            use super::*;

            // A skipped name must be a case of the suite.
            #[allow(unused_imports)]
            use $($suite)::+ as __suite;
            $(
                #[allow(unused_imports)]
                use __suite::$skip as _;
            )*

            macro_rules! __case_unless_skipped {
                $( ($skip $d($d tag:tt)*) => {}; )*
                ($d case:ident $d($d tag:tt)*) => {
                    $crate::$test! { { $($args)* } $d case $d($d tag)* }
                };
            }

            $( __case_unless_skipped!($case $([$tag])?); )*
        }
    };
}

/// Support of the macros' expansions; not a stable API.
#[doc(hidden)]
pub mod __private {
    use std::future::Future;

    /// Runs `future` to completion on a new multi-threaded tokio runtime with `workers` worker
    /// threads and every driver enabled, as `#[tokio::test(flavor = "multi_thread")]` would.
    ///
    /// # Panics
    ///
    /// When the runtime cannot be built, and when `future` panics.
    pub fn block_on<F: Future>(workers: usize, future: F) -> F::Output {
        #[allow(clippy::expect_used)] // only tests call it: a runtime that cannot start fails them
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers)
            .enable_all()
            .build()
            .expect("a tokio runtime for a conformance case");
        runtime.block_on(future)
    }
}
