//! Answers kept to be given again, for non-streamed requests.
//!
//! - **Idempotency.** A request that names itself (`Idempotency-Key`, or the `x-request-id` a
//!   gateway sends on every attempt of one request) is answered once: a repeat that arrives
//!   while the first is running waits for its answer, and one that arrives later (within
//!   [`KEPT_FOR`]) is given the stored answer, marked `x-osprey-replayed: true`. So a retry
//!   after a lost response, or a second attempt while the first is still generating, does not
//!   generate twice. The key is the tenant's scope, the route, the id *and* the body: the same
//!   id with another body is another request, and no tenant can name another's answer.
//! - **Recent answers.** The last successful answers by tenant, route and exact body: what
//!   level 5 of the degradation ladder gives instead of generating, and the last step of a
//!   fallback chain when every backend failed (`x-osprey-cache: hit`).
//!
//! Both are [`Answers`]: a bounded map of buffered responses that expire.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use osprey_core::api::JsonBody;
use sha2::{Digest, Sha256};
use tokio::sync::watch;

/// The header a client names a request with, to make it idempotent.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// Marks an answer given again to a repeat of its request.
pub const REPLAYED: &str = "x-osprey-replayed";
/// Marks an answer served from the recent answers.
pub const CACHE: &str = "x-osprey-cache";
/// How long an answer is kept.
pub const KEPT_FOR: Duration = Duration::from_secs(600);
/// Answers kept at most, per map.
const CAPACITY: usize = 4096;
/// Bytes of answer bodies kept at most, per map.
const MAX_BYTES: usize = 64 << 20;
/// Largest answer body kept (a larger one is passed on, not kept).
const MAX_BODY: usize = 1 << 20;

/// What names an answer: a digest of its scope, route, id and body.
pub type Key = [u8; 32];

/// The key of a request for `path` by the tenant of `scope`, named `id` (empty for the recent
/// answers), with `body`.
pub fn key(scope: &str, path: &str, id: &str, body: &[u8]) -> Key {
    let mut h = Sha256::new();
    for part in [scope.as_bytes(), path.as_bytes(), id.as_bytes(), body] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part);
    }
    h.finalize().into()
}

/// The key making a request idempotent, if it names itself and is not streamed.
pub fn idempotency_key(
    headers: &HeaderMap,
    scope: &str,
    path: &str,
    body: &JsonBody,
) -> Option<Key> {
    let id = [IDEMPOTENCY_KEY, osprey_router::upstream::REQUEST_ID]
        .iter()
        .find_map(|h| headers.get(*h)?.to_str().ok())
        .filter(|id| !id.is_empty())?;
    (!body.streamed()).then(|| key(scope, path, id, &body.bytes()))
}

/// A response held in memory.
#[derive(Debug)]
pub struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl Answer {
    /// Reads `response` whole; gives it back as it was if its body is too large to keep.
    pub async fn read(response: Response) -> Result<Self, Response> {
        let (parts, body) = response.into_parts();
        match axum::body::to_bytes(body, MAX_BODY).await {
            Ok(body) => Ok(Self {
                status: parts.status,
                headers: parts.headers,
                body,
            }),
            Err(e) => {
                let e = osprey_core::Error::new(
                    osprey_core::ErrorKind::BadGateway,
                    format!("The answer could not be read: {e}"),
                );
                Err(crate::error::ApiError(e).into_response())
            }
        }
    }

    /// Its body as JSON, if it is.
    pub fn json(&self) -> Option<serde_json::Value> {
        serde_json::from_slice(&self.body).ok()
    }

    /// The answer as a response, with `body` as its JSON body instead.
    pub fn response_with(&self, body: &serde_json::Value) -> Response {
        let mut r = self.response();
        r.headers_mut().remove(axum::http::header::CONTENT_LENGTH);
        *r.body_mut() = Body::from(serde_json::to_vec(body).expect("JSON serialises"));
        r
    }

    /// The answer as a response.
    pub fn response(&self) -> Response {
        let mut r = Response::new(Body::from(self.body.clone()));
        *r.status_mut() = self.status;
        *r.headers_mut() = self.headers.clone();
        r
    }

    /// The answer as a response, with `header: true`.
    pub fn marked(&self, header: &'static str, value: &'static str) -> Response {
        let mut r = self.response();
        r.headers_mut()
            .insert(header, HeaderValue::from_static(value));
        r
    }
}

enum Entry {
    /// Being answered: the answer comes on the channel (which closes if the request is dropped).
    Running(watch::Receiver<Option<Arc<Answer>>>),
    Kept {
        answer: Arc<Answer>,
        at: Instant,
    },
}

/// A map of answers, kept [`KEPT_FOR`], bounded in count and in bytes.
#[derive(Default)]
pub struct Answers {
    entries: Mutex<Entries>,
}

