//! The engine thread: one step after another — schedule, one forward pass, sample, report.

mod self_draft;
mod tiering;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use osprey_core::metrics as names;
use osprey_core::{Error, FinishReason};
use osprey_models::{BatchSeq, ForwardBatch, ForwardScratch, KvCache, LogitsWanted, Transformer};
use rayon::prelude::*;

use crate::engine::EngineStats;
use crate::kda::{ExpertLayout, RoutedLoad};
use crate::kv::{BlockTable, KvCacheCounters, KvCacheManager, SharedKvCacheManager};
use crate::kv_events::KvEventLog;
use crate::request::{EventSender, SeqEvent, ValidRequest};
use crate::sampler::{Sampled, Sampler, TokenLogprob, log_sum_exp, top_n};
use crate::scheduler::{ScheduledSeq, Scheduler, SchedulerConfig, SchedulingPolicy};
use crate::sequence::Sequence;
use crate::speculative::{Drafter, Speculation};
use crate::structured::{Constraint, SimpleVob};
use crate::tiers::KvTiers;
use tiering::Tiering;

/// Messages from request handlers to the engine thread.
pub enum Command {
    /// A new sequence and where its events go.
    Add(Box<ValidRequest>, EventSender),
    /// Switch the scheduling policy from the next step on.
    SetPolicy(SchedulingPolicy),
}

/// What the engine thread is built from.
pub struct LoopSetup {
    pub model: Transformer,
    pub kv: KvCache,
    pub scheduler: SchedulerConfig,
    pub prefix_caching: bool,
    pub pool: rayon::ThreadPool,
    pub end_tokens: Vec<u32>,
    pub max_model_len: usize,
    pub stats: Arc<EngineStats>,
    pub kv_events: Arc<KvEventLog>,
    /// The KV tiers below the pool, when any runs.
    pub tiers: Option<KvTiers>,
    /// The `model` label of the engine's metrics.
    pub label: metrics::SharedString,
}

/// State owned by the engine thread.
pub struct EngineLoop {
    model: Transformer,
    kv: KvCache,
    kv_manager: SharedKvCacheManager,
    scheduler: Scheduler,
    scratch: ForwardScratch,
    pool: rayon::ThreadPool,
    end_tokens: Vec<u32>,
    max_model_len: usize,
    next_id: u64,
    stats: Arc<EngineStats>,
    kv_events: Arc<KvEventLog>,
    /// The model's MoE layers, whose routing is measured every step.
    experts: Option<ExpertLayout>,
    /// Steps run, which paces attention-heat samples.
    steps: u64,
    /// The KV tiers below the pool, when any runs.
    tiering: Option<Tiering>,
    /// Counters already exported to metrics (they are exported as deltas).
    exported: Exported,
    /// The `model` label of its metrics.
    label: metrics::SharedString,
}

/// Counters as last exported to metrics.
#[derive(Default)]
struct Exported {
    kv: KvCacheCounters,
    preemptions: u64,
    deferrals: u64,
}

impl EngineLoop {
    /// Builds the loop's state (on the engine thread: the KV bookkeeping is not `Send`).
    pub fn new(s: LoopSetup) -> Self {
        let kv_manager =
            KvCacheManager::grouped(s.kv.num_blocks(), s.prefix_caching, s.kv.layout().windows());
        kv_manager.borrow_mut().set_tiering(s.tiers.is_some());
        let experts = ExpertLayout::from_layers(&s.model.moe_layout());
        let mut scheduler = Scheduler::new(s.scheduler, kv_manager.clone());
        scheduler.set_expert_layout(experts.clone());
        Self {
            scheduler,
            experts,
            steps: 0,
            tiering: s.tiers.map(Tiering::new),
            kv_manager,
            model: s.model,
            kv: s.kv,
            scratch: ForwardScratch::default(),
            pool: s.pool,
            end_tokens: s.end_tokens,
            max_model_len: s.max_model_len,
            next_id: 0,
            stats: s.stats,
            kv_events: s.kv_events,
            exported: Default::default(),
            label: s.label,
        }
    }

