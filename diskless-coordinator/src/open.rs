//! Opening the batch coordinator a host's configuration names ([`open_coordinator`]): one call for
//! every host (the example broker, the Nisshi adapter), so that the URL schemes, the files in the
//! data directory and the guard rails between sharded and unsharded data directories are the same
//! everywhere.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::sharded::{
    FileShardMap, MemoryShardMap, ShardMapStore, ShardedConfig, ShardedCoordinator,
};
use crate::{BatchCoordinator, Clock, CoordinatorError};

#[cfg(feature = "postgres")]
use crate::postgres::{PostgresCoordinator, PostgresOptions};
#[cfg(feature = "sqlite")]
use crate::sqlite::{SqliteCoordinator, SqliteOptions};

/// The SQLite file of the unsharded coordinator in the data directory (no [`OpenOptions::url`]).
pub const SQLITE_FILE: &str = "coordinator.db";

/// The partition → shard map of a sharded coordinator in the data directory (every kind but
/// `memory:`, whose map is in memory).
pub const SHARD_MAP_FILE: &str = "coordinator-shards.map";

/// The SQLite file of shard `i` in the data directory (no [`OpenOptions::url`], `shards` > 1).
#[cfg(feature = "sqlite")]
fn shard_file(i: u32) -> String {
    format!("coordinator-shard-{i}.db")
}

/// Makes the coordinator of a `memory:` URL (one call per shard), given the clock of
/// [`open_coordinator`]. This crate has no in-memory coordinator of its own: the reference model
/// is `diskless_testkit::coordinator::InMemoryCoordinator`.
pub type MemoryFactory = Arc<dyn Fn(Arc<dyn Clock>) -> Arc<dyn BatchCoordinator> + Send + Sync>;

/// What [`open_coordinator`] opens: [`OpenOptions::new`] with the data directory, then a `with_*`
/// setter per field to change.
#[derive(Clone)]
#[non_exhaustive]
pub struct OpenOptions {
    /// The coordinator URL: `None` (SQLite files in [`OpenOptions::data_dir`]), `sqlite:...`,
    /// `postgres:...` / `postgresql:...` or `memory:...` (see [`open_coordinator`]). Default
    /// `None`.
    pub url: Option<String>,
    /// The data directory: the SQLite files when there is no URL, and the shard map when sharded.
    /// It must exist (it is not created).
    pub data_dir: PathBuf,
    /// Coordinator shards: 1 (one coordinator, no router) or more (a [`ShardedCoordinator`] over
    /// that many). At least 1. Default 1.
    pub shards: u32,
    /// Settings of the router when `shards` > 1. Default `ShardedConfig::default()`, whose
    /// `max_commit_age` is [`crate::DEFAULT_MAX_COMMIT_AGE`], the deadline every coordinator also
    /// enforces (with the orphan fences) inside its own commit transaction: the router's refusal is
    /// only an early one.
    pub sharded: ShardedConfig,
    /// Options of every SQLite coordinator opened. Default `SqliteOptions::default()`.
    #[cfg(feature = "sqlite")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
    pub sqlite: SqliteOptions,
    /// Options of every PostgreSQL coordinator opened, of which `url` is replaced by
    /// [`OpenOptions::url`] and, when sharded, `schema` by `<schema>_shard_<i>`. Default
    /// `PostgresOptions::default()` (schema `diskless`).
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    pub postgres: PostgresOptions,
    /// Makes the coordinators of a `memory:` URL. Default `None`: `memory:` is refused
    /// ([`OpenError::NoMemoryFactory`]).
    pub memory: Option<MemoryFactory>,
}

