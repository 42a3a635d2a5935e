//! Per-tenant feature flags: a name and a JSON value each. Every change bumps the `flags`
//! change counter in the same transaction, so servers notice it with one cheap read.

use crate::{Result, Store, StoreError, now_ms};

/// A flag as stored.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct FlagRecord {
    /// The tenant it applies to.
    pub tenant: String,
    /// Its name (`policy`, `tier.large`, `prompt.support.label`, ...).
    pub flag: String,
    /// Its value, JSON.
    pub value: String,
    /// When it last changed, Unix ms.
    pub updated_at: i64,
}

impl Store {
    /// Sets flag `flag` of `tenant` to `value` (JSON).
    pub async fn set_flag(&self, tenant: &str, flag: &str, value: &str) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        sqlx::query(
            "INSERT INTO feature_flags (tenant, flag, value, updated_at) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (tenant, flag) DO UPDATE SET value = $3, updated_at = $4",
        )
        .bind(tenant)
        .bind(flag)
        .bind(value)
        .bind(now_ms())
        .execute(&mut *tx)
        .await?;
        crate::bump_counter(&mut tx, "flags").await?;
        tx.commit().await?;
        Ok(())
    }

    /// Removes flag `flag` of `tenant`.
    pub async fn unset_flag(&self, tenant: &str, flag: &str) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        let deleted = sqlx::query("DELETE FROM feature_flags WHERE tenant = $1 AND flag = $2")
            .bind(tenant)
            .bind(flag)
            .execute(&mut *tx)
            .await?;
        if deleted.rows_affected() == 0 {
            return Err(StoreError::NotFound(format!(
                "flag {flag} of tenant {tenant}"
            )));
        }
        crate::bump_counter(&mut tx, "flags").await?;
        tx.commit().await?;
        Ok(())
    }

    /// Every flag, by tenant and name.
    pub async fn flags(&self) -> Result<Vec<FlagRecord>> {
        Ok(sqlx::query_as(
            "SELECT tenant, flag, value, updated_at FROM feature_flags ORDER BY tenant, flag",
        )
        .fetch_all(&self.pool)
        .await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn flags_are_set_replaced_and_removed() {
        for s in crate::testing::stores().await {
            let before = s.change_counter("flags").await.unwrap();
            s.set_flag("acme", "policy", r#""strict""#).await.unwrap();
            s.set_flag("acme", "policy", r#""open""#).await.unwrap();
            s.set_flag("zeta", "tier.large", "false").await.unwrap();
            let all = s.flags().await.unwrap();
            let pairs: Vec<(&str, &str, &str)> = (all.iter())
                .map(|f| (f.tenant.as_str(), f.flag.as_str(), f.value.as_str()))
                .collect();
            assert_eq!(
                pairs,
                [
                    ("acme", "policy", r#""open""#),
                    ("zeta", "tier.large", "false")
                ]
            );
            assert_eq!(s.change_counter("flags").await.unwrap(), before + 3);
            s.unset_flag("acme", "policy").await.unwrap();
            assert!(matches!(
                s.unset_flag("acme", "policy").await,
                Err(StoreError::NotFound(_))
            ));
            assert_eq!(s.flags().await.unwrap().len(), 1);
        }
    }
}
