//! The engine: a handle for request handlers, and the step loop on its own thread.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::Instant;

use osprey_core::{Error, ErrorKind, FinishReason, SamplingParams};
use osprey_models::{
    BatchSeq, ForwardBatch, ForwardScratch, GgufFile, KvCache, LlamaModel, LogitsWanted, ModelError,
};
use rayon::prelude::*;

use crate::block_allocator::{BlockAllocator, BlockTable};
use crate::chat_template::{ChatTemplate, TemplateMessage};
use crate::request::{EventReceiver, SeqEvent, ValidRequest};
use crate::sampler::{Sampled, TokenLogprob, log_sum_exp, top_n};
use crate::scheduler::{Scheduler, SchedulerConfig};
use crate::sequence::Sequence;
use crate::tokenizer::Tokenizer;

/// How the engine is sized.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Most tokens in one forward pass.
    pub max_num_batched_tokens: usize,
    /// Most sequences in one forward pass.
    pub max_num_seqs: usize,
    /// Bytes of KV cache to preallocate.
    pub kv_cache_bytes: usize,
    /// Compute threads (0 = one per core).
    pub threads: usize,
    /// Context window; `None` uses the model's.
    pub max_model_len: Option<usize>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            max_num_batched_tokens: 512,
            max_num_seqs: 32,
            kv_cache_bytes: 1 << 30,
            threads: 0,
            max_model_len: None,
        }
    }
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
    /// KV cache capacity in tokens.
    pub kv_capacity_tokens: usize,
    /// Bytes of weights read per forward pass.
    pub weight_bytes: usize,
}

enum Command {
    Add(Box<ValidRequest>, crate::request::EventSender),
}

/// Live counters of the engine, updated after every step.
#[derive(Debug, Default)]
pub struct EngineStats {
    running: AtomicUsize,
    waiting: AtomicUsize,
    free_blocks: AtomicUsize,
    total_blocks: AtomicUsize,
    steps: AtomicUsize,
}

impl EngineStats {
    /// Sequences in the running batch.
    pub fn running(&self) -> usize {
        self.running.load(Ordering::Relaxed)
    }
    /// Sequences waiting for admission.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
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
}

struct Shared {
    commands: mpsc::Sender<Command>,
    stats: Arc<EngineStats>,
    tokenizer: Tokenizer,
    template: ChatTemplate,
    info: ModelInfo,
}

/// A running engine. Cheap to clone; the engine thread stops when the last clone is dropped.
#[derive(Clone)]
pub struct Engine {
    shared: Arc<Shared>,
}

impl Engine {
    /// Loads the GGUF model at `path` and starts the engine thread.
    pub fn load(path: &Path, config: EngineConfig) -> Result<Self, ModelError> {
        let gguf = GgufFile::open(path)?;
        let (model, tokenizer) =
            rayon::join(|| LlamaModel::load(&gguf), || Tokenizer::from_gguf(&gguf));
        let (model, tokenizer) = (model?, tokenizer?);
        let token_text = |id: Option<u32>| {
            id.and_then(|i| tokenizer.id_to_token(i))
                .unwrap_or_default()
        };
        let source = gguf.str("tokenizer.chat_template").ok();
        let template = ChatTemplate::new(
            source,
            token_text(tokenizer.bos()),
            token_text(tokenizer.eos()),
        )
        .or_else(|e| {
            tracing::warn!(error = %e, "the model's chat template does not compile; using ChatML");
            ChatTemplate::new(None, String::new(), String::new())
        })
        .map_err(ModelError::Tokenizer)?;
        let mc = model.config().clone();
        let max_model_len = config
            .max_model_len
            .unwrap_or(mc.context_length)
            .min(mc.context_length);
        let blocks = KvCache::blocks_for_bytes(&mc, config.kv_cache_bytes).max(1);
        let info = ModelInfo {
            name: mc.name.clone(),
            max_model_len,
            vocab_size: mc.vocab_size,
            kv_capacity_tokens: blocks * osprey_models::BLOCK_SIZE,
            weight_bytes: model.weight_bytes(),
        };
        let threads = if config.threads == 0 {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            config.threads
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
        let loop_stats = stats.clone();
        let end_tokens = tokenizer.end_of_generation().to_vec();
        let kv = KvCache::new(&mc, blocks);
        let sched = SchedulerConfig {
            max_num_batched_tokens: config.max_num_batched_tokens.max(1),
            max_num_seqs: config.max_num_seqs.max(1),
        };
        std::thread::Builder::new()
            .name("osprey-engine".into())
            .spawn(move || {
                // The allocator is single-threaded shared state, so it is made on this thread.
                let engine_loop = EngineLoop {
                    model,
                    kv,
                    allocator: BlockAllocator::new(blocks),
                    scheduler: Scheduler::new(sched),
                    scratch: ForwardScratch::default(),
                    pool,
                    end_tokens,
                    max_model_len,
                    next_id: 0,
                    stats: loop_stats,
                };
                engine_loop.run(rx)
            })
            .map_err(|e| ModelError::Tokenizer(format!("engine thread: {e}")))?;
        tracing::info!(
            path = %path.display(),
            layers = mc.n_layers,
            kv_tokens = info.kv_capacity_tokens,
            threads,
            "model loaded"
        );
        Ok(Self {
            shared: Arc::new(Shared {
                commands: tx,
                stats,
                tokenizer,
                template,
                info,
            }),
        })
    }

    /// The model's tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.shared.tokenizer
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
        self.shared.template.render(messages, true)
    }

