//! The semantic response cache, opt-in per tenant (flag `cache.semantic`: `true`, or the
//! similarity threshold): a deterministic chat request whose last user message means what an
//! earlier one's did, with everything else the same (the tenant's cache scope, the user's when
//! their context is in the prompt, model, settings, prompt version, system prompt and earlier
//! turns), gets the earlier answer.
//!
//! - **Match**: the request's context is the exact cache's key of the request with its last
//!   user message blanked; that message is embedded with all-MiniLM-L6-v2
//!   ([`osprey_engine::Embedder`]), and the kept answer of the same context whose message is
//!   nearest, if its cosine similarity reaches the threshold, answers.
//! - **Kept**: beside the exact cache's entries, in this process (not shared through Redis),
//!   at most [`CAPACITY`] answers for the exact cache's TTL, oldest dropped first; a user's
//!   go with [`crate::cache::ResponseCache::forget`].
//! - **Seen**: `x-osprey-cache: hit` with `x-osprey-cache-similarity`, and
//!   `osprey_semantic_cache_total{result}`.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use osprey_store::Owner;
use serde_json::{Map, Value};

use crate::cache::Key;
use crate::replay::KEPT_FOR;
use crate::state::Services;

/// The tenant flag that turns it on.
pub const FLAG: &str = "cache.semantic";
/// The similarity a match needs when the flag says `true` (see docs/state.md for how it was
/// chosen).
pub const DEFAULT_THRESHOLD: f32 = 0.9;
/// Answers kept at most.
pub const CAPACITY: usize = 4096;
/// The response header with a semantic hit's similarity.
pub const SIMILARITY_HEADER: &str = "x-osprey-cache-similarity";

/// A request, as the semantic cache looks it up.
#[derive(Clone, Debug)]
pub struct Similar {
    /// Everything but its last user message.
    pub context: Key,
    /// The embedding of that message.
    pub embedding: Vec<f32>,
    /// The similarity a match needs.
    pub threshold: f32,
}

struct Entry {
    context: Key,
    embedding: Vec<f32>,
    answer: Arc<Value>,
    owner: Option<Owner>,
    at: Instant,
}

/// The kept answers, oldest first; looked up by a scan of the request's context (a few
/// thousand dot products of 384 floats: well under a millisecond).
#[derive(Default)]
pub struct SemanticIndex {
    entries: Mutex<VecDeque<Entry>>,
}

impl SemanticIndex {
    /// The kept answer nearest `s` at or above its threshold, and its similarity.
    pub fn find(&self, s: &Similar) -> Option<(Arc<Value>, f32)> {
        let entries = self.entries.lock().expect("semantic cache lock");
        let best = (entries.iter())
            .filter(|e| e.context == s.context && e.at.elapsed() < KEPT_FOR)
            .map(|e| {
                (
                    e,
                    osprey_engine::embedder::cosine(&e.embedding, &s.embedding),
                )
            })
            .max_by(|a, b| a.1.total_cmp(&b.1));
        let found = best.filter(|(_, sim)| *sim >= s.threshold);
        let result = if found.is_some() { "hit" } else { "miss" };
        metrics::counter!(osprey_core::metrics::SEMANTIC_CACHE, "result" => result).increment(1);
        found.map(|(e, sim)| (e.answer.clone(), sim))
    }

    /// Keeps `answer` for `s`, as `owner`'s if it is a user's.
    pub fn keep(&self, s: Similar, answer: Value, owner: Option<Owner>) {
        let mut entries = self.entries.lock().expect("semantic cache lock");
        while entries.len() >= CAPACITY
            || entries.front().is_some_and(|e| e.at.elapsed() >= KEPT_FOR)
        {
            entries.pop_front();
        }
        entries.push_back(Entry {
            context: s.context,
            embedding: s.embedding,
            answer: Arc::new(answer),
            owner,
            at: Instant::now(),
        });
    }

    /// Drops `owner`'s answers; how many there were.
    pub fn forget(&self, owner: &Owner) -> usize {
        let mut entries = self.entries.lock().expect("semantic cache lock");
        let before = entries.len();
        entries.retain(|e| e.owner.as_ref() != Some(owner));
        before - entries.len()
    }
}

/// The threshold the tenant's `flags` set, if the semantic cache is on for it.
pub fn threshold(flags: &Map<String, Value>) -> Option<f32> {
    match flags.get(FLAG)? {
        Value::Bool(true) => Some(DEFAULT_THRESHOLD),
        Value::Number(n) => n
            .as_f64()
            .map(|t| t as f32)
            .filter(|t| (0.0..=1.0).contains(t)),
        _ => None,
    }
}

/// The chat request `body` for `path` in `scope` as the semantic cache sees it: `None` when it
/// is not cacheable, has no user message last, or the embedder is not available.
pub async fn similar(
    state: &Services,
    scope: &str,
    path: &str,
    body: &Value,
    threshold: f32,
) -> Option<Similar> {
    let mut v = body.clone();
    let last = v["messages"].as_array_mut()?.last_mut()?;
    if last["role"] != "user" {
        return None;
    }
    let text = osprey_core::api::content_text(&last["content"])?;
    last["content"] = Value::String(String::new());
    let context = crate::cache::key(scope, path, &v)?;
    let embedder = state.embedder().await?;
    let embedding = tokio::task::spawn_blocking(move || embedder.embed(&text))
        .await
        .ok()?
        .inspect_err(|e| tracing::warn!(error = %e, "embedding for the semantic cache failed"))
        .ok()?;
    Some(Similar {
        context,
        embedding,
        threshold,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(context: u8, embedding: Vec<f32>) -> Similar {
        Similar {
            context: [context; 32],
            embedding,
            threshold: 0.9,
        }
    }

    #[test]
    fn the_nearest_answer_of_the_same_context_above_the_threshold_answers() {
        let index = SemanticIndex::default();
        let alice = Owner {
            tenant: "t".into(),
            user: "alice".into(),
        };
        index.keep(at(1, vec![1.0, 0.0]), "east".into(), None);
        index.keep(at(1, vec![0.0, 1.0]), "north".into(), Some(alice.clone()));
        let (answer, sim) = index.find(&at(1, vec![0.95, 0.312])).unwrap();
        assert_eq!(
            (answer.as_str(), (sim * 100.0).round()),
            (Some("east"), 95.0)
        );
        assert!(
            index.find(&at(1, vec![0.707, 0.707])).is_none(),
            "below 0.9 for both"
        );
        assert!(
            index.find(&at(2, vec![1.0, 0.0])).is_none(),
            "another context"
        );
        assert_eq!(index.forget(&alice), 1);
        assert!(index.find(&at(1, vec![0.0, 1.0])).is_none());
    }

    #[test]
    fn the_flag_turns_it_on_with_a_threshold() {
        let flags = |v: Value| serde_json::json!({ FLAG: v }).as_object().unwrap().clone();
        assert_eq!(threshold(&flags(true.into())), Some(DEFAULT_THRESHOLD));
        assert_eq!(threshold(&flags(0.8.into())), Some(0.8));
        assert_eq!(threshold(&flags(false.into())), None);
        assert_eq!(threshold(&flags(3.into())), None);
        assert_eq!(threshold(&Map::new()), None);
    }
}
