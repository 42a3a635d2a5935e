//! Forgetting a user: one call removes everything the store keeps of a tenant's user (their
//! conversations with items and summaries, facts, scratchpads, agent runs and request-log rows), in one
//! transaction, so a failure leaves nothing half deleted.

use crate::{Owner, Result, Store};

/// What deleting a user removed, by kind.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct UserDeleted {
    /// Conversations.
    pub conversations: u64,
    /// Their items.
    pub items: u64,
    /// Episodic facts.
    pub facts: u64,
    /// Working-memory scratchpads.
    pub working: u64,
    /// Request-log rows.
    pub requests: u64,
    /// Agent runs (with their steps).
    pub runs: u64,
}

impl Store {
    /// Deletes everything the store keeps of `owner`.
    pub async fn delete_user(&self, owner: &Owner) -> Result<UserDeleted> {
        let mut tx = self.pool.begin().await?;
        let mut count = async |sql: &str| -> Result<u64> {
            let done = sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()))
                .bind(&owner.tenant)
                .bind(&owner.user)
                .execute(&mut *tx)
                .await?;
            Ok(done.rows_affected())
        };
        let theirs = "SELECT id FROM conversations WHERE tenant = $1 AND user_id = $2";
        let deleted = UserDeleted {
            items: count(&format!(
                "DELETE FROM conversation_items WHERE conversation_id IN ({theirs})"
            ))
            .await?,
            conversations: {
                count(&format!(
                    "DELETE FROM conversation_summaries WHERE conversation_id IN ({theirs})"
                ))
                .await?;
                count("DELETE FROM conversations WHERE tenant = $1 AND user_id = $2").await?
            },
            facts: count("DELETE FROM memory_facts WHERE tenant = $1 AND user_id = $2").await?,
            working: count("DELETE FROM working_memory WHERE tenant = $1 AND user_id = $2").await?,
            requests: count("DELETE FROM request_log WHERE tenant = $1 AND user_id = $2").await?,
            runs: {
                count(
                    "DELETE FROM agent_steps WHERE run_id IN \
                     (SELECT id FROM agent_runs WHERE tenant = $1 AND user_id = $2)",
                )
                .await?;
                count("DELETE FROM agent_runs WHERE tenant = $1 AND user_id = $2").await?
            },
        };
        tx.commit().await?;
        Ok(deleted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{NewItem, RequestLogEntry};

    #[tokio::test]
    async fn deleting_a_user_leaves_nothing_of_theirs_and_everything_of_others() {
        for store in crate::testing::stores().await {
            let alice = Owner {
                tenant: "acme".into(),
                user: "alice".into(),
            };
            let others = [
                Owner {
                    tenant: "acme".into(),
                    user: "bob".into(),
                },
                Owner {
                    tenant: "globex".into(),
                    user: "alice".into(),
                },
            ];
            for owner in std::iter::once(&alice).chain(&others) {
                let hi = [
                    NewItem::new("user", "hi"),
                    NewItem::new("assistant", "hello"),
                ];
                store.create_conversation(owner, "{}", &hi).await.unwrap();
                store.add_fact(owner, "likes tea", "api").await.unwrap();
                store.set_working(owner, "plan", "x", 60_000).await.unwrap();
                let row = RequestLogEntry {
                    id: "r".into(),
                    tenant: owner.tenant.clone(),
                    user_id: owner.user.clone(),
                    injected: "{}".into(),
                    ..RequestLogEntry::default()
                };
                store.log_requests(&[row]).await.unwrap();
            }
            let deleted = store.delete_user(&alice).await.unwrap();
            let expected = UserDeleted {
                conversations: 1,
                items: 2,
                facts: 1,
                working: 1,
                requests: 1,
                runs: 0,
            };
            assert_eq!(deleted, expected);
            assert_eq!(
                store.delete_user(&alice).await.unwrap(),
                UserDeleted::default()
            );
            for other in &others {
                assert_eq!(store.facts(other).await.unwrap().len(), 1);
                assert!(store.working(other, "plan").await.is_ok());
            }
        }
    }
}