    /// Runs until every [`Engine`](crate::Engine) handle is dropped.
    pub fn run(mut self, commands: mpsc::Receiver<Command>) {
        loop {
            let fetching = self.tiering.as_ref().is_some_and(|t| t.num_parked() > 0);
            if !self.scheduler.has_work() {
                if fetching {
                    // Nothing to step: wait on requests and on the fetch alike.
                    match commands.recv_timeout(Duration::from_millis(1)) {
                        Ok(cmd) => self.accept(cmd),
                        Err(mpsc::RecvTimeoutError::Timeout) => {}
                        Err(mpsc::RecvTimeoutError::Disconnected) => return,
                    }
                } else {
                    match commands.recv() {
                        Ok(cmd) => self.accept(cmd),
                        Err(_) => return,
                    }
                }
            }
            while let Ok(cmd) = commands.try_recv() {
                self.accept(cmd);
            }
            self.collect_fetched();
            self.scheduler.remove_cancelled();
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
            self.publish_stats();
        }
    }

    fn accept(&mut self, command: Command) {
        let (valid, events) = match command {
            Command::Add(valid, events) => (valid, events),
            Command::SetPolicy(policy) => {
                tracing::info!(policy = policy.as_str(), "scheduling policy switched");
                self.scheduler.set_policy(policy);
                self.stats.set_policy(policy);
                return;
            }
        };
        self.stats.queued.fetch_sub(1, Ordering::Relaxed);
        let ValidRequest {
            request: req,
            constraint,
        } = *valid;
        let end_tokens = if req.params.ignore_eos {
            Vec::new()
        } else {
            self.end_tokens.clone()
        };
        let mut enders = end_tokens.clone();
        enders.extend(&req.params.stop_token_ids);
        self.next_id += 1;
        let spec = self.scheduler.config().speculation;
        let speculation = (req.speculative && spec.max_draft > 0)
            .then(|| Speculation::new(spec.drafter, spec.max_draft, req.drafts));
        let seq = Sequence {
            id: self.next_id,
            prompt_len: req.prompt.len(),
            sampler: Sampler::new(req.params, req.seed, &req.prompt, enders),
            constraint,
            tokens: req.prompt,
            num_computed: 0,
            block_table: BlockTable::new(self.kv_manager.clone(), &req.cache_salt),
            priority: req.priority,
            prefix_cacheable: !req.prompt_logprobs,
            prompt_logprobs_sent: req.prompt_logprobs.then_some(0),
            max_len: self.max_model_len,
            end_tokens,
            events,
            arrival: Instant::now(),
            deadline: req.deadline,
            experts: Default::default(),
            heat: Default::default(),
            look_below: true,
            deferrals: 0,
            speculation,
            finish: None,
        };
        self.scheduler.add(seq);
    }

    /// Parks the waiting sequences whose prefix is to be looked up below the pool (new,
    /// preempted, or that gave back what they held), to bring it up rather than recompute it,
    /// and puts back in line those whose prefix is all in the pool now.
    fn collect_fetched(&mut self) {
        let Some(t) = &mut self.tiering else { return };
        let pool = self.kv_manager.borrow().num_total_blocks();
        let unknown = self.scheduler.take_waiting(|s| s.look_below);
        let hot = t.look_below(unknown, &self.kv_manager, pool);
        let running = self.scheduler.running().len();
        let fetched = t.collect(&self.kv_manager, &mut self.kv, Duration::ZERO, running);
        for seq in hot.into_iter().chain(fetched) {
            self.scheduler.put_back(seq);
        }
    }