    /// Checks a tokenized prompt and its options against the model and caps `max_tokens` to
    /// the context window. Errors about the prompt name the field `prompt`.
    pub fn validate(
        &self,
        prompt: Vec<u32>,
        mut params: SamplingParams,
        prompt_logprobs: bool,
        seed: u64,
    ) -> Result<ValidRequest, Error> {
        let info = &self.shared.info;
        let param = "prompt";
        if prompt.is_empty() {
            return Err(Error::invalid(param, "the prompt is empty"));
        }
        if let Some(&bad) = prompt.iter().find(|&&t| t as usize >= info.vocab_size) {
            return Err(Error::invalid(
                "prompt",
                format!(
                    "token id {bad} is outside the vocabulary (size {})",
                    info.vocab_size
                ),
            ));
        }
        for &(id, _) in &params.logit_bias {
            if id as usize >= info.vocab_size {
                return Err(Error::invalid(
                    "logit_bias",
                    format!(
                        "token id {id} is outside the vocabulary (size {})",
                        info.vocab_size
                    ),
                ));
            }
        }
        let ctx = info.max_model_len.min(info.kv_capacity_tokens);
        if prompt.len() >= ctx {
            return Err(Error::invalid(
                param,
                format!(
                    "This model's maximum context length is {ctx} tokens, but the prompt has {} tokens, leaving no room for output.",
                    prompt.len()
                ),
            )
            .with_code("context_length_exceeded"));
        }
        let room = ctx - prompt.len();
        if params.max_tokens == 0 && !prompt_logprobs {
            return Err(Error::invalid(
                "max_tokens",
                "max_tokens must be at least 1 (0 is only allowed to score the prompt, with echo and logprobs)",
            ));
        }
        if params.max_tokens == usize::MAX {
            params.max_tokens = room;
        } else if params.max_tokens > room {
            return Err(Error::invalid(
                "max_tokens",
                format!(
                    "max_tokens is {}, but the prompt has {} tokens and this model's maximum context length is {ctx}: at most {room} tokens can be generated.",
                    params.max_tokens,
                    prompt.len()
                ),
            )
            .with_code("context_length_exceeded"));
        }
        Ok(ValidRequest {
            prompt,
            params,
            prompt_logprobs,
            seed,
        })
    }

    /// Queues a request; its events arrive on the returned receiver, and dropping the
    /// receiver cancels it.
    pub fn submit(&self, request: ValidRequest) -> Result<EventReceiver, Error> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        self.shared
            .commands
            .send(Command::Add(Box::new(request), tx))
            .map_err(|_| Error::new(ErrorKind::Unavailable, "the engine has stopped"))?;
        Ok(rx)
    }
}

/// State owned by the engine thread.
struct EngineLoop {
    model: LlamaModel,
    kv: KvCache,
    allocator: crate::block_allocator::SharedAllocator,
    scheduler: Scheduler,
    scratch: ForwardScratch,
    pool: rayon::ThreadPool,
    end_tokens: Vec<u32>,
    max_model_len: usize,
    next_id: u64,
    stats: Arc<EngineStats>,
}

