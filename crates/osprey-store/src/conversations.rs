//! Conversations: an ordered list of messages (items) owned by one user of one tenant. Every
//! read and write names the owner, and a conversation of another owner is reported as not
//! found, so nobody learns that it exists.

use crate::keys::random_hex;
use crate::{Result, Store, StoreError, now_ms};

/// Whose a conversation is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    /// The tenant.
    pub tenant: String,
    /// The user within the tenant (`""` when the caller names none).
    pub user: String,
}

/// A conversation (without its items).
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct ConversationRecord {
    /// `conv_…`.
    pub id: String,
    /// Its tenant.
    pub tenant: String,
    /// Its user.
    pub user_id: String,
    /// The caller's metadata, a JSON object as text.
    pub metadata: String,
    /// Creation time, Unix ms.
    pub created_at: i64,
}

/// A message of a conversation.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct ItemRecord {
    /// Its place in the store's order of items: later items have larger ones.
    pub seq: i64,
    /// `msg_…`.
    pub id: String,
    /// Its conversation.
    pub conversation_id: String,
    /// `system`, `developer`, `user`, `assistant` or `tool`.
    pub role: String,
    /// Its text.
    pub content: String,
    /// When it was added, Unix ms.
    pub created_at: i64,
}

/// A message to add: role and text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewItem {
    /// The role.
    pub role: String,
    /// The text.
    pub content: String,
}

impl NewItem {
    /// A message of `role` saying `content`.
    pub fn new(role: &str, content: &str) -> Self {
        Self {
            role: role.to_owned(),
            content: content.to_owned(),
        }
    }
}

/// Which items of a conversation to list.
#[derive(Clone, Debug, Default)]
pub struct ItemPage<'a> {
    /// Items after this one (in the listing's order).
    pub after: Option<&'a str>,
    /// How many at most.
    pub limit: i64,
    /// Newest first.
    pub newest_first: bool,
}

const ITEM_COLUMNS: &str = "seq, id, conversation_id, role, content, created_at";