    fn step(&mut self) {
        let start = Instant::now();
        let plan = self.scheduler.schedule();
        metrics::histogram!(names::SCHEDULE_DURATION, "model" => self.label.clone())
            .record(start.elapsed().as_secs_f64());
        if let Some(t) = &self.tiering {
            // Before the forward pass overwrites the blocks the plan evicted.
            t.demote(&mut self.kv_manager.borrow_mut(), &self.kv);
        }
        for (seq, reason) in plan.ended {
            seq.send(SeqEvent::Finished(reason));
        }
        if plan.scheduled.is_empty() {
            return;
        }

        if let Drafter::Layers(layers) = self.scheduler.config().speculation.drafter {
            let running = self.scheduler.running_mut();
            let pass = self_draft::Pass {
                model: &self.model,
                kv: &mut self.kv,
                scratch: &mut self.scratch,
                pool: &self.pool,
                layers,
            };
            pass.guess(running, &plan.scheduled);
        }

        // The grammar states of the sequences that sample this step, taken out so that their
        // masks can be computed on a thread of their own while the forward pass runs.
        let mut constrained: Vec<(usize, Constraint)> = Vec::new();
        let running = self.scheduler.running_mut();
        for (k, s) in plan.scheduled.iter().enumerate() {
            let seq = &mut running[s.index];
            if samples(seq, s)
                && let Some(c) = seq.constraint.take()
            {
                constrained.push((k, c));
            }
        }

        // The batch: each scheduled sequence's next tokens, and which logits it needs.
        let running = self.scheduler.running();
        let mut tokens = Vec::new();
        let mut seqs = Vec::with_capacity(plan.scheduled.len());
        for s in &plan.scheduled {
            let seq = &running[s.index];
            let start = seq.num_computed;
            tokens.extend_from_slice(&seq.tokens[start..start + s.n_tokens - s.n_draft]);
            tokens.extend_from_slice(draft_of(seq, s));
            let logits = if !prompt_positions(seq, s.n_tokens).is_empty() || s.n_draft > 0 {
                LogitsWanted::All
            } else if start + s.n_tokens == seq.tokens.len() {
                LogitsWanted::Last
            } else {
                LogitsWanted::None
            };
            seqs.push(BatchSeq {
                n_tokens: s.n_tokens,
                start_pos: start,
                block_tables: seq.block_table.tables(),
                logits,
            });
        }
        let heat_interval = self.scheduler.config().kda.heat_interval as u64;
        let sample_heat = self.scheduler.policy() == SchedulingPolicy::Kda
            && heat_interval > 0
            && self.steps.is_multiple_of(heat_interval);
        self.steps += 1;
        self.scratch.set_sample_heat(sample_heat);
        let (model, kv, scratch) = (&self.model, &mut self.kv, &mut self.scratch);
        let batch = ForwardBatch {
            tokens: &tokens,
            seqs: &seqs,
        };
        let pool = &self.pool;
        let (logits, computed) = std::thread::scope(|scope| {
            let masks = (!constrained.is_empty()).then(|| {
                scope.spawn(move || {
                    (constrained.into_iter())
                        .map(|(k, mut c)| {
                            let mask = c.allowed();
                            (k, c, mask)
                        })
                        .collect::<Vec<_>>()
                })
            });
            let logits = pool.install(|| model.forward(&batch, kv, scratch));
            // The grammar code catches its own panics; a thread that still died loses its
            // sequences' states, which then fail below.
            (logits, masks.map(|m| m.join().unwrap_or_default()))
        });
        let mut grammars: Vec<Option<(Constraint, Result<SimpleVob, Error>)>> =
            (0..plan.scheduled.len()).map(|_| None).collect();
        for (k, c, mask) in computed.into_iter().flatten() {
            grammars[k] = Some((c, mask));
        }
        metrics::histogram!(names::BATCH_TOKENS, "model" => self.label.clone())
            .record(tokens.len() as f64);
        metrics::histogram!(names::BATCH_SEQUENCES, "model" => self.label.clone())
            .record(seqs.len() as f64);
        let kinds: Vec<LogitsWanted> = seqs.iter().map(|s| s.logits).collect();

        // Hand each sequence its rows of logits, then score prompts and sample in parallel.
        let vocab = self.model.config().vocab_size;
        let mut rest: &mut [f32] = logits;
        let mut work = Vec::with_capacity(plan.scheduled.len());
        let mut next = (plan.scheduled.iter().zip(&kinds)).zip(grammars).peekable();
        for (index, seq) in self.scheduler.running_mut().iter_mut().enumerate() {
            let Some(((s, kind), _)) = next.peek() else {
                break;
            };
            let (s, kind) = (*s, **kind);
            if s.index != index {
                continue;
            }
            let ((_, _), grammar) = next.next().expect("peeked");
            let n_rows = match kind {
                LogitsWanted::None => 0,
                LogitsWanted::Last => 1,
                LogitsWanted::All => s.n_tokens,
            };
            let (rows, tail) = std::mem::take(&mut rest).split_at_mut(n_rows * vocab);
            rest = tail;
            let targets = prompt_positions(seq, s.n_tokens)
                .map(|q| (q > 0).then(|| (seq.tokens[q], q - 1 - seq.num_computed)))
                .collect();
            let top = seq.sampler.params().logprobs.unwrap_or(0);
            let sampling = samples(seq, s);
            let draft = match &seq.speculation {
                Some(spec) if s.n_draft > 0 => &spec.draft()[..s.n_draft],
                _ => &[],
            };
            work.push(StepWork {
                rows,
                targets,
                top,
                grammar,
                draft,
                sampler: sampling.then_some(&mut seq.sampler),
            });
        }
        let results: Vec<StepResult> = self
            .pool
            .install(|| work.into_par_iter().map(|w| w.run(vocab)).collect());

        // Apply results in order: report, advance, cache full blocks, end what is done.
        let running = self.scheduler.running_mut();
        let mut spec = SpecCounts::default();
        for (s, result) in plan.scheduled.iter().zip(results) {
            let seq = &mut running[s.index];
            let reported = prompt_positions(seq, s.n_tokens);
            if !result.prompt_logprobs.is_empty() {
                seq.prompt_logprobs_sent = Some(reported.end);
                seq.send(SeqEvent::PromptLogprobs(result.prompt_logprobs));
            }
            if seq.num_computed + s.n_tokens == seq.tokens.len()
                && seq.sampler.params().max_tokens == 0
            {
                // Scoring only: the prompt is done and nothing is to be generated.
                seq.finish = Some(FinishReason::Length);
            }
            for sampled in result.chosen {
                let id = sampled.id;
                if seq.generated() == 0 {
                    metrics::histogram!(names::ENGINE_QUEUE_TO_FIRST_TOKEN, "model" => self.label.clone(), "priority" => seq.priority.as_str())
                        .record(seq.arrival.elapsed().as_secs_f64());
                }
                seq.send(SeqEvent::Token(sampled));
                seq.finish = seq.push_token(id);
                if seq.finish.is_some() {
                    break; // the rest of a draft past the end is not part of the answer
                }
            }
            // The keys and values kept: the rows of its tokens and of the accepted draft; a
            // rejected draft's rows are past them, overwritten later, and their pages go back.
            let computed = seq.num_computed + s.n_tokens - s.n_draft + result.accepted;
            seq.num_computed = computed.min(seq.tokens.len());
            seq.block_table.commit(&seq.tokens, seq.num_computed);
            if s.n_draft > 0 {
                seq.block_table.shrink(seq.tokens.len());
                if let Some(speculation) = &mut seq.speculation {
                    speculation.verified(result.accepted);
                }
                spec.record(s.n_draft, result.accepted);
            }
            match result.grammar {
                Some(Ok(c)) => {
                    // Complete: nothing else may follow, so the answer ends here.
                    if c.is_complete() {
                        seq.finish.get_or_insert(FinishReason::Stop);
                    }
                    seq.constraint = Some(c);
                }
                Some(Err(e)) => {
                    // The sequence's stream ends with this error; the `Finished` sent when it
                    // is taken out below comes after the end and is not read.
                    seq.send(SeqEvent::Failed(e));
                    seq.finish = Some(FinishReason::Stop);
                }
                None => {}
            }
        }
        spec.export(&self.label);
        self.gather_signals(&plan.scheduled);
        for seq in self.scheduler.take_running(|s| s.finish.is_some()) {
            seq.send(SeqEvent::Finished(seq.finish.unwrap_or(FinishReason::Stop)));
        }
        self.stats.steps.fetch_add(1, Ordering::Relaxed);
        metrics::histogram!(names::STEP_DURATION, "model" => self.label.clone())
            .record(start.elapsed().as_secs_f64());
    }

