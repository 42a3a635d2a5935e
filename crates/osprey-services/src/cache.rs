//! The exact response cache: a deterministic request (temperature 0, or a `seed`) that was
//! answered before is answered again from the cache, streamed or not, without generating.
//!
//! - **Key**: the tenant's cache scope, the route and the request as it reaches the model
//!   (after its prompt is rendered and its conversation's history added), normalised: keys
//!   sorted, and `stream`, `stream_options`, `user` and `osprey.priority` left out. So the
//!   same question with a new prompt version or a longer history is another entry.
//! - **Where**: in this process by default (bounded like the recent answers); with `--redis`,
//!   in Redis, so every replica shares it. A Redis that fails or is slow (100 ms) is a miss.
//! - **What**: successful answers without logprobs or tool calls, not stopped by the output
//!   filter and not degraded by the load ladder, as the JSON of a non-streamed answer, once
//!   it is complete (streamed or not). A request that hits gets the kept answer as typed
//!   events, written like any answer (streamed if it asks for a stream) under the kept id.
//! - **Whose**: an answer given with a user's memory or conversation in its prompt is that
//!   user's: its key's scope names the user, and [`ResponseCache::forget`] drops every answer
//!   of a user (deleting the user does).
//! - **Skipped**: `"osprey": {"cache": false}` asks for a fresh answer, neither looked up nor
//!   kept (offline evaluation measures the model, not the cache).
//! - **Seen**: `x-osprey-cache: hit` or `miss` on every cacheable answer, and
//!   `osprey_response_cache_total{result}`.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderValue};
use axum::response::Response;
use futures_util::future::BoxFuture;
use osprey_core::backend::ChoiceDelta;
use osprey_core::{Error, FinishReason};
use osprey_store::Owner;
use redis::AsyncCommands;
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

use crate::outbound::{Added, Complete, Seen, Step};
use crate::replay::{Answers, CACHE, KEPT_FOR};
use crate::semantic_cache::{SemanticIndex, Similar};
use osprey_store::SharedRedis;

/// How long Redis may take to answer before the lookup counts as a miss.
const REDIS_TIMEOUT: Duration = Duration::from_millis(100);
const REDIS_PREFIX: &str = "osprey:cache:";

/// Where answers are kept.
pub struct ResponseCache {
    memory: Answers,
    /// The keys of each user's answers, in memory (in Redis, a set per user).
    owned: Mutex<HashMap<(String, String), Vec<Key>>>,
    /// Answers by meaning, for tenants that turn it on.
    semantic: SemanticIndex,
    redis: Option<SharedRedis>,
}

/// A cacheable request's key.
pub type Key = [u8; 32];

/// Where a cacheable request's answer is kept: its key, whose it is (a user's, when their
/// context is in the prompt) and, for the semantic cache, what it means.
pub struct Slot {
    /// The exact key.
    pub key: Key,
    /// The user whose answer it is.
    pub owner: Option<Owner>,
    /// The request by meaning, for tenants with the semantic cache.
    pub similar: Option<Similar>,
}

