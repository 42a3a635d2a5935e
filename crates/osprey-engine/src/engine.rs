//! The engine handle: loads a model, validates requests, queues them for the engine thread.

use std::path::Path;
use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock};

use osprey_core::{Error, ErrorKind};
use osprey_models::{KvCache, KvLayout, ModelError, Transformer};

use crate::chat_template::TemplateMessage;
use crate::engine_loop::{Command, EngineLoop, LoopSetup};
use crate::kda::RoutedLoad;
use crate::kv_events::KvEventLog;
use crate::prompter::Prompter;
use crate::request::{EventReceiver, GenerateRequest, ValidRequest};
use crate::scheduler::{SchedulerConfig, SchedulingPolicy};
use crate::speculative::Drafter;
use crate::structured::GrammarCompiler;
use crate::tiers::{BlockLayout, KvTiers, Tier, TierConfig, model_fingerprint};
use crate::tokenizer::Tokenizer;

/// How the engine is sized and scheduled.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Step budget, sequence cap and priority policy.
    pub scheduler: SchedulerConfig,
    /// Bytes of KV cache in the block pool.
    pub kv_cache_bytes: usize,
    /// Reuse the KV of earlier requests sharing a prefix.
    pub prefix_caching: bool,
    /// Sequences that may wait for admission; beyond this, requests get a 503.
    pub max_waiting: usize,
    /// Compute threads (0 = one per core).
    pub threads: usize,
    /// Context window; `None` uses the model's.
    pub max_model_len: Option<usize>,
    /// KV tiers below the pool (host RAM, disk, Redis); none by default.
    pub tiers: TierConfig,
    /// The name the model is served under: the `model` label of the engine's metrics
    /// (default: the file's `general.name`, else its file name).
    pub name: Option<String>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            scheduler: SchedulerConfig::default(),
            kv_cache_bytes: default_kv_cache_bytes(),
            prefix_caching: true,
            max_waiting: 256,
            threads: 0,
            max_model_len: None,
            tiers: TierConfig::default(),
            name: None,
        }
    }
}

/// A tenth of physical memory, between 256 MiB and 4 GiB. (The pool is allocated lazily, so
/// memory is only resident once blocks are used.)
pub fn default_kv_cache_bytes() -> usize {
    let total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .map(str::to_owned)
        })
        .and_then(|l| {
            l.split_whitespace()
                .nth(1)
                .and_then(|kb| kb.parse::<usize>().ok())
        })
        .map_or(8 << 30, |kb| kb * 1024);
    (total / 10).clamp(256 << 20, 4 << 30)
}

/// Facts about the loaded model.
#[derive(Clone, Debug)]
pub struct ModelInfo {
    /// Name from the file's metadata.
    pub name: Option<String>,
    /// Context window in tokens.
    pub max_model_len: usize,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// KV cache capacity in tokens (of a sequence every KV group holds whole).
    pub kv_capacity_tokens: usize,
    /// Bytes of KV cache one token takes.
    pub kv_bytes_per_token: usize,
    /// Bytes of weights read per forward pass.
    pub weight_bytes: usize,
}

/// Live counters of the engine, updated after every step.
#[derive(Debug, Default)]
pub struct EngineStats {
    pub(crate) running: AtomicUsize,
    pub(crate) waiting: AtomicUsize,
    /// Requests submitted but not yet taken in by the engine thread.
    pub(crate) queued: AtomicUsize,
    pub(crate) free_blocks: AtomicUsize,
    pub(crate) total_blocks: AtomicUsize,
    pub(crate) steps: AtomicUsize,
    pub(crate) preemptions: AtomicU64,
    pub(crate) prefix_queried_tokens: AtomicU64,
    pub(crate) prefix_hit_tokens: AtomicU64,
    pub(crate) deferrals: AtomicU64,
    /// KV blocks brought back into the pool from each lower tier (warm, cold, shared).
    pub(crate) tier_hits: [AtomicU64; 3],
    /// The scheduling policy in force, as its index in [`POLICIES`].
    policy: AtomicU8,
    routing: Mutex<RoutingTotals>,
}

/// The policies, numbered for [`EngineStats`].
const POLICIES: [SchedulingPolicy; 3] = [
    SchedulingPolicy::Priority,
    SchedulingPolicy::Fcfs,
    SchedulingPolicy::Kda,
];

