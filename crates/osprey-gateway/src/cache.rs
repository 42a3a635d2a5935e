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
//!   filter and not degraded by the load ladder, as the JSON of a non-streamed answer. A streamed answer is kept once its stream
//!   ends with usage and `[DONE]`. A streamed request that hits gets the kept answer as a
//!   stream: a chunk with each choice's text, its finish, the usage if asked, `[DONE]`.
//! - **Whose**: an answer given with a user's memory or conversation in its prompt is that
//!   user's: its key's scope names the user, and [`ResponseCache::forget`] drops every answer
//!   of a user (deleting the user does).
//! - **Skipped**: `"osprey": {"cache": false}` asks for a fresh answer, neither looked up nor
//!   kept (offline evaluation measures the model, not the cache).
//! - **Seen**: `x-osprey-cache: hit` or `miss` on every cacheable answer, and
//!   `osprey_response_cache_total{result}`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use futures_util::future::BoxFuture;
use osprey_core::Error;
use osprey_store::Owner;
use redis::AsyncCommands;
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

use crate::outbound::{Seen, Step};
use crate::replay::{Answers, CACHE, KEPT_FOR};
use crate::semantic_cache::{SIMILARITY_HEADER, SemanticIndex, Similar};
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

    /// The answer kept for a request that means the same as `s`, marked as a hit with its
    /// similarity, streamed if `streamed`.
    pub fn similar(&self, s: &Similar, streamed: bool, include_usage: bool) -> Option<Response> {
        let (answer, similarity) = self.semantic.find(s)?;
        let mut response = replay(&answer, streamed, include_usage);
        if let Ok(v) = HeaderValue::from_str(&format!("{similarity:.3}")) {
            response.headers_mut().insert(SIMILARITY_HEADER, v);
        }
        Some(response)
    }

    async fn put(&self, slot: &Slot, answer: &Value) {
        if !keepable(answer) {
            return;
        }
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
/// marked `miss`, kept in its slot once it is complete.
pub struct CacheKeep {
    cache: Arc<ResponseCache>,
    slot: Slot,
    /// A stream's chunks so far.
    assembled: Assembled,
}

impl CacheKeep {
    /// Keeps the answer in `slot` of `cache`.
    pub fn new(cache: Arc<ResponseCache>, slot: Slot) -> Self {
        Self {
            cache,
            slot,
            assembled: Assembled::default(),
        }
    }
}

impl Step for CacheKeep {
    fn headers(&mut self, headers: &mut HeaderMap) {
        headers.insert(CACHE, HeaderValue::from_static("miss"));
    }

    fn chunk(&mut self, chunk: &mut Value) -> Seen {
        self.assembled.add(chunk);
        Seen::Send
    }

    fn end(&mut self) -> BoxFuture<'_, Result<Option<Value>, Error>> {
        Box::pin(async move {
            if let Some(answer) = self.assembled.answer() {
                self.cache.put(&self.slot, &answer).await;
            }
            Ok(None)
        })
    }

    fn whole<'a>(&'a mut self, answer: &'a mut Value) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            self.cache.put(&self.slot, answer).await;
            Ok(())
        })
    }
}

/// Whether an answer may be kept: it has usage, and no choice has logprobs, tool calls or
/// was stopped by the output filter.
fn keepable(answer: &Value) -> bool {
    let choices = answer["choices"].as_array();
    answer["usage"].is_object()
        && choices.is_some_and(|cs| {
            cs.iter().all(|c| {
                c["logprobs"].is_null()
                    && c["message"]["tool_calls"].is_null()
                    && c["finish_reason"] != "content_filter"
            })
        })
}

/// A streamed answer put back together from its chunks.
#[derive(Default)]
struct Assembled {
    head: Option<Value>,
    /// Per choice: text, finish reason.
    choices: std::collections::BTreeMap<u64, (String, Value)>,
    usage: Option<Value>,
    chat: bool,
    broken: bool,
}

