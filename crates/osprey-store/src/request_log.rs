//! The request log: one row per generation request, saying who asked (tenant, user, key), which
//! model and tier answered and why, which prompt version and conversation it used, what the
//! prompt builder injected (memory layers, history), what happened on the way (guard verdicts,
//! retrieval hits, tool calls, in `detail`), its tokens and timings, and how it ended. Text
//! only for the share of a tenant's requests it samples, PII redacted before it gets here.

use crate::{Backend, Result, Store, now_ms};

/// One request, as logged.
#[derive(Clone, Debug, Default, PartialEq, Eq, sqlx::FromRow)]
pub struct RequestLogEntry {
    /// The request's id (`x-request-id`).
    pub id: String,
    /// Its tenant.
    pub tenant: String,
    /// Its user (`""` for the tenant's anonymous user).
    pub user_id: String,
    /// `chat/completions` or `completions`.
    pub route: String,
    /// The model it named.
    pub model: String,
    /// The HTTP status of its answer.
    pub status: i64,
    /// The registered prompt it used.
    pub prompt_name: Option<String>,
    /// That prompt's version.
    pub prompt_version: Option<i64>,
    /// The conversation it was part of.
    pub conversation_id: Option<String>,
    /// What the prompt builder put in the prompt, a JSON object: tokens per layer, fact ids,
    /// the scratchpad's name, history items.
    pub injected: String,
    /// `hit` or `miss` for a cacheable request.
    pub cache: Option<String>,
    /// Time to the answer's headers, ms.
    pub latency_ms: i64,
    /// When it was logged, Unix ms (set on write).
    pub created_at: i64,
    /// The row's place in the log (set on write): pages go backwards from a `seq`.
    pub seq: i64,
    /// The API key's id, when one was used.
    pub key_id: Option<String>,
    /// The tier an `auto` request went to.
    pub tier: Option<String>,
    /// Why it went where it did (`x-osprey-route-reason`).
    pub route_reason: Option<String>,
    /// Prompt tokens, when known.
    pub prompt_tokens: Option<i64>,
    /// Generated tokens, when known.
    pub completion_tokens: Option<i64>,
    /// Time to the first generated token, ms.
    pub ttft_ms: Option<i64>,
    /// Mean time per output token after the first, µs.
    pub tpot_us: Option<i64>,
    /// Time to the end of the answer (its last byte sent), ms.
    pub total_ms: Option<i64>,
    /// The error it ended with, if any.
    pub error: Option<String>,
    /// Its OpenTelemetry trace id (32 hex digits), when traced.
    pub trace_id: Option<String>,
    /// A JSON object of what happened on its way: guard verdicts, retrieval hits, tool calls,
    /// the worker or upstream that served it.
    pub detail: String,
    /// The prompt's text, for the sampled share of a tenant's requests (PII redacted).
    pub prompt_text: Option<String>,
    /// The answer's text, likewise.
    pub response_text: Option<String>,
}

/// Which rows to read.
#[derive(Clone, Debug, Default)]
pub struct RequestLogQuery<'a> {
    /// Of this tenant only.
    pub tenant: Option<&'a str>,
    /// Of this user only.
    pub user: Option<&'a str>,
    /// That used this prompt only.
    pub prompt: Option<&'a str>,
    /// That named (or were served by) this model only.
    pub model: Option<&'a str>,
    /// With this HTTP status only.
    pub status: Option<i64>,
    /// Logged at or after this time, Unix ms.
    pub since: Option<i64>,
    /// Older than this row (`seq`): the next page.
    pub before: Option<i64>,
    /// How many at most, newest first.
    pub limit: i64,
}

const COLUMNS: &str = "id, tenant, user_id, route, model, status, prompt_name, prompt_version, \
                       conversation_id, injected, cache, latency_ms, created_at, key_id, tier, \
                       route_reason, prompt_tokens, completion_tokens, ttft_ms, tpot_us, \
                       total_ms, error, trace_id, detail, prompt_text, response_text";

/// Columns of a row as written.
const WRITTEN: usize = 26;
/// Rows in one INSERT at most: 256 × 26 parameters stay under SQLite's limit (32,766).
const ROWS_PER_INSERT: usize = 256;

/// Inserts `entries` (at most [`ROWS_PER_INSERT`]) with one statement, logged at `now`.
async fn insert(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    backend: Backend,
    entries: &[RequestLogEntry],
    now: i64,
) -> Result<()> {
    // Postgres numbers its parameters; SQLite gets plain `?`s, since sqlx looks up each
    // numbered one by name, a scan of all of them (quadratic in a long statement).
    let param = |n: usize| match backend {
        Backend::Sqlite => "?".to_owned(),
        Backend::Postgres => format!("${n}"),
    };
    let rows: Vec<String> = (0..entries.len())
        .map(|row| {
            let params: Vec<String> = (1..=WRITTEN)
                .map(|col| param(row * WRITTEN + col))
                .collect();
            format!("({})", params.join(", "))
        })
        .collect();
    let sql = format!(
        "INSERT INTO request_log ({COLUMNS}) VALUES {}",
        rows.join(", ")
    );
    let mut query = sqlx::query(sqlx::AssertSqlSafe(sql)).persistent(false);
    for entry in entries {
        query = query
            .bind(&entry.id)
            .bind(&entry.tenant)
            .bind(&entry.user_id)
            .bind(&entry.route)
            .bind(&entry.model)
            .bind(entry.status)
            .bind(&entry.prompt_name)
            .bind(entry.prompt_version)
            .bind(&entry.conversation_id)
            .bind(&entry.injected)
            .bind(&entry.cache)
            .bind(entry.latency_ms)
            .bind(now)
            .bind(&entry.key_id)
            .bind(&entry.tier)
            .bind(&entry.route_reason)
            .bind(entry.prompt_tokens)
            .bind(entry.completion_tokens)
            .bind(entry.ttft_ms)
            .bind(entry.tpot_us)
            .bind(entry.total_ms)
            .bind(&entry.error)
            .bind(&entry.trace_id)
            .bind(&entry.detail)
            .bind(&entry.prompt_text)
            .bind(&entry.response_text);
    }
    query.execute(&mut **tx).await?;
    Ok(())
}

