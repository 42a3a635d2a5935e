//! The safety audit log: who was caught by which rule, what was done, and how sure the guard
//! was; never the text (nor any PII in it).

use crate::{Result, Store, now_ms};

/// One verdict acted on.
#[derive(Clone, Debug, PartialEq, sqlx::FromRow)]
pub struct AuditEntry {
    /// When, Unix ms (set on write).
    pub at: i64,
    /// The tenant of the request.
    pub tenant: String,
    /// Its API key's id, if it had one.
    pub key_id: Option<String>,
    /// Where the text came from: `user`, `untrusted` or `model`.
    pub source: String,
    /// `prompt_injection`, `jailbreak`, `pii`, `denied`.
    pub category: String,
    /// The rule or detector.
    pub rule: String,
    /// `flag`, `redact` or `block`.
    pub action: String,
    /// The guard's score.
    pub score: f64,
}

impl Store {
    /// Appends `entries` (their `at` set to now), in one transaction.
    pub async fn audit(&self, entries: &[AuditEntry]) -> Result<()> {
        let at = now_ms();
        let mut tx = self.pool.begin().await?;
        for e in entries {
            sqlx::query(
                "INSERT INTO audit (at, tenant, key_id, source, category, rule, action, score) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
            )
            .bind(at)
            .bind(&e.tenant)
            .bind(&e.key_id)
            .bind(&e.source)
            .bind(&e.category)
            .bind(&e.rule)
            .bind(&e.action)
            .bind(e.score)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// The latest `limit` entries of `tenant` (all tenants for `None`), newest first.
    pub async fn audit_log(&self, tenant: Option<&str>, limit: i64) -> Result<Vec<AuditEntry>> {
        let rows = sqlx::query_as::<_, AuditEntry>(
            "SELECT at, tenant, key_id, source, category, rule, action, score FROM audit \
             WHERE $1 IS NULL OR tenant = $1 ORDER BY id DESC LIMIT $2",
        )
        .bind(tenant)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn entries_are_kept_per_tenant_newest_first() {
        for store in crate::testing::stores().await {
            kept_per_tenant(&store).await;
        }
    }

    async fn kept_per_tenant(store: &Store) {
        let entry = |tenant: &str, rule: &str| AuditEntry {
            at: 0,
            tenant: tenant.into(),
            key_id: Some("key_1".into()),
            source: "user".into(),
            category: "prompt_injection".into(),
            rule: rule.into(),
            action: "block".into(),
            score: 0.95,
        };
        store
            .audit(&[entry("acme", "ignore_previous"), entry("zeta", "dan")])
            .await
            .unwrap();
        store.audit(&[entry("acme", "classifier")]).await.unwrap();
        let acme = store.audit_log(Some("acme"), 10).await.unwrap();
        let rules: Vec<&str> = acme.iter().map(|e| e.rule.as_str()).collect();
        assert_eq!(rules, ["classifier", "ignore_previous"]);
        assert!(acme[0].at > 0);
        assert_eq!(store.audit_log(None, 10).await.unwrap().len(), 3);
        assert_eq!(store.audit_log(None, 1).await.unwrap().len(), 1);
    }
}