#[derive(Default)]
struct Entries {
    map: HashMap<Key, Entry>,
    /// Bytes of the kept answers' bodies.
    bytes: usize,
}

impl Entry {
    fn bytes(&self) -> usize {
        match self {
            Entry::Kept { answer, .. } => answer.body.len(),
            Entry::Running(_) => 0,
        }
    }
}

impl Entries {
    fn get(&self, key: &Key) -> Option<&Entry> {
        self.map.get(key)
    }

    fn remove(&mut self, key: &Key) {
        if let Some(e) = self.map.remove(key) {
            self.bytes -= e.bytes();
        }
    }

    /// Inserts `entry`, first dropping expired answers and then the oldest, while the map is
    /// over its count or its bytes.
    fn insert(&mut self, key: Key, entry: Entry) {
        self.remove(&key);
        let size = entry.bytes();
        if self.map.len() >= CAPACITY || self.bytes + size > MAX_BYTES {
            self.map.retain(|_, e| match e {
                Entry::Kept { at, .. } => at.elapsed() < KEPT_FOR,
                Entry::Running(_) => true,
            });
            self.bytes = self.map.values().map(Entry::bytes).sum();
        }
        while self.map.len() >= CAPACITY || self.bytes + size > MAX_BYTES {
            let oldest = (self.map.iter())
                .filter_map(|(k, e)| match e {
                    Entry::Kept { at, .. } => Some((*at, *k)),
                    Entry::Running(_) => None,
                })
                .min();
            match oldest {
                Some((_, k)) => self.remove(&k),
                None => break,
            }
        }
        self.bytes += size;
        self.map.insert(key, entry);
    }
}

impl Answers {
    /// The kept answer for `key`, if any.
    pub fn get(&self, key: &Key) -> Option<Arc<Answer>> {
        match self.entries.lock().expect("answers lock").get(key)? {
            Entry::Kept { answer, at } if at.elapsed() < KEPT_FOR => Some(answer.clone()),
            _ => None,
        }
    }

    /// Drops the answer kept under `key`; whether there was one.
    pub fn forget(&self, key: &Key) -> bool {
        let mut entries = self.entries.lock().expect("answers lock");
        let kept = matches!(entries.get(key), Some(Entry::Kept { .. }));
        if kept {
            entries.remove(key);
        }
        kept
    }

    /// Keeps `response` under `key` if it is a success, and gives it back.
    pub async fn keep(&self, key: Key, response: Response) -> Response {
        if !response.status().is_success() {
            return response;
        }
        match Answer::read(response).await {
            Ok(answer) => {
                let answer = Arc::new(answer);
                let r = answer.response();
                self.insert(
                    key,
                    Entry::Kept {
                        answer,
                        at: Instant::now(),
                    },
                );
                r
            }
            Err(r) => r,
        }
    }

    /// Answers `key` once: runs `run` unless the same request is running (then waits for its
    /// answer) or was answered within [`KEPT_FOR`] (then gives that answer again).
    pub async fn once(&self, key: Key, run: impl Future<Output = Response>) -> Response {
        let tx = loop {
            let waiting = {
                let entries = self.entries.lock().expect("answers lock");
                match entries.get(&key) {
                    Some(Entry::Kept { answer, at }) if at.elapsed() < KEPT_FOR => {
                        metrics::counter!(osprey_core::metrics::REPLAYED).increment(1);
                        return answer.marked(REPLAYED, "true");
                    }
                    Some(Entry::Running(rx)) => rx.clone(),
                    _ => {
                        let (tx, rx) = watch::channel(None);
                        drop(entries);
                        self.insert(key, Entry::Running(rx));
                        break tx;
                    }
                }
            };
            let mut waiting = waiting;
            if let Ok(answer) = waiting.wait_for(Option::is_some).await {
                let answer = answer.clone().expect("waited for an answer");
                metrics::counter!(osprey_core::metrics::REPLAYED).increment(1);
                return answer.marked(REPLAYED, "true");
            }
            // The first attempt was dropped unanswered: this one takes over.
        };
        let mut running = Running {
            answers: self,
            key,
            kept: false,
        };
        let answer = match Answer::read(run.await).await {
            Ok(answer) => Arc::new(answer),
            Err(response) => return response,
        };
        let _ = tx.send(Some(answer.clone()));
        if answer.status.is_success() {
            self.insert(
                key,
                Entry::Kept {
                    answer: answer.clone(),
                    at: Instant::now(),
                },
            );
            running.kept = true;
        }
        answer.response()
    }

    fn insert(&self, key: Key, entry: Entry) {
        self.entries
            .lock()
            .expect("answers lock")
            .insert(key, entry);
    }
}

