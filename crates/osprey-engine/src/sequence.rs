//! A sequence: one prompt being continued, with its KV blocks and sampler.

use std::time::{Duration, Instant};

use osprey_core::{FinishReason, Priority};

use crate::kda::{BlockHeat, ExpertForecast};
use crate::kv::BlockTable;
use crate::request::{EventSender, SeqEvent};
use crate::sampler::Sampler;
use crate::speculative::Speculation;
use crate::structured::Constraint;

/// One generation in flight, owned by the scheduler.
pub struct Sequence {
    /// Engine-wide id, for logs.
    pub id: u64,
    /// Prompt followed by generated tokens.
    pub tokens: Vec<u32>,
    /// Tokens of `tokens` that are prompt.
    pub prompt_len: usize,
    /// Leading tokens whose keys and values are in the KV cache.
    pub num_computed: usize,
    /// The KV blocks; returned to the pool when the sequence is dropped.
    pub block_table: BlockTable,
    /// Chooses the next token.
    pub sampler: Sampler,
    /// The grammar the output follows, if any: its state after the tokens generated so far
    /// (a recomputed sequence keeps it, since its tokens do not change).
    pub constraint: Option<Constraint>,
    /// Scheduling class.
    pub priority: Priority,
    /// Whether the prefix cache may supply this sequence's leading tokens (not when the
    /// prompt's log-probabilities are wanted: cached positions have no logits).
    pub prefix_cacheable: bool,
    /// Prompt positions whose log-probabilities have been sent (when asked for); survives
    /// preemption so a recomputed prompt is not reported twice.
    pub prompt_logprobs_sent: Option<usize>,
    /// Hard cap on `tokens.len()`: the context window.
    pub max_len: usize,
    /// Tokens that end generation (EOS and end-of-turn), unless `ignore_eos`.
    pub end_tokens: Vec<u32>,
    /// Where events go.
    pub events: EventSender,
    /// When the request reached the engine (the order of `fcfs`, and anti-starvation).
    pub arrival: Instant,
    /// The first-token deadline the request asked for, from `arrival` (the policy's default
    /// for its class otherwise).
    pub deadline: Option<Duration>,
    /// Its recent expert choices, which forecast its next step's (`kda`).
    pub experts: ExpertForecast,
    /// Where its attention goes, per KV block (`kda`, sampled).
    pub heat: BlockHeat,
    /// Whether its prefix is to be looked up in the tiers below the pool before it can be
    /// scheduled: on arrival, after each preemption, and after giving back a prefix it held
    /// (its blocks may have gone down since).
    pub look_below: bool,
    /// Steps it has been deferred in a row to keep an expert under capacity (`kda`).
    pub deferrals: u32,
    /// Its drafts, when it speculates.
    pub speculation: Option<Speculation>,
    /// Set when the last step ended the sequence.
    pub finish: Option<FinishReason>,
}

impl Sequence {
    /// Tokens not yet in the KV cache (the prompt, or the last sampled token).
    pub fn uncomputed(&self) -> usize {
        self.tokens.len() - self.num_computed
    }

    /// Tokens generated so far.
    pub fn generated(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }

    /// Whether the client has gone away.
    pub fn is_cancelled(&self) -> bool {
        self.events.is_closed()
    }

    /// Sends an event; a gone client is noticed at the next step.
    pub fn send(&self, event: SeqEvent) {
        let _ = self.events.send(event);
    }

    /// Appends a sampled token and says whether that ends the sequence.
    pub fn push_token(&mut self, id: u32) -> Option<FinishReason> {
        self.tokens.push(id);
        let p = self.sampler.params();
        let min_reached = self.generated() >= p.min_tokens;
        if min_reached && (self.end_tokens.contains(&id) || p.stop_token_ids.contains(&id)) {
            return Some(FinishReason::Stop);
        }
        if self.generated() >= p.max_tokens || self.tokens.len() >= self.max_len {
            return Some(FinishReason::Length);
        }
        None
    }
}

#[cfg(test)]
impl Sequence {
    /// A sequence of `tokens` (all prompt) for unit tests, with default sampling. Its event
    /// receiver is leaked so that it does not look cancelled.
    pub(crate) fn for_test(
        manager: &crate::kv::SharedKvCacheManager,
        id: u64,
        tokens: Vec<u32>,
        priority: Priority,
    ) -> Self {
        let (events, rx) = tokio::sync::mpsc::unbounded_channel();
        std::mem::forget(rx);
        let params = osprey_core::SamplingParams::default();
        Self {
            id,
            prompt_len: tokens.len(),
            sampler: Sampler::new(params, 0, &tokens, Vec::new()),
            constraint: None,
            tokens,
            num_computed: 0,
            block_table: BlockTable::new(manager.clone(), ""),
            priority,
            prefix_cacheable: true,
            prompt_logprobs_sent: None,
            max_len: 4096,
            end_tokens: Vec::new(),
            events,
            arrival: Instant::now(),
            deadline: None,
            experts: Default::default(),
            heat: Default::default(),
            look_below: true,
            deferrals: 0,
            speculation: None,
            finish: None,
        }
    }
}