impl Assembled {
    fn add(&mut self, chunk: &Value) {
        if self.head.is_none() {
            self.head = Some(chunk.clone());
            self.chat = chunk["object"] == "chat.completion.chunk";
        }
        if chunk["usage"].is_object() {
            self.usage = Some(chunk["usage"].clone());
        }
        for c in chunk["choices"].as_array().into_iter().flatten() {
            let entry = self
                .choices
                .entry(c["index"].as_u64().unwrap_or(0))
                .or_default();
            entry
                .0
                .push_str(osprey_core::api::choice_text(c).unwrap_or_default());
            if !c["finish_reason"].is_null() {
                entry.1 = c["finish_reason"].clone();
            }
            self.broken |= !c["logprobs"].is_null() || !c["delta"]["tool_calls"].is_null();
        }
    }

    /// The non-streamed answer it amounts to.
    fn answer(&self) -> Option<Value> {
        let head = self.head.as_ref().filter(|_| !self.broken)?;
        let choices: Vec<Value> = (self.choices.iter())
            .map(|(i, (text, finish))| match self.chat {
                true => json!({"index": i, "message": {"role": "assistant", "content": text},
                               "logprobs": null, "finish_reason": finish}),
                false => {
                    json!({"index": i, "text": text, "logprobs": null, "finish_reason": finish})
                }
            })
            .collect();
        let object = if self.chat {
            "chat.completion"
        } else {
            "text_completion"
        };
        Some(
            json!({"id": head["id"], "object": object, "created": head["created"],
                    "model": head["model"], "system_fingerprint": head["system_fingerprint"],
                    "choices": choices, "usage": self.usage.clone()?}),
        )
    }
}

/// The kept `answer` as the response to a request that hit, streamed if it asked for a stream.
pub fn replay(answer: &Value, streamed: bool, include_usage: bool) -> Response {
    let mut response = match streamed {
        false => axum::Json(answer.clone()).into_response(),
        true => {
            let chat = answer["object"] == "chat.completion";
            let object = if chat {
                "chat.completion.chunk"
            } else {
                "text_completion"
            };
            let chunk = |choices: Value| {
                json!({"id": answer["id"], "object": object, "created": answer["created"],
                       "model": answer["model"], "system_fingerprint": answer["system_fingerprint"],
                       "choices": choices})
            };
            let mut events = Vec::new();
            for c in answer["choices"].as_array().into_iter().flatten() {
                let i = &c["index"];
                events.push(match chat {
                    true => chunk(json!([{"index": i, "delta": {"role": "assistant", "content": c["message"]["content"]}, "logprobs": null, "finish_reason": null}])),
                    false => chunk(json!([{"index": i, "text": c["text"], "logprobs": null, "finish_reason": null}])),
                });
                events.push(match chat {
                    true => chunk(json!([{"index": i, "delta": {}, "logprobs": null, "finish_reason": c["finish_reason"]}])),
                    false => chunk(json!([{"index": i, "text": "", "logprobs": null, "finish_reason": c["finish_reason"]}])),
                });
            }
            if include_usage {
                let mut last = chunk(json!([]));
                last["usage"] = answer["usage"].clone();
                events.push(last);
            }
            let mut sse: String = events.iter().map(|e| format!("data: {e}\n\n")).collect();
            sse.push_str("data: [DONE]\n\n");
            let mut r = Response::new(Body::from(sse));
            r.headers_mut().insert(
                axum::http::header::CONTENT_TYPE,
                HeaderValue::from_static("text/event-stream"),
            );
            r
        }
    };
    response
        .headers_mut()
        .insert(CACHE, HeaderValue::from_static("hit"));
    response
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
    fn a_stream_puts_back_together_and_replays() {
        let mut a = Assembled::default();
        let head =
            json!({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m"});
        let with = |choices: Value| {
            let mut c = head.clone();
            c["choices"] = choices;
            c
        };
        a.add(&with(
            json!([{"index": 0, "delta": {"role": "assistant", "content": "Hel"}}]),
        ));
        a.add(&with(
            json!([{"index": 0, "delta": {"content": "lo"}, "finish_reason": "stop"}]),
        ));
        assert!(a.answer().is_none(), "no usage yet: not kept");
        let mut usage = with(json!([]));
        usage["usage"] = json!({"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5});
        a.add(&usage);
        let answer = a.answer().unwrap();
        assert_eq!(answer["choices"][0]["message"]["content"], "Hello");
        assert_eq!(answer["choices"][0]["finish_reason"], "stop");
        assert!(keepable(&answer));
        let r = replay(&answer, false, false);
        assert_eq!(r.headers()[CACHE], "hit");
    }
}