impl Store {
    /// Creates a conversation of `owner` holding `items`.
    pub async fn create_conversation(
        &self,
        owner: &Owner,
        metadata: &str,
        items: &[NewItem],
    ) -> Result<(ConversationRecord, Vec<ItemRecord>)> {
        let record = ConversationRecord {
            id: format!("conv_{}", random_hex(16)),
            tenant: owner.tenant.clone(),
            user_id: owner.user.clone(),
            metadata: metadata.to_owned(),
            created_at: now_ms(),
        };
        let mut tx = self.pool.begin().await?;
        sqlx::query(
            "INSERT INTO conversations (id, tenant, user_id, metadata, created_at) \
             VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(&record.id)
        .bind(&record.tenant)
        .bind(&record.user_id)
        .bind(&record.metadata)
        .bind(record.created_at)
        .execute(&mut *tx)
        .await?;
        let added = insert_items(&mut tx, &record.id, items).await?;
        tx.commit().await?;
        Ok((record, added))
    }

    /// Conversation `id`, if `owner` has it.
    pub async fn conversation(&self, owner: &Owner, id: &str) -> Result<ConversationRecord> {
        sqlx::query_as(
            "SELECT id, tenant, user_id, metadata, created_at FROM conversations \
             WHERE id = $1 AND tenant = $2 AND user_id = $3",
        )
        .bind(id)
        .bind(&owner.tenant)
        .bind(&owner.user)
        .fetch_optional(&self.pool)
        .await?
        .ok_or_else(|| StoreError::NotFound(format!("conversation {id}")))
    }

    /// Replaces the metadata of conversation `id` of `owner`.
    pub async fn update_conversation(
        &self,
        owner: &Owner,
        id: &str,
        metadata: &str,
    ) -> Result<ConversationRecord> {
        sqlx::query(
            "UPDATE conversations SET metadata = $1 WHERE id = $2 AND tenant = $3 AND user_id = $4",
        )
        .bind(metadata)
        .bind(id)
        .bind(&owner.tenant)
        .bind(&owner.user)
        .execute(&self.pool)
        .await?;
        self.conversation(owner, id).await
    }

    /// Deletes conversation `id` of `owner` and its items.
    pub async fn delete_conversation(&self, owner: &Owner, id: &str) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        let deleted =
            sqlx::query("DELETE FROM conversations WHERE id = $1 AND tenant = $2 AND user_id = $3")
                .bind(id)
                .bind(&owner.tenant)
                .bind(&owner.user)
                .execute(&mut *tx)
                .await?;
        if deleted.rows_affected() == 0 {
            return Err(StoreError::NotFound(format!("conversation {id}")));
        }
        for table in ["conversation_items", "conversation_summaries"] {
            let sql = format!("DELETE FROM {table} WHERE conversation_id = $1");
            sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(id)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Appends `items` to conversation `id` of `owner`, in order.
    pub async fn append_items(
        &self,
        owner: &Owner,
        id: &str,
        items: &[NewItem],
    ) -> Result<Vec<ItemRecord>> {
        self.conversation(owner, id).await?;
        let mut tx = self.pool.begin().await?;
        let added = insert_items(&mut tx, id, items).await?;
        tx.commit().await?;
        Ok(added)
    }

    /// A page of the items of conversation `id` of `owner`.
    pub async fn items(
        &self,
        owner: &Owner,
        id: &str,
        page: ItemPage<'_>,
    ) -> Result<Vec<ItemRecord>> {
        self.conversation(owner, id).await?;
        // The cursor is an item of this conversation; an unknown one starts from the edge.
        let cursor: Option<(i64,)> = match page.after {
            Some(after) => {
                sqlx::query_as(
                    "SELECT seq FROM conversation_items WHERE id = $1 AND conversation_id = $2",
                )
                .bind(after)
                .bind(id)
                .fetch_optional(&self.pool)
                .await?
            }
            None => None,
        };
        let sql = match page.newest_first {
            true => sqlx::AssertSqlSafe(format!(
                "SELECT {ITEM_COLUMNS} FROM conversation_items \
                 WHERE conversation_id = $1 AND seq < $2 ORDER BY seq DESC LIMIT $3"
            )),
            false => sqlx::AssertSqlSafe(format!(
                "SELECT {ITEM_COLUMNS} FROM conversation_items \
                 WHERE conversation_id = $1 AND seq > $2 ORDER BY seq LIMIT $3"
            )),
        };
        let edge = match page.newest_first {
            true => i64::MAX,
            false => 0,
        };
        Ok(sqlx::query_as(sql)
            .bind(id)
            .bind(cursor.map_or(edge, |c| c.0))
            .bind(page.limit)
            .fetch_all(&self.pool)
            .await?)
    }

    /// Up to `limit` items of conversation `id` of `owner` after the item with `seq`, oldest
    /// first.
    pub async fn items_since(
        &self,
        owner: &Owner,
        id: &str,
        seq: i64,
        limit: i64,
    ) -> Result<Vec<ItemRecord>> {
        self.conversation(owner, id).await?;
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {ITEM_COLUMNS} FROM conversation_items \
             WHERE conversation_id = $1 AND seq > $2 ORDER BY seq LIMIT $3"
        )))
        .bind(id)
        .bind(seq)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?)
    }

    /// Item `item` of conversation `id` of `owner`.
    pub async fn item(&self, owner: &Owner, id: &str, item: &str) -> Result<ItemRecord> {
        self.conversation(owner, id).await?;
        sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {ITEM_COLUMNS} FROM conversation_items WHERE id = $1 AND conversation_id = $2"
        )))
        .bind(item)
        .bind(id)
        .fetch_optional(&self.pool)
        .await?
        .ok_or_else(|| StoreError::NotFound(format!("item {item}")))
    }

    /// Deletes item `item` of conversation `id` of `owner`.
    /// The conversation's summary goes too, since it may tell of the item.
    pub async fn delete_item(&self, owner: &Owner, id: &str, item: &str) -> Result<()> {
        self.conversation(owner, id).await?;
        let mut tx = self.pool.begin().await?;
        let deleted =
            sqlx::query("DELETE FROM conversation_items WHERE id = $1 AND conversation_id = $2")
                .bind(item)
                .bind(id)
                .execute(&mut *tx)
                .await?;
        if deleted.rows_affected() == 0 {
            return Err(StoreError::NotFound(format!("item {item}")));
        }
        sqlx::query("DELETE FROM conversation_summaries WHERE conversation_id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }
}

async fn insert_items(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    conversation: &str,
    items: &[NewItem],
) -> Result<Vec<ItemRecord>> {
    let mut added = Vec::with_capacity(items.len());
    for item in items {
        let mut record = ItemRecord {
            seq: 0,
            id: format!("msg_{}", random_hex(16)),
            conversation_id: conversation.to_owned(),
            role: item.role.clone(),
            content: item.content.clone(),
            created_at: now_ms(),
        };
        (record.seq,) = sqlx::query_as(
            "INSERT INTO conversation_items (id, conversation_id, role, content, created_at) \
             VALUES ($1, $2, $3, $4, $5) RETURNING seq",
        )
        .bind(&record.id)
        .bind(&record.conversation_id)
        .bind(&record.role)
        .bind(&record.content)
        .bind(record.created_at)
        .fetch_one(&mut **tx)
        .await?;
        added.push(record);
    }
    Ok(added)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(tenant: &str, user: &str) -> Owner {
        Owner {
            tenant: tenant.into(),
            user: user.into(),
        }
    }

    fn say(role: &str, content: &str) -> NewItem {
        NewItem::new(role, content)
    }

    #[tokio::test]
    async fn conversations_keep_their_order_and_their_owner() {
        for store in crate::testing::stores().await {
            keep_order_and_owner(&store).await;
        }
    }

    async fn keep_order_and_owner(s: &Store) {
        let alice = owner("acme", "alice");
        let (c, first) = s
            .create_conversation(&alice, "{}", &[say("user", "hi")])
            .await
            .unwrap();
        let more = s
            .append_items(
                &alice,
                &c.id,
                &[say("assistant", "hello"), say("user", "bye")],
            )
            .await
            .unwrap();
        let page = |after, newest_first| ItemPage {
            after,
            limit: 10,
            newest_first,
        };
        let all = s.items(&alice, &c.id, page(None, false)).await.unwrap();
        let texts: Vec<&str> = all.iter().map(|i| i.content.as_str()).collect();
        assert_eq!(texts, ["hi", "hello", "bye"]);
        let newest = s.items(&alice, &c.id, page(None, true)).await.unwrap();
        assert_eq!(newest[0].content, "bye");
        let after = (s
            .items(&alice, &c.id, page(Some(&first[0].id), false))
            .await)
            .unwrap();
        assert_eq!(after.len(), 2);
        // Nobody else reads, writes or deletes it: not the same user of another tenant, not
        // another user of the same tenant.
        for other in [
            owner("globex", "alice"),
            owner("acme", "bob"),
            owner("acme", ""),
        ] {
            assert!(matches!(
                s.conversation(&other, &c.id).await,
                Err(StoreError::NotFound(_))
            ));
            assert!(s.items(&other, &c.id, page(None, false)).await.is_err());
            assert!(
                s.append_items(&other, &c.id, &[say("user", "x")])
                    .await
                    .is_err()
            );
            assert!(s.delete_item(&other, &c.id, &more[0].id).await.is_err());
            assert!(s.delete_conversation(&other, &c.id).await.is_err());
        }
        s.delete_item(&alice, &c.id, &more[0].id).await.unwrap();
        assert_eq!(
            s.items(&alice, &c.id, page(None, false))
                .await
                .unwrap()
                .len(),
            2
        );
        let updated = s
            .update_conversation(&alice, &c.id, r#"{"topic":"x"}"#)
            .await
            .unwrap();
        assert_eq!(updated.metadata, r#"{"topic":"x"}"#);
        s.delete_conversation(&alice, &c.id).await.unwrap();
        assert!(s.conversation(&alice, &c.id).await.is_err());
        assert!(s.item(&alice, &c.id, &first[0].id).await.is_err());
    }
}