impl EngineLoop {
    fn run(mut self, commands: mpsc::Receiver<Command>) {
        loop {
            if !self.scheduler.has_work() {
                match commands.recv() {
                    Ok(cmd) => self.accept(cmd),
                    Err(_) => return,
                }
            }
            while let Ok(cmd) = commands.try_recv() {
                self.accept(cmd);
            }
            self.scheduler.remove_cancelled();
            self.publish_stats();
            // A panic here is a bug; fail the step's sequences rather than the whole server.
            let step = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.step()));
            if step.is_err() {
                tracing::error!("engine step panicked; failing its sequences");
                for seq in self.scheduler.take_running(|_| true) {
                    seq.send(SeqEvent::Failed(Error::internal(
                        "the engine failed while computing this request",
                    )));
                }
            }
        }
    }

    fn accept(&mut self, Command::Add(req, events): Command) {
        let ValidRequest {
            prompt,
            params,
            prompt_logprobs,
            seed,
        } = *req;
        let end_tokens = if params.ignore_eos {
            Vec::new()
        } else {
            self.end_tokens.clone()
        };
        let mut enders = end_tokens.clone();
        enders.extend(&params.stop_token_ids);
        self.next_id += 1;
        self.scheduler.add(Sequence {
            id: self.next_id,
            prompt_len: prompt.len(),
            sampler: crate::sampler::Sampler::new(params, seed, &prompt, enders),
            tokens: prompt,
            num_computed: 0,
            block_table: BlockTable::new(self.allocator.clone()),
            prompt_logprobs_sent: prompt_logprobs.then_some(0),
            max_len: self.max_model_len,
            end_tokens,
            events,
            arrival: Instant::now(),
            finish: None,
        });
    }

    fn step(&mut self) {
        let plan = self.scheduler.schedule();
        for (seq, reason) in plan.ended {
            seq.send(SeqEvent::Finished(reason));
        }
        if plan.scheduled.is_empty() {
            return;
        }

        // Build the batch: each scheduled sequence's next tokens, and which logits it needs.
        let running = self.scheduler.running();
        let mut tokens = Vec::new();
        let mut seqs = Vec::with_capacity(plan.scheduled.len());
        for s in &plan.scheduled {
            let seq = &running[s.index];
            let start = seq.num_computed;
            tokens.extend_from_slice(&seq.tokens[start..start + s.n_tokens]);
            let logits = if !prompt_positions(seq, s.n_tokens).is_empty() {
                LogitsWanted::All
            } else if start + s.n_tokens == seq.tokens.len() {
                LogitsWanted::Last
            } else {
                LogitsWanted::None
            };
            seqs.push(BatchSeq {
                n_tokens: s.n_tokens,
                start_pos: start,
                block_table: seq.block_table.blocks(),
                logits,
            });
        }
        let (model, kv, scratch) = (&self.model, &mut self.kv, &mut self.scratch);
        let batch = ForwardBatch {
            tokens: &tokens,
            seqs: &seqs,
        };
        let logits = self.pool.install(|| model.forward(&batch, kv, scratch));
        metrics::histogram!(osprey_core::metrics::BATCH_TOKENS).record(tokens.len() as f64);
        metrics::histogram!(osprey_core::metrics::BATCH_SEQUENCES).record(seqs.len() as f64);
        let kinds: Vec<LogitsWanted> = seqs.iter().map(|s| s.logits).collect();

        // Hand each sequence its rows of logits, then score prompts and sample in parallel.
        let vocab = self.model.config().vocab_size;
        let mut rest: &mut [f32] = logits;
        let mut work = Vec::with_capacity(plan.scheduled.len());
        let mut next = plan.scheduled.iter().zip(&kinds).peekable();
        for (index, seq) in self.scheduler.running_mut().iter_mut().enumerate() {
            let Some(&(s, &kind)) = next.peek() else {
                break;
            };
            if s.index != index {
                continue;
            }
            next.next();
            let n_rows = match kind {
                LogitsWanted::None => 0,
                LogitsWanted::Last => 1,
                LogitsWanted::All => s.n_tokens,
            };
            let (rows, tail) = std::mem::take(&mut rest).split_at_mut(n_rows * vocab);
            rest = tail;
            let positions = prompt_positions(seq, s.n_tokens);
            let targets = positions
                .clone()
                .map(|q| (q > 0).then(|| (seq.tokens[q], q - 1 - seq.num_computed)))
                .collect();
            let top = seq.sampler.params().logprobs.unwrap_or(0);
            let completes = seq.num_computed + s.n_tokens == seq.tokens.len();
            let samples = completes && seq.sampler.params().max_tokens > 0;
            work.push(StepWork {
                rows,
                targets,
                top,
                sampler: samples.then_some(&mut seq.sampler),
            });
        }
        let results: Vec<StepResult> = self
            .pool
            .install(|| work.into_par_iter().map(|w| w.run(vocab)).collect());

        // Apply results in order: advance, report, and end sequences that are done.
        let running = self.scheduler.running_mut();
        for (s, result) in plan.scheduled.iter().zip(results) {
            let seq = &mut running[s.index];
            let reported = prompt_positions(seq, s.n_tokens);
            seq.num_computed += s.n_tokens;
            if !result.prompt_logprobs.is_empty() {
                seq.prompt_logprobs_sent = Some(reported.end);
                seq.send(SeqEvent::PromptLogprobs(result.prompt_logprobs));
            }
            if seq.num_computed == seq.tokens.len() && seq.sampler.params().max_tokens == 0 {
                // Scoring only: the prompt is done and nothing is to be generated.
                seq.finish = Some(FinishReason::Length);
            }
            if let Some(sampled) = result.sampled {
                let id = sampled.id;
                if seq.generated() == 0 {
                    metrics::histogram!(osprey_core::metrics::ENGINE_QUEUE_TO_FIRST_TOKEN)
                        .record(seq.arrival.elapsed().as_secs_f64());
                }
                seq.send(SeqEvent::Token(sampled));
                seq.finish = seq.push_token(id);
            }
        }
        for seq in self.scheduler.take_running(|s| s.finish.is_some()) {
            seq.send(SeqEvent::Finished(seq.finish.unwrap_or(FinishReason::Stop)));
        }
        self.stats.steps.fetch_add(1, Ordering::Relaxed);
        self.publish_stats();
    }

    fn publish_stats(&self) {
        let (running, waiting) = (self.scheduler.running().len(), self.scheduler.num_waiting());
        let free = self.allocator.borrow().num_free();
        self.stats.running.store(running, Ordering::Relaxed);
        self.stats.waiting.store(waiting, Ordering::Relaxed);
        self.stats.free_blocks.store(free, Ordering::Relaxed);
        metrics::gauge!(osprey_core::metrics::RUNNING_SEQUENCES).set(running as f64);
        metrics::gauge!(osprey_core::metrics::WAITING_SEQUENCES).set(waiting as f64);
        metrics::gauge!(osprey_core::metrics::KV_BLOCKS_FREE).set(free as f64);
    }
}

