//! Stores for tests, one per backend: a fresh SQLite file always, and a fresh Postgres schema
//! when `OSPREY_TEST_POSTGRES_URL` is set (it says so on stderr when it is not). A store test
//! runs its body against each, so both backends meet the same assertions.

use std::path::PathBuf;

use sqlx::{Connection, Executor};

use crate::keys::random_hex;
use crate::{Backend, Store};

/// The variable naming the Postgres server tests may use.
pub const POSTGRES_URL_VAR: &str = "OSPREY_TEST_POSTGRES_URL";

/// A store made for one test.
pub struct TestStore {
    /// The store.
    pub store: Store,
    /// Its directory, for SQLite.
    pub dir: Option<PathBuf>,
}

impl std::ops::Deref for TestStore {
    type Target = Store;
    fn deref(&self) -> &Store {
        &self.store
    }
}

/// A fresh SQLite store, and a fresh Postgres one when the server is configured.
pub async fn stores() -> Vec<TestStore> {
    let mut out = vec![sqlite().await];
    match postgres_url().await {
        Some(url) => out.push(TestStore {
            store: Store::open(&url)
                .await
                .expect("the test Postgres store opens"),
            dir: None,
        }),
        None => eprintln!("{POSTGRES_URL_VAR} is not set: the Postgres store is skipped"),
    }
    out
}

/// A fresh SQLite store in a new temporary directory.
pub async fn sqlite() -> TestStore {
    let dir = std::env::temp_dir().join(format!("osprey-store-{}", random_hex(6)));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let store = Store::open(&Store::default_url(&dir))
        .await
        .expect("the SQLite store opens");
    assert_eq!(store.backend(), Backend::Sqlite);
    TestStore {
        store,
        dir: Some(dir),
    }
}

/// The URL of a new, empty schema on the test Postgres server (`None` without one): every
/// connection of a store opened on it works in that schema alone.
pub async fn postgres_url() -> Option<String> {
    let base = std::env::var(POSTGRES_URL_VAR).ok()?;
    let now = crate::now_ms() / 1000;
    let schema = format!("osprey_test_{now}_{}", random_hex(6));
    sqlx::any::install_default_drivers();
    let mut conn = sqlx::AnyConnection::connect(&base)
        .await
        .unwrap_or_else(|e| panic!("{POSTGRES_URL_VAR}={base} is set but unreachable: {e}"));
    // Schemas of earlier runs (over an hour old) are dropped, so they do not pile up.
    let old: Vec<(String,)> = sqlx::query_as(
        "SELECT nspname::text FROM pg_namespace WHERE nspname LIKE 'osprey\\_test\\_%'",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap_or_default();
    for (name,) in old {
        let born = name.split('_').nth(2).and_then(|t| t.parse::<i64>().ok());
        if born.is_none_or(|t| t < now - 3600) {
            let drop = format!("DROP SCHEMA IF EXISTS {name} CASCADE");
            let _ = conn.execute(sqlx::AssertSqlSafe(drop)).await;
        }
    }
    // The name is ours (hex), never input.
    conn.execute(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
        .await
        .expect("a test schema");
    let sep = if base.contains('?') { '&' } else { '?' };
    Some(format!("{base}{sep}options=-c%20search_path%3D{schema}"))
}
