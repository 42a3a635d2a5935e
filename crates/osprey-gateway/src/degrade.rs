//! The degradation ladder in the gateway (`osprey-router`'s [`Ladder`] decides the level):
//! the load observed is the share of `--max-in-flight` in use, sampled every
//! [`SAMPLE_EVERY`]; a request admitted while the ladder is up is degraded as its level says
//! (premium tenants two levels less) and its response carries `x-osprey-degraded: LEVEL`.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use axum::body::Bytes;
use osprey_core::{Error, ErrorKind};
use osprey_router::degrade::{Ladder, LadderConfig};

/// The header saying a response was degraded, and to which level.
pub const DEGRADED: &str = "x-osprey-degraded";
/// At level 1 and above, the largest `max_tokens` a request keeps.
pub const DEGRADED_MAX_TOKENS: u64 = 256;
/// How often the load is sampled.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(250);

/// The ladder and its current level.
#[derive(Debug)]
pub struct Degradation {
    ladder: Mutex<Ladder>,
    level: AtomicU8,
}

impl Default for Degradation {
    fn default() -> Self {
        Self {
            ladder: Mutex::new(Ladder::new(LadderConfig::default())),
            level: AtomicU8::new(0),
        }
    }
}

impl Degradation {
    /// Observes `load` (0..=1); returns the level, and exports it when it changed.
    pub fn observe(&self, load: f64) -> u8 {
        let level = self.ladder.lock().expect("ladder lock").observe(load);
        if self.level.swap(level, Ordering::Relaxed) != level {
            tracing::info!(level, load, "degradation level changed");
            metrics::gauge!(osprey_core::metrics::DEGRADATION_LEVEL).set(f64::from(level));
        }
        level
    }

    /// The current level (0: not degraded).
    pub fn level(&self) -> u8 {
        self.level.load(Ordering::Relaxed)
    }
}

/// `body` with `max_tokens` (or `max_completion_tokens`) at most `cap`; `None` if it already
/// is (or the body is not a JSON object).
pub fn cap_max_tokens(body: &Bytes, cap: u64) -> Option<Bytes> {
    let mut v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let object = v.as_object_mut()?;
    let field = match object.contains_key("max_completion_tokens") {
        true => "max_completion_tokens",
        false => "max_tokens",
    };
    if object
        .get(field)
        .and_then(|m| m.as_u64())
        .is_some_and(|m| m <= cap)
    {
        return None;
    }
    object.insert(field.to_owned(), cap.into());
    Some(serde_json::to_vec(&v).ok()?.into())
}

/// Whether `body` (or, when it says nothing, its tenant's default) asks for batch priority.
pub fn is_batch(body: &Bytes, tenant_default: osprey_core::Priority) -> bool {
    let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    match v["osprey"]["priority"].as_str() {
        Some(p) => p == "batch",
        None => tenant_default == osprey_core::Priority::Batch,
    }
}

/// The refusal of batch work at level 4.
pub fn deferred() -> Error {
    Error::new(
        ErrorKind::Unavailable,
        "The service is degraded under load and defers batch work; retry later.",
    )
    .with_code("degraded_batch_deferred")
    .with_retry_after(30)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_tokens_is_capped_only_when_larger() {
        let capped = cap_max_tokens(&Bytes::from_static(br#"{"max_tokens": 900}"#), 256).unwrap();
        assert_eq!(capped, Bytes::from_static(br#"{"max_tokens":256}"#));
        assert!(cap_max_tokens(&Bytes::from_static(br#"{"max_tokens": 16}"#), 256).is_none());
        let unset = cap_max_tokens(&Bytes::from_static(br#"{"model": "m"}"#), 256).unwrap();
        assert!(String::from_utf8_lossy(&unset).contains(r#""max_tokens":256"#));
        let newer = br#"{"max_completion_tokens": 1000}"#;
        let capped = cap_max_tokens(&Bytes::from_static(newer), 256).unwrap();
        assert!(String::from_utf8_lossy(&capped).contains(r#""max_completion_tokens":256"#));
    }
}
