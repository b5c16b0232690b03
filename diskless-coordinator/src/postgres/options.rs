//! The settings of a [`super::PostgresCoordinator`], and the connection and pool options made
//! from them.

use crate::CoordinatorError;
use crate::config::{at_least_one, invalid, positive, with_setters};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use std::str::FromStr;
use std::time::Duration;

/// The schema [`PostgresOptions::new`] uses.
pub const DEFAULT_SCHEMA: &str = "diskless";

/// Options of [`super::PostgresCoordinator::connect`]: [`PostgresOptions::new`] with the primary's
/// URL (or `default()` then [`PostgresOptions::with_url`]), then a `with_*` setter per field to
/// change. Checked by `connect` and [`super::migrate`] ([`PostgresOptions::validate`]): an invalid
/// value is refused, never adjusted.
#[derive(Clone)]
#[non_exhaustive]
pub struct PostgresOptions {
    /// The primary's URL, `postgres://user[:password]@host[:port]/database[?params]`. Every write
    /// goes here. Required (the default is empty, which is refused).
    pub url: String,
    /// An optional URL for reads (a streaming read replica): `find_batches`, `list_offsets` and
    /// `list_topics` go there. When `None`, reads use a separate pool on the primary so that they
    /// never wait for a write connection.
    pub read_url: Option<String>,
    /// The schema holding every object of the coordinator (created by the migrations). A lowercase
    /// identifier: `[a-z_][a-z0-9_]*`, at most 63 characters, not `pg_*`. Default
    /// [`DEFAULT_SCHEMA`].
    pub schema: String,
    /// Connections of the write pool (commits, deletions, topic changes), at least 1. Default 10.
    pub max_connections: u32,
    /// Connections the write pool keeps open when idle, at most `max_connections`. Default 0.
    pub min_connections: u32,
    /// Connections of the read pool, at least 1. Default 10.
    pub read_max_connections: u32,
    /// How long a call waits for a pooled connection before failing with
    /// [`CoordinatorError::Unavailable`]. Default 10 s.
    pub acquire_timeout: Duration,
    /// `statement_timeout` of every connection: a statement running longer is cancelled (and the
    /// call fails with [`CoordinatorError::Unavailable`]). Also used as
    /// `idle_in_transaction_session_timeout`, so a stalled caller cannot hold partition locks.
    /// Zero disables both. Default 30 s.
    pub statement_timeout: Duration,
    /// `lock_timeout` while migrating: a migration that cannot get a lock within it fails instead of
    /// blocking live traffic behind its lock request. Default 5 s.
    pub migration_lock_timeout: Duration,
    /// Apply pending migrations in [`super::PostgresCoordinator::connect`]. When false, `connect`
    /// checks that the schema is at this build's version and fails otherwise; the host applies
    /// migrations explicitly with [`super::migrate`] or [`super::PostgresCoordinator::migrate`].
    /// Default true.
    pub migrate_on_start: bool,
    /// `application_name` of the write connections (the read pool's get a `-read` suffix), as shown
    /// in `pg_stat_activity`. Default `diskless-coordinator`.
    pub application_name: String,
    /// How many times a transaction is retried after a serialization failure (40001) or a deadlock
    /// (40P01), which PostgreSQL reports before anything was applied. Default 5.
    pub max_conflict_retries: u32,
    /// A pooled connection idle for longer than this is pinged before use, so that a connection the
    /// server dropped (restart, failover, idle timeout) is replaced instead of failing a commit with
    /// [`CoordinatorError::OutcomeUnknown`]. Busy connections are not pinged: a commit stays one
    /// round trip. Zero pings before every use. Default 1 s.
    pub ping_idle_after: Duration,
    /// With [`PostgresOptions::read_url`]: the most a read replica may lag for reads to use it.
    /// Each read measures the lag in its own snapshot (the replica's clock minus the newest
    /// heartbeat of the primary it holds; the coordinator writes that heartbeat every quarter of
    /// this bound, kept between 50 ms and 1 s); a read finding more reads the primary instead.
    /// Keep it well below the object cleaner's deletion grace period (`ObjectCleaner`, 60 s by
    /// default) minus the clock skew between the servers, so that a fetch never gets the
    /// coordinates of an object already deleted. Default 30 s.
    pub max_replica_lag: Duration,
    /// The commit deadline: `commit_file` of a key whose UUID v7 time is older than the server's
    /// clock (`clock_timestamp()`) minus this is refused with
    /// [`CoordinatorError::DeadlineExceeded`], checked inside the commit function once every lock
    /// of the commit is held (see [`crate::check_commit_deadline`]). Positive. Default
    /// [`crate::DEFAULT_MAX_COMMIT_AGE`].
    ///
    /// Fences (of `fence_orphans` and of `confirm_deleted`) must outlive the deadline of EVERY
    /// coordinator sharing the schema, whatever its own setting, so they are not kept for a
    /// multiple of this value but of the schema's stored maximum:
    /// [`super::PostgresCoordinator::connect`] raises the schema's
    /// `coordinator_settings.max_commit_age_ms` to this value (it never lowers it; migration 6
    /// starts it at 10 minutes, the previous fixed value) before the coordinator's first commit,
    /// and fences are kept until their key's time is older than [`crate::FENCE_RETENTION_FACTOR`]
    /// times the stored value (and at least that many times this one). Lowering `max_commit_age`
    /// therefore never shortens fence retention; to shorten it, lower the stored value by hand once
    /// no coordinator runs with a larger one. Brokers of the previous version (the old
    /// `commit_file` signature) use the stored value as their deadline.
    pub max_commit_age: Duration,
}

