//! Layered memory of a tenant's user, beside their conversations:
//! - **episodic**: durable facts and preferences ("prefers concise answers"), added through
//!   the API or extracted from what the user says, listed and deleted by the user; the same
//!   text is kept once;
//! - **working**: named scratchpads of a multi-step task or agent run, each with an expiry;
//!   an expired one reads as absent and is purged on the next write;
//! - **session**: the summary of a conversation's older turns, through the item it covers
//!   (the recent turns themselves are the conversation's items).
//!
//! Every read and write names the [`Owner`]; another owner's record is not found.

use crate::keys::random_hex;
use crate::{Owner, Result, Store, StoreError, now_ms};

/// A durable fact about a user.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct FactRecord {
    /// `fact_…`.
    pub id: String,
    /// The fact, as text.
    pub content: String,
    /// `api` (added by a caller) or `extracted` (from the user's own words).
    pub source: String,
    /// When it was added, Unix ms.
    pub created_at: i64,
}

/// A scratchpad of a task.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct WorkingRecord {
    /// Its name, chosen by the caller.
    pub name: String,
    /// Its text.
    pub content: String,
    /// When it was last written, Unix ms.
    pub updated_at: i64,
    /// When it expires, Unix ms.
    pub expires_at: i64,
}

/// The summary of a conversation's older turns.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct SummaryRecord {
    /// The newest item it covers (its `seq`): the items after it are not in it.
    pub through_seq: i64,
    /// The summary.
    pub content: String,
}

/// Now in Unix ms, but always after the last fact this process added: two facts added in one
/// millisecond still list newest first.
fn fact_time() -> i64 {
    static LAST: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(0);
    let now = now_ms();
    let prev = LAST.fetch_max(now, std::sync::atomic::Ordering::Relaxed);
    match prev >= now {
        true => LAST.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1,
        false => now,
    }
}

impl Store {
    /// Adds fact `content` of `owner` (from `source`); the same text again is the fact kept
    /// before.
    pub async fn add_fact(&self, owner: &Owner, content: &str, source: &str) -> Result<FactRecord> {
        let id = format!("fact_{}", random_hex(12));
        sqlx::query(
            "INSERT INTO memory_facts (id, tenant, user_id, content, source, created_at) \
             VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (tenant, user_id, content) DO NOTHING",
        )
        .bind(&id)
        .bind(&owner.tenant)
        .bind(&owner.user)
        .bind(content)
        .bind(source)
        .bind(fact_time())
        .execute(&self.pool)
        .await?;
        sqlx::query_as(
            "SELECT id, content, source, created_at FROM memory_facts \
             WHERE tenant = $1 AND user_id = $2 AND content = $3",
        )
        .bind(&owner.tenant)
        .bind(&owner.user)
        .bind(content)
        .fetch_optional(&self.pool)
        .await?
        .ok_or_else(|| StoreError::NotFound("fact".into()))
    }

    /// The facts of `owner`, newest first.
    pub async fn facts(&self, owner: &Owner) -> Result<Vec<FactRecord>> {
        Ok(sqlx::query_as(
            "SELECT id, content, source, created_at FROM memory_facts \
             WHERE tenant = $1 AND user_id = $2 ORDER BY created_at DESC, id",
        )
        .bind(&owner.tenant)
        .bind(&owner.user)
        .fetch_all(&self.pool)
        .await?)
    }

    /// Deletes fact `id` of `owner`.
    pub async fn delete_fact(&self, owner: &Owner, id: &str) -> Result<()> {
        let deleted =
            sqlx::query("DELETE FROM memory_facts WHERE id = $1 AND tenant = $2 AND user_id = $3")
                .bind(id)
                .bind(&owner.tenant)
                .bind(&owner.user)
                .execute(&self.pool)
                .await?;
        match deleted.rows_affected() {
            0 => Err(StoreError::NotFound(format!("fact {id}"))),
            _ => Ok(()),
        }
    }

