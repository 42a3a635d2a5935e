//! What every handler shares, [`Services`]: built once at start from a [`Wiring`] and frozen.
//! What is set later is set once: each local engine when it has loaded, or why it failed to
//! (the server answers `/health` while the models load), and the parts started on first use
//! (the embedder, the agent runtime, the request log's writer).

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use osprey_core::{Error, ErrorKind};
use osprey_engine::Engine;

use crate::edge::Edge;
use crate::replay::Answers;
use crate::safety::{Abuse, Policies};
use osprey_router::degrade::Degradation;
use osprey_router::tiers::Tiers;
use osprey_router::upstream::Upstream;
use osprey_router::workers::WorkerPool;
use osprey_store::Store;
use tokio::sync::Notify;

/// What every handler shares, frozen at start ([`Wiring`]); cheaply cloned.
#[derive(Clone)]
pub struct Services {
    inner: Arc<Inner>,
}

struct Inner {
    /// The models this process's engines serve, in the order they were given.
    local: Vec<LocalModel>,
    upstreams: BTreeMap<String, Arc<Upstream>>,
    pool: Option<Arc<WorkerPool>>,
    tiers: Option<Tiers>,
    degradation: Arc<Degradation>,
    /// Answers of idempotent requests.
    replays: Answers,
    /// Recent successful answers, by request.
    recent: Answers,
    /// The safety policies (off on workers: their gateway screened).
    policies: Option<Policies>,
    /// Flagged requests per key.
    abuse: Abuse,
    /// Per-tenant feature flags, from the store.
    flags: osprey_store::tenant_flags::Flags,
    /// The exact response cache (off on workers: their gateway caches).
    response_cache: Option<Arc<crate::cache::ResponseCache>>,
    store: Option<Store>,
    /// The same store, as what keeps prompts' context.
    context_store: Option<Arc<dyn osprey_context::store::ContextStore>>,
    /// The sentence embedder, loaded (fetched if need be) on first use; `None` if that failed.
    embedder: tokio::sync::OnceCell<Option<Arc<osprey_engine::Embedder>>>,
    /// The tenants' document collections (retrieval).
    library: Arc<osprey_rag::Library>,
    /// Ingest jobs, run one at a time off the serving threads.
    ingest: osprey_rag::jobs::IngestJobs,
    /// The request log's writer, started on first use (it needs the runtime).
    request_log: OnceLock<osprey_store::log_writer::RequestLog>,
    batch_added: Notify,
    edge: Arc<Edge>,
    created: u64,
    /// The agent runtime's config, and the runtime, set up on first use.
    agent_config: osprey_agent::AgentConfig,
    agents: OnceLock<Result<Arc<osprey_agent::responses::Agents>, String>>,
}

struct LocalModel {
    name: String,
    engine: OnceLock<Engine>,
    load_error: OnceLock<String>,
}

/// A local model as loaded so far: its engine once loaded, or why it failed to load.
pub struct LocalStatus<'a> {
    /// The name it is served under.
    pub name: &'a str,
    /// Its engine, once loaded.
    pub engine: Option<&'a Engine>,
    /// Why it failed to load, if it did.
    pub load_error: Option<&'a str>,
}

/// Where a model's requests go.
pub enum ServedBy {
    /// The engine in this process.
    Local(Engine),
    /// An OpenAI-compatible server elsewhere.
    Upstream(Arc<Upstream>),
    /// `osprey worker`s.
    Pool(Arc<WorkerPool>),
}

/// What a server is set up with, built once at start: what it serves, and the services its
/// requests use. [`Services::new`] freezes it; nothing changes it afterwards (but the local
/// engine, set once it has loaded).
pub struct Wiring {
    /// The models this process's engines serve (none without an engine), each on its own
    /// engine; the first is the default of requests and tools that name no model.
    pub local: Vec<String>,
    /// The OpenAI-compatible servers elsewhere, by the model names they serve.
    pub upstreams: Vec<Upstream>,
    /// `osprey worker`s serving a model (instead of a local engine).
    pub pool: Option<Arc<WorkerPool>>,
    /// The tiers of `"model": "auto"`.
    pub tiers: Option<Tiers>,
    /// The time to first token the degradation ladder holds (`None`: not watched).
    pub ttft_slo: Option<std::time::Duration>,
    /// The safety policies (`None` on workers: their gateway screened).
    pub policies: Option<Policies>,
    /// The exact response cache (`None`: no cache; workers leave it to their gateway).
    pub response_cache: Option<crate::cache::ResponseCache>,
    /// Where batches, files, conversations, memory and the request log are kept.
    pub store: Option<Store>,
    /// The tenants' document collections.
    pub library: osprey_rag::Library,
    /// The agent runtime's config (`[agent]`).
    pub agents: osprey_agent::AgentConfig,
    /// Keys, limits and admission.
    pub edge: Edge,
}

impl Wiring {
    /// A server of `model_name` on its own engine (set once loaded), behind an open edge (no
    /// keys, default limits), with the default policies and an in-memory response cache.
    pub fn serving(model_name: impl Into<String>) -> Self {
        Self::new(Some(model_name.into()), Vec::new(), Edge::open())
    }