    /// Reads what the step's forward pass routed and attended to: the step's expert load for
    /// metrics, each sequence's expert forecast, and on sampled steps its attention heat, which
    /// the KV manager keeps per block.
    fn gather_signals(&mut self, scheduled: &[ScheduledSeq]) {
        let running = self.scheduler.running_mut();
        if let Some(layout) = &self.experts {
            let (mut all, mut rows) = (Vec::new(), 0);
            for s in scheduled {
                let start = all.len();
                self.scratch.routed_slots(rows..rows + s.n_tokens, &mut all);
                running[s.index]
                    .experts
                    .observe(layout, &all[start..], s.n_tokens);
                rows += s.n_tokens;
            }
            if let Some(load) = RoutedLoad::measure(layout, &all) {
                metrics::histogram!(names::EXPERT_LOAD_IMBALANCE, "model" => self.label.clone())
                    .record(load.imbalance as f64);
                metrics::histogram!(names::EXPERTS_ACTIVE, "model" => self.label.clone())
                    .record(load.active_experts as f64);
                self.stats.record_routing(&load);
            }
        }
        let heat = self.scratch.heat();
        if heat.len() == scheduled.len() {
            let mut kv = self.kv_manager.borrow_mut();
            for (s, mass) in scheduled.iter().zip(heat) {
                let seq = &mut running[s.index];
                seq.heat.observe(mass);
                kv.record_heat(&seq.block_table.tables()[0], mass);
            }
        }
    }