    /// Writes scratchpad `name` of `owner`, to expire `ttl_ms` from now; purges expired ones.
    pub async fn set_working(
        &self,
        owner: &Owner,
        name: &str,
        content: &str,
        ttl_ms: i64,
    ) -> Result<WorkingRecord> {
        let now = now_ms();
        let record = WorkingRecord {
            name: name.to_owned(),
            content: content.to_owned(),
            updated_at: now,
            expires_at: now.saturating_add(ttl_ms),
        };
        let mut tx = self.pool.begin().await?;
        sqlx::query("DELETE FROM working_memory WHERE expires_at <= $1")
            .bind(now)
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "INSERT INTO working_memory (tenant, user_id, name, content, updated_at, expires_at) \
             VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (tenant, user_id, name) \
             DO UPDATE SET content = $4, updated_at = $5, expires_at = $6",
        )
        .bind(&owner.tenant)
        .bind(&owner.user)
        .bind(name)
        .bind(content)
        .bind(record.updated_at)
        .bind(record.expires_at)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(record)
    }

    /// Scratchpad `name` of `owner`, unless it expired.
    pub async fn working(&self, owner: &Owner, name: &str) -> Result<WorkingRecord> {
        sqlx::query_as(
            "SELECT name, content, updated_at, expires_at FROM working_memory \
             WHERE tenant = $1 AND user_id = $2 AND name = $3 AND expires_at > $4",
        )
        .bind(&owner.tenant)
        .bind(&owner.user)
        .bind(name)
        .bind(now_ms())
        .fetch_optional(&self.pool)
        .await?
        .ok_or_else(|| StoreError::NotFound(format!("working memory {name}")))
    }

    /// The scratchpads of `owner` that have not expired, by name.
    pub async fn working_list(&self, owner: &Owner) -> Result<Vec<WorkingRecord>> {
        Ok(sqlx::query_as(
            "SELECT name, content, updated_at, expires_at FROM working_memory \
             WHERE tenant = $1 AND user_id = $2 AND expires_at > $3 ORDER BY name",
        )
        .bind(&owner.tenant)
        .bind(&owner.user)
        .bind(now_ms())
        .fetch_all(&self.pool)
        .await?)
    }

    /// Deletes scratchpad `name` of `owner`.
    pub async fn delete_working(&self, owner: &Owner, name: &str) -> Result<()> {
        let deleted = sqlx::query(
            "DELETE FROM working_memory WHERE tenant = $1 AND user_id = $2 AND name = $3 \
             AND expires_at > $4",
        )
        .bind(&owner.tenant)
        .bind(&owner.user)
        .bind(name)
        .bind(now_ms())
        .execute(&self.pool)
        .await?;
        match deleted.rows_affected() {
            0 => Err(StoreError::NotFound(format!("working memory {name}"))),
            _ => Ok(()),
        }
    }

    /// The summary of conversation `id` of `owner`, if one was made.
    pub async fn summary(&self, owner: &Owner, id: &str) -> Result<Option<SummaryRecord>> {
        self.conversation(owner, id).await?;
        Ok(sqlx::query_as(
            "SELECT through_seq, content FROM conversation_summaries WHERE conversation_id = $1",
        )
        .bind(id)
        .fetch_optional(&self.pool)
        .await?)
    }

    /// Keeps `summary` as the summary of conversation `id` of `owner`.
    pub async fn set_summary(
        &self,
        owner: &Owner,
        id: &str,
        summary: &SummaryRecord,
    ) -> Result<()> {
        self.conversation(owner, id).await?;
        sqlx::query(
            "INSERT INTO conversation_summaries (conversation_id, through_seq, content, created_at) \
             VALUES ($1, $2, $3, $4) ON CONFLICT (conversation_id) \
             DO UPDATE SET through_seq = $2, content = $3, created_at = $4",
        )
        .bind(id)
        .bind(summary.through_seq)
        .bind(&summary.content)
        .bind(now_ms())
        .execute(&self.pool)
        .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::NewItem;

    fn owner(tenant: &str, user: &str) -> Owner {
        Owner {
            tenant: tenant.into(),
            user: user.into(),
        }
    }

    #[tokio::test]
    async fn memory_is_its_owners_alone() {
        for store in crate::testing::stores().await {
            memory_of_one_owner(&store).await;
        }
    }

    async fn memory_of_one_owner(s: &Store) {
        let alice = owner("acme", "alice");
        let others = [owner("globex", "alice"), owner("acme", "bob")];
        let concise = s
            .add_fact(&alice, "prefers concise answers", "api")
            .await
            .unwrap();
        let again = s
            .add_fact(&alice, "prefers concise answers", "extracted")
            .await
            .unwrap();
        assert_eq!(again, concise, "the same fact is kept once");
        s.add_fact(&alice, "lives in Lisbon", "extracted")
            .await
            .unwrap();
        assert_eq!(s.facts(&alice).await.unwrap().len(), 2);
        for other in &others {
            assert!(s.facts(other).await.unwrap().is_empty());
            assert!(s.delete_fact(other, &concise.id).await.is_err());
            assert!(s.working(other, "plan").await.is_err());
        }
        s.delete_fact(&alice, &concise.id).await.unwrap();
        let left = s.facts(&alice).await.unwrap();
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].content, "lives in Lisbon");

        s.set_working(&alice, "plan", "step 1", 60_000)
            .await
            .unwrap();
        s.set_working(&alice, "plan", "step 2", 60_000)
            .await
            .unwrap();
        assert_eq!(s.working(&alice, "plan").await.unwrap().content, "step 2");
        s.set_working(&alice, "gone", "x", -1).await.unwrap();
        assert!(matches!(
            s.working(&alice, "gone").await,
            Err(StoreError::NotFound(_))
        ));
        let names: Vec<String> = (s.working_list(&alice).await.unwrap().into_iter())
            .map(|w| w.name)
            .collect();
        assert_eq!(names, ["plan"]);
        s.delete_working(&alice, "plan").await.unwrap();
        assert!(s.working(&alice, "plan").await.is_err());

        let (c, items) = (s
            .create_conversation(&alice, "{}", &[NewItem::new("user", "hi")])
            .await)
            .unwrap();
        assert_eq!(s.summary(&alice, &c.id).await.unwrap(), None);
        let summary = SummaryRecord {
            through_seq: items[0].seq,
            content: "they said hi".into(),
        };
        s.set_summary(&alice, &c.id, &summary).await.unwrap();
        assert_eq!(s.summary(&alice, &c.id).await.unwrap(), Some(summary));
        assert!(s.summary(&others[1], &c.id).await.is_err());
    }
}