/// A request being answered; removes its entry if dropped before its answer is kept.
struct Running<'a> {
    answers: &'a Answers,
    key: Key,
    kept: bool,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        if !self.kept {
            let mut entries = self.answers.entries.lock().expect("answers lock");
            if matches!(entries.get(&self.key), Some(Entry::Running(_))) {
                entries.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// A response after `delay`, counting the runs.
    async fn answer(runs: &AtomicUsize, status: u16, delay: u64) -> Response {
        let run = runs.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(delay)).await;
        let mut r = Response::new(Body::from(format!("run {run}")));
        *r.status_mut() = StatusCode::from_u16(status).unwrap();
        r
    }

    async fn text(r: Response) -> (String, bool) {
        let replayed = r.headers().contains_key(REPLAYED);
        let body = axum::body::to_bytes(r.into_body(), 1 << 10).await.unwrap();
        (String::from_utf8(body.to_vec()).unwrap(), replayed)
    }

    #[tokio::test]
    async fn a_request_is_answered_once_whenever_its_repeats_come() {
        let (answers, runs) = (Answers::default(), AtomicUsize::new(0));
        let k = key("tenant:a", "completions", "req-1", b"{}");
        let (a, b) = tokio::join!(
            answers.once(k, answer(&runs, 200, 50)),
            answers.once(k, answer(&runs, 200, 50)),
        );
        let later = answers.once(k, answer(&runs, 200, 0)).await;
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        let (a, b, later) = (text(a).await, text(b).await, text(later).await);
        assert_eq!(a.0, "run 0");
        assert_eq!((b.0.as_str(), later.0.as_str()), ("run 0", "run 0"));
        assert!(!a.1 && b.1 && later.1, "repeats are marked");
    }

    #[tokio::test]
    async fn failures_and_dropped_attempts_are_not_kept() {
        let (answers, runs) = (Answers::default(), AtomicUsize::new(0));
        let k = key("tenant:a", "completions", "req-1", b"{}");
        assert_eq!(
            text(answers.once(k, answer(&runs, 502, 0)).await).await.0,
            "run 0"
        );
        assert_eq!(
            text(answers.once(k, answer(&runs, 200, 0)).await).await.0,
            "run 1"
        );
        let k = key("tenant:a", "completions", "req-2", b"{}");
        let dropped = tokio::time::timeout(
            Duration::from_millis(10),
            answers.once(k, answer(&runs, 200, 1_000)),
        );
        assert!(dropped.await.is_err());
        let (retry, replayed) = text(answers.once(k, answer(&runs, 200, 0)).await).await;
        assert_eq!((retry.as_str(), replayed), ("run 3", false), "ran again");
    }

    #[test]
    fn kept_answers_stay_within_their_bytes() {
        let answers = Answers::default();
        let big = |i: u8| Entry::Kept {
            answer: Arc::new(Answer {
                status: StatusCode::OK,
                headers: HeaderMap::new(),
                body: Bytes::from(vec![i; MAX_BODY]),
            }),
            at: Instant::now(),
        };
        for i in 0..70u8 {
            answers.insert(key("t", "p", "", &[i]), big(i));
        }
        let entries = answers.entries.lock().unwrap();
        assert!(entries.bytes <= MAX_BYTES, "{}", entries.bytes);
        assert_eq!(entries.bytes, entries.map.len() * MAX_BODY);
        assert!(
            entries.get(&key("t", "p", "", &[0])).is_none(),
            "the oldest went first"
        );
        assert!(entries.get(&key("t", "p", "", &[69])).is_some());
    }

    #[test]
    fn keys_separate_tenants_ids_and_bodies_and_skip_streams() {
        let named = |id: &str| {
            let mut h = HeaderMap::new();
            h.insert(IDEMPOTENCY_KEY, HeaderValue::from_str(id).unwrap());
            h
        };
        let parse =
            |json: &'static str| JsonBody::parse(Bytes::from_static(json.as_bytes())).unwrap();
        let body = &parse(r#"{"model":"m","prompt":"hi"}"#);
        let k = idempotency_key(&named("x"), "tenant:a", "completions", body).unwrap();
        assert_ne!(
            Some(k),
            idempotency_key(&named("x"), "tenant:b", "completions", body)
        );
        assert_ne!(
            Some(k),
            idempotency_key(&named("y"), "tenant:a", "completions", body)
        );
        assert_ne!(
            Some(k),
            idempotency_key(&named("x"), "tenant:a", "completions", &parse("{}"))
        );
        assert_eq!(
            idempotency_key(&HeaderMap::new(), "tenant:a", "completions", body),
            None
        );
        let streamed = parse(r#"{"model":"m","prompt":"hi","stream":true}"#);
        assert_eq!(
            idempotency_key(&named("x"), "tenant:a", "completions", &streamed),
            None
        );
    }
}