impl std::fmt::Debug for PostgresOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresOptions")
            .field("url", &redact(&self.url))
            .field("read_url", &self.read_url.as_deref().map(redact))
            .field("schema", &self.schema)
            .field("max_connections", &self.max_connections)
            .field("min_connections", &self.min_connections)
            .field("read_max_connections", &self.read_max_connections)
            .field("acquire_timeout", &self.acquire_timeout)
            .field("statement_timeout", &self.statement_timeout)
            .field("migration_lock_timeout", &self.migration_lock_timeout)
            .field("migrate_on_start", &self.migrate_on_start)
            .field("application_name", &self.application_name)
            .field("max_conflict_retries", &self.max_conflict_retries)
            .field("ping_idle_after", &self.ping_idle_after)
            .field("max_replica_lag", &self.max_replica_lag)
            .field("max_commit_age", &self.max_commit_age)
            .finish()
    }
}

/// A URL with its password replaced by `***`.
pub(super) fn redact(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_string();
    };
    let rest = &url[scheme_end..];
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => match rest[..at].find(':') {
            Some(colon) => format!(
                "{}{}:***{}",
                &url[..scheme_end],
                &rest[..colon],
                &rest[at..]
            ),
            None => url.to_string(),
        },
        None => url.to_string(),
    }
}

impl Default for PostgresOptions {
    /// The documented defaults, without a URL: set one with [`PostgresOptions::with_url`].
    fn default() -> Self {
        PostgresOptions {
            url: String::new(),
            read_url: None,
            schema: DEFAULT_SCHEMA.to_string(),
            max_connections: 10,
            min_connections: 0,
            read_max_connections: 10,
            acquire_timeout: Duration::from_secs(10),
            statement_timeout: Duration::from_secs(30),
            migration_lock_timeout: Duration::from_secs(5),
            migrate_on_start: true,
            application_name: "diskless-coordinator".to_string(),
            max_conflict_retries: 5,
            ping_idle_after: Duration::from_secs(1),
            max_replica_lag: Duration::from_secs(30),
            max_commit_age: crate::DEFAULT_MAX_COMMIT_AGE,
        }
    }
}

with_setters!(PostgresOptions {
    with_url => url: into [String],
    with_schema => schema: into [String],
    with_max_connections => max_connections: [u32],
    with_min_connections => min_connections: [u32],
    with_read_max_connections => read_max_connections: [u32],
    with_acquire_timeout => acquire_timeout: [Duration],
    with_statement_timeout => statement_timeout: [Duration],
    with_migration_lock_timeout => migration_lock_timeout: [Duration],
    with_migrate_on_start => migrate_on_start: [bool],
    with_application_name => application_name: into [String],
    with_max_conflict_retries => max_conflict_retries: [u32],
    with_ping_idle_after => ping_idle_after: [Duration],
    with_max_replica_lag => max_replica_lag: [Duration],
    with_max_commit_age => max_commit_age: [Duration],
});

impl PostgresOptions {
    /// Options for the database at `url`, with the defaults documented on each field.
    pub fn new(url: impl Into<String>) -> Self {
        PostgresOptions::default().with_url(url)
    }