impl OpenOptions {
    /// Options opening the default coordinator (SQLite, unsharded) in `data_dir`, with the defaults
    /// documented on each field.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        OpenOptions {
            url: None,
            data_dir: data_dir.into(),
            shards: 1,
            sharded: ShardedConfig::default(),
            #[cfg(feature = "sqlite")]
            sqlite: SqliteOptions::default(),
            #[cfg(feature = "postgres")]
            postgres: PostgresOptions::default(),
            memory: None,
        }
    }

    /// Sets [`OpenOptions::memory`] (to `Some(factory)`): how `memory:` URLs are opened, e.g.
    /// `|clock| Arc::new(InMemoryCoordinator::new(clock))` with `diskless-testkit`.
    pub fn with_memory(
        mut self,
        factory: impl Fn(Arc<dyn Clock>) -> Arc<dyn BatchCoordinator> + Send + Sync + 'static,
    ) -> Self {
        self.memory = Some(Arc::new(factory));
        self
    }
}

crate::config::with_setters!(OpenOptions {
    with_url => url: [Option<String>],
    with_data_dir => data_dir: into [PathBuf],
    with_shards => shards: [u32],
    with_sharded => sharded: [ShardedConfig],
});

#[cfg(feature = "sqlite")]
crate::config::with_setters!(OpenOptions {
    with_sqlite => sqlite: [SqliteOptions],
});

#[cfg(feature = "postgres")]
crate::config::with_setters!(OpenOptions {
    with_postgres => postgres: [PostgresOptions],
});

impl std::fmt::Debug for OpenOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("OpenOptions");
        d.field("url", &self.url.as_deref().map(redact))
            .field("data_dir", &self.data_dir)
            .field("shards", &self.shards)
            .field("sharded", &self.sharded);
        #[cfg(feature = "sqlite")]
        d.field("sqlite", &self.sqlite);
        #[cfg(feature = "postgres")]
        d.field("postgres", &self.postgres);
        d.field("memory", &self.memory.as_ref().map(|_| "<factory>"))
            .finish()
    }
}

/// What [`open_coordinator`] opened.
#[derive(Debug)]
#[non_exhaustive]
pub struct OpenedCoordinator {
    /// What every component uses: the one coordinator, or the router over the shards.
    pub coordinator: Arc<dyn BatchCoordinator>,
    /// The router, when `shards` > 1 (the same object as `coordinator`).
    pub sharded: Option<Arc<ShardedCoordinator>>,
    /// Every SQLite coordinator opened (one per shard), in shard order.
    #[cfg(feature = "sqlite")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
    pub sqlite: Vec<Arc<SqliteCoordinator>>,
    /// Every PostgreSQL coordinator opened (one per shard), in shard order.
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    pub postgres: Vec<Arc<PostgresCoordinator>>,
    /// Whether the coordinator remembers across a restart (every kind but `memory:`). A host gates
    /// orphan collection and consolidation on it: with a coordinator that forgets everything, the
    /// objects of a previous run would be neither readable nor collectable.
    pub persistent: bool,
}

impl OpenedCoordinator {
    /// Closes every SQLite and PostgreSQL coordinator opened (at shutdown, after the last call).
    pub async fn close(&self) {
        close_all(
            #[cfg(feature = "sqlite")]
            &self.sqlite,
            #[cfg(feature = "postgres")]
            &self.postgres,
        )
        .await;
    }
}

/// Closes these coordinators, SQLite first ([`OpenedCoordinator::close`], and `open_coordinator`
/// when a later step fails).
async fn close_all(
    #[cfg(feature = "sqlite")] sqlite: &[Arc<SqliteCoordinator>],
    #[cfg(feature = "postgres")] postgres: &[Arc<PostgresCoordinator>],
) {
    #[cfg(feature = "sqlite")]
    for c in sqlite {
        c.close().await;
    }
    #[cfg(feature = "postgres")]
    for c in postgres {
        c.close().await;
    }
}

