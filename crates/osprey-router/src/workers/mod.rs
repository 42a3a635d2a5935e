//! A pool of `osprey worker`s serving one model (`osprey serve --worker URL ...`), as a
//! [`Backend`]: each request goes to one worker, chosen by the pool's [`Policy`], and its
//! answer is read as typed events ([`crate::events`]).
//!
//! The pool follows every worker's event stream ([`feed`]): the blocks its prefix cache holds
//! go into one [`PrefixIndex`], its load is noted, and a worker whose stream breaks or stalls
//! is ejected until it answers again. To choose, the gateway hashes the request's prompt as
//! the workers do (it loads the model's tokenizer and chat template, not its weights) and asks
//! [`choose`] for the worker where the request is cheapest: most of its prompt cached, least
//! work queued. The prompt is then recorded as held by that worker, so the requests right
//! behind it find it there before the worker's own events say so.
//!
//! A plain OpenAI-compatible server (vLLM, SGLang, llama-server, another Osprey) can be a
//! worker too: it has no `/worker/events` (404), so the pool follows its `/ready` (or
//! `/health`) instead, and
//! takes what it sent there as what it caches ([`SentBlocks`], the last
//! [`PLAIN_CACHE_BLOCKS`] blocks), with the requests in flight there as its load.
//!
//! A request whose worker cannot be reached is sent to another worker (each worker is tried
//! once; the unreachable one is ejected), and so is a whole answer the worker broke off. One
//! the worker failed with an error (or did not finish within its timeout, whole) goes to
//! another while the pool's retry budget allows.
//! Nothing is retried once its answer has started to go out: a stream the worker breaks off
//! ends with an error event.

mod feed;
pub mod protocol;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::http::{HeaderMap, HeaderValue};
use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use osprey_core::backend::{Asked, Backend, GenRequest, GenStream};
use osprey_core::metrics as names;
use osprey_core::{Error, ErrorKind};
use osprey_engine::Prompter;
use osprey_engine::backend::{chat, completions};
use osprey_engine::kv::prefix_hashes;

use crate::events::Source;
use crate::prefix_index::{MAX_WORKERS, PrefixIndex};
use crate::retry::{RetryBudget, RetryBudgetConfig};
use crate::select::{Candidate, Policy, choose};
use crate::sent_blocks::SentBlocks;
use crate::upstream::{REQUEST_ID, Upstream, UpstreamConfig, new_request_id, warrants_fallback};

/// The blocks a plain upstream is taken to cache: the last this many it was sent (at 16 tokens
/// a block, 128k tokens).
pub const PLAIN_CACHE_BLOCKS: usize = 8192;

/// The header naming the worker that served a response.
pub const SERVED_BY_WORKER: &str = "x-osprey-worker";

/// Workers serving one model.
pub struct WorkerPool {
    name: String,
    prompter: Prompter,
    policy: Policy,
    workers: Vec<Worker>,
    index: Mutex<PrefixIndex>,
    turn: AtomicUsize,
    budget: Mutex<RetryBudget>,
}

struct Worker {
    url: String,
    upstream: Upstream,
    /// Following its events: it takes requests.
    live: AtomicBool,
    /// Sequences running and waiting there, as it last said.
    reported: AtomicUsize,
    /// Its recent time to first token (ms), as it last said.
    ttft_ms: AtomicU64,
    /// A plain OpenAI-compatible server, without the worker protocol.
    plain: AtomicBool,
    /// For a plain one: what it was sent, as what it caches.
    sent: Mutex<SentBlocks>,
    /// Requests this gateway has in flight there.
    in_flight: Arc<AtomicUsize>,
}

