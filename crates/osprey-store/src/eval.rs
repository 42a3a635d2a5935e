//! Offline evaluation runs (`osprey eval`): each run's report as JSON, with a summary and the
//! suite and target to list them by. The store keeps them opaque; `osprey-eval` reads them.

use crate::{Result, Store, now_ms};

/// A stored evaluation run.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct EvalRunRecord {
    /// The run's id.
    pub id: String,
    /// `run`, `replay` or `log`.
    pub kind: String,
    /// The suite's name.
    pub suite: String,
    /// The target's name.
    pub target: String,
    /// When it was stored, Unix ms.
    pub created_at: i64,
    /// Its summary, JSON.
    pub summary: String,
    /// The whole report, JSON (empty in listings).
    pub report: String,
}

impl Store {
    /// Stores a run (replacing one with the same id).
    pub async fn save_eval_run(&self, run: &EvalRunRecord) -> Result<()> {
        sqlx::query(
            "INSERT INTO eval_runs (id, kind, suite, target, created_at, summary, report) \
             VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (id) DO UPDATE SET \
             kind = $2, suite = $3, target = $4, created_at = $5, summary = $6, report = $7",
        )
        .bind(&run.id)
        .bind(&run.kind)
        .bind(&run.suite)
        .bind(&run.target)
        .bind(if run.created_at > 0 {
            run.created_at
        } else {
            now_ms()
        })
        .bind(&run.summary)
        .bind(&run.report)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// One run, with its report.
    pub async fn eval_run(&self, id: &str) -> Result<Option<EvalRunRecord>> {
        Ok(sqlx::query_as(
            "SELECT id, kind, suite, target, created_at, summary, report FROM eval_runs WHERE id = $1",
        )
        .bind(id)
        .fetch_optional(&self.pool)
        .await?)
    }

    /// The newest `limit` runs, newest first, without their reports.
    pub async fn eval_runs(&self, limit: i64) -> Result<Vec<EvalRunRecord>> {
        Ok(sqlx::query_as(
            "SELECT id, kind, suite, target, created_at, summary, '' AS report FROM eval_runs \
             ORDER BY created_at DESC, id DESC LIMIT $1",
        )
        .bind(limit)
        .fetch_all(&self.pool)
        .await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn runs_are_stored_listed_and_read_back() {
        for s in crate::testing::stores().await {
            let run = |id: &str, at: i64| EvalRunRecord {
                id: id.into(),
                kind: "run".into(),
                suite: "qa".into(),
                target: "local".into(),
                created_at: at,
                summary: r#"{"pass_rate": 0.5}"#.into(),
                report: r#"{"cases": []}"#.into(),
            };
            s.save_eval_run(&run("a", 1_000)).await.unwrap();
            s.save_eval_run(&run("b", 2_000)).await.unwrap();
            let listed = s.eval_runs(10).await.unwrap();
            let ids: Vec<&str> = listed.iter().map(|r| r.id.as_str()).collect();
            assert_eq!(ids, ["b", "a"]);
            assert!(listed.iter().all(|r| r.report.is_empty()));
            assert_eq!(s.eval_run("a").await.unwrap().unwrap(), run("a", 1_000));
            assert!(s.eval_run("zzz").await.unwrap().is_none());
        }
    }
}