/// Why [`open_coordinator`] failed. The messages name the shard count `--shards`, the option of the
/// example hosts; a host with other option names matches the variant.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// An option breaks its documented rule.
    #[error("invalid coordinator options: {0}")]
    InvalidOptions(String),
    /// The URL's scheme is none of `sqlite:`, `postgres:`, `postgresql:`, `memory:`.
    #[error("unsupported coordinator URL {0:?}")]
    UnsupportedUrl(String),
    /// The coordinator asked for needs a feature of this crate that the build left out.
    #[error("{what} needs diskless-coordinator built with its `{feature}` feature")]
    FeatureDisabled {
        /// The coordinator asked for (its URL, password hidden).
        what: String,
        /// The missing feature.
        feature: &'static str,
    },
    /// A `memory:` URL without [`OpenOptions::memory`].
    #[error(
        "coordinator URL {url:?}: no in-memory coordinator was given (OpenOptions::with_memory; \
         the in-memory model is diskless-testkit's InMemoryCoordinator)"
    )]
    NoMemoryFactory {
        /// The URL.
        url: String,
    },
    /// Unsharded (`shards` = 1), but the data directory holds a shard map (or, for the default
    /// SQLite coordinator, shard 0's database): it was used sharded.
    #[error(
        "{} exists: this data directory was used with --shards > 1; give the same --shards",
        path.display()
    )]
    ShardedDataDirectory {
        /// The file found: the shard map, or `coordinator-shard-0.db`.
        path: PathBuf,
    },
    /// Sharded, but the data directory holds the unsharded SQLite coordinator.
    #[error(
        "{} exists: this data directory was used without --shards; its topics would be \
         invisible (and its objects orphans) with --shards {shards}",
        database.display()
    )]
    UnshardedDataDirectory {
        /// The unsharded coordinator's file found.
        database: PathBuf,
        /// The shards asked for.
        shards: u32,
    },
    /// Sharded with a `sqlite:` URL, which names one database.
    #[error(
        "--shards {shards} needs one database per shard: give no coordinator URL (SQLite files \
         in the data directory) instead of {url:?}"
    )]
    ShardedSqliteUrl {
        /// The URL.
        url: String,
        /// The shards asked for.
        shards: u32,
    },
    /// A coordinator (or a shard of one) failed to open.
    #[error("{}: {source}", target(.shard, .url))]
    Coordinator {
        /// The shard, when sharded.
        shard: Option<u32>,
        /// The URL (password hidden), `None` for the SQLite file in the data directory.
        url: Option<String>,
        /// The coordinator's error.
        #[source]
        source: CoordinatorError,
    },
    /// The shard map failed to open.
    #[error("shard map {}: {source}", path.display())]
    ShardMap {
        /// The shard map file.
        path: PathBuf,
        /// The map's error.
        #[source]
        source: CoordinatorError,
    },
    /// The router over the shards failed to open (e.g. the stored map names a shard that does not
    /// exist: fewer shards than before).
    #[error("sharded coordinator: {source}")]
    Sharded {
        /// The router's error.
        #[source]
        source: CoordinatorError,
    },
}

/// `coordinator[ shard <i>][ <url>]`, the subject of [`OpenError::Coordinator`]'s message.
fn target(shard: &Option<u32>, url: &Option<String>) -> String {
    let mut s = match shard {
        Some(i) => format!("coordinator shard {i}"),
        None => "coordinator".to_string(),
    };
    if let Some(url) = url {
        s.push(' ');
        s.push_str(url);
    }
    s
}

/// A URL with its password replaced by `***` (for messages and `Debug`).
fn redact(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_string();
    };
    let (scheme, rest) = url.split_at(scheme_end);
    let authority = &rest[..rest.find('/').unwrap_or(rest.len())];
    match authority.rfind('@') {
        Some(at) => match authority[..at].find(':') {
            Some(colon) => format!("{scheme}{}:***{}", &rest[..colon], &rest[at..]),
            None => url.to_string(),
        },
        None => url.to_string(),
    }
}