    fn publish_stats(&mut self) {
        let parked = self.tiering.as_ref().map_or(0, Tiering::num_parked);
        let (running, waiting) = (
            self.scheduler.running().len(),
            self.scheduler.num_waiting() + parked,
        );
        let mut kv = self.kv_manager.borrow_mut();
        let (free, total) = (kv.num_free_blocks(), kv.num_total_blocks());
        let counters = kv.counters();
        let changes = kv.take_changes();
        metrics::gauge!(names::KV_TIER_BLOCKS, "model" => self.label.clone(), "tier" => "hot")
            .set(kv.num_cached_blocks() as f64);
        drop(kv);
        self.kv_events.publish(changes);
        let preemptions = self.scheduler.preemptions();
        let deferrals = self.scheduler.deferrals();
        let s = &self.stats;
        s.deferrals.store(deferrals, Ordering::Relaxed);
        if let Some(t) = &self.tiering {
            for (stat, &n) in s.tier_hits.iter().zip(&t.promoted) {
                stat.store(n, Ordering::Relaxed);
            }
        }
        s.running.store(running, Ordering::Relaxed);
        s.waiting.store(waiting, Ordering::Relaxed);
        s.free_blocks.store(free, Ordering::Relaxed);
        s.preemptions.store(preemptions, Ordering::Relaxed);
        s.prefix_queried_tokens
            .store(counters.queried_tokens, Ordering::Relaxed);
        s.prefix_hit_tokens
            .store(counters.hit_tokens, Ordering::Relaxed);
        metrics::gauge!(names::RUNNING_SEQUENCES, "model" => self.label.clone())
            .set(running as f64);
        metrics::gauge!(names::WAITING_SEQUENCES, "model" => self.label.clone())
            .set(waiting as f64);
        metrics::gauge!(names::KV_BLOCKS_FREE, "model" => self.label.clone()).set(free as f64);
        metrics::gauge!(names::KV_BLOCKS_USED, "model" => self.label.clone())
            .set((total - free) as f64);
        let before = &self.exported;
        metrics::counter!(names::PREFIX_CACHE_QUERIED_TOKENS, "model" => self.label.clone())
            .increment(counters.queried_tokens - before.kv.queried_tokens);
        metrics::counter!(names::PREFIX_CACHE_HIT_TOKENS, "model" => self.label.clone())
            .increment(counters.hit_tokens - before.kv.hit_tokens);
        metrics::counter!(names::KV_BLOCKS_EVICTED, "model" => self.label.clone())
            .increment(counters.evicted_blocks - before.kv.evicted_blocks);
        metrics::counter!(names::PREEMPTIONS, "model" => self.label.clone())
            .increment(preemptions - before.preemptions);
        metrics::counter!(names::SCHEDULER_DEFERRALS, "model" => self.label.clone())
            .increment(deferrals - before.deferrals);
        self.exported = Exported {
            kv: counters,
            preemptions,
            deferrals,
        };
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

/// Whether `seq` samples a token after its share `s` of the step: its prompt is then complete
/// and it is to generate.
fn samples(seq: &Sequence, s: &ScheduledSeq) -> bool {
    seq.num_computed + s.n_tokens - s.n_draft == seq.tokens.len()
        && seq.sampler.params().max_tokens > 0
}

/// The draft `seq` verifies in its share `s` of the step (empty when none).
fn draft_of<'a>(seq: &'a Sequence, s: &ScheduledSeq) -> &'a [u32] {
    match &seq.speculation {
        Some(spec) if s.n_draft > 0 => &spec.draft()[..s.n_draft],
        _ => &[],
    }
}

