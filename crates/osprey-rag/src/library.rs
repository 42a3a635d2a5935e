//! A tenant's collections, each in `<root>/<tenant>/<name>/` (the root is
//! `$OSPREY_HOME/collections`), opened once and shared.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use crate::{Collection, RagError, now_ms};

/// The collections under one root.
pub struct Library {
    root: PathBuf,
    open: Mutex<HashMap<(String, String), Arc<Collection>>>,
}

/// A collection overdue for re-indexing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stale {
    /// Its tenant.
    pub tenant: String,
    /// Its name.
    pub name: String,
    /// Seconds since it was last indexed.
    pub age_seconds: u64,
}

impl Library {
    /// The collections under `root`.
    pub fn new(root: PathBuf) -> Self {
        Self {
            root,
            open: Mutex::new(HashMap::new()),
        }
    }

    /// The collections under `$OSPREY_HOME/collections`.
    pub fn at_home() -> Self {
        Self::new(osprey_models::osprey_home().join("collections"))
    }

    fn dir(&self, tenant: &str, name: &str) -> Result<PathBuf, RagError> {
        valid_name(name)?;
        // Tenant names are the operator's, but never let one walk out of the root.
        let tenant: String = (tenant.chars())
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        Ok(self
            .root
            .join(if tenant.is_empty() { "_" } else { &tenant })
            .join(name))
    }

    /// Tenant `tenant`'s collection `name`, created if `create`, else `None` if it does not
    /// exist.
    pub fn get(
        &self,
        tenant: &str,
        name: &str,
        create: bool,
    ) -> Result<Option<Arc<Collection>>, RagError> {
        let dir = self.dir(tenant, name)?;
        let key = (tenant.to_owned(), name.to_owned());
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = open.get(&key) {
            return Ok(Some(c.clone()));
        }
        if !create && !dir.exists() {
            return Ok(None);
        }
        let collection = Arc::new(Collection::open(&dir)?);
        open.insert(key, collection.clone());
        Ok(Some(collection))
    }

    /// The names of tenant `tenant`'s collections.
    pub fn names(&self, tenant: &str) -> Vec<String> {
        let Ok(dir) = self.dir(tenant, "x") else {
            return Vec::new();
        };
        let parent = dir.parent().map(PathBuf::from).unwrap_or_default();
        let mut names: Vec<String> = (std::fs::read_dir(parent).into_iter().flatten())
            .filter_map(|e| e.ok())
            .filter(|e| e.path().is_dir())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| valid_name(n).is_ok())
            .collect();
        names.sort();
        names
    }

    /// Deletes tenant `tenant`'s collection `name`; whether it existed.
    pub fn delete(&self, tenant: &str, name: &str) -> Result<bool, RagError> {
        let dir = self.dir(tenant, name)?;
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        open.remove(&(tenant.to_owned(), name.to_owned()));
        if !dir.exists() {
            return Ok(false);
        }
        std::fs::remove_dir_all(&dir)
            .map_err(|e| RagError::Io(format!("{}: {e}", dir.display())))?;
        Ok(true)
    }

    /// Collections with a re-index interval that were last indexed longer ago than it.
    pub fn stale(&self) -> Vec<Stale> {
        let now = now_ms();
        let mut stale = Vec::new();
        let tenants = (std::fs::read_dir(&self.root).into_iter().flatten()).filter_map(|e| e.ok());
        for tenant in tenants {
            let tenant = tenant.file_name().to_string_lossy().into_owned();
            for name in self.names(&tenant) {
                let dir = self.root.join(&tenant).join(&name);
                let Ok(meta) = crate::collection::read_meta(&dir) else {
                    continue;
                };
                let (Some(interval), Some(last)) =
                    (meta.reindex_interval_seconds, meta.last_indexed_at)
                else {
                    continue;
                };
                let age_seconds = ((now - last).max(0) / 1000) as u64;
                if age_seconds > interval {
                    stale.push(Stale {
                        tenant: tenant.clone(),
                        name,
                        age_seconds,
                    });
                }
            }
        }
        stale
    }
}

/// Whether `name` can name a collection: 1 to 64 of letters, digits, `-`, `_` and `.`, not
/// starting with `.`.
pub fn valid_name(name: &str) -> Result<(), RagError> {
    let ok = (1..=64).contains(&name.len())
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    if ok {
        Ok(())
    } else {
        Err(RagError::Name(format!(
            "{name:?} is not a collection name (1 to 64 letters, digits, '-', '_' or '.', not starting with '.')"
        )))
    }
}