/// The coordinator kinds of [`OpenOptions::url`] this build can open.
enum Kind<'a> {
    /// `<data_dir>/coordinator.db` (sharded: `coordinator-shard-<i>.db`).
    #[cfg(feature = "sqlite")]
    DefaultSqlite,
    #[cfg(feature = "sqlite")]
    SqliteUrl(&'a str),
    #[cfg(feature = "postgres")]
    Postgres(&'a str),
    Memory(&'a MemoryFactory),
}

impl<'a> Kind<'a> {
    fn of(options: &'a OpenOptions) -> Result<Self, OpenError> {
        #[cfg(not(all(feature = "sqlite", feature = "postgres")))]
        let disabled = |what: String, feature| OpenError::FeatureDisabled { what, feature };
        Ok(match options.url.as_deref() {
            #[cfg(feature = "sqlite")]
            None => Kind::DefaultSqlite,
            #[cfg(not(feature = "sqlite"))]
            None => {
                return Err(disabled(
                    "the default coordinator (SQLite in the data directory)".into(),
                    "sqlite",
                ));
            }
            #[cfg(feature = "sqlite")]
            Some(u) if u.starts_with("sqlite:") => Kind::SqliteUrl(u),
            #[cfg(not(feature = "sqlite"))]
            Some(u) if u.starts_with("sqlite:") => {
                return Err(disabled(format!("coordinator URL {u:?}"), "sqlite"));
            }
            #[cfg(feature = "postgres")]
            Some(u) if u.starts_with("postgres:") || u.starts_with("postgresql:") => {
                Kind::Postgres(u)
            }
            #[cfg(not(feature = "postgres"))]
            Some(u) if u.starts_with("postgres:") || u.starts_with("postgresql:") => {
                return Err(disabled(
                    format!("coordinator URL {:?}", redact(u)),
                    "postgres",
                ));
            }
            Some(u) if u.starts_with("memory:") => match &options.memory {
                Some(factory) => Kind::Memory(factory),
                None => return Err(OpenError::NoMemoryFactory { url: u.to_string() }),
            },
            Some(u) => return Err(OpenError::UnsupportedUrl(redact(u))),
        })
    }
}

/// The coordinators opened so far: closed when a later step fails, handed over otherwise.
#[derive(Default)]
struct Backends {
    #[cfg(feature = "sqlite")]
    sqlite: Vec<Arc<SqliteCoordinator>>,
    #[cfg(feature = "postgres")]
    postgres: Vec<Arc<PostgresCoordinator>>,
}

impl Backends {
    async fn close(&self) {
        close_all(
            #[cfg(feature = "sqlite")]
            &self.sqlite,
            #[cfg(feature = "postgres")]
            &self.postgres,
        )
        .await;
    }
}

/// Opens one coordinator of `kind`: shard `shard` of a sharded set, or the only one (`None`).
#[cfg_attr(
    not(any(feature = "sqlite", feature = "postgres")),
    allow(unused_variables)
)]
async fn open_one(
    kind: &Kind<'_>,
    shard: Option<u32>,
    options: &OpenOptions,
    clock: &Arc<dyn Clock>,
    backends: &mut Backends,
) -> Result<Arc<dyn BatchCoordinator>, OpenError> {
    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    let failed = |url: Option<String>| move |source| OpenError::Coordinator { shard, url, source };
    Ok(match kind {
        #[cfg(feature = "sqlite")]
        Kind::DefaultSqlite => {
            let file = match shard {
                Some(i) => shard_file(i),
                None => SQLITE_FILE.to_string(),
            };
            let c = Arc::new(
                SqliteCoordinator::open(
                    options.data_dir.join(file),
                    options.sqlite.clone(),
                    clock.clone(),
                )
                .await
                .map_err(failed(None))?,
            );
            backends.sqlite.push(c.clone());
            c
        }
        #[cfg(feature = "sqlite")]
        Kind::SqliteUrl(url) => {
            let c = Arc::new(
                SqliteCoordinator::open_url(url, options.sqlite.clone(), clock.clone())
                    .await
                    .map_err(failed(Some(redact(url))))?,
            );
            backends.sqlite.push(c.clone());
            c
        }
        #[cfg(feature = "postgres")]
        Kind::Postgres(url) => {
            let mut postgres = options.postgres.clone().with_url(*url);
            if let Some(i) = shard {
                let schema = format!("{}_shard_{i}", postgres.schema);
                postgres = postgres.with_schema(schema);
            }
            let c = Arc::new(
                PostgresCoordinator::connect(postgres, clock.clone())
                    .await
                    .map_err(failed(Some(redact(url))))?,
            );
            backends.postgres.push(c.clone());
            c
        }
        Kind::Memory(factory) => factory(clock.clone()),
    })
}

