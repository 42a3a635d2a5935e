//! API keys: random secrets with 256 bits of entropy, stored only as SHA-256 hashes, each
//! belonging to a tenant, with optional per-key limits, an expiry, and a revocation time.

use rand::RngCore;
use sha2::{Digest, Sha256};

use crate::{Result, Store, StoreError, now_ms};

/// What identifies an Osprey key at a glance (`osk-…`).
pub const SECRET_PREFIX: &str = "osk-";

/// A key as stored (never its secret).
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct KeyRecord {
    /// Public id (`key_…`), used to list and revoke.
    pub id: String,
    /// SHA-256 of the secret, hex.
    pub hash: String,
    /// The secret's first characters, to recognise it in listings.
    pub prefix: String,
    /// The tenant the key acts for.
    pub tenant: String,
    /// A label for people.
    pub name: Option<String>,
    /// Requests per minute for this key, overriding the tenant's per-key default.
    pub rpm: Option<i64>,
    /// Tokens per minute for this key, overriding the tenant's per-key default.
    pub tpm: Option<i64>,
    /// Creation time, Unix ms.
    pub created_at: i64,
    /// Expiry, Unix ms.
    pub expires_at: Option<i64>,
    /// Last use seen by a server, Unix ms (written in batches, so up to a few seconds old).
    pub last_used_at: Option<i64>,
    /// Revocation time, Unix ms.
    pub revoked_at: Option<i64>,
    /// ACL groups its requests belong to, comma-separated (see [`KeyRecord::groups`]).
    pub acl_groups: String,
    /// Tool scopes the key is granted, comma-separated; `None`: its tenant's.
    pub tool_scopes: Option<String>,
}

impl KeyRecord {
    /// The ACL groups its requests belong to.
    pub fn groups(&self) -> Vec<String> {
        (self.acl_groups.split(',').map(str::trim))
            .filter(|g| !g.is_empty())
            .map(str::to_owned)
            .collect()
    }

    /// Whether the key may be used at `now_ms`.
    pub fn is_active(&self, now_ms: i64) -> bool {
        self.revoked_at.is_none() && self.expires_at.is_none_or(|e| e > now_ms)
    }
}

/// What `create_key` needs.
#[derive(Clone, Debug, Default)]
pub struct NewKey {
    /// The tenant the key acts for.
    pub tenant: String,
    /// A label for people.
    pub name: Option<String>,
    /// Expiry, Unix ms.
    pub expires_at: Option<i64>,
    /// Requests per minute for this key.
    pub rpm: Option<i64>,
    /// Tokens per minute for this key.
    pub tpm: Option<i64>,
    /// ACL groups its requests belong to.
    pub groups: Vec<String>,
    /// Tool scopes it is granted (within its tenant's); `None`: the tenant's.
    pub tool_scopes: Option<Vec<String>>,
}

impl NewKey {
    /// A key for `tenant` with no limits of its own and no expiry.
    pub fn for_tenant(tenant: &str) -> Self {
        Self {
            tenant: tenant.to_owned(),
            ..Self::default()
        }
    }
}

/// A freshly created key: the only time its secret exists outside the caller's hands.
#[derive(Clone, Debug)]
pub struct CreatedKey {
    /// The stored record.
    pub record: KeyRecord,
    /// The secret to hand to the client.
    pub secret: String,
}