    /// A server of `local` (the names of the models this process's engines serve; none, or an
    /// `Option`, for one or no engine) and `upstreams`, behind `edge`, with the default
    /// policies and an in-memory response cache.
    pub fn new(
        local: impl IntoIterator<Item = String>,
        upstreams: Vec<Upstream>,
        edge: Edge,
    ) -> Self {
        Self {
            local: local.into_iter().collect(),
            upstreams,
            pool: None,
            tiers: None,
            ttft_slo: None,
            policies: Some(Policies::default()),
            response_cache: Some(crate::cache::ResponseCache::memory()),
            store: None,
            library: osprey_rag::Library::at_home(),
            agents: osprey_agent::AgentConfig::default(),
            edge,
        }
    }
}

impl Services {
    /// The services of `setup`, frozen.
    pub fn new(setup: Wiring) -> Self {
        let Wiring {
            local,
            upstreams,
            pool,
            tiers,
            ttft_slo,
            policies,
            response_cache,
            store,
            library,
            agents,
            edge,
        } = setup;
        Self {
            inner: Arc::new(Inner {
                local: (local.into_iter())
                    .map(|name| LocalModel {
                        name,
                        engine: OnceLock::new(),
                        load_error: OnceLock::new(),
                    })
                    .collect(),
                upstreams: upstreams
                    .into_iter()
                    .map(|u| (u.name.clone(), Arc::new(u)))
                    .collect(),
                pool,
                tiers,
                degradation: Arc::new(Degradation::new(ttft_slo)),
                replays: Answers::default(),
                recent: Answers::default(),
                policies,
                abuse: Abuse::default(),
                flags: osprey_store::tenant_flags::Flags::new(),
                response_cache: response_cache.map(Arc::new),
                context_store: (store.clone()).map(|s| Arc::new(s) as Arc<_>),
                store,
                request_log: OnceLock::new(),
                embedder: tokio::sync::OnceCell::new(),
                library: Arc::new(library),
                ingest: osprey_rag::jobs::IngestJobs::default(),
                batch_added: Notify::new(),
                edge: Arc::new(edge),
                created: unix_now(),
                agent_config: agents,
                agents: OnceLock::new(),
            }),
        }
    }

    /// The services of a server of `model_name` on its own engine ([`Wiring::serving`]).
    pub fn serving(model_name: impl Into<String>) -> Self {
        Self::new(Wiring::serving(model_name))
    }

    /// The agent runtime (its tools set up on first use; an error names the bad config).
    pub fn agents(&self) -> Result<&Arc<osprey_agent::responses::Agents>, Error> {
        let built = (self.inner.agents).get_or_init(|| {
            osprey_agent::responses::Agents::new(self.inner.agent_config.clone()).map(Arc::new)
        });
        built.as_ref().map_err(|e| {
            Error::new(
                ErrorKind::Unavailable,
                format!("The agent runtime is not available: {e}"),
            )
        })
    }

    /// The tenants' document collections.
    pub fn library(&self) -> &Arc<osprey_rag::Library> {
        &self.inner.library
    }

    /// The ingest jobs.
    pub fn ingest_jobs(&self) -> &osprey_rag::jobs::IngestJobs {
        &self.inner.ingest
    }

    /// The store of batches and files, if any.
    pub fn store(&self) -> Option<&Store> {
        self.inner.store.as_ref()
    }

    /// The store, as what keeps prompts' context (conversations, memory).
    pub fn context_store(&self) -> Option<&Arc<dyn osprey_context::store::ContextStore>> {
        self.inner.context_store.as_ref()
    }

    /// The sentence embedder (all-MiniLM-L6-v2), loaded on first use from `$OSPREY_HOME`,
    /// fetched there first if need be; `None`, logged once, if it cannot be had.
    pub async fn embedder(&self) -> Option<Arc<osprey_engine::Embedder>> {
        let load = || async {
            match tokio::task::spawn_blocking(osprey_engine::Embedder::fetch_default).await {
                Ok(Ok(embedder)) => Some(Arc::new(embedder)),
                Ok(Err(e)) => {
                    tracing::error!(error = %e, "the embedding model is not available");
                    None
                }
                Err(_) => None,
            }
        };
        self.inner.embedder.get_or_init(load).await.clone()
    }

    /// Where generation requests are logged: the store's request log, if there is a store.
    pub fn request_log(&self) -> Option<&osprey_store::log_writer::RequestLog> {
        if self.edge().config().no_request_log {
            return None;
        }
        let store = self.inner.store.as_ref()?;
        Some((self.inner.request_log).get_or_init(|| {
            osprey_store::log_writer::RequestLog::spawn(
                store.clone(),
                crate::telemetry::lower_thread_priority,
            )
        }))
    }

    /// The request log's writer if it has started (a request was logged), without starting it.
    pub fn started_request_log(&self) -> Option<&osprey_store::log_writer::RequestLog> {
        self.inner.request_log.get()
    }

    /// Wakes the batch runner: a batch was created.
    pub fn batches_changed(&self) {
        self.inner.batch_added.notify_one();
    }