/// Opens the coordinator `options` name, or with `shards` > 1 that many under a
/// [`ShardedCoordinator`]. On failure, whatever was opened is closed again.
///
/// | [`OpenOptions::url`]             | `shards` = 1                       | `shards` = N > 1                              |
/// |----------------------------------|------------------------------------|-----------------------------------------------|
/// | none                             | SQLite `<data_dir>/coordinator.db` | SQLite `<data_dir>/coordinator-shard-<i>.db`  |
/// | `sqlite:...`                     | SQLite at the URL                  | refused: one URL names one database           |
/// | `postgres:...`, `postgresql:...` | PostgreSQL, schema `<schema>`      | PostgreSQL, schemas `<schema>_shard_<i>`      |
/// | `memory:...`                     | [`OpenOptions::memory`]'s factory  | N of the factory's                            |
///
/// `<schema>` is that of `OpenOptions::postgres` (feature `postgres`; default `diskless`, so the
/// shards' are `diskless_shard_<i>`).
/// When sharded, the partition → shard map is the file `<data_dir>/coordinator-shards.map`
/// ([`SHARD_MAP_FILE`], a [`FileShardMap`]: a restart routes identically), in memory for
/// `memory:`. SQLite needs the crate's `sqlite` feature (on by default), PostgreSQL its `postgres`
/// feature; a URL whose feature is off is refused ([`OpenError::FeatureDisabled`]).
///
/// **Guard rails.** A data directory keeps the layout it was first used with: one holding a shard
/// map (or, without a URL, `coordinator-shard-0.db`: the map is written with the first topic) is
/// refused unsharded ([`OpenError::ShardedDataDirectory`]: its topics are in the shards; `memory:`
/// reads nothing there and is not refused), one holding `coordinator.db` is refused
/// sharded ([`OpenError::UnshardedDataDirectory`]: its topics would be invisible and its objects
/// orphans), and fewer shards than the stored map names are refused ([`OpenError::Sharded`]).
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use diskless_coordinator::{OpenOptions, SystemClock, open_coordinator};
/// use std::sync::Arc;
///
/// let dir = tempfile::tempdir().unwrap();
/// // No URL: SQLite files in the data directory, here three shards under a router.
/// let options = OpenOptions::new(dir.path()).with_shards(3);
/// let opened = open_coordinator(&options, Arc::new(SystemClock)).await.unwrap();
/// assert_eq!(opened.sharded.as_ref().map(|r| r.shard_count()), Some(3));
/// assert!(opened.persistent);
/// assert!(dir.path().join("coordinator-shard-2.db").exists());
/// opened.close().await;
///
/// // The data directory is sharded now: opening it unsharded is refused.
/// let err = open_coordinator(&OpenOptions::new(dir.path()), Arc::new(SystemClock)).await;
/// assert!(err.is_err());
/// # });
/// ```
pub async fn open_coordinator(
    options: &OpenOptions,
    clock: Arc<dyn Clock>,
) -> Result<OpenedCoordinator, OpenError> {
    let kind = Kind::of(options)?;
    let mut backends = Backends::default();
    match open_kind(&kind, options, &clock, &mut backends).await {
        Ok((coordinator, sharded)) => Ok(OpenedCoordinator {
            coordinator,
            sharded,
            #[cfg(feature = "sqlite")]
            sqlite: backends.sqlite,
            #[cfg(feature = "postgres")]
            postgres: backends.postgres,
            persistent: !matches!(kind, Kind::Memory(_)),
        }),
        Err(e) => {
            backends.close().await;
            Err(e)
        }
    }
}

