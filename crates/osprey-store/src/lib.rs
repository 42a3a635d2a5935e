//! Osprey's persistent state, behind one [`Store`] handle.
//!
//! The embedded default is SQLite at `$OSPREY_HOME/osprey.db` (WAL journal, `synchronous = FULL`,
//! so an acknowledged write survives a crash; the request log alone commits without waiting for the
//! disk); migrations run on open. Today the store holds API keys ([`keys`]), the Batch API's files
//! and batches ([`batches`]), the safety audit log ([`audit`]), conversations ([`conversations`]),
//! users' layered memory ([`memory`]), the prompt registry ([`prompts`]), per-tenant feature flags
//! ([`flags`]; [`tenant_flags`] keeps those in force in memory), the request log
//! ([`request_log`], written in batches off the serving threads by [`log_writer`]) and agent
//! runs with their steps and tool-call audit ([`runs`]) and offline evaluation runs ([`eval`]);
//! [`users`] forgets a user in one call.
//! Postgres (`postgres://...`) is the scaled backend behind the same interface: one set of queries
//! through sqlx's `Any` driver, a migration directory per backend, and [`testing`] runs every store
//! test against both. [`SharedRedis`] is the server's one connection to `--redis`, which the
//! rate limits and the response cache share.
//!
//! ```no_run
//! # async fn demo() -> Result<(), osprey_store::StoreError> {
//! let store = osprey_store::Store::open("sqlite:///tmp/osprey.db").await?;
//! let created = store.create_key(osprey_store::NewKey::for_tenant("acme")).await?;
//! println!("{}", created.secret); // shown once; only its hash is stored
//! let found = store.key_by_secret(&created.secret).await?;
//! assert_eq!(found.unwrap().tenant, "acme");
//! # Ok(()) }
//! ```
#![deny(missing_docs)]

pub mod audit;
pub mod batches;
pub mod conversations;
pub mod eval;
pub mod flags;
pub mod keys;
pub mod log_writer;
pub mod memory;
pub mod prompts;
pub mod request_log;
pub mod runs;
pub mod shared_redis;
pub mod tenant_flags;
pub mod testing;
pub mod users;

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sqlx::Executor;
use sqlx::any::AnyPoolOptions;

pub use audit::AuditEntry;
pub use batches::{BatchRecord, FileRecord};
pub use conversations::{ConversationRecord, ItemPage, ItemRecord, NewItem, Owner};
pub use eval::EvalRunRecord;
pub use flags::FlagRecord;
pub use keys::{CreatedKey, KeyRecord, NewKey};
pub use memory::{FactRecord, SummaryRecord, WorkingRecord};
pub use prompts::{PromptSummary, PromptVersion, Split};
pub use request_log::{RequestLogEntry, RequestLogQuery};
pub use runs::{RunQuery, RunRecord, StepRecord, ToolAuditRecord};
pub use shared_redis::SharedRedis;
pub use users::UserDeleted;

/// A failure of the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store URL is not one this build understands.
    #[error("unsupported store URL `{0}` (use sqlite://PATH or postgres://...)")]
    UnsupportedUrl(String),
    /// The database could not be reached (or did not answer in time): worth retrying later.
    #[error("the store is unavailable: {0}")]
    Unavailable(sqlx::Error),
    /// The database failed.
    #[error("store: {0}")]
    Database(sqlx::Error),
    /// A migration failed.
    #[error("store migration: {0}")]
    Migration(#[from] sqlx::migrate::MigrateError),
    /// The named record does not exist.
    #[error("{0} not found")]
    NotFound(String),
}

/// A store failure as the API reports it: a record not found is a 404 (`not_found`); a
/// store that cannot be reached is a 503 to retry (`store_unavailable`); anything else is a
/// 500.
impl From<StoreError> for osprey_core::Error {
    fn from(e: StoreError) -> Self {
        use osprey_core::ErrorKind;
        match e {
            StoreError::NotFound(what) => {
                Self::new(ErrorKind::NotFound, format!("No {what} exists.")).with_code("not_found")
            }
            e if e.is_unavailable() => Self::new(ErrorKind::Unavailable, e.to_string())
                .with_code("store_unavailable")
                .with_retry_after(1),
            e => Self::new(ErrorKind::Internal, e.to_string()),
        }
    }
}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        match e {
            sqlx::Error::Io(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::Tls(_)
            | sqlx::Error::WorkerCrashed => Self::Unavailable(e),
            sqlx::Error::Database(ref d) if is_transient(d.as_ref()) => Self::Unavailable(e),
            e => Self::Database(e),
        }
    }
}