/// One sequence's post-forward work: score its prompt positions, and sample, or verify its
/// draft row by row.
struct StepWork<'a> {
    rows: &'a mut [f32],
    /// Per reported prompt position: its token and the logits row predicting it (`None` for
    /// position 0).
    targets: Vec<Option<(u32, usize)>>,
    top: usize,
    /// Its grammar, if it has one, and the tokens it allows at the first row sampled.
    grammar: Option<(Constraint, Result<SimpleVob, Error>)>,
    /// The drafted tokens its last rows verify.
    draft: &'a [u32],
    sampler: Option<&'a mut Sampler>,
}

/// What a [`StepWork`] produced.
struct StepResult {
    prompt_logprobs: Vec<Option<TokenLogprob>>,
    /// The tokens chosen, in order: the drafted ones the target agreed with, then its own.
    chosen: Vec<Sampled>,
    /// Of those, the drafted ones.
    accepted: usize,
    /// Its grammar advanced past the chosen tokens, or the error that ended it.
    grammar: Option<Result<Constraint, Error>>,
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
        let mut result = StepResult {
            prompt_logprobs,
            chosen: Vec::new(),
            accepted: 0,
            grammar: None,
        };
        let Some(sampler) = self.sampler else {
            return result;
        };
        let (mut grammar, mut mask) = match self.grammar {
            None => (None, None),
            Some((c, Ok(mask))) => (Some(c), Some(mask)),
            Some((_, Err(e))) => {
                result.grammar = Some(Err(e));
                return result;
            }
        };
        let first = self.rows.len() / vocab - 1 - self.draft.len();
        for (i, row) in self.rows[first * vocab..]
            .chunks_exact_mut(vocab)
            .enumerate()
        {
            let (sampled, agreed) = match self.draft.get(i) {
                Some(&d) => sampler.verify(row, mask.as_ref(), d),
                None => (sampler.sample(row, mask.as_ref()), false),
            };
            let id = sampled.id;
            result.chosen.push(sampled);
            result.accepted += usize::from(agreed);
            if let Some(c) = grammar.as_mut() {
                let next = c
                    .advance(id)
                    .and_then(|()| match agreed && !c.is_complete() {
                        true => c.allowed().map(Some),
                        false => Ok(None),
                    });
                match next {
                    Ok(next) => mask = next,
                    Err(e) => {
                        result.grammar = Some(Err(e));
                        return result;
                    }
                }
                if c.is_complete() {
                    break; // nothing may follow
                }
            }
            if !agreed {
                break;
            }
        }
        result.grammar = grammar.map(Ok);
        result
    }
}

/// Drafted and accepted tokens over one step, for the metrics.
#[derive(Default)]
struct SpecCounts {
    drafted: u64,
    accepted: u64,
    /// Accepted lengths of the step's verified drafts.
    lengths: Vec<usize>,
}

impl SpecCounts {
    fn record(&mut self, drafted: usize, accepted: usize) {
        self.drafted += drafted as u64;
        self.accepted += accepted as u64;
        self.lengths.push(accepted);
    }

    fn export(self, label: &metrics::SharedString) {
        if self.lengths.is_empty() {
            return;
        }
        metrics::counter!(names::SPEC_DRAFT_TOKENS, "model" => label.clone())
            .increment(self.drafted);
        metrics::counter!(names::SPEC_ACCEPTED_TOKENS, "model" => label.clone())
            .increment(self.accepted);
        let lengths = metrics::histogram!(names::SPEC_ACCEPTED_LENGTH, "model" => label.clone());
        for n in self.lengths {
            lengths.record(n as f64);
        }
    }
}
