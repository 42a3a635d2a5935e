//! `sql_query`: a read-only, parameterised query over the operator's database (Postgres or
//! SQLite), at most `max_rows` rows within `timeout_seconds`. Needs the `read` scope.
//!
//! Read-only is enforced by the database, not by reading the SQL: Postgres runs every query
//! in a `READ ONLY` transaction that is rolled back, with a `statement_timeout`; SQLite opens
//! the file read-only with `query_only` set. Values come only through `$1`, `$2`… parameters.

use std::time::Duration;

use futures_util::TryStreamExt;
use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use sqlx::{Column, Row, TypeInfo, ValueRef};

use crate::scope::{Scope, Scopes};
use crate::tool::{Tool, ToolError, ToolSpec};

/// The operator's settings (`[agent.sql]`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SqlConfig {
    /// `postgres://…` or `sqlite://PATH`. Empty: the tool is not offered.
    pub url: String,
    /// What the database holds, for the model (tables and columns help it most).
    pub description: String,
    /// Most rows returned.
    pub max_rows: usize,
    /// Longest a query may run, seconds.
    pub timeout_seconds: f64,
}

impl Default for SqlConfig {
    fn default() -> Self {
        Self {
            url: String::new(),
            description: String::new(),
            max_rows: 100,
            timeout_seconds: 5.0,
        }
    }
}

enum Pool {
    Postgres(sqlx::PgPool),
    Sqlite(sqlx::SqlitePool),
}

/// The query tool over one database.
pub struct SqlQuery {
    spec: ToolSpec,
    pool: Pool,
    config: SqlConfig,
}

impl SqlQuery {
    /// Connects (lazily) to `config.url`.
    pub fn new(config: SqlConfig) -> Result<Self, String> {
        let timeout = Duration::from_secs_f64(config.timeout_seconds.max(0.1));
        let pool = if config.url.starts_with("postgres") {
            let ms = timeout.as_millis();
            let opts = sqlx::postgres::PgPoolOptions::new()
                .max_connections(4)
                .acquire_timeout(timeout)
                .after_connect(move |conn, _| {
                    Box::pin(async move {
                        // `ms` is a number this code formats, not user text.
                        let set = format!(
                            "SET default_transaction_read_only = on; SET statement_timeout = {ms}"
                        );
                        sqlx::Executor::execute(&mut *conn, sqlx::AssertSqlSafe(set))
                            .await
                            .map(|_| ())
                    })
                });
            let pool = opts
                .connect_lazy(&config.url)
                .map_err(|e| format!("agent.sql.url: {e}"))?;
            Pool::Postgres(pool)
        } else if let Some(path) = config.url.strip_prefix("sqlite://") {
            let opts = sqlx::sqlite::SqliteConnectOptions::new()
                .filename(path)
                .read_only(true)
                .pragma("query_only", "ON");
            let pool = sqlx::sqlite::SqlitePoolOptions::new()
                .max_connections(4)
                .acquire_timeout(timeout)
                .connect_lazy_with(opts);
            Pool::Sqlite(pool)
        } else {
            return Err(format!(
                "agent.sql.url must be postgres://… or sqlite://PATH, got `{}`",
                config.url
            ));
        };
        let parameters = json!({
            "type": "object",
            "properties": {
                "query": {"type": "string", "maxLength": 4000,
                    "description": "One read-only SQL query; values as $1, $2, ..."},
                "params": {"type": "array", "maxItems": 32,
                    "items": {"type": ["string", "number", "boolean", "null"]}}
            },
            "required": ["query"],
            "additionalProperties": false
        });
        let description = match config.description.is_empty() {
            true => {
                "Runs a read-only SQL query with parameters and returns rows as JSON.".to_owned()
            }
            false => format!(
                "Runs a read-only SQL query with parameters and returns rows as JSON. {}",
                config.description
            ),
        };
        let mut spec = ToolSpec::new("sql_query", &description, parameters)
            .with_scopes(Scopes::of(&[Scope::Read]));
        spec.timeout = timeout;
        Ok(Self { spec, pool, config })
    }

