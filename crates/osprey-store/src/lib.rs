//! Osprey's persistent state, behind one [`Store`] handle.
//!
//! The embedded default is SQLite at `$OSPREY_HOME/osprey.db` (WAL journal, `synchronous =
//! FULL`, so an acknowledged write survives a crash); migrations run on open. Today the store
//! holds API keys ([`keys`]), the Batch API's files and batches ([`batches`]) and the safety
//! audit log ([`audit`]); conversations, prompts, memory and documents join it in [6/13],
//! with Postgres as the scaled backend behind the same interface.
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
pub mod keys;

use std::path::Path;
use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};

pub use audit::AuditEntry;
pub use batches::{BatchRecord, FileRecord};
pub use keys::{CreatedKey, KeyRecord, NewKey};

/// A failure of the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store URL is not one this build understands.
    #[error("unsupported store URL `{0}` (use sqlite://PATH)")]
    UnsupportedUrl(String),
    /// The database failed or could not be reached.
    #[error("store: {0}")]
    Database(#[from] sqlx::Error),
    /// A migration failed.
    #[error("store migration: {0}")]
    Migration(#[from] sqlx::migrate::MigrateError),
    /// The named record does not exist.
    #[error("{0} not found")]
    NotFound(String),
}

/// Result alias of this crate.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// A handle to the store; cheap to clone, shared by every request.
#[derive(Clone, Debug)]
pub struct Store {
    pool: sqlx::SqlitePool,
}

impl Store {
    /// Opens (creating if needed) the store at `url` (`sqlite://PATH`) and migrates it.
    pub async fn open(url: &str) -> Result<Self> {
        let Some(path) = url.strip_prefix("sqlite://") else {
            return Err(StoreError::UnsupportedUrl(url.to_owned()));
        };
        let options = SqliteConnectOptions::from_str(&format!("sqlite://{path}"))?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(5));
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(options)
            .await?;
        // Replicas sharing the file may start together and race to apply a migration (SQLite
        // takes no migration lock): the loser's transaction fails, and a second look finds the
        // migration applied.
        let mut attempt = 0;
        while let Err(e) = sqlx::migrate!("migrations/sqlite").run(&pool).await {
            attempt += 1;
            if attempt == 3 {
                return Err(e.into());
            }
            tokio::time::sleep(Duration::from_millis(100 * attempt)).await;
        }
        Ok(Self { pool })
    }

    /// The default store of an Osprey home directory: `HOME/osprey.db`.
    pub fn default_url(home: &Path) -> String {
        format!("sqlite://{}", home.join("osprey.db").display())
    }

    /// A counter that changes whenever the named kind of record does (`keys`), so other
    /// processes sharing the store can notice cheaply.
    pub async fn change_counter(&self, name: &str) -> Result<i64> {
        let value: Option<(i64,)> =
            sqlx::query_as("SELECT value FROM change_counters WHERE name = ?")
                .bind(name)
                .fetch_optional(&self.pool)
                .await?;
        Ok(value.map_or(0, |v| v.0))
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