    /// Sets [`PostgresOptions::read_url`] (to `Some(url)`).
    pub fn with_read_url(mut self, url: impl Into<String>) -> Self {
        self.read_url = Some(url.into());
        self
    }

    /// Checks every field against its documented rule: [`CoordinatorError::InvalidRequest`] naming
    /// the first field that breaks it. (A URL that does not parse is refused when connecting.)
    pub fn validate(&self) -> Result<(), CoordinatorError> {
        if self.url.is_empty() {
            return Err(invalid("url", "required (PostgresOptions::new(url))"));
        }
        let s = self.schema.as_bytes();
        let schema_ok = s.len() <= 63
            && s.first()
                .is_some_and(|c| c.is_ascii_lowercase() || *c == b'_')
            && s.iter()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'_')
            && !self.schema.starts_with("pg_");
        if !schema_ok {
            return Err(invalid(
                "schema",
                format!(
                    "{:?}: use [a-z_][a-z0-9_]*, at most 63 characters, not pg_*",
                    self.schema
                ),
            ));
        }
        at_least_one("max_connections", self.max_connections)?;
        at_least_one("read_max_connections", self.read_max_connections)?;
        if self.min_connections > self.max_connections {
            return Err(invalid(
                "min_connections",
                format!("above max_connections ({})", self.max_connections),
            ));
        }
        positive("max_commit_age", self.max_commit_age)
    }

    /// Pool options shared by both pools: timeouts and the idle-connection health check.
    pub(super) fn pool_options(&self, max_connections: u32, min_connections: u32) -> PgPoolOptions {
        let ping_after = self.ping_idle_after;
        PgPoolOptions::new()
            .max_connections(max_connections)
            .min_connections(min_connections)
            .acquire_timeout(self.acquire_timeout)
            .test_before_acquire(false)
            .before_acquire(move |conn, meta| {
                Box::pin(async move {
                    if meta.idle_for >= ping_after {
                        sqlx::Connection::ping(conn).await?;
                    }
                    Ok(true)
                })
            })
    }

    /// Connection options for `url`: search_path = the schema, statement_timeout, application_name.
    pub(super) fn connect_options(
        &self,
        url: &str,
        suffix: &str,
    ) -> Result<PgConnectOptions, CoordinatorError> {
        let base = PgConnectOptions::from_str(url).map_err(|e| {
            CoordinatorError::InvalidRequest(format!("bad PostgreSQL URL {}: {e}", redact(url)))
        })?;
        let statement_timeout = self.statement_timeout.as_millis().to_string();
        Ok(base
            .options([
                ("search_path", self.schema.clone()),
                ("statement_timeout", statement_timeout.clone()),
                // A transaction left idle (a stalled process) must not hold partition locks for
                // long: the server ends the session, and the transaction never commits.
                ("idle_in_transaction_session_timeout", statement_timeout),
            ])
            .application_name(&format!("{}{suffix}", self.application_name)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(options: PostgresOptions, field: &str) {
        match options.validate() {
            Err(CoordinatorError::InvalidRequest(m)) => assert!(m.contains(field), "{m}"),
            other => panic!("{field}: {other:?}"),
        }
    }

    #[test]
    fn invalid_values_are_refused_not_adjusted() {
        let ok = PostgresOptions::new("postgres://u@h/db");
        assert!(ok.validate().is_ok());
        refused(PostgresOptions::default(), "url");
        refused(ok.clone().with_schema("Bad-Name"), "schema");
        refused(ok.clone().with_schema("pg_catalog"), "schema");
        refused(ok.clone().with_schema("x".repeat(64)), "schema");
        refused(ok.clone().with_max_connections(0), "max_connections");
        refused(
            ok.clone().with_read_max_connections(0),
            "read_max_connections",
        );
        refused(
            ok.clone().with_max_connections(2).with_min_connections(3),
            "min_connections",
        );
        refused(
            ok.clone().with_max_commit_age(Duration::ZERO),
            "max_commit_age",
        );
        assert_eq!(
            ok.with_max_connections(0).max_connections,
            0,
            "set as given"
        );
    }

    #[test]
    fn debug_hides_passwords() {
        let options =
            PostgresOptions::new("postgres://u:secret@h/db").with_read_url("postgres://r:pw@h2/db");
        let shown = format!("{options:?}");
        assert!(
            !shown.contains("secret") && !shown.contains("pw@"),
            "{shown}"
        );
        assert!(shown.contains("postgres://u:***@h/db"), "{shown}");
    }
}