/// Sums over the steps of an MoE model of what they routed (see [`RoutedLoad`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RoutingTotals {
    /// Steps measured.
    pub steps: u64,
    /// Sum of their expert-load imbalance.
    pub imbalance: f64,
    /// Sum of their experts run per MoE layer.
    pub active_experts: f64,
}

impl EngineStats {
    /// Sequences in the running batch.
    pub fn running(&self) -> usize {
        self.running.load(Ordering::Relaxed)
    }
    /// Sequences waiting for admission.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed) + self.queued.load(Ordering::Relaxed)
    }
    /// KV blocks not held by any sequence.
    pub fn free_blocks(&self) -> usize {
        self.free_blocks.load(Ordering::Relaxed)
    }
    /// KV blocks in the pool.
    pub fn total_blocks(&self) -> usize {
        self.total_blocks.load(Ordering::Relaxed)
    }
    /// Forward passes run so far.
    pub fn steps(&self) -> usize {
        self.steps.load(Ordering::Relaxed)
    }
    /// Sequences preempted so far.
    pub fn preemptions(&self) -> u64 {
        self.preemptions.load(Ordering::Relaxed)
    }
    /// Prompt tokens looked up in the prefix cache so far.
    pub fn prefix_queried_tokens(&self) -> u64 {
        self.prefix_queried_tokens.load(Ordering::Relaxed)
    }
    /// Of those, tokens whose KV was reused.
    pub fn prefix_hit_tokens(&self) -> u64 {
        self.prefix_hit_tokens.load(Ordering::Relaxed)
    }
    /// KV blocks brought back into the pool from `tier` so far.
    pub fn tier_hits(&self, tier: Tier) -> u64 {
        self.tier_hits[tier as usize].load(Ordering::Relaxed)
    }
    /// Steps sequences were held back to keep an expert under capacity (`kda`).
    pub fn deferrals(&self) -> u64 {
        self.deferrals.load(Ordering::Relaxed)
    }
    /// The scheduling policy in force.
    pub fn policy(&self) -> SchedulingPolicy {
        POLICIES[self.policy.load(Ordering::Relaxed) as usize]
    }
    /// What the steps of an MoE model have routed so far (zero for a dense model).
    pub fn routing(&self) -> RoutingTotals {
        *self.routing.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn set_policy(&self, policy: SchedulingPolicy) {
        let i = POLICIES.iter().position(|&p| p == policy).unwrap_or(0);
        self.policy.store(i as u8, Ordering::Relaxed);
    }

    pub(crate) fn record_routing(&self, load: &RoutedLoad) {
        let mut t = self.routing.lock().unwrap_or_else(|e| e.into_inner());
        t.steps += 1;
        t.imbalance += load.imbalance as f64;
        t.active_experts += load.active_experts as f64;
    }
}

struct Shared {
    commands: mpsc::Sender<Command>,
    /// Built on the first request with a grammar (it takes a walk over the whole vocabulary).
    grammars: OnceLock<Result<GrammarCompiler, String>>,
    stats: Arc<EngineStats>,
    prompter: Prompter,
    kv_events: Arc<KvEventLog>,
    info: ModelInfo,
    max_waiting: usize,
}

/// A running engine. Cheap to clone; the engine thread stops when the last clone is dropped.
#[derive(Clone)]
pub struct Engine {
    shared: Arc<Shared>,
}

/// The longest sequence `pages` pages hold: a full group needs a page for each of its blocks; a
/// windowed group at most its window's and a prefill chunk's (it gives back the rest as the
/// sequence advances).
fn kv_capacity_tokens(layout: &KvLayout, pages: usize, chunk: usize) -> usize {
    use osprey_models::BLOCK_SIZE;
    let groups = layout.groups();
    let every_group_whole = pages / groups.len() * BLOCK_SIZE;
    let capped: usize = (groups.iter())
        .filter_map(|g| g.window)
        .map(|w| w.div_ceil(BLOCK_SIZE) + 1 + chunk.div_ceil(BLOCK_SIZE))
        .sum();
    let full = groups.iter().filter(|g| g.window.is_none()).count();
    match pages.checked_sub(capped) {
        None => every_group_whole,
        Some(_) if full == 0 => usize::MAX,
        Some(rest) => every_group_whole.max(rest / full * BLOCK_SIZE),
    }
}

