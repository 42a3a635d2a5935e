//! Per-tenant feature flags, read at request time from the store and changed there (`osprey
//! flags`, `/admin/flags`) without a restart. The flags in force are kept in memory; at most
//! once a second a request reads the store's `flags` change counter, and a change reloads them
//! all, so every replica follows within about a second. While the store cannot be read, the
//! flags last read stay in force.
//!
//! The flags the gateway reads:
//! - `policy` (a string): the safety policy the tenant's requests run, instead of its
//!   configured one (it must name a configured policy; else the configured one stays);
//! - `tier.NAME` (`false`): `auto` never picks tier NAME for the tenant;
//! - `prompt.NAME.label` (a string): the label a request naming prompt NAME gets when it gives
//!   neither label nor version.
//! - `memory` (`true`): chats get their user's facts unless they say `"memory": false`;
//! - `memory.extract` (`true`): facts a named user states are kept (`osprey_context::memory`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use crate::Store;
use serde_json::{Map, Value};

/// How long a request waits for the store when reloading flags, before going on with those it has.
const READ_TIMEOUT: Duration = Duration::from_millis(250);

/// A tenant's flags.
pub type TenantFlags = Arc<Map<String, Value>>;

/// The flags in force, per tenant.
#[derive(Default)]
pub struct Flags {
    by_tenant: RwLock<HashMap<String, TenantFlags>>,
    /// The store's change counter when they were read (-1: never).
    version: AtomicI64,
    /// When the counter was last read, Unix ms.
    checked_at: AtomicI64,
    reload: tokio::sync::Mutex<()>,
}

impl Flags {
    /// Empty, to be read on first use.
    pub fn new() -> Self {
        Self {
            version: AtomicI64::new(-1),
            ..Self::default()
        }
    }

    /// The flags of `tenant`, reloaded first if the store says they changed (checked at most
    /// once a second).
    pub async fn of(&self, store: Option<&Store>, tenant: &str) -> TenantFlags {
        if let Some(store) = store {
            let now = crate::now_ms();
            let due = now - self.checked_at.load(Ordering::Relaxed) >= 1000;
            if due && let Ok(_one) = self.reload.try_lock() {
                self.checked_at.store(now, Ordering::Relaxed);
                if let Err(e) = tokio::time::timeout(READ_TIMEOUT, self.reload(store)).await {
                    tracing::warn!(error = %e, "reading the feature flags timed out; keeping those in force");
                }
            }
        }
        let by_tenant = self.by_tenant.read().expect("flags lock");
        by_tenant.get(tenant).cloned().unwrap_or_default()
    }

    async fn reload(&self, store: &Store) {
        let version = match store.change_counter("flags").await {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(error = %e, "reading the feature flags failed; keeping those in force");
                return;
            }
        };
        if version == self.version.load(Ordering::Relaxed) {
            return;
        }
        let records = match store.flags().await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "reading the feature flags failed; keeping those in force");
                return;
            }
        };
        let mut by_tenant: HashMap<String, Map<String, Value>> = HashMap::new();
        for r in records {
            let value = serde_json::from_str(&r.value).unwrap_or(Value::String(r.value));
            by_tenant.entry(r.tenant).or_default().insert(r.flag, value);
        }
        *self.by_tenant.write().expect("flags lock") = by_tenant
            .into_iter()
            .map(|(t, m)| (t, Arc::new(m)))
            .collect();
        self.version.store(version, Ordering::Relaxed);
        tracing::info!(version, "feature flags reloaded");
    }
}

/// The policy flag, if set.
pub fn policy(flags: &Map<String, Value>) -> Option<&str> {
    flags.get("policy").and_then(Value::as_str)
}

/// Whether tier `name` is turned off.
pub fn tier_off(flags: &Map<String, Value>, name: &str) -> bool {
    flags.get(&format!("tier.{name}")) == Some(&Value::Bool(false))
}

/// The default label of prompt `name`, if set.
pub fn prompt_label<'a>(flags: &'a Map<String, Value>, name: &str) -> Option<&'a str> {
    flags
        .get(&format!("prompt.{name}.label"))
        .and_then(Value::as_str)
}
