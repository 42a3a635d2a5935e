//! The built-in tools against real parts: WASI modules in the WebAssembly sandbox (fuel,
//! memory, wall time, output cap, no filesystem unless granted, and then read-only), read-only SQL on real SQLite and
//! Postgres databases, and HTTP fetch against a local server behind the allow-list.

use std::time::{Duration, Instant};

use osprey_agent::builtin::http_fetch::{HttpFetch, HttpFetchConfig};
use osprey_agent::builtin::sql::{SqlConfig, SqlQuery};
use osprey_agent::builtin::wasm::{HELLO_WAT, Sandbox, WasmConfig};
use osprey_agent::{Tool, ToolError};
use serde_json::{Value, json};

/// Copies stdin to stdout (up to 1 KiB).
const ECHO: &str = r#"(module
  (import "wasi_snapshot_preview1" "fd_read" (func $fd_read (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (func (export "_start")
    (i32.store (i32.const 0) (i32.const 100))
    (i32.store (i32.const 4) (i32.const 1024))
    (drop (call $fd_read (i32.const 0) (i32.const 0) (i32.const 1) (i32.const 8)))
    (i32.store (i32.const 4) (i32.load (i32.const 8)))
    (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 12)))))"#;

const SPIN: &str =
    r#"(module (memory (export "memory") 1) (func (export "_start") (loop (br 0))))"#;

/// Asks for 2,000 pages (125 MiB) of memory up front.
const HUNGRY: &str = r#"(module (memory (export "memory") 2000) (func (export "_start")))"#;

/// Writes 1 KiB to stdout 1,000 times.
const CHATTY: &str = r#"(module
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (func (export "_start") (local $i i32)
    (i32.store (i32.const 0) (i32.const 64))
    (i32.store (i32.const 4) (i32.const 1024))
    (loop
      (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if 0 (i32.lt_u (local.get $i) (i32.const 1000))))))"#;