impl Store {
    /// Appends `entries` (their `created_at` set to now), in one transaction that does not wait
    /// for the disk: a crash of the machine may lose the last rows.
    pub async fn log_requests(&self, entries: &[RequestLogEntry]) -> Result<()> {
        let now = now_ms();
        let mut tx = self.log_pool.begin().await?;
        for chunk in entries.chunks(ROWS_PER_INSERT) {
            insert(&mut tx, self.backend, chunk, now).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// The rows `query` asks for, newest first.
    pub async fn request_log(&self, query: &RequestLogQuery<'_>) -> Result<Vec<RequestLogEntry>> {
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {COLUMNS}, seq FROM request_log \
             WHERE ($1 IS NULL OR tenant = $1) AND ($2 IS NULL OR user_id = $2) \
             AND ($3 IS NULL OR prompt_name = $3) AND ($4 IS NULL OR model = $4) \
             AND ($5 IS NULL OR status = $5) AND ($6 IS NULL OR created_at >= $6) \
             AND ($7 IS NULL OR seq < $7) ORDER BY seq DESC LIMIT $8"
        )))
        .bind(query.tenant)
        .bind(query.user)
        .bind(query.prompt)
        .bind(query.model)
        .bind(query.status)
        .bind(query.since)
        .bind(query.before)
        .bind(query.limit)
        .fetch_all(&self.pool)
        .await?)
    }

    /// The row of request `id` (the newest, should an id repeat), within `tenant` when given.
    pub async fn request_log_entry(
        &self,
        id: &str,
        tenant: Option<&str>,
    ) -> Result<Option<RequestLogEntry>> {
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {COLUMNS}, seq FROM request_log WHERE id = $1 \
             AND ($2 IS NULL OR tenant = $2) ORDER BY seq DESC LIMIT 1"
        )))
        .bind(id)
        .bind(tenant)
        .fetch_optional(&self.pool)
        .await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn rows_are_read_back_newest_first_by_tenant_user_and_prompt() {
        for store in crate::testing::stores().await {
            let row = |id: &str, tenant: &str, user: &str, prompt: Option<&str>| RequestLogEntry {
                id: id.into(),
                tenant: tenant.into(),
                user_id: user.into(),
                route: "chat/completions".into(),
                model: "m".into(),
                status: 200,
                prompt_name: prompt.map(Into::into),
                prompt_version: prompt.map(|_| 2),
                injected: r#"{"facts":1}"#.into(),
                ..RequestLogEntry::default()
            };
            let rows = [
                row("a", "acme", "alice", Some("support")),
                row("b", "acme", "bob", None),
                row("c", "globex", "alice", Some("support")),
            ];
            store.log_requests(&rows).await.unwrap();
            let ids = |q: RequestLogQuery<'static>| {
                let store = store.store.clone();
                async move {
                    let rows = store.request_log(&q).await.unwrap();
                    rows.into_iter().map(|r| r.id).collect::<Vec<_>>()
                }
            };
            let all = RequestLogQuery {
                limit: 10,
                ..RequestLogQuery::default()
            };
            assert_eq!(ids(all.clone()).await, ["c", "b", "a"]);
            let acme = RequestLogQuery {
                tenant: Some("acme"),
                ..all.clone()
            };
            assert_eq!(ids(acme.clone()).await, ["b", "a"]);
            let alice = RequestLogQuery {
                user: Some("alice"),
                ..acme
            };
            assert_eq!(ids(alice).await, ["a"]);
            let support = RequestLogQuery {
                prompt: Some("support"),
                ..all
            };
            let rows = store.request_log(&support).await.unwrap();
            assert_eq!(rows.len(), 2);
            assert_eq!(rows[1].prompt_version, Some(2));
            assert_eq!(rows[1].injected, r#"{"facts":1}"#);
        }
    }

    #[tokio::test]
    async fn a_batch_longer_than_one_insert_is_written_whole_and_in_order() {
        for store in crate::testing::stores().await {
            let rows: Vec<RequestLogEntry> = (0..ROWS_PER_INSERT + 44)
                .map(|i| RequestLogEntry {
                    id: format!("r{i}"),
                    tenant: "acme".into(),
                    status: 200,
                    ttft_ms: (i % 2 == 0).then_some(i as i64),
                    detail: format!(r#"{{"n":{i}}}"#),
                    ..RequestLogEntry::default()
                })
                .collect();
            store.log_requests(&rows).await.unwrap();
            let read = store
                .request_log(&RequestLogQuery {
                    limit: 1000,
                    ..RequestLogQuery::default()
                })
                .await
                .unwrap();
            assert_eq!(read.len(), rows.len(), "{:?}", store.backend());
            for (row, written) in read.iter().rev().zip(&rows) {
                assert_eq!(
                    (&row.id, row.ttft_ms, &row.detail),
                    (&written.id, written.ttft_ms, &written.detail)
                );
            }
            assert!(read.windows(2).all(|w| w[0].seq > w[1].seq));
        }
    }
}