/// [`open_coordinator`] once `kind` is known: the coordinator, and the router when sharded.
async fn open_kind(
    kind: &Kind<'_>,
    options: &OpenOptions,
    clock: &Arc<dyn Clock>,
    backends: &mut Backends,
) -> Result<(Arc<dyn BatchCoordinator>, Option<Arc<ShardedCoordinator>>), OpenError> {
    if options.shards == 0 {
        return Err(OpenError::InvalidOptions(
            "shards: must be at least 1".into(),
        ));
    }
    let persistent = !matches!(kind, Kind::Memory(_));
    let data_dir: &Path = &options.data_dir;
    let map_path = data_dir.join(SHARD_MAP_FILE);
    if options.shards == 1 {
        if persistent && map_path.exists() {
            return Err(OpenError::ShardedDataDirectory { path: map_path });
        }
        // The map is written with the first topic: before that, shard 0's file tells.
        #[cfg(feature = "sqlite")]
        if matches!(kind, Kind::DefaultSqlite) && data_dir.join(shard_file(0)).exists() {
            return Err(OpenError::ShardedDataDirectory {
                path: data_dir.join(shard_file(0)),
            });
        }
        let coordinator = open_one(kind, None, options, clock, backends).await?;
        return Ok((coordinator, None));
    }
    #[cfg(feature = "sqlite")]
    match kind {
        Kind::SqliteUrl(url) => {
            return Err(OpenError::ShardedSqliteUrl {
                url: redact(url),
                shards: options.shards,
            });
        }
        Kind::DefaultSqlite if data_dir.join(SQLITE_FILE).exists() => {
            return Err(OpenError::UnshardedDataDirectory {
                database: data_dir.join(SQLITE_FILE),
                shards: options.shards,
            });
        }
        _ => {}
    }
    let mut shards = Vec::with_capacity(options.shards as usize);
    for i in 0..options.shards {
        shards.push(open_one(kind, Some(i), options, clock, backends).await?);
    }
    let map: Arc<dyn ShardMapStore> = if persistent {
        Arc::new(
            FileShardMap::open(&map_path)
                .await
                .map_err(|source| OpenError::ShardMap {
                    path: map_path.clone(),
                    source,
                })?,
        )
    } else {
        Arc::new(MemoryShardMap::new())
    };
    let router = Arc::new(
        ShardedCoordinator::open(shards, map, clock.clone(), options.sharded.clone())
            .await
            .map_err(|source| OpenError::Sharded { source })?,
    );
    Ok((router.clone(), Some(router)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_hidden() {
        assert_eq!(
            redact("postgres://user:secret@host:5432/db"),
            "postgres://user:***@host:5432/db"
        );
        assert_eq!(redact("postgres://user@host/db"), "postgres://user@host/db");
        assert_eq!(redact("sqlite:///tmp/a.db"), "sqlite:///tmp/a.db");
        assert_eq!(redact("memory:"), "memory:");
        let options = OpenOptions::new("/d").with_url(Some("postgres://u:pw@h/db".into()));
        let debug = format!("{options:?}");
        assert!(!debug.contains("pw"), "{debug}");
    }

    #[test]
    fn coordinator_errors_name_the_shard_and_the_url() {
        let e = OpenError::Coordinator {
            shard: Some(2),
            url: Some("postgres://h/db".into()),
            source: CoordinatorError::Unavailable("down".into()),
        };
        assert!(
            e.to_string()
                .starts_with("coordinator shard 2 postgres://h/db: "),
            "{e}"
        );
        let e = OpenError::Coordinator {
            shard: None,
            url: None,
            source: CoordinatorError::Unavailable("down".into()),
        };
        assert!(e.to_string().starts_with("coordinator: "), "{e}");
    }
}