/// Exits with the errno of `fd_prestat_get(3)`: 0 if a directory is preopened, 8 (EBADF) if
/// the module sees no filesystem at all.
const SEES_FILES: &str = r#"(module
  (import "wasi_snapshot_preview1" "fd_prestat_get" (func $prestat (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
  (memory (export "memory") 1)
  (func (export "_start") (call $exit (call $prestat (i32.const 3) (i32.const 0)))))"#;

/// Exits with the errno of creating `new.txt` for writing in the preopened directory (fd 3).
const CREATES_A_FILE: &str = r#"(module
  (import "wasi_snapshot_preview1" "path_open" (func $open
    (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
  (memory (export "memory") 1)
  (data (i32.const 100) "new.txt")
  (func (export "_start")
    (call $exit (call $open (i32.const 3) (i32.const 0) (i32.const 100) (i32.const 7)
      (i32.const 1) (i64.const 64) (i64.const 0) (i32.const 0) (i32.const 200)))))"#;

#[test]
fn wasm_modules_run_within_their_limits() {
    let sandbox = Sandbox::new(WasmConfig {
        fuel: 5_000_000,
        timeout_seconds: 0.5,
        max_output_bytes: 8 << 10,
        ..WasmConfig::default()
    })
    .unwrap();
    let out = sandbox.run(HELLO_WAT.as_bytes(), "", &[]).unwrap();
    assert_eq!((out.exit_code, out.stdout.as_str()), (0, "hello\n"));
    assert!(
        out.fuel_used > 0 && out.fuel_used < 1000,
        "{}",
        out.fuel_used
    );
    let again = sandbox.run(HELLO_WAT.as_bytes(), "", &[]).unwrap();
    assert_eq!(
        again.compile,
        Duration::ZERO,
        "the compiled module is cached"
    );
    assert_eq!(
        sandbox
            .run(ECHO.as_bytes(), "{\"x\": 1}", &[])
            .unwrap()
            .stdout,
        "{\"x\": 1}"
    );

    let err = sandbox.run(SPIN.as_bytes(), "", &[]).unwrap_err();
    assert!(err.contains("ran out of fuel"), "{err}");
    let err = sandbox.run(HUNGRY.as_bytes(), "", &[]).unwrap_err();
    assert!(err.contains("memory"), "{err}");
    let err = sandbox.run(CHATTY.as_bytes(), "", &[]).unwrap_err();
    assert!(err.contains("wrote more than 8192 bytes"), "{err}");
    assert_eq!(
        sandbox
            .run(SEES_FILES.as_bytes(), "", &[])
            .unwrap()
            .exit_code,
        8,
        "no filesystem"
    );
    let err = sandbox.run(b"(module (func", "", &[]).unwrap_err();
    assert!(err.contains("does not compile"), "{err}");

    // Wall time: fuel enough for minutes, stopped by the clock.
    let slow = Sandbox::new(WasmConfig {
        fuel: u64::MAX / 2,
        timeout_seconds: 0.3,
        ..WasmConfig::default()
    })
    .unwrap();
    let t = Instant::now();
    let err = slow.run(SPIN.as_bytes(), "", &[]).unwrap_err();
    assert!(err.contains("time limit"), "{err}");
    assert!(t.elapsed() < Duration::from_secs(5));

    // A granted directory is visible, and read-only.
    let dir = std::env::temp_dir().join(format!("osprey-wasm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let granted = Sandbox::new(WasmConfig {
        read_dir: Some(dir.clone()),
        ..WasmConfig::default()
    })
    .unwrap();
    assert_eq!(
        granted
            .run(SEES_FILES.as_bytes(), "", &[])
            .unwrap()
            .exit_code,
        0
    );
    let refused = granted.run(CREATES_A_FILE.as_bytes(), "", &[]).unwrap();
    assert_ne!(refused.exit_code, 0, "creating a file is refused");
    assert!(!dir.join("new.txt").exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

async fn call(tool: &dyn Tool, args: Value) -> Result<String, ToolError> {
    tool.call(args).await
}

#[tokio::test]
async fn sqlite_queries_are_read_only_parameterised_and_capped() {
    let path = std::env::temp_dir().join(format!("osprey-sql-{:08x}.db", rand::random::<u32>()));
    {
        let url = format!("sqlite://{}?mode=rwc", path.display());
        let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
        sqlx::query("CREATE TABLE books (id INTEGER, title TEXT, price REAL)")
            .execute(&pool)
            .await
            .unwrap();
        for i in 0..10 {
            sqlx::query("INSERT INTO books VALUES ($1, $2, $3)")
                .bind(i)
                .bind(format!("Book {i}"))
                .bind(i as f64 * 1.5)
                .execute(&pool)
                .await
                .unwrap();
        }
        pool.close().await;
    }
    let tool = SqlQuery::new(SqlConfig {
        url: format!("sqlite://{}", path.display()),
        max_rows: 3,
        ..SqlConfig::default()
    })
    .unwrap();
    let out: Value = serde_json::from_str(
        &call(&tool, json!({"query": "SELECT id, title, price FROM books WHERE id >= $1 ORDER BY id", "params": [8]}))
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        out["rows"],
        json!([{"id": 8, "title": "Book 8", "price": 12.0}, {"id": 9, "title": "Book 9", "price": 13.5}])
    );
    let all: Value = serde_json::from_str(
        &call(&tool, json!({"query": "SELECT * FROM books"}))
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(all["row_count"], 3);
    assert!(all["truncated"].is_string());
    for write in [
        "INSERT INTO books VALUES (99, 'x', 1)",
        "DELETE FROM books",
        "DROP TABLE books",
    ] {
        let err = call(&tool, json!({"query": write})).await.unwrap_err();
        assert!(err.message.contains("failed"), "{write}: {}", err.message);
    }
    let err = call(&tool, json!({"query": "SELECT 1; DELETE FROM books"}))
        .await
        .unwrap_err();
    assert!(err.message.contains("one statement"), "{}", err.message);
    let count: Value = serde_json::from_str(
        &call(&tool, json!({"query": "SELECT count(*) AS n FROM books"}))
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(count["rows"][0]["n"], 10, "nothing was written");
}

#[tokio::test]
async fn postgres_queries_run_in_read_only_transactions_with_a_timeout() {
    let Some(url) = std::env::var("OSPREY_TEST_POSTGRES_URL")
        .ok()
        .filter(|u| !u.is_empty())
    else {
        eprintln!(
            "SKIPPED postgres_queries_run_in_read_only_transactions_with_a_timeout: OSPREY_TEST_POSTGRES_URL is not set (.ci/run sets it)"
        );
        return;
    };
    let table = format!("osprey_sql_tool_{:08x}", rand::random::<u32>());
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    let create = format!("CREATE TABLE {table} (id INT, name TEXT)");
    sqlx::query(sqlx::AssertSqlSafe(create))
        .execute(&pool)
        .await
        .unwrap();
    let insert = format!("INSERT INTO {table} SELECT g, 'n' || g FROM generate_series(1, 50) g");
    sqlx::query(sqlx::AssertSqlSafe(insert))
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SEQUENCE {table}_seq")))
        .execute(&pool)
        .await
        .unwrap();
    let tool = SqlQuery::new(SqlConfig {
        url: url.clone(),
        max_rows: 5,
        timeout_seconds: 0.5,
        ..SqlConfig::default()
    })
    .unwrap();
    let q = format!("SELECT id, name FROM {table} WHERE id = $1");
    let out: Value = serde_json::from_str(
        &call(&tool, json!({"query": q, "params": [7]}))
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(out["rows"], json!([{"id": 7, "name": "n7"}]));
    let all: Value = serde_json::from_str(
        &call(&tool, json!({"query": format!("SELECT * FROM {table}")}))
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        (all["row_count"].as_u64(), all["truncated"].is_string()),
        (Some(5), true)
    );
    // A write Postgres can even plan (the query runs as a subquery) meets the read-only
    // transaction; a data-modifying CTE cannot run as a subquery at all.
    let err = call(
        &tool,
        json!({"query": format!("SELECT nextval('{table}_seq')")}),
    )
    .await
    .unwrap_err();
    assert!(
        err.message.contains("read-only transaction"),
        "{}",
        err.message
    );
    let err = call(
        &tool,
        json!({"query": format!("WITH d AS (DELETE FROM {table} RETURNING id) SELECT * FROM d")}),
    )
    .await
    .unwrap_err();
    assert!(err.message.contains("the query failed"), "{}", err.message);
    let err = call(&tool, json!({"query": "SELECT pg_sleep(5)"}))
        .await
        .unwrap_err();
    assert!(err.message.contains("statement timeout"), "{}", err.message);
    let left: (i64,) = sqlx::query_as(sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {table}")))
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(left.0, 50, "nothing was deleted");
    let seq: (i64,) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT nextval('{table}_seq')"
    )))
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(seq.0, 1, "the sequence never moved");
    for drop in [
        format!("DROP TABLE {table}"),
        format!("DROP SEQUENCE {table}_seq"),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(drop))
            .execute(&pool)
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn http_fetch_reaches_only_the_allowed_hosts() {
    use axum::response::Redirect;
    use axum::routing::get;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let app =
        axum::Router::new()
            .route("/page", get(|| async { "the page" }))
            .route("/big", get(|| async { "x".repeat(100_000) }))
            .route(
                "/away",
                get(move || async move {
                    Redirect::temporary(&format!("http://localhost:{port}/page"))
                }),
            )
            .route("/here", get(|| async { Redirect::temporary("/page") }));
    tokio::spawn(async move { axum::serve(listener, app).await });
    let tool = HttpFetch::new(HttpFetchConfig {
        allow: vec![format!("127.0.0.1:{port}")],
        max_bytes: 1000,
        ..HttpFetchConfig::default()
    });
    let base = format!("http://127.0.0.1:{port}");
    let page = call(&tool, json!({"url": format!("{base}/page")}))
        .await
        .unwrap();
    assert!(
        page.starts_with("status: 200") && page.ends_with("the page"),
        "{page}"
    );
    let here = call(&tool, json!({"url": format!("{base}/here")}))
        .await
        .unwrap();
    assert!(
        here.ends_with("the page"),
        "a redirect on the allowed host is followed: {here}"
    );
    let big = call(&tool, json!({"url": format!("{base}/big")}))
        .await
        .unwrap();
    assert!(
        big.ends_with("[cut at 1000 bytes]") && big.len() < 1200,
        "{}",
        big.len()
    );
    let away = call(&tool, json!({"url": format!("{base}/away")}))
        .await
        .unwrap_err();
    assert!(away.message.contains("not allowed"), "{}", away.message);
    let other = call(
        &tool,
        json!({"url": format!("http://localhost:{port}/page")}),
    )
    .await
    .unwrap_err();
    assert!(other.message.contains("allow-list"), "{}", other.message);
    let file = call(&tool, json!({"url": "file:///etc/passwd"}))
        .await
        .unwrap_err();
    assert!(file.message.contains("only http"), "{}", file.message);
}
