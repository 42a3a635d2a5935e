//! Agent runs: each run's request and state (as JSON the agent runtime writes), its steps in
//! order, and the audit of every tool call. A run belongs to an [`Owner`]; another owner's
//! run is not found. Runs are part of a user's working memory: deleting the user deletes them.

use crate::{Owner, Result, Store, StoreError, now_ms};

/// A run as stored.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct RunRecord {
    /// `resp_…`.
    pub id: String,
    /// Its tenant.
    pub tenant: String,
    /// Its user (`x-osprey-user`, or `anonymous`).
    pub user_id: String,
    /// The key that started it.
    pub key_id: Option<String>,
    /// The model that decides its steps.
    pub model: String,
    /// `in_progress`, `requires_approval`, `completed`…
    pub status: String,
    /// The request that started it, JSON.
    pub request: String,
    /// Its state (transcript, budget, spending), JSON.
    pub state: String,
    /// The run it continues (`previous_response_id`).
    pub previous_id: Option<String>,
    /// The run it replays.
    pub replay_of: Option<String>,
    /// Unix ms.
    pub created_at: i64,
    /// Unix ms of the last change.
    pub updated_at: i64,
}

/// One stored step.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct StepRecord {
    /// Its number in the run.
    pub n: i64,
    /// `decide`, `act`, `observe`, `approval`, `finish`.
    pub kind: String,
    /// JSON.
    pub detail: String,
    /// Model tokens.
    pub tokens: i64,
    /// ms.
    pub duration_ms: i64,
    /// Unix ms.
    pub at: i64,
}

/// One audited tool call.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct ToolAuditRecord {
    /// Unix ms (set on write).
    pub at: i64,
    /// The tenant.
    pub tenant: String,
    /// The key.
    pub key_id: Option<String>,
    /// The run.
    pub run_id: String,
    /// The call.
    pub call_id: String,
    /// The tool.
    pub tool: String,
    /// Its arguments, PII redacted.
    pub arguments: String,
    /// Bytes of its result.
    pub result_bytes: i64,
    /// ms.
    pub duration_ms: i64,
    /// `allowed`, `denied`, `approval_requested`…
    pub verdict: String,
    /// Why.
    pub detail: String,
}

/// Which runs to list.
#[derive(Clone, Debug, Default)]
pub struct RunQuery {
    /// Only this tenant's.
    pub tenant: Option<String>,
    /// Only this user's (with `tenant`).
    pub user: Option<String>,
    /// Only in this status.
    pub status: Option<String>,
    /// Only those created before this run (pagination: the last id of the previous page).
    pub before: Option<String>,
    /// At most this many (default 20, at most 100).
    pub limit: Option<i64>,
}

const RUN_COLUMNS: &str = "id, tenant, user_id, key_id, model, status, request, state, previous_id, replay_of, created_at, updated_at";