    /// Completes when a batch is created.
    pub async fn batch_added(&self) {
        self.inner.batch_added.notified().await;
    }

    /// The degradation ladder.
    pub fn degradation(&self) -> &Arc<Degradation> {
        &self.inner.degradation
    }

    /// The answers of idempotent requests ([`crate::replay`]).
    pub fn replays(&self) -> &Answers {
        &self.inner.replays
    }

    /// The recent successful answers ([`crate::replay`]).
    pub fn recent(&self) -> &Answers {
        &self.inner.recent
    }

    /// Flagged requests per key, for throttling abuse.
    pub fn abuse(&self) -> &Abuse {
        &self.inner.abuse
    }

    /// The exact response cache, if on.
    pub fn response_cache(&self) -> Option<&Arc<crate::cache::ResponseCache>> {
        self.inner.response_cache.as_ref()
    }

    /// The feature flags of `tenant` now (see [`osprey_store::tenant_flags`]).
    pub async fn flags(&self, tenant: &str) -> osprey_store::tenant_flags::TenantFlags {
        let store = self.audit_store();
        self.inner.flags.of(store.as_ref(), tenant).await
    }

    /// Where safety verdicts are audited: the store, or the key store.
    pub fn audit_store(&self) -> Option<Store> {
        self.store().or(self.edge().auth().store()).cloned()
    }

    /// The safety policies, unless off.
    pub fn policies(&self) -> Option<&Policies> {
        self.inner.policies.as_ref()
    }

    /// The tiers of `auto`, if configured.
    pub fn tiers(&self) -> Option<&Tiers> {
        self.inner.tiers.as_ref()
    }

    /// The worker pool, if the model is served by workers.
    pub fn pool(&self) -> Option<&Arc<WorkerPool>> {
        self.inner.pool.as_ref()
    }

    /// Marks the first local model loaded (the only one, on most servers): its requests are
    /// served from now on.
    pub fn set_engine(&self, engine: Engine) {
        if let Some(local) = self.inner.local.first() {
            let _ = local.engine.set(engine);
        }
    }

    /// Records how loading the local model `name` ended: its engine, whose requests are served
    /// from now on, or why it failed, which its requests get in a 503.
    pub fn set_loaded(&self, name: &str, loaded: Result<Engine, String>) {
        let Some(local) = self.inner.local.iter().find(|l| l.name == name) else {
            return;
        };
        let _ = match loaded {
            Ok(engine) => local.engine.set(engine).map_err(drop),
            Err(why) => local.load_error.set(why).map_err(drop),
        };
    }

    /// The first local model's name (the default one), if this server runs an engine.
    pub fn model_name(&self) -> Option<&str> {
        self.inner.local.first().map(|l| l.name.as_str())
    }

    /// The local models, in the order they were given, each as loaded so far.
    pub fn local_models(&self) -> impl Iterator<Item = LocalStatus<'_>> {
        self.inner.local.iter().map(|l| LocalStatus {
            name: &l.name,
            engine: l.engine.get(),
            load_error: l.load_error.get().map(String::as_str),
        })
    }

    /// Whether `model` is one of the local models.
    pub fn is_local(&self, model: &str) -> bool {
        self.inner.local.iter().any(|l| l.name == model)
    }

    /// The upstream models.
    pub fn upstreams(&self) -> impl Iterator<Item = &Arc<Upstream>> {
        self.inner.upstreams.values()
    }

    /// When the server started (Unix seconds).
    pub fn created(&self) -> u64 {
        self.inner.created
    }

    /// The first local model's engine (the default one), once loaded.
    pub fn engine(&self) -> Option<&Engine> {
        self.inner.local.first()?.engine.get()
    }

    /// The edge (keys, limits, admission).
    pub fn edge(&self) -> &Edge {
        &self.inner.edge
    }

    /// The edge, shared.
    pub fn edge_arc(&self) -> Arc<Edge> {
        self.inner.edge.clone()
    }

    /// Where `model` is served: 404 for a model not served here, 503 while the local one loads.
    pub fn served_by(&self, model: &str) -> Result<ServedBy, Error> {
        if let Some(u) = self.inner.upstreams.get(model) {
            return Ok(ServedBy::Upstream(u.clone()));
        }
        if let Some(pool) = self.inner.pool.as_ref().filter(|p| p.name() == model) {
            return Ok(ServedBy::Pool(pool.clone()));
        }
        self.engine_for(model).map(ServedBy::Local)
    }

    /// The local engine serving `model`: 404 for a model not served here, 503 while loading.
    pub fn engine_for(&self, model: &str) -> Result<Engine, Error> {
        let Some(local) = self.inner.local.iter().find(|l| l.name == model) else {
            return Err(Error::model_not_found(model));
        };
        if let Some(e) = local.engine.get() {
            return Ok(e.clone());
        }
        let why = match local.load_error.get() {
            Some(e) => format!("The model failed to load: {e}"),
            None => "The model is still loading; retry shortly.".to_owned(),
        };
        Err(Error::new(ErrorKind::Unavailable, why))
    }
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