/// Whether a database error means "not now" rather than "never": the server went away
/// mid-query (Postgres classes 57, operator intervention such as a shutdown, and 08,
/// connection) or ran out of room (class 53: disk full, out of memory); SQLite found its disk
/// full, hit an I/O error, or waited too long for a lock (primary codes 13, 10, 5 and 6).
fn is_transient(e: &dyn sqlx::error::DatabaseError) -> bool {
    let Some(code) = e.code() else {
        return false;
    };
    if e.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() {
        // Extended codes keep the primary code in their low byte.
        return code
            .parse::<u32>()
            .is_ok_and(|c| matches!(c & 0xff, 5 | 6 | 10 | 13));
    }
    ["57", "08", "53"]
        .iter()
        .any(|class| code.starts_with(class))
}

impl StoreError {
    /// Whether the store was unreachable, rather than the request wrong.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, Self::Unavailable(_))
    }
}

/// Result alias of this crate.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// Which database a store is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// Embedded, one file (the default).
    Sqlite,
    /// A server, shared by replicas.
    Postgres,
}

/// How long a request waits for a database connection before the store is called unavailable.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(3);

/// A handle to the store; cheap to clone, shared by every request.
#[derive(Clone, Debug)]
pub struct Store {
    pool: sqlx::AnyPool,
    /// The request log's own connections, whose commits do not wait for the disk: the log
    /// takes a row per request, and a synced commit each would cost more than serving the
    /// request. A crash of the machine (not of the process) may lose its last rows.
    log_pool: sqlx::AnyPool,
    backend: Backend,
}

impl Store {
    /// Opens the store at `url` and migrates it: `sqlite://PATH` (created if needed) or
    /// `postgres://USER@HOST/DB`.
    pub async fn open(url: &str) -> Result<Self> {
        sqlx::any::install_default_drivers();
        let backend = match url.split_once("://").map(|(scheme, _)| scheme) {
            Some("sqlite") => Backend::Sqlite,
            Some("postgres" | "postgresql") => Backend::Postgres,
            _ => return Err(StoreError::UnsupportedUrl(url.to_owned())),
        };
        let pool = connect(url, backend, Durability::Synced, 4, 16).await?;
        let log_pool = connect(url, backend, Durability::Relaxed, 1, 2).await?;
        let migrator = match backend {
            Backend::Sqlite => sqlx::migrate!("migrations/sqlite"),
            Backend::Postgres => sqlx::migrate!("migrations/postgres"),
        };
        // Replicas sharing a SQLite file may start together and race to apply a migration
        // (SQLite takes no migration lock; Postgres does): the loser's transaction fails, and
        // a second look finds the migration applied.
        let mut attempt = 0;
        while let Err(e) = migrator.run(&pool).await {
            attempt += 1;
            if attempt == 3 {
                return Err(e.into());
            }
            tokio::time::sleep(Duration::from_millis(100 * attempt)).await;
        }
        Ok(Self {
            pool,
            log_pool,
            backend,
        })
    }

    /// Closes every connection, waiting for those in use to come back (SQLite checkpoints its
    /// log on the last close).
    pub async fn close(&self) {
        self.log_pool.close().await;
        self.pool.close().await;
    }

    /// Which database this is.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The default store of an Osprey home directory: `HOME/osprey.db`.
    pub fn default_url(home: &Path) -> String {
        format!("sqlite://{}", home.join("osprey.db").display())
    }

    /// A counter that changes whenever the named kind of record does (`keys`), so other
    /// processes sharing the store can notice cheaply.
    pub async fn change_counter(&self, name: &str) -> Result<i64> {
        let value: Option<(i64,)> =
            sqlx::query_as("SELECT value FROM change_counters WHERE name = $1")
                .bind(name)
                .fetch_optional(&self.pool)
                .await?;
        Ok(value.map_or(0, |v| v.0))
    }
}