impl Store {
    /// Stores a new run.
    pub async fn create_run(&self, run: &RunRecord) -> Result<()> {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO agent_runs ({RUN_COLUMNS}) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)"
        )))
        .bind(&run.id)
        .bind(&run.tenant)
        .bind(&run.user_id)
        .bind(&run.key_id)
        .bind(&run.model)
        .bind(&run.status)
        .bind(&run.request)
        .bind(&run.state)
        .bind(&run.previous_id)
        .bind(&run.replay_of)
        .bind(run.created_at)
        .bind(run.updated_at)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Saves a run's status and state, and the step that led there, in one transaction.
    pub async fn save_run_step(
        &self,
        id: &str,
        status: &str,
        state: &str,
        step: Option<&StepRecord>,
    ) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        let now = now_ms();
        let updated = sqlx::query(
            "UPDATE agent_runs SET status = $1, state = $2, updated_at = $3 WHERE id = $4",
        )
        .bind(status)
        .bind(state)
        .bind(now)
        .bind(id)
        .execute(&mut *tx)
        .await?;
        if updated.rows_affected() == 0 {
            return Err(StoreError::NotFound(format!("run {id}")));
        }
        if let Some(s) = step {
            sqlx::query(
                "INSERT INTO agent_steps (run_id, n, kind, detail, tokens, duration_ms, at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7)",
            )
            .bind(id)
            .bind(s.n)
            .bind(&s.kind)
            .bind(&s.detail)
            .bind(s.tokens)
            .bind(s.duration_ms)
            .bind(now)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Marks run `id` `in_progress` if it is in status `from`; false if it is not (another
    /// request took it first, or it moved on): what keeps two approvals from both running it.
    pub async fn claim_run(&self, id: &str, from: &str) -> Result<bool> {
        let claimed = sqlx::query(
            "UPDATE agent_runs SET status = 'in_progress', updated_at = $1 \
             WHERE id = $2 AND status = $3",
        )
        .bind(now_ms())
        .bind(id)
        .bind(from)
        .execute(&self.pool)
        .await?;
        Ok(claimed.rows_affected() == 1)
    }

    /// Run `id`, if `owner` (or anyone, for `None`: the admin) may see it.
    pub async fn run(&self, owner: Option<&Owner>, id: &str) -> Result<RunRecord> {
        let sql = format!(
            "SELECT {RUN_COLUMNS} FROM agent_runs WHERE id = $1 \
             AND ($2 IS NULL OR (tenant = $2 AND user_id = $3))"
        );
        sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(id)
            .bind(owner.map(|o| o.tenant.clone()))
            .bind(owner.map(|o| o.user.clone()))
            .fetch_optional(&self.pool)
            .await?
            .ok_or_else(|| StoreError::NotFound(format!("run {id}")))
    }

    /// Runs matching `query`, newest first.
    pub async fn runs(&self, query: &RunQuery) -> Result<Vec<RunRecord>> {
        let before = match &query.before {
            Some(id) => Some(self.run(None, id).await?.created_at),
            None => None,
        };
        let sql = format!(
            "SELECT {RUN_COLUMNS} FROM agent_runs WHERE ($1 IS NULL OR tenant = $1) \
             AND ($2 IS NULL OR user_id = $2) AND ($3 IS NULL OR status = $3) \
             AND ($4 IS NULL OR created_at < $4) ORDER BY created_at DESC, id LIMIT $5"
        );
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(&query.tenant)
            .bind(&query.user)
            .bind(&query.status)
            .bind(before)
            .bind(query.limit.unwrap_or(20).clamp(1, 100))
            .fetch_all(&self.pool)
            .await?)
    }

    /// The steps of run `id`, in order.
    pub async fn run_steps(&self, id: &str) -> Result<Vec<StepRecord>> {
        Ok(sqlx::query_as(
            "SELECT n, kind, detail, tokens, duration_ms, at FROM agent_steps \
             WHERE run_id = $1 ORDER BY n",
        )
        .bind(id)
        .fetch_all(&self.pool)
        .await?)
    }

    /// Appends audited tool calls (their `at` set to now).
    pub async fn audit_tool_calls(&self, entries: &[ToolAuditRecord]) -> Result<()> {
        let at = now_ms();
        let mut tx = self.pool.begin().await?;
        for e in entries {
            sqlx::query(
                "INSERT INTO tool_audit (at, tenant, key_id, run_id, call_id, tool, arguments, \
                 result_bytes, duration_ms, verdict, detail) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
            )
            .bind(at)
            .bind(&e.tenant)
            .bind(&e.key_id)
            .bind(&e.run_id)
            .bind(&e.call_id)
            .bind(&e.tool)
            .bind(&e.arguments)
            .bind(e.result_bytes)
            .bind(e.duration_ms)
            .bind(&e.verdict)
            .bind(&e.detail)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// The latest `limit` audited calls of `tenant` (all for `None`), of run `run` if given,
    /// newest first.
    pub async fn tool_audit_log(
        &self,
        tenant: Option<&str>,
        run: Option<&str>,
        limit: i64,
    ) -> Result<Vec<ToolAuditRecord>> {
        Ok(sqlx::query_as(
            "SELECT at, tenant, key_id, run_id, call_id, tool, arguments, result_bytes, \
             duration_ms, verdict, detail FROM tool_audit \
             WHERE ($1 IS NULL OR tenant = $1) AND ($2 IS NULL OR run_id = $2) \
             ORDER BY id DESC LIMIT $3",
        )
        .bind(tenant)
        .bind(run)
        .bind(limit.clamp(1, 1000))
        .fetch_all(&self.pool)
        .await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str, owner: &Owner, at: i64) -> RunRecord {
        RunRecord {
            id: id.into(),
            tenant: owner.tenant.clone(),
            user_id: owner.user.clone(),
            key_id: None,
            model: "m".into(),
            status: "in_progress".into(),
            request: "{}".into(),
            state: "{}".into(),
            previous_id: None,
            replay_of: None,
            created_at: at,
            updated_at: at,
        }
    }

    #[tokio::test]
    async fn runs_steps_and_audits_are_kept_per_owner() {
        for store in crate::testing::stores().await {
            let alice = Owner {
                tenant: "acme".into(),
                user: "alice".into(),
            };
            let bob = Owner {
                tenant: "acme".into(),
                user: "bob".into(),
            };
            let tag = crate::keys::random_hex(4);
            let (r1, r2) = (format!("resp_a{tag}"), format!("resp_b{tag}"));
            store.create_run(&record(&r1, &alice, 1)).await.unwrap();
            store.create_run(&record(&r2, &alice, 2)).await.unwrap();
            let step = StepRecord {
                n: 1,
                kind: "decide".into(),
                detail: "{\"text\":\"hi\"}".into(),
                tokens: 12,
                duration_ms: 3,
                at: 0,
            };
            store
                .save_run_step(&r1, "completed", "{\"done\":true}", Some(&step))
                .await
                .unwrap();
            assert!(store.claim_run(&r2, "in_progress").await.unwrap());
            assert!(!store.claim_run(&r2, "requires_approval").await.unwrap());
            let got = store.run(Some(&alice), &r1).await.unwrap();
            assert_eq!(
                (got.status.as_str(), got.state.as_str()),
                ("completed", "{\"done\":true}")
            );
            assert!(matches!(
                store.run(Some(&bob), &r1).await,
                Err(StoreError::NotFound(_))
            ));
            assert_eq!(
                store.run(None, &r1).await.unwrap().id,
                r1,
                "the admin sees it"
            );
            let steps = store.run_steps(&r1).await.unwrap();
            assert_eq!(
                (steps.len(), steps[0].kind.as_str(), steps[0].tokens),
                (1, "decide", 12)
            );
            let mine = RunQuery {
                tenant: Some("acme".into()),
                user: Some("alice".into()),
                ..RunQuery::default()
            };
            let listed: Vec<String> = store
                .runs(&mine)
                .await
                .unwrap()
                .into_iter()
                .map(|r| r.id)
                .collect();
            assert!(listed.iter().position(|i| *i == r2) < listed.iter().position(|i| *i == r1));
            let page = RunQuery {
                before: Some(r2.clone()),
                ..mine.clone()
            };
            assert!(!store.runs(&page).await.unwrap().iter().any(|r| r.id == r2));
            let audit = ToolAuditRecord {
                at: 0,
                tenant: "acme".into(),
                key_id: Some("key_1".into()),
                run_id: r1.clone(),
                call_id: "call_1".into(),
                tool: "calculator".into(),
                arguments: "{}".into(),
                result_bytes: 3,
                duration_ms: 1,
                verdict: "allowed".into(),
                detail: String::new(),
            };
            store.audit_tool_calls(&[audit]).await.unwrap();
            let log = store
                .tool_audit_log(Some("acme"), Some(&r1), 10)
                .await
                .unwrap();
            assert_eq!((log.len(), log[0].verdict.as_str()), (1, "allowed"));
            assert!(
                store
                    .tool_audit_log(Some("globex"), None, 10)
                    .await
                    .unwrap()
                    .is_empty()
            );
            let deleted = store.delete_user(&alice).await.unwrap();
            assert!(deleted.runs >= 2);
            assert!(
                store.run(None, &r1).await.is_err()
                    && store.run_steps(&r1).await.unwrap().is_empty()
            );
        }
    }
}
