//! Who is calling: API keys from `Authorization: Bearer` or `api-key`, checked against the
//! store's hashes through an in-memory cache.
//!
//! The cache holds every key, reloaded whenever the store's key counter moves (polled each
//! second, so a key created or revoked by another process counts within a second; with Redis,
//! revocation reaches every replica before the revoker returns, through the limiter's
//! revocation feed). Last-use
//! times are collected in memory and written in one batch a second.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use axum::http::HeaderMap;
use osprey_core::metrics as names;
use osprey_core::{Error, ErrorKind};
use osprey_store::keys::hash_secret;
use osprey_store::{KeyRecord, Store, StoreError, now_ms};

/// Checks API keys.
pub struct Authenticator {
    store: Option<Store>,
    /// Every key by hash, as of `version`.
    keys: RwLock<HashMap<String, Arc<KeyRecord>>>,
    version: AtomicI64,
    /// Whether any key (active or not) exists: if none, the server is open.
    any_key: AtomicBool,
    /// Key id → last use (Unix ms), not yet written.
    uses: Mutex<HashMap<String, i64>>,
}

impl Authenticator {
    /// An authenticator over `store`'s keys, loaded now.
    pub async fn new(store: Store) -> Result<Arc<Self>, StoreError> {
        let auth = Arc::new(Self::build(Some(store)));
        auth.refresh().await?;
        Ok(auth)
    }

    /// No store, no keys: every request is let in.
    pub fn open() -> Arc<Self> {
        Arc::new(Self::build(None))
    }

    fn build(store: Option<Store>) -> Self {
        Self {
            store,
            keys: RwLock::default(),
            version: AtomicI64::new(-1),
            any_key: AtomicBool::new(false),
            uses: Mutex::default(),
        }
    }

    /// Whether requests need no key (no key was ever created).
    pub fn is_open(&self) -> bool {
        !self.any_key.load(Ordering::Relaxed)
    }

    /// The store the keys live in.
    pub fn store(&self) -> Option<&Store> {
        self.store.as_ref()
    }

    /// Reloads the keys if the store says they changed.
    pub async fn refresh(&self) -> Result<(), StoreError> {
        let Some(store) = &self.store else {
            return Ok(());
        };
        let version = store.change_counter("keys").await?;
        if version == self.version.load(Ordering::Relaxed) {
            return Ok(());
        }
        let keys: HashMap<String, Arc<KeyRecord>> = store
            .list_keys()
            .await?
            .into_iter()
            .map(|k| (k.hash.clone(), Arc::new(k)))
            .collect();
        // Once a key has existed the server stays closed, even if every key is revoked.
        let any = !keys.is_empty();
        *self.keys.write().expect("keys lock") = keys;
        self.any_key.store(any, Ordering::Relaxed);
        self.version.store(version, Ordering::Relaxed);
        Ok(())
    }

    /// Forgets a key this process revoked, before the next reload.
    pub fn forget(&self, id: &str) {
        self.keys
            .write()
            .expect("keys lock")
            .retain(|_, k| k.id != id);
    }

    /// The caller's key: `Ok(None)` for a request without a valid key on an open server; 401
    /// when a key is needed and missing, unknown, expired or revoked.
    ///
    /// An Osprey key (`osk-…`) is always checked, even on an open server, so a key created
    /// by another process works, and closes the server, from its first use.
    pub async fn authenticate(&self, headers: &HeaderMap) -> Result<Option<Arc<KeyRecord>>, Error> {
        let secret = presented_key(headers);
        let ours = secret.filter(|s| s.starts_with(osprey_store::keys::SECRET_PREFIX));
        if self.is_open() && ours.is_none() {
            return Ok(None);
        }
        let Some(secret) = secret else {
            return Err(unauthorized(
                "No API key was given. Send it as `Authorization: Bearer KEY` (or `api-key: KEY`).",
            ));
        };
        let key = self.lookup(secret).await?;
        let now = now_ms();
        match key {
            Some(k) if k.is_active(now) => {
                self.any_key.store(true, Ordering::Relaxed);
                self.uses
                    .lock()
                    .expect("uses lock")
                    .insert(k.id.clone(), now);
                Ok(Some(k))
            }
            Some(k) if k.revoked_at.is_some() => {
                Err(unauthorized("This API key has been revoked."))
            }
            Some(_) => Err(unauthorized("This API key has expired.")),
            None => Err(unauthorized("Incorrect API key provided.")),
        }
    }

    /// The key with this secret: from the cache, else (created since the last reload?) the
    /// store.
    async fn lookup(&self, secret: &str) -> Result<Option<Arc<KeyRecord>>, Error> {
        let hash = hash_secret(secret);
        if let Some(k) = self.keys.read().expect("keys lock").get(&hash) {
            return Ok(Some(k.clone()));
        }
        let Some(store) = &self.store else {
            return Ok(None);
        };
        let found = (store.key_by_hash(&hash).await).map_err(osprey_core::Error::from)?;
        let found = found.map(Arc::new);
        if let Some(k) = &found {
            self.keys
                .write()
                .expect("keys lock")
                .insert(hash, k.clone());
        }
        Ok(found)
    }

    /// Reloads changed keys and writes last-use times, every second, until the process ends.
    pub fn spawn_refresh_task(self: &Arc<Self>) {
        let this = Arc::clone(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                if let Err(e) = this.refresh().await {
                    tracing::warn!(error = %e, "reloading API keys failed");
                }
                let uses: Vec<(String, i64)> =
                    this.uses.lock().expect("uses lock").drain().collect();
                if let (Some(store), false) = (&this.store, uses.is_empty())
                    && let Err(e) = store.touch_keys(&uses).await
                {
                    tracing::warn!(error = %e, "recording key use failed");
                }
            }
        });
    }
}

/// The key a request presents, if any.
pub fn presented_key(headers: &HeaderMap) -> Option<&str> {
    let bearer = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        });
    bearer
        .or_else(|| headers.get("api-key").and_then(|v| v.to_str().ok()))
        .map(str::trim)
        .filter(|k| !k.is_empty())
}

/// A 401 in OpenAI's terms.
pub fn unauthorized(message: &str) -> Error {
    metrics::counter!(names::AUTH_FAILURES).increment(1);
    Error::new(ErrorKind::Unauthorized, message).with_code("invalid_api_key")
}