/// Prompt positions whose log-probabilities this step reports for `seq` computing `n` more
/// tokens: those not yet sent, up to the last one the step's logits can score.
fn prompt_positions(seq: &Sequence, n: usize) -> std::ops::Range<usize> {
    match seq.prompt_logprobs_sent {
        Some(sent) => sent..(seq.num_computed + n + 1).min(seq.prompt_len).max(sent),
        None => 0..0,
    }
}

/// One sequence's post-forward work: score its prompt positions and sample.
struct StepWork<'a> {
    rows: &'a mut [f32],
    /// Per reported prompt position: its token and the logits row predicting it (`None` for
    /// position 0).
    targets: Vec<Option<(u32, usize)>>,
    top: usize,
    sampler: Option<&'a mut crate::sampler::Sampler>,
}

/// What a [`StepWork`] produced.
struct StepResult {
    prompt_logprobs: Vec<Option<TokenLogprob>>,
    sampled: Option<Sampled>,
}

impl StepWork<'_> {
    fn run(self, vocab: usize) -> StepResult {
        let prompt_logprobs = self
            .targets
            .iter()
            .map(|t| {
                t.map(|(id, row)| {
                    let row = &self.rows[row * vocab..(row + 1) * vocab];
                    let lse = log_sum_exp(row);
                    TokenLogprob {
                        id,
                        logprob: row[id as usize] - lse,
                        top: top_n(row, self.top, lse),
                    }
                })
            })
            .collect();
        let sampled = self.sampler.map(|s| {
            let last = self.rows.len() - vocab;
            s.sample(&mut self.rows[last..])
        });
        StepResult {
            prompt_logprobs,
            sampled,
        }
    }
}
