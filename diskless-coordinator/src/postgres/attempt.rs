//! What a database error means for a call ([`sql_error`]), the attempts of a write
//! ([`Attempt`]) and their retry after a conflict ([`PostgresCoordinator::retrying`]), and the
//! other guards every call runs through ([`PostgresCoordinator::check_open`],
//! [`PostgresCoordinator::fresh_pool`]). Every module that talks to the database uses this one;
//! it uses none of them.

use super::PostgresCoordinator;
use crate::CoordinatorError;
use sqlx::postgres::PgPool;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::time::Duration;

impl PostgresCoordinator {
    /// [`CoordinatorError::Closed`] once closed.
    pub(super) fn check_open(&self) -> Result<(), CoordinatorError> {
        if self.closed.load(Ordering::SeqCst) {
            Err(CoordinatorError::Closed)
        } else {
            Ok(())
        }
    }

    /// The pool for reads that must see the primary: the read pool unless it points elsewhere.
    pub(super) fn fresh_pool(&self) -> &PgPool {
        if self.options.read_url.is_some() {
            &self.write
        } else {
            &self.read
        }
    }

    /// Runs a write: refused once closed; the coordinator clock is read once, then `attempt(now)`
    /// runs until it succeeds, fails for good, or exhausts
    /// [`PostgresOptions::max_conflict_retries`](crate::postgres::PostgresOptions::max_conflict_retries)
    /// after conflicts (serialization failures and deadlocks: nothing was applied), backing off a
    /// little longer after each.
    pub(super) async fn retrying<T, F, Fut>(&self, attempt: F) -> Result<T, CoordinatorError>
    where
        F: Fn(i64) -> Fut,
        Fut: Future<Output = Result<T, Attempt>>,
    {
        self.check_open()?;
        let now = self.clock.now_ms();
        let mut retries = 0u32;
        loop {
            match attempt(now).await {
                Ok(v) => return Ok(v),
                Err(Attempt::Sql(e, _))
                    if is_conflict(&e) && retries < self.options.max_conflict_retries =>
                {
                    retries += 1;
                    tracing::debug!(error = %e, attempt = retries, "retrying after a conflict");
                    self.counters
                        .conflict_retries
                        .fetch_add(1, Ordering::Relaxed);
                    let ms = 2u64.saturating_pow(retries.min(8));
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                }
                Err(Attempt::Sql(e, sent)) => return Err(sql_error(e, sent)),
                Err(Attempt::Done(e)) => return Err(e),
            }
        }
    }
}

/// A read on a connection that broke under it (the server restarted or failed over, a proxy or
/// the network cut it: the pool only pings connections idle for `ping_idle_after`) is asked once
/// more, on another connection, instead of failing its caller (`backend::sql_call`). Found by
/// the fault campaign (chaos/, `pg-cut`): ListOffsets answered `KAFKA_STORAGE_ERROR` after a cut.
impl crate::backend::RetryRead for PostgresCoordinator {
    /// One more than the read pool holds: past every connection a restart broke.
    fn read_retries(&self) -> u32 {
        self.options.read_max_connections.saturating_add(1)
    }

    fn retry_read(&self, e: &CoordinatorError) -> bool {
        let CoordinatorError::Unavailable(source) = e else {
            return false;
        };
        match source.downcast_ref::<sqlx::Error>() {
            Some(
                sqlx::Error::Io(_)
                | sqlx::Error::Tls(_)
                | sqlx::Error::Protocol(_)
                | sqlx::Error::WorkerCrashed,
            ) => true,
            Some(sqlx::Error::Database(d)) => d.code().is_some_and(|c| {
                c.starts_with("08") || matches!(c.as_ref(), "57P01" | "57P02" | "57P03")
            }),
            _ => false,
        }
    }
}

/// Why one attempt of a write failed.
pub(super) enum Attempt {
    /// A database or connection error; `sent` when a statement that commits had been sent.
    Sql(sqlx::Error, bool),
    /// A decided outcome (unknown topic, duplicate object, corrupt row...).
    Done(CoordinatorError),
}

impl From<CoordinatorError> for Attempt {
    fn from(e: CoordinatorError) -> Self {
        Attempt::Done(e)
    }
}

impl Attempt {
    /// A failed statement that does not commit (nothing was applied).
    pub(super) fn before(e: sqlx::Error) -> Self {
        Attempt::Sql(e, false)
    }

    /// A failed statement that commits (autocommit, or `COMMIT`): the outcome may be unknown.
    pub(super) fn sent(e: sqlx::Error) -> Self {
        Attempt::Sql(e, true)
    }
}

/// Serialization failure or deadlock: PostgreSQL rolled the transaction back.
fn is_conflict(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(d) if matches!(d.code().as_deref(), Some("40001" | "40P01")))
}

/// Maps a sqlx error to the coordinator's. `sent`: a statement that commits (autocommit statement
/// or COMMIT) had been sent, so a lost connection leaves the outcome unknown.
pub(crate) fn sql_error(e: sqlx::Error, sent: bool) -> CoordinatorError {
    let lost = |e: sqlx::Error| {
        if sent {
            CoordinatorError::OutcomeUnknown(Box::new(e))
        } else {
            CoordinatorError::Unavailable(Box::new(e))
        }
    };
    match &e {
        sqlx::Error::Database(d) => {
            let code = d.code().map(|c| c.into_owned()).unwrap_or_default();
            match code.as_str() {
                // Connection exceptions, admin/crash shutdown: the session is gone.
                c if c.starts_with("08") => lost(e),
                "57P01" | "57P02" | "57P03" => lost(e),
                // Rolled back for sure: conflicts, cancellation (statement_timeout), lock timeout,
                // insufficient resources, read-only (a replica or a demoted primary).
                "40001" | "40P01" | "57014" | "55P03" | "25006" => {
                    CoordinatorError::Unavailable(Box::new(e))
                }
                c if c.starts_with("53") => CoordinatorError::Unavailable(Box::new(e)),
                _ => CoordinatorError::Storage(Box::new(e)),
            }
        }
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::WorkerCrashed => lost(e),
        sqlx::Error::PoolTimedOut => CoordinatorError::Unavailable(Box::new(e)),
        sqlx::Error::PoolClosed => CoordinatorError::Closed,
        _ => CoordinatorError::Storage(Box::new(e)),
    }
}