/// Whether a pool's commits wait until they are on disk.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Durability {
    /// An acknowledged write survives a crash of the process or the machine.
    Synced,
    /// An acknowledged write survives a crash of the process; one of the machine may lose the
    /// last commits (SQLite `synchronous = NORMAL` in WAL mode, Postgres `synchronous_commit =
    /// off`), never corrupt the database.
    Relaxed,
}

/// A pool on `url` with commits of `durability`, of at most `sqlite` connections to a SQLite
/// file or `postgres` to a server. A relaxed pool (the request log's) connects on first use:
/// from its writer's thread, whose lowered priority the SQLite worker thread it starts inherits.
async fn connect(
    url: &str,
    backend: Backend,
    durability: Durability,
    sqlite: u32,
    postgres: u32,
) -> Result<sqlx::AnyPool> {
    let relaxed = durability == Durability::Relaxed;
    let (options, url) = match backend {
        Backend::Sqlite => {
            let sep = if url.contains('?') { '&' } else { '?' };
            let setup = if relaxed {
                "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;"
            } else {
                "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL;"
            };
            let options = AnyPoolOptions::new()
                .max_connections(sqlite)
                .acquire_timeout(ACQUIRE_TIMEOUT)
                .after_connect(move |conn, _| {
                    Box::pin(async move {
                        conn.execute(setup).await?;
                        Ok(())
                    })
                })
                .after_release(|conn, _| Box::pin(still_in_step(conn)));
            (options, format!("{url}{sep}mode=rwc"))
        }
        Backend::Postgres => {
            let options = AnyPoolOptions::new()
                .max_connections(postgres)
                .acquire_timeout(ACQUIRE_TIMEOUT)
                .after_connect(move |conn, _| {
                    Box::pin(async move {
                        if relaxed {
                            conn.execute("SET synchronous_commit = off").await?;
                        }
                        Ok(())
                    })
                });
            (options, url.to_owned())
        }
    };
    Ok(match relaxed {
        true => options.connect_lazy(&url)?,
        false => options.connect(&url).await?,
    })
}

/// Whether a SQLite connection coming back to the pool may be used again: not if sqlx still
/// counts a transaction open on it. That happens when SQLite rolled a transaction back by
/// itself (a full disk, an I/O error) and sqlx's own ROLLBACK then failed: sqlx would turn the
/// connection's next transaction into a savepoint, whose failure leaves a transaction open that
/// nothing commits, so later writes on it are acknowledged and never kept, and the write lock
/// it holds refuses every other connection. Such a connection is closed, which rolls back
/// whatever it holds.
async fn still_in_step(conn: &mut sqlx::AnyConnection) -> sqlx::Result<bool> {
    use sqlx::Connection;
    // A failed transaction's rollback is queued, not yet done: a ping runs after it.
    conn.ping().await?;
    let in_step = !conn.is_in_transaction();
    if !in_step {
        tracing::warn!("closing a store connection whose transaction SQLite rolled back itself");
    }
    Ok(in_step)
}

/// Bumps change counter `name` within `tx`, so other processes notice the change.
pub(crate) async fn bump_counter(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    name: &str,
) -> Result<()> {
    sqlx::query("UPDATE change_counters SET value = value + 1 WHERE name = $1")
        .bind(name)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

#[cfg(test)]
mod tests {
    use super::{Backend, Store};

    /// What a connection of `pool` says of its commits: SQLite's `synchronous` (2 = FULL,
    /// 1 = NORMAL), Postgres's `synchronous_commit`.
    async fn commit_setting(store: &Store, pool: &sqlx::AnyPool) -> String {
        match store.backend {
            Backend::Sqlite => (sqlx::query_scalar::<_, i64>("PRAGMA synchronous"))
                .fetch_one(pool)
                .await
                .unwrap()
                .to_string(),
            Backend::Postgres => (sqlx::query_scalar::<_, String>("SHOW synchronous_commit"))
                .fetch_one(pool)
                .await
                .unwrap(),
        }
    }

    #[tokio::test]
    async fn only_the_request_log_commits_without_waiting_for_the_disk() {
        for store in crate::testing::stores().await {
            let main = commit_setting(&store, &store.pool).await;
            let log = commit_setting(&store, &store.log_pool).await;
            let want = match store.backend {
                Backend::Sqlite => ("2", "1"),
                Backend::Postgres => ("on", "off"),
            };
            assert_eq!((main.as_str(), log.as_str()), want, "{:?}", store.backend);
        }
    }
}