    async fn query(&self, sql: &str, params: &[Value]) -> Result<String, ToolError> {
        let sql = sql.trim().trim_end_matches(';').trim();
        if sql.contains(';') {
            return Err(ToolError::fatal("one statement at a time"));
        }
        let limit = self.config.max_rows;
        let fail = |e: sqlx::Error| match e {
            sqlx::Error::PoolTimedOut | sqlx::Error::Io(_) => {
                ToolError::transient(format!("the database is unavailable: {e}"))
            }
            e => ToolError::fatal(format!("the query failed: {e}")),
        };
        let (rows, more) = match &self.pool {
            Pool::Postgres(pool) => {
                let mut tx = pool.begin().await.map_err(fail)?;
                sqlx::Executor::execute(&mut *tx, "SET TRANSACTION READ ONLY")
                    .await
                    .map_err(fail)?;
                let wrapped = format!(
                    "SELECT to_jsonb(q)::text FROM ({sql}) q LIMIT {}",
                    limit + 1
                );
                // The caller's SQL runs as given, by design, inside a read-only transaction:
                // the database, not this string, is what keeps it from writing.
                let mut query = sqlx::query_scalar::<_, String>(sqlx::AssertSqlSafe(wrapped));
                for p in params {
                    query = match p {
                        Value::Bool(b) => query.bind(*b),
                        Value::Number(n) if n.is_i64() => query.bind(n.as_i64()),
                        Value::Number(n) => query.bind(n.as_f64()),
                        Value::String(s) => query.bind(s.clone()),
                        _ => query.bind(None::<String>),
                    };
                }
                let texts: Vec<String> = query.fetch_all(&mut *tx).await.map_err(fail)?;
                tx.rollback().await.map_err(fail)?;
                let mut rows: Vec<Value> = (texts.iter())
                    .map(|t| serde_json::from_str(t).unwrap_or(Value::Null))
                    .collect();
                let more = rows.len() > limit;
                rows.truncate(limit);
                (rows, more)
            }
            Pool::Sqlite(pool) => {
                // As above: the connection is read-only (`query_only`), whatever the SQL says.
                let mut query = sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()));
                for p in params {
                    query = match p {
                        Value::Bool(b) => query.bind(*b),
                        Value::Number(n) if n.is_i64() => query.bind(n.as_i64()),
                        Value::Number(n) => query.bind(n.as_f64()),
                        Value::String(s) => query.bind(s.clone()),
                        _ => query.bind(None::<String>),
                    };
                }
                let mut stream = query.fetch(pool);
                let mut rows = Vec::new();
                let mut more = false;
                while let Some(row) = stream.try_next().await.map_err(fail)? {
                    if rows.len() == limit {
                        more = true;
                        break;
                    }
                    rows.push(sqlite_row(&row));
                }
                (rows, more)
            }
        };
        let mut out = json!({"rows": rows, "row_count": rows.len()});
        if more {
            out["truncated"] = format!("only the first {limit} rows").into();
        }
        Ok(out.to_string())
    }
}

/// A SQLite row as a JSON object, each value by its stored type.
fn sqlite_row(row: &sqlx::sqlite::SqliteRow) -> Value {
    let mut object = Map::new();
    for (i, column) in row.columns().iter().enumerate() {
        let raw = row.try_get_raw(i).ok();
        let kind = raw.as_ref().map(|r| r.type_info().name().to_owned());
        let value = match (raw.is_some_and(|r| r.is_null()), kind.as_deref()) {
            (true, _) | (_, None) => Value::Null,
            (_, Some("INTEGER" | "BOOLEAN")) => {
                row.try_get::<i64, _>(i).map_or(Value::Null, Value::from)
            }
            (_, Some("REAL")) => row.try_get::<f64, _>(i).map_or(Value::Null, Value::from),
            (_, Some("BLOB")) => row
                .try_get::<Vec<u8>, _>(i)
                .map_or(Value::Null, |b| format!("<{} bytes>", b.len()).into()),
            _ => row.try_get::<String, _>(i).map_or(Value::Null, Value::from),
        };
        object.insert(column.name().to_owned(), value);
    }
    Value::Object(object)
}

impl Tool for SqlQuery {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn call(&self, arguments: Value) -> BoxFuture<'_, Result<String, ToolError>> {
        Box::pin(async move {
            let sql = arguments["query"].as_str().unwrap_or_default().to_owned();
            let params = arguments["params"].as_array().cloned().unwrap_or_default();
            self.query(&sql, &params).await
        })
    }
}