/// The key of the request `v` for `path` in `scope`, if the request is deterministic.
pub fn key(scope: &str, path: &str, v: &Value) -> Option<Key> {
    let deterministic = v["temperature"].as_f64() == Some(0.0) || v["seed"].is_number();
    let skipped = v["osprey"]["cache"] == Value::Bool(false);
    if !deterministic || skipped || v["n"].as_u64().is_some_and(|n| n > 1) {
        return None;
    }
    // What does not change the answer: how it is delivered, who asks, how urgently.
    let mut object: Map<String, Value> = (v.as_object()?.iter())
        .filter(|(k, _)| !matches!(k.as_str(), "stream" | "stream_options" | "user"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if let Some(osprey) = object.get_mut("osprey").and_then(Value::as_object_mut) {
        osprey.remove("priority");
    }
    Some(crate::replay::key(
        scope,
        path,
        "cache",
        canonical(&Value::Object(object)).as_bytes(),
    ))
}

/// `v` as JSON with every object's keys sorted.
fn canonical(v: &Value) -> String {
    fn sorted(v: &Value) -> Value {
        match v {
            Value::Object(m) => {
                let mut keys: Vec<&String> = m.keys().collect();
                keys.sort();
                let out: Map<String, Value> = keys
                    .into_iter()
                    .map(|k| (k.clone(), sorted(&m[k])))
                    .collect();
                Value::Object(out)
            }
            Value::Array(a) => Value::Array(a.iter().map(sorted).collect()),
            v => v.clone(),
        }
    }
    sorted(v).to_string()
}

impl ResponseCache {
    /// In this process only.
    pub fn memory() -> Self {
        Self {
            memory: Answers::default(),
            owned: Mutex::default(),
            semantic: SemanticIndex::default(),
            redis: None,
        }
    }

    /// In `redis`, shared by replicas.
    pub fn redis(redis: SharedRedis) -> Self {
        Self {
            redis: Some(redis),
            ..Self::memory()
        }
    }

    async fn connection(&self) -> Option<redis::aio::ConnectionManager> {
        match self.redis.as_ref()?.connection().await {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::warn!(error = %e, "the response cache's Redis is unreachable");
                None
            }
        }
    }

    /// Drops the shared connection after a failure.
    async fn forget_connection(&self) {
        if let Some(redis) = &self.redis {
            redis.reset().await;
        }
    }

    fn redis_key(key: &Key) -> String {
        let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
        format!("{REDIS_PREFIX}{hex}")
    }

    fn redis_owner_key(owner: &Owner) -> String {
        let hash = Sha256::digest(format!("{}\u{0}{}", owner.tenant, owner.user));
        let hex: String = hash[..16].iter().map(|b| format!("{b:02x}")).collect();
        format!("{REDIS_PREFIX}owner:{hex}")
    }

    /// The kept answer (its JSON) for `key`.
    pub async fn get(&self, key: &Key) -> Option<Value> {
        let found = match &self.redis {
            None => (self.memory.get(key)).and_then(|a| a.json()),
            Some(_) => {
                let mut conn = self.connection().await?;
                let got = tokio::time::timeout(
                    REDIS_TIMEOUT,
                    conn.get::<_, Option<Vec<u8>>>(Self::redis_key(key)),
                )
                .await;
                match got {
                    Ok(Ok(bytes)) => bytes.and_then(|b| serde_json::from_slice(&b).ok()),
                    Ok(Err(e)) => {
                        tracing::warn!(error = %e, "response cache lookup failed");
                        self.forget_connection().await;
                        None
                    }
                    Err(_) => None,
                }
            }
        };
        let result = if found.is_some() { "hit" } else { "miss" };
        metrics::counter!(osprey_core::metrics::RESPONSE_CACHE, "result" => result).increment(1);
        found
    }

    /// The answer kept for a request that means the same as `s`, with its similarity.
    pub fn similar(&self, s: &Similar) -> Option<(Arc<Value>, f32)> {
        self.semantic.find(s)
    }

    async fn put(&self, slot: &Slot, answer: &Value) {
        let key = slot.key;
        if let Some(s) = &slot.similar {
            self.semantic
                .keep(s.clone(), answer.clone(), slot.owner.clone());
        }
        if let Some(owner) = &slot.owner {
            self.own(key, owner).await;
        }
        let body = Bytes::from(serde_json::to_vec(answer).expect("JSON serialises"));
        match &self.redis {
            None => {
                let mut r = Response::new(Body::from(body));
                r.headers_mut().insert(
                    axum::http::header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                );
                self.memory.keep(key, r).await;
            }
            Some(_) => {
                let Some(mut conn) = self.connection().await else {
                    return;
                };
                let ttl = KEPT_FOR.as_secs();
                let set = conn.set_ex::<_, _, ()>(Self::redis_key(&key), body.to_vec(), ttl);
                if let Ok(Err(e)) = tokio::time::timeout(REDIS_TIMEOUT, set).await {
                    tracing::warn!(error = %e, "response cache write failed");
                }
            }
        }
    }

    /// Notes that the answer under `key` is `owner`'s.
    async fn own(&self, key: Key, owner: &Owner) {
        if self.redis.is_none() {
            let mut owned = self.owned.lock().expect("owned lock");
            let keys = owned
                .entry((owner.tenant.clone(), owner.user.clone()))
                .or_default();
            keys.retain(|k| self.memory.get(k).is_some());
            keys.push(key);
            return;
        }
        let Some(mut conn) = self.connection().await else {
            return;
        };
        let set = Self::redis_owner_key(owner);
        let ttl = KEPT_FOR.as_secs() as i64;
        let mut pipe = redis::pipe();
        pipe.sadd(&set, Self::redis_key(&key)).expire(&set, ttl);
        let noted = pipe.query_async::<()>(&mut conn);
        if let Ok(Err(e)) = tokio::time::timeout(REDIS_TIMEOUT, noted).await {
            tracing::warn!(error = %e, "response cache owner not noted");
        }
    }

    /// Drops every answer kept for `owner`; how many there were.
    pub async fn forget(&self, owner: &Owner) -> redis::RedisResult<usize> {
        if self.redis.is_none() {
            let keys = (self.owned.lock().expect("owned lock"))
                .remove(&(owner.tenant.clone(), owner.user.clone()))
                .unwrap_or_default();
            let semantic = self.semantic.forget(owner);
            return Ok(keys.iter().filter(|k| self.memory.forget(k)).count() + semantic);
        }
        let Some(mut conn) = self.connection().await else {
            return Err(redis::RedisError::from((
                redis::ErrorKind::Io,
                "the response cache's Redis is unreachable",
            )));
        };
        let set = Self::redis_owner_key(owner);
        let keys: Vec<String> = conn.smembers(&set).await?;
        let mut dropped = self.semantic.forget(owner);
        for key in &keys {
            dropped += conn.del::<_, usize>(key).await?;
        }
        conn.del::<_, ()>(&set).await?;
        Ok(dropped)
    }
}

/// Cache keep, a step of the way out ([`crate::outbound`]): the answer to a cacheable miss,
/// marked `miss`, kept in its slot once it is complete, as the JSON of a whole answer.
pub struct CacheKeep {
    cache: Arc<ResponseCache>,
    slot: Slot,
    /// Per choice: its text and why it ended.
    choices: BTreeMap<usize, (String, Option<FinishReason>)>,
    /// A choice had what is not kept (log-probabilities, tool calls, fields Osprey does not
    /// know, a filtered end).
    unkept: bool,
}

impl CacheKeep {
    /// Keeps the answer in `slot` of `cache`.
    pub fn new(cache: Arc<ResponseCache>, slot: Slot) -> Self {
        Self {
            cache,
            slot,
            choices: BTreeMap::new(),
            unkept: false,
        }
    }

    /// The whole answer it heard, complete as `answer`.
    fn answer(&self, answer: &Complete<'_>) -> Option<Value> {
        let usage = answer.usage.filter(|_| !self.unkept)?;
        let choices: Vec<Value> = (self.choices.iter())
            .map(|(i, (text, finish))| match answer.chat {
                true => json!({"index": i, "message": {"role": "assistant", "content": text},
                               "logprobs": null, "finish_reason": finish}),
                false => {
                    json!({"index": i, "text": text, "logprobs": null, "finish_reason": finish})
                }
            })
            .collect();
        let object = match answer.chat {
            true => "chat.completion",
            false => "text_completion",
        };
        Some(
            json!({"id": answer.id, "object": object, "created": answer.created,
            "model": answer.model, "system_fingerprint": crate::sse::FINGERPRINT,
            "choices": choices, "usage": usage}),
        )
    }
}

impl Step for CacheKeep {
    fn headers(&mut self, headers: &mut HeaderMap) {
        headers.insert(CACHE, HeaderValue::from_static("miss"));
    }

    fn delta(&mut self, delta: &mut ChoiceDelta) -> Seen {
        let (text, finish) = self.choices.entry(delta.index).or_default();
        text.push_str(&delta.text);
        *finish = delta.finish.or(*finish);
        self.unkept |= delta.logprobs.is_some()
            || delta.tool_call.is_some()
            || delta.extra.is_some()
            || delta.finish == Some(FinishReason::ContentFilter);
        Seen::Send
    }

    fn end<'a>(&'a mut self, answer: &'a Complete<'a>) -> BoxFuture<'a, Result<Added, Error>> {
        Box::pin(async move {
            if let Some(answer) = self.answer(answer) {
                self.cache.put(&self.slot, &answer).await;
            }
            Ok(None)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_deterministic_requests_have_a_key_and_it_ignores_delivery() {
        let k = |v: Value| key("t", "chat", &v);
        let base = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0});
        assert!(
            k(json!({"model": "m", "messages": []})).is_none(),
            "sampled"
        );
        assert!(k(json!({"model": "m", "temperature": 0.7})).is_none());
        assert!(k(json!({"model": "m", "seed": 3})).is_some());
        let mut streamed = base.clone();
        streamed["stream"] = true.into();
        streamed["stream_options"] = json!({"include_usage": true});
        streamed["user"] = "ada".into();
        assert_eq!(k(base.clone()), k(streamed), "delivery is not the question");
        let reordered = json!({"temperature": 0, "messages": [{"content": "hi", "role": "user"}], "model": "m"});
        assert_eq!(k(base.clone()), k(reordered));
        let mut other = base.clone();
        other["max_tokens"] = 5.into();
        assert_ne!(k(base.clone()), k(other));
        assert_ne!(key("t", "chat", &base), key("u", "chat", &base));
    }

    #[test]
    fn an_answer_is_kept_whole_once_complete_and_not_with_what_is_not_kept() {
        let slot = Slot {
            key: [0; 32],
            owner: None,
            similar: None,
        };
        let mut keep = CacheKeep::new(Arc::new(ResponseCache::memory()), slot);
        for (text, finish) in [("Hel", None), ("lo", Some(FinishReason::Stop))] {
            let text = text.to_owned();
            let mut delta = ChoiceDelta {
                text,
                finish,
                ..Default::default()
            };
            assert_eq!(keep.delta(&mut delta), Seen::Send);
        }
        let usage = osprey_core::api::Usage::new(3, 2);
        let complete = |usage| Complete {
            id: "c1",
            created: 1,
            model: "m",
            chat: true,
            usage,
        };
        assert!(keep.answer(&complete(None)).is_none(), "ended early");
        let answer = keep.answer(&complete(Some(&usage))).unwrap();
        assert_eq!(answer["choices"][0]["message"]["content"], "Hello");
        assert_eq!(answer["choices"][0]["finish_reason"], "stop");
        assert_eq!(
            (
                answer["id"].as_str(),
                answer["usage"]["total_tokens"].as_u64()
            ),
            (Some("c1"), Some(5))
        );
        let mut filtered = ChoiceDelta {
            finish: Some(FinishReason::ContentFilter),
            ..Default::default()
        };
        keep.delta(&mut filtered);
        assert!(keep.answer(&complete(Some(&usage))).is_none(), "filtered");
    }
}