impl Engine {
    /// Loads the model at `path` (a GGUF file or a checkpoint directory) and starts the
    /// engine thread.
    pub fn load(path: &Path, config: EngineConfig) -> Result<Self, ModelError> {
        let (model, prompter) = rayon::join(|| Transformer::open(path), || Prompter::load(path));
        let (model, prompter) = (model?, prompter?);
        let mc = model.config().clone();
        if let Drafter::Layers(n) = config.scheduler.speculation.drafter
            && n >= mc.n_layers
        {
            return Err(ModelError::Input(format!(
                "--speculative layers:{n} must draft with fewer layers than the model's {}",
                mc.n_layers
            )));
        }
        let max_model_len = config
            .max_model_len
            .unwrap_or(mc.context_length)
            .min(mc.context_length);
        // Pages: each holds one KV group's layers, so a position costs a page per group (until
        // a windowed group gives it back).
        let layout = KvLayout::new(&mc);
        let groups = layout.groups().len();
        let blocks = KvCache::blocks_for_bytes(&mc, config.kv_cache_bytes).max(groups);
        let chunk = config.scheduler.max_num_batched_tokens;
        let info = ModelInfo {
            name: mc.name.clone(),
            max_model_len,
            vocab_size: mc.vocab_size,
            kv_capacity_tokens: kv_capacity_tokens(&layout, blocks, chunk),
            kv_bytes_per_token: mc.kv_bytes_per_token(),
            weight_bytes: model.weight_bytes(),
        };
        let threads = match config.threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        };
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("osprey-compute-{i}"))
            .build()
            .map_err(|e| ModelError::Tokenizer(format!("thread pool: {e}")))?;
        let (tx, rx) = mpsc::channel();
        let stats = Arc::new(EngineStats::default());
        stats.free_blocks.store(blocks, Ordering::Relaxed);
        stats.total_blocks.store(blocks, Ordering::Relaxed);
        stats.set_policy(config.scheduler.policy);
        let kv = KvCache::new(&mc, blocks);
        let label: metrics::SharedString = (config.name.clone())
            .or_else(|| mc.name.clone())
            .or_else(|| path.file_stem().map(|s| s.to_string_lossy().into_owned()))
            .unwrap_or_default()
            .into();
        let tiers = match config.tiers.enabled() {
            true => {
                let layout = BlockLayout {
                    len: kv.block_len(),
                    group: osprey_models::BLOCK_SIZE * mc.head_dim,
                };
                let start = || {
                    let fingerprint = model_fingerprint(path)?;
                    KvTiers::start(config.tiers.clone(), &fingerprint, layout, label.clone())
                };
                Some(
                    start()
                        .map_err(|e| ModelError::Input(format!("starting the KV tiers: {e}")))?,
                )
            }
            false => None,
        };
        let end_tokens = prompter.tokenizer().end_of_generation().to_vec();
        let kv_events = Arc::new(KvEventLog::default());
        let loop_events = kv_events.clone();
        let loop_stats = stats.clone();
        let scheduler = config.scheduler.clone();
        let prefix_caching = config.prefix_caching;
        std::thread::Builder::new()
            .name("osprey-engine".into())
            .spawn(move || {
                let setup = LoopSetup {
                    model,
                    kv,
                    scheduler,
                    prefix_caching,
                    pool,
                    end_tokens,
                    max_model_len,
                    stats: loop_stats,
                    kv_events: loop_events,
                    tiers,
                    label,
                };
                EngineLoop::new(setup).run(rx)
            })
            .map_err(|e| ModelError::Tokenizer(format!("engine thread: {e}")))?;
        tracing::info!(
            path = %path.display(),
            layers = mc.n_layers,
            kv_tokens = info.kv_capacity_tokens,
            threads,
            prefix_caching,
            "model loaded"
        );
        Ok(Self {
            shared: Arc::new(Shared {
                commands: tx,
                grammars: OnceLock::new(),
                stats,
                prompter,
                kv_events,
                info,
                max_waiting: config.max_waiting,
            }),
        })
    }

    /// Switches the scheduling policy from the engine's next step on (waiting requests are
    /// requeued in the new order; running ones keep their place).
    pub fn set_scheduling_policy(&self, policy: SchedulingPolicy) -> Result<(), Error> {
        (self.shared.commands.send(Command::SetPolicy(policy)))
            .map_err(|_| Error::new(ErrorKind::Unavailable, "the engine has stopped"))?;
        self.shared.stats.set_policy(policy);
        Ok(())
    }

    /// The model's tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        self.shared.prompter.tokenizer()
    }

    /// The model's tokenizer and chat template.
    pub fn prompter(&self) -> &Prompter {
        &self.shared.prompter
    }

    /// The prefix cache's contents and changes, for routers (see [`KvEventLog`]).
    pub fn kv_events(&self) -> &KvEventLog {
        &self.shared.kv_events
    }

    /// Live counters.
    pub fn stats(&self) -> &EngineStats {
        &self.shared.stats
    }

    /// Facts about the model.
    pub fn info(&self) -> &ModelInfo {
        &self.shared.info
    }

    /// Renders a conversation with the model's chat template, ready for the assistant's turn.
    pub fn render_chat(&self, messages: &[TemplateMessage]) -> Result<String, Error> {
        self.shared.prompter.render_chat(messages)
    }

    /// Checks a request against the model and caps `max_tokens` to the context window.
    /// Errors about the prompt name the field `prompt`.
    pub fn validate(&self, mut request: GenerateRequest) -> Result<ValidRequest, Error> {
        let info = &self.shared.info;
        let (prompt, params) = (&request.prompt, &mut request.params);
        if prompt.is_empty() {
            return Err(Error::invalid("prompt", "the prompt is empty"));
        }
        let outside = |what: &str, id: u32| {
            Error::invalid(
                what,
                format!(
                    "token id {id} is outside the vocabulary (size {})",
                    info.vocab_size
                ),
            )
        };
        if let Some(&bad) = prompt.iter().find(|&&t| t as usize >= info.vocab_size) {
            return Err(outside("prompt", bad));
        }
        if let Some(&(bad, _)) = params
            .logit_bias
            .iter()
            .find(|(id, _)| *id as usize >= info.vocab_size)
        {
            return Err(outside("logit_bias", bad));
        }
        let ctx = info.max_model_len.min(info.kv_capacity_tokens);
        if prompt.len() >= ctx {
            let message = format!(
                "This model's maximum context length is {ctx} tokens, but the prompt has {} tokens, leaving no room for output.",
                prompt.len()
            );
            return Err(Error::invalid("prompt", message).with_code("context_length_exceeded"));
        }
        let room = ctx - prompt.len();
        if params.max_tokens == 0 && !request.prompt_logprobs {
            let message = "max_tokens must be at least 1 (0 is only allowed to score the prompt, with echo and logprobs)";
            return Err(Error::invalid("max_tokens", message));
        }
        if params.max_tokens == usize::MAX {
            params.max_tokens = room;
        } else if params.max_tokens > room {
            let message = format!(
                "max_tokens is {}, but the prompt has {} tokens and this model's maximum context length is {ctx}: at most {room} tokens can be generated.",
                params.max_tokens,
                prompt.len()
            );
            return Err(Error::invalid("max_tokens", message).with_code("context_length_exceeded"));
        }
        let constraint = match &request.grammar {
            Some(grammar) => Some(self.grammars()?.compile(grammar)?),
            None => None,
        };
        Ok(ValidRequest {
            request,
            constraint,
        })
    }

    /// The grammar compiler of this model's vocabulary, built on first use.
    pub fn grammars(&self) -> Result<&GrammarCompiler, Error> {
        let shared = &self.shared;
        let built = shared.grammars.get_or_init(|| {
            GrammarCompiler::new(shared.prompter.tokenizer()).map_err(|e| e.message)
        });
        built.as_ref().map_err(|e| Error::internal(e.clone()))
    }

    /// Queues a request; its events arrive on the returned receiver, and dropping the receiver
    /// cancels it. When too many sequences are already waiting, answers `Unavailable` with a
    /// retry hint instead of queueing without limit.
    pub fn submit(&self, request: ValidRequest) -> Result<EventReceiver, Error> {
        let stats = &self.shared.stats;
        let queued = stats.queued.fetch_add(1, Ordering::Relaxed);
        if queued + stats.waiting.load(Ordering::Relaxed) >= self.shared.max_waiting {
            stats.queued.fetch_sub(1, Ordering::Relaxed);
            return Err(Error::new(
                ErrorKind::Unavailable,
                "The server is at capacity; retry shortly.",
            )
            .with_code("server_overloaded")
            .with_retry_after(1));
        }
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        self.shared
            .commands
            .send(Command::Add(Box::new(request), tx))
            .map_err(|_| {
                stats.queued.fetch_sub(1, Ordering::Relaxed);
                Error::new(ErrorKind::Unavailable, "the engine has stopped")
            })?;
        Ok(rx)
    }
}