/// SHA-256 of a secret, hex: what the store keeps and looks keys up by.
pub fn hash_secret(secret: &str) -> String {
    let digest = Sha256::digest(secret.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

pub(crate) fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    rand::rng().fill_bytes(&mut buf);
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

/// The key columns in `KeyRecord`'s order, spliced into SQL text at compile time (sqlx accepts
/// only static SQL).
macro_rules! columns {
    () => {
        "id, hash, prefix, tenant, name, rpm, tpm, created_at, expires_at, last_used_at, revoked_at, acl_groups, tool_scopes"
    };
}

macro_rules! select_keys {
    ($rest:literal) => {
        concat!("SELECT ", columns!(), " FROM api_keys ", $rest)
    };
}

impl Store {
    /// Creates a key and returns it with its secret.
    pub async fn create_key(&self, new: NewKey) -> Result<CreatedKey> {
        let secret = format!("{SECRET_PREFIX}{}", random_hex(32));
        let record = KeyRecord {
            id: format!("key_{}", random_hex(8)),
            hash: hash_secret(&secret),
            prefix: secret[..SECRET_PREFIX.len() + 6].to_owned(),
            tenant: new.tenant,
            name: new.name,
            rpm: new.rpm,
            tpm: new.tpm,
            created_at: now_ms(),
            expires_at: new.expires_at,
            last_used_at: None,
            revoked_at: None,
            acl_groups: new.groups.join(","),
            tool_scopes: new.tool_scopes.map(|s| s.join(",")),
        };
        let mut tx = self.pool.begin().await?;
        sqlx::query(concat!(
            "INSERT INTO api_keys (",
            columns!(),
            ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)"
        ))
        .bind(&record.id)
        .bind(&record.hash)
        .bind(&record.prefix)
        .bind(&record.tenant)
        .bind(&record.name)
        .bind(record.rpm)
        .bind(record.tpm)
        .bind(record.created_at)
        .bind(record.expires_at)
        .bind(record.last_used_at)
        .bind(record.revoked_at)
        .bind(&record.acl_groups)
        .bind(&record.tool_scopes)
        .execute(&mut *tx)
        .await?;
        crate::bump_counter(&mut tx, "keys").await?;
        tx.commit().await?;
        Ok(CreatedKey { record, secret })
    }

    /// Every key, newest first.
    pub async fn list_keys(&self) -> Result<Vec<KeyRecord>> {
        let sql = select_keys!("ORDER BY created_at DESC, id");
        Ok(sqlx::query_as(sql).fetch_all(&self.pool).await?)
    }

    /// The key with this hash, active or not.
    pub async fn key_by_hash(&self, hash: &str) -> Result<Option<KeyRecord>> {
        Ok(sqlx::query_as(select_keys!("WHERE hash = $1"))
            .bind(hash)
            .fetch_optional(&self.pool)
            .await?)
    }

    /// The key whose secret this is, active or not.
    pub async fn key_by_secret(&self, secret: &str) -> Result<Option<KeyRecord>> {
        self.key_by_hash(&hash_secret(secret)).await
    }

    /// Revokes key `id` (idempotent) and returns it.
    pub async fn revoke_key(&self, id: &str) -> Result<KeyRecord> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("UPDATE api_keys SET revoked_at = $1 WHERE id = $2 AND revoked_at IS NULL")
            .bind(now_ms())
            .bind(id)
            .execute(&mut *tx)
            .await?;
        let record: Option<KeyRecord> = sqlx::query_as(select_keys!("WHERE id = $1"))
            .bind(id)
            .fetch_optional(&mut *tx)
            .await?;
        let record = record.ok_or_else(|| StoreError::NotFound(format!("key {id}")))?;
        crate::bump_counter(&mut tx, "keys").await?;
        tx.commit().await?;
        Ok(record)
    }

    /// Records when keys were last used: `(id, Unix ms)` pairs, written in one transaction.
    pub async fn touch_keys(&self, uses: &[(String, i64)]) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        for (id, at) in uses {
            sqlx::query(
                "UPDATE api_keys SET last_used_at = $1 WHERE id = $2 AND COALESCE(last_used_at, 0) < $1",
            )
            .bind(at)
            .bind(id)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn keys_are_stored_as_hashes_and_found_by_secret() {
        for store in crate::testing::stores().await {
            keys_are_stored_as_hashes(&store).await;
        }
    }

    async fn keys_are_stored_as_hashes(store: &crate::testing::TestStore) {
        let before = store.change_counter("keys").await.unwrap();
        let created = store
            .create_key(NewKey {
                rpm: Some(10),
                name: Some("ci".into()),
                ..NewKey::for_tenant("acme")
            })
            .await
            .unwrap();
        assert!(created.secret.starts_with(SECRET_PREFIX));
        assert_eq!(created.secret.len(), SECRET_PREFIX.len() + 64);
        assert_ne!(created.record.hash, created.secret);
        if let Some(dir) = &store.dir {
            let db = std::fs::read(dir.join("osprey.db")).unwrap_or_default();
            let wal = std::fs::read(dir.join("osprey.db-wal")).unwrap_or_default();
            let needle = created.secret.as_bytes();
            for bytes in [db, wal] {
                assert!(
                    !bytes.windows(needle.len()).any(|w| w == needle),
                    "secret on disk"
                );
            }
        }
        let found = store.key_by_secret(&created.secret).await.unwrap().unwrap();
        assert_eq!(found, created.record);
        assert!(store.key_by_secret("osk-wrong").await.unwrap().is_none());
        assert!(store.change_counter("keys").await.unwrap() > before);
    }

    #[tokio::test]
    async fn revoked_and_expired_keys_are_inactive() {
        for store in crate::testing::stores().await {
            revoked_and_expired(&store).await;
        }
    }

    async fn revoked_and_expired(store: &Store) {
        let a = store.create_key(NewKey::for_tenant("a")).await.unwrap();
        let expired = NewKey {
            expires_at: Some(now_ms() - 1),
            ..NewKey::for_tenant("a")
        };
        let b = store.create_key(expired).await.unwrap();
        assert!(a.record.is_active(now_ms()));
        assert!(!b.record.is_active(now_ms()));
        let revoked = store.revoke_key(&a.record.id).await.unwrap();
        assert!(!revoked.is_active(now_ms()));
        assert!(matches!(
            store.revoke_key("key_missing").await,
            Err(StoreError::NotFound(_))
        ));
        store
            .touch_keys(&[(a.record.id.clone(), 42)])
            .await
            .unwrap();
        let listed = store.list_keys().await.unwrap();
        assert_eq!(listed.len(), 2);
        let a = listed.iter().find(|k| k.id == a.record.id).unwrap();
        assert_eq!(a.last_used_at, Some(42));
    }
}