impl WorkerPool {
    /// A pool serving `name` from the workers at `urls` (base URLs, without `/v1`), which
    /// tokenize with `prompter`. Call [`Self::follow`] to start following them.
    pub fn new(
        name: &str,
        urls: &[String],
        policy: Policy,
        prompter: Prompter,
        client: reqwest::Client,
    ) -> Result<Self, String> {
        if urls.is_empty() || urls.len() > MAX_WORKERS {
            return Err(format!(
                "a pool has 1 to {MAX_WORKERS} workers, not {}",
                urls.len()
            ));
        }
        let workers = urls
            .iter()
            .map(|url| {
                let url = url.trim_end_matches('/').to_owned();
                let config = UpstreamConfig {
                    url: format!("{url}/v1"),
                    api_key_env: None,
                    model: None,
                    timeout_secs: Some(600.0),
                    // The pool retries, on another worker.
                    max_retries: Some(0),
                    fallbacks: None,
                };
                let upstream = Upstream::new(&url, &config, client.clone())
                    .map_err(|e| format!("--worker {url}: {e}"))?
                    .relaying_client_errors();
                metrics::gauge!(names::WORKER_LIVE, "worker" => url.clone()).set(0.0);
                Ok(Worker {
                    url,
                    upstream,
                    live: AtomicBool::new(false),
                    reported: AtomicUsize::new(0),
                    ttft_ms: AtomicU64::new(0),
                    plain: AtomicBool::new(false),
                    sent: Mutex::new(SentBlocks::new(PLAIN_CACHE_BLOCKS)),
                    in_flight: Arc::default(),
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(Self {
            name: name.to_owned(),
            prompter,
            policy,
            workers,
            index: Mutex::default(),
            turn: AtomicUsize::new(0),
            budget: Mutex::new(RetryBudget::new(
                RetryBudgetConfig::default(),
                Instant::now(),
            )),
        })
    }

    /// Starts following every worker's events (on the current Tokio runtime), for as long as
    /// the pool lives.
    pub fn follow(self: &Arc<Self>, client: reqwest::Client) {
        for w in 0..self.workers.len() {
            tokio::spawn(feed::follow(Arc::downgrade(self), w, client.clone()));
        }
    }

    /// The model the pool serves.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The model's tokenizer and chat template.
    pub fn prompter(&self) -> &Prompter {
        &self.prompter
    }

    /// Whether worker `w` is a plain OpenAI-compatible server.
    pub fn is_plain(&self, w: usize) -> bool {
        self.workers[w].plain.load(Ordering::Relaxed)
    }

    /// The workers' URLs and whether each takes requests.
    pub fn workers(&self) -> Vec<(String, bool)> {
        let live = |w: &Worker| w.live.load(Ordering::Relaxed);
        self.workers
            .iter()
            .map(|w| (w.url.clone(), live(w)))
            .collect()
    }

    /// The slowest recent time to first token a live worker reports.
    pub fn reported_ttft(&self) -> std::time::Duration {
        let ms = (self.workers.iter())
            .filter(|w| w.live.load(Ordering::Relaxed))
            .map(|w| w.ttft_ms.load(Ordering::Relaxed))
            .max();
        std::time::Duration::from_millis(ms.unwrap_or(0))
    }

    /// Starts `request`'s answer on the best worker, and on others if it cannot be served there
    /// before its answer starts; `headers` go with it (its trace context). The URL of the
    /// worker that answers, and the events of its answer.
    ///
    /// A worker is always asked to stream, with its usage: the answer is written once, by the
    /// caller. A whole answer (the client did not ask for a stream) is read to its end here,
    /// so a worker that breaks off before the end is replaced: nothing of it has gone out.
    pub async fn generate_with(
        &self,
        request: GenRequest,
        mut headers: HeaderMap,
    ) -> Result<(String, GenStream), Error> {
        let GenRequest {
            asked,
            mut body,
            priority,
            cache_salt,
        } = request;
        let (path, prompt) = match &asked {
            Asked::Chat(r) => ("chat/completions", chat::prompt_tokens(r, &self.prompter)?),
            Asked::Completion(r) => (
                "completions",
                completions::prompt_tokens(r, &self.prompter)?,
            ),
        };
        let hashes = prefix_hashes(&cache_salt, &prompt);
        if let Ok(salt) = HeaderValue::from_str(&cache_salt) {
            headers.insert(protocol::CACHE_SALT, salt);
        }
        headers.insert(
            protocol::PRIORITY,
            HeaderValue::from_static(priority.as_str()),
        );
        // One id for every worker the request is tried on.
        headers.entry(REQUEST_ID).or_insert_with(new_request_id);
        let edit = body.edit();
        edit["stream"] = true.into();
        edit["stream_options"] = serde_json::json!({ "include_usage": true });
        let whole = !asked.sampling().streaming();
        let source = Source::of(&self.name, &asked, prompt.len())?;
        self.budget
            .lock()
            .expect("budget lock")
            .on_request(Instant::now());
        let mut tried = vec![false; self.workers.len()];
        let mut failure = None;
        loop {
            let Some(w) = self.pick(&hashes, &tried) else {
                return Err(failure.unwrap_or_else(|| self.no_worker()));
            };
            tried[w] = true;
            let worker = &self.workers[w];
            let in_flight = InFlight::enter(&worker.in_flight);
            let answer = (worker.upstream).answer(path, &body, headers.clone(), source.clone());
            let e = match answer.await {
                Ok(events) => {
                    let events = Box::pin(events.map(move |event| {
                        let _until_the_end = &in_flight;
                        event
                    }));
                    match whole {
                        false => return Ok((worker.url.clone(), events)),
                        true => match (worker.upstream)
                            .read_to_end(events, Some(worker.upstream.timeout()))
                            .await
                        {
                            Ok(events) => return Ok((worker.url.clone(), events)),
                            Err(e) => e,
                        },
                    }
                }
                Err(e) => e,
            };
            if !warrants_fallback(&e) {
                return Err(e);
            }
            let unreachable = is_gone(&e);
            if unreachable {
                feed::eject(
                    worker,
                    "a request could not reach it, or it broke off an answer",
                );
            }
            // A worker that could not be reached is ejected, and each is tried once: moving its
            // requests elsewhere is failover, not a retry storm. A worker's error answer is
            // retried elsewhere only within the budget.
            let retry = unreachable
                || self
                    .budget
                    .lock()
                    .expect("budget lock")
                    .try_retry(Instant::now());
            if !retry || tried.iter().all(|&t| t) {
                return Err(e);
            }
            metrics::counter!(names::WORKER_FAILOVERS, "worker" => worker.url.clone()).increment(1);
            failure = Some(e);
        }
    }

    /// The worker to try next, among those live and not yet tried; records the prompt as
    /// held there.
    fn pick(&self, hashes: &[u128], tried: &[bool]) -> Option<usize> {
        let mut index = self.index.lock().expect("prefix index lock");
        let matched = index.matched(self.workers.len(), hashes);
        let candidates: Vec<Option<Candidate>> = (self.workers.iter().zip(tried))
            .zip(&matched)
            .map(|((w, &tried), &cached_blocks)| {
                let live = w.live.load(Ordering::Relaxed) && !tried;
                live.then(|| Candidate {
                    load: (w.in_flight.load(Ordering::Relaxed))
                        .max(w.reported.load(Ordering::Relaxed)),
                    cached_blocks,
                })
            })
            .collect();
        let turn = self.turn.fetch_add(1, Ordering::Relaxed);
        let w = choose(self.policy, &candidates, hashes.len(), turn)?;
        index.store(w, hashes);
        let worker = &self.workers[w];
        if worker.plain.load(Ordering::Relaxed) {
            let forgotten = worker.sent.lock().expect("sent blocks lock").record(hashes);
            index.evict(w, &forgotten);
        }
        drop(index);
        let url = self.workers[w].url.clone();
        metrics::counter!(names::WORKER_REQUESTS, "worker" => url, "policy" => self.policy.as_str())
            .increment(1);
        let blocks = hashes.len() as u64;
        metrics::counter!(names::WORKER_PROMPT_BLOCKS, "cached" => "false")
            .increment(blocks - matched[w] as u64);
        metrics::counter!(names::WORKER_PROMPT_BLOCKS, "cached" => "true")
            .increment(matched[w] as u64);
        Some(w)
    }

    /// The error of a whole answer not done within `limit`.
    fn no_worker(&self) -> Error {
        Error::new(
            ErrorKind::Unavailable,
            format!(
                "No worker serving `{}` is answering; retry shortly.",
                self.name
            ),
        )
        .with_code("no_worker_available")
        .with_retry_after(1)
    }
}

impl Backend for WorkerPool {
    fn generate(&self, request: GenRequest) -> BoxFuture<'_, Result<GenStream, Error>> {
        Box::pin(async move {
            let (_, events) = self.generate_with(request, HeaderMap::new()).await?;
            Ok(events)
        })
    }
}

/// Whether `e` says a worker is gone: it could not be reached, or it broke off an answer.
fn is_gone(e: &Error) -> bool {
    matches!(
        e.code.as_deref(),
        Some("upstream_unavailable" | "upstream_disconnected")
    )
}

/// One request in flight at a worker, until dropped.
struct InFlight(Arc<AtomicUsize>);

impl InFlight {
    fn enter(count: &Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Self(count.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}
