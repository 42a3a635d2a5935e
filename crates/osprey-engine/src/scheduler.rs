//! Which sequences run in the next step, and how many of their tokens.
//!
//! Continuous batching with chunked prefill. Each step, in order:
//! 1. If interactive work is waiting and there is no seat or no KV memory for it, running batch
//!    sequences are preempted (newest first) to make room.
//! 2. Running sequences, interactive first then by arrival, each get one decode token or the next
//!    chunk of their prompt, within the step's token budget. While interactive work exists, batch
//!    prefills advance by at most `batch_prefill_chunk` tokens a step, so interactive decodes are
//!    never held behind a long batch prompt. A sequence that cannot get a KV block preempts the
//!    lowest-priority, newest running sequence.
//! 3. Waiting sequences are admitted — interactive first, except that a batch request past its
//!    deadline (by default `starvation_timeout` after it arrived) counts as interactive —
//!    reusing cached prefixes, while the budget, the sequence cap and the KV pool allow: a
//!    sequence is admitted (with its first chunk) only once its whole prompt fits in the free
//!    blocks, so that long prompts do not preempt each other in turn without end.
//!
//! A decoding sequence that speculates ([`crate::speculative`]) may add a draft to its one
//! token: its rows count against the budget like any others, and drafts are given only while
//! the step has fewer rows than [`SpeculationConfig::max_step_rows`], past which a step is
//! bound by compute and drafted rows stop being nearly free.
//!
//! Preemption is by recompute (vLLM's default): the victim's blocks are freed and it returns to
//! the front of its queue; on resumption its tokens are recomputed (often from the prefix cache)
//! and generation continues exactly where it stopped.
//!
//! Three policies, switchable while running ([`Scheduler::set_policy`]):
//! - `priority`: the above.
//! - `fcfs`: every request in one class, which reduces all of the above to first come, first
//!   served.
//! - `kda`: the above, earliest deadline first within each class, and on an MoE model the
//!   demoted (batch) sequences composed around the experts the step already uses: those sharing
//!   them most go first, and one that would push an expert past its capacity waits a step
//!   ([`crate::kda`]).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use osprey_core::{FinishReason, Priority};

use crate::kda::{ExpertLayout, ExpertLoad, KdaConfig, share_experts_order};
use crate::kv::SharedKvCacheManager;
use crate::sequence::Sequence;
use crate::speculative::SpeculationConfig;
use osprey_models::BLOCK_SIZE;

/// How requests are ordered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SchedulingPolicy {
    /// Interactive before batch, with anti-starvation.
    #[default]
    Priority,
    /// Arrival order only.
    Fcfs,
    /// Priority with deadlines, and batches composed by expert load and overlap.
    Kda,
}

impl SchedulingPolicy {
    /// The policy's name on the command line and in the admin API.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Priority => "priority",
            Self::Fcfs => "fcfs",
            Self::Kda => "kda",
        }
    }

    /// The policy named `name`.
    pub fn parse(name: &str) -> Option<Self> {
        [Self::Priority, Self::Fcfs, Self::Kda]
            .into_iter()
            .find(|p| p.as_str() == name)
    }
}

/// Limits and policy of the scheduler.
#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    /// Most tokens (prefill and decode together) in one forward pass.
    pub max_num_batched_tokens: usize,
    /// Most sequences in one forward pass.
    pub max_num_seqs: usize,
    /// Ordering policy.
    pub policy: SchedulingPolicy,
    /// A batch request waiting or running longer than this (without a deadline of its own) is
    /// treated as interactive.
    pub starvation_timeout: Duration,
    /// Most prompt tokens a batch sequence prefills per step while interactive work exists.
    pub batch_prefill_chunk: usize,
    /// Settings of the `kda` policy.
    pub kda: KdaConfig,
    /// How decoding sequences draft tokens to verify.
    pub speculation: SpeculationConfig,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            max_num_batched_tokens: 512,
            max_num_seqs: 32,
            policy: SchedulingPolicy::Priority,
            starvation_timeout: Duration::from_secs(300),
            batch_prefill_chunk: 64,
            kda: KdaConfig::default(),
            speculation: SpeculationConfig::default(),
        }
    }
}

/// A sequence's share of the next step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScheduledSeq {
    /// Index into [`Scheduler::running`].
    pub index: usize,
    /// Rows to compute, starting at its `num_computed`: its next tokens, then its draft.
    pub n_tokens: usize,
    /// Of those rows, how many are its draft (0 unless it speculates).
    pub n_draft: usize,
}

/// The plan for one step: sequences in batch order.
#[derive(Default)]
pub struct SchedulerOutput {
    /// Scheduled sequences.
    pub scheduled: Vec<ScheduledSeq>,
    /// Sequences that can never run again (they alone need more KV than the pool has).
    pub ended: Vec<(Sequence, FinishReason)>,
}

/// Waiting and running sequences.
pub struct Scheduler {
    config: SchedulerConfig,
    kv: SharedKvCacheManager,
    /// The model's MoE layers, which `kda` balances (`None` for a dense model).
    experts: Option<ExpertLayout>,
    /// Waiting sequences, interactive and batch, each in arrival order (`kda`: deadline order;
    /// preempted sequences re-enter at the front).
    waiting: [VecDeque<Sequence>; 2],
    running: Vec<Sequence>,
    preemptions: u64,
    deferrals: u64,
}

impl Scheduler {
    /// An idle scheduler drawing KV blocks from `kv`.
    pub fn new(config: SchedulerConfig, kv: SharedKvCacheManager) -> Self {
        Self {
            config,
            kv,
            experts: None,
            waiting: [VecDeque::new(), VecDeque::new()],
            running: Vec::new(),
            preemptions: 0,
            deferrals: 0,
        }
    }

    /// Tells the scheduler the model's MoE layout, so that `kda` can balance its experts.
    pub fn set_expert_layout(&mut self, layout: Option<ExpertLayout>) {
        self.experts = layout;
    }

    /// Limits and settings.
    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    /// The policy in force.
    pub fn policy(&self) -> SchedulingPolicy {
        self.config.policy
    }

    /// Switches the policy; waiting sequences are requeued in the new policy's order.
    pub fn set_policy(&mut self, policy: SchedulingPolicy) {
        if policy == self.config.policy {
            return;
        }
        self.config.policy = policy;
        let mut waiting: Vec<Sequence> =
            self.waiting.iter_mut().flat_map(|q| q.drain(..)).collect();
        waiting.sort_by_key(|s| s.arrival);
        for seq in waiting {
            self.add(seq);
        }
    }

    /// Queues a new sequence.
    pub fn add(&mut self, seq: Sequence) {
        let q = self.queue_of(&seq);
        match self.config.policy {
            SchedulingPolicy::Kda => self.insert_by_deadline(q, seq),
            _ => self.waiting[q].push_back(seq),
        }
    }

    /// Whether anything is queued or running.
    pub fn has_work(&self) -> bool {
        self.num_waiting() > 0 || !self.running.is_empty()
    }

    /// Sequences waiting for admission.
    pub fn num_waiting(&self) -> usize {
        self.waiting[0].len() + self.waiting[1].len()
    }

    /// Running sequences, in the order of the last plan.
    pub fn running(&self) -> &[Sequence] {
        &self.running
    }

    /// Mutable access to running sequences, to apply a step's results.
    pub fn running_mut(&mut self) -> &mut [Sequence] {
        &mut self.running
    }

    /// Preemptions so far.
    pub fn preemptions(&self) -> u64 {
        self.preemptions
    }

    /// Steps sequences were held back to keep an expert under capacity (`kda`), so far.
    pub fn deferrals(&self) -> u64 {
        self.deferrals
    }

    /// Takes out the waiting sequences for which `pick` is true, in queue order.
    pub fn take_waiting(&mut self, mut pick: impl FnMut(&Sequence) -> bool) -> Vec<Sequence> {
        let mut taken = Vec::new();
        for q in &mut self.waiting {
            if !q.iter().any(&mut pick) {
                continue; // the usual case, each step: leave the queue as it is
            }
            let (picked, kept): (VecDeque<_>, _) =
                std::mem::take(q).into_iter().partition(|s| pick(s));
            *q = kept;
            taken.extend(picked);
        }
        taken
    }

    /// Puts a sequence taken out of the waiting queues back in its place: by arrival (under
    /// `kda`, by deadline).
    pub fn put_back(&mut self, seq: Sequence) {
        let q = self.queue_of(&seq);
        match self.config.policy {
            SchedulingPolicy::Kda => self.insert_by_deadline(q, seq),
            _ => {
                let at = self.waiting[q].partition_point(|s| s.arrival <= seq.arrival);
                self.waiting[q].insert(at, seq);
            }
        }
    }

    /// Queues a sequence that was running before (preempted): at the front of its queue
    /// (under `kda`, by deadline).
    pub fn requeue(&mut self, seq: Sequence) {
        let q = self.queue_of(&seq);
        match self.config.policy {
            SchedulingPolicy::Kda => self.insert_by_deadline(q, seq),
            _ => self.waiting[q].push_front(seq),
        }
    }

    /// Drops sequences whose clients have gone (their blocks return to the pool).
    pub fn remove_cancelled(&mut self) -> usize {
        let before = self.num_waiting() + self.running.len();
        for q in &mut self.waiting {
            q.retain(|s| !s.is_cancelled());
        }
        self.running.retain(|s| !s.is_cancelled());
        before - self.num_waiting() - self.running.len()
    }

    /// Removes and returns the running sequences for which `done` is true.
    pub fn take_running(&mut self, mut done: impl FnMut(&Sequence) -> bool) -> Vec<Sequence> {
        let (finished, kept) = std::mem::take(&mut self.running)
            .into_iter()
            .partition(|s| done(s));
        self.running = kept;
        finished
    }

    /// Which waiting queue a sequence belongs to.
    fn queue_of(&self, seq: &Sequence) -> usize {
        match (self.config.policy, seq.priority) {
            (SchedulingPolicy::Fcfs, _) | (_, Priority::Interactive) => 0,
            (_, Priority::Batch) => 1,
        }
    }

    /// When `seq` is late: for interactive work, when its first token is due; for batch work,
    /// when it stops being demoted.
    fn deadline(&self, seq: &Sequence) -> Instant {
        let default = match seq.priority {
            Priority::Interactive => self.config.kda.interactive_deadline,
            Priority::Batch => self.config.starvation_timeout,
        };
        let after = seq.deadline.unwrap_or(default);
        (seq.arrival.checked_add(after)).unwrap_or(seq.arrival + Duration::from_secs(86_400))
    }

    /// The order within a class: arrival, or deadline under `kda`.
    fn order_key(&self, seq: &Sequence) -> Instant {
        match self.config.policy {
            SchedulingPolicy::Kda => self.deadline(seq),
            _ => seq.arrival,
        }
    }

    /// 0 for interactive (or late batch) work, 1 for batch.
    fn class(&self, seq: &Sequence, now: Instant) -> usize {
        if self.queue_of(seq) == 1 && now < self.deadline(seq) {
            1
        } else {
            0
        }
    }

    fn insert_by_deadline(&mut self, q: usize, seq: Sequence) {
        let key = self.deadline(&seq);
        let at = self.waiting[q].partition_point(|s| self.deadline(s) <= key);
        self.waiting[q].insert(at, seq);
    }

    /// The waiting queue to admit from next.
    fn next_queue(&self, now: Instant) -> Option<usize> {
        match (self.waiting[0].front(), self.waiting[1].front()) {
            (None, None) => None,
            (Some(_), None) => Some(0),
            (None, Some(_)) => Some(1),
            (Some(i), Some(b)) => Some(
                if self.class(b, now) == 0 && self.order_key(b) < self.order_key(i) {
                    1
                } else {
                    0
                },
            ),
        }
    }

    fn preempt(&mut self, mut seq: Sequence) {
        tracing::debug!(seq = seq.id, tokens = seq.tokens.len(), "preempted");
        seq.block_table.release();
        seq.num_computed = 0;
        seq.look_below = true;
        if let Some(spec) = &mut seq.speculation {
            spec.drop_draft();
        }
        self.preemptions += 1;
        self.requeue(seq);
    }

    /// Tokens `seq` may compute this step from a budget of `budget`.
    fn chunk(
        &self,
        seq: &Sequence,
        budget: usize,
        class: usize,
        interactive_active: bool,
    ) -> usize {
        let mut n = seq.uncomputed().min(budget);
        if class == 1 && interactive_active && seq.uncomputed() > 1 {
            n = n.min(self.config.batch_prefill_chunk.max(1));
        }
        n
    }

    /// Sorts the running sequences most urgent first: by class, then arrival (`kda`: deadline,
    /// and demoted sequences in the order that shares experts most).
    fn order_running(&mut self, now: Instant) {
        let mut running = std::mem::take(&mut self.running);
        running.sort_by_key(|s| (self.class(s, now), self.order_key(s)));
        if let Some(load) = self.expert_load(0) {
            let split = running.partition_point(|s| self.class(s, now) == 0);
            let mut load = load;
            for s in &running[..split] {
                load.add(s.experts.load(), 1);
            }
            let demoted: Vec<Option<Sequence>> =
                running.split_off(split).into_iter().map(Some).collect();
            let forecasts: Vec<_> = (demoted.iter().flatten())
                .map(|s| (s.experts.load(), 1))
                .collect();
            let order = share_experts_order(load, &forecasts);
            let mut demoted = demoted;
            running.extend(order.into_iter().filter_map(|i| demoted[i].take()));
        }
        self.running = running;
    }

    /// An empty step's expert load for `tokens` tokens, when `kda` balances experts.
    fn expert_load(&self, tokens: usize) -> Option<ExpertLoad> {
        let layout = self.experts.clone()?;
        (self.config.policy == SchedulingPolicy::Kda)
            .then(|| ExpertLoad::new(layout, tokens, self.config.kda.expert_capacity))
    }

    /// `kda`: how many of the `n` tokens `seq` would compute keep every expert under capacity.
    /// A decode runs whole or not at all (0); a prompt chunk is cut to what fits, in whole
    /// blocks, and to one block while its routing is unknown.
    fn balanced_chunk(&self, load: &ExpertLoad, seq: &Sequence, n: usize) -> usize {
        let forecast = seq.experts.load();
        let fit = load.fitting(forecast, n);
        if n <= 1 || fit == n {
            return if forecast.is_none() && n > BLOCK_SIZE {
                BLOCK_SIZE
            } else {
                fit
            };
        }
        let fit = fit / BLOCK_SIZE * BLOCK_SIZE;
        if forecast.is_none() {
            fit.clamp(BLOCK_SIZE.min(n), BLOCK_SIZE)
        } else {
            fit
        }
    }

    /// Plans the next step.
    pub fn schedule(&mut self) -> SchedulerOutput {
        let now = Instant::now();
        let mut out = SchedulerOutput::default();
        self.order_running(now);
        self.make_room_for_interactive(now);

        let interactive_active = self.running.iter().any(|s| self.class(s, now) == 0)
            || self.next_queue(now).is_some_and(|q| {
                self.waiting[q]
                    .front()
                    .is_some_and(|s| self.class(s, now) == 0)
            });
        let mut budget = self.config.max_num_batched_tokens;
        // Capacity is a share of what the running sequences would compute if none waited.
        let wanted: usize = (self.running.iter())
            .map(|s| self.chunk(s, budget, self.class(s, now), interactive_active))
            .sum();
        let mut load = self.expert_load(wanted.min(budget));
        let mut draft_rows = (self.config.speculation.max_step_rows).saturating_sub(wanted);

        // Running sequences, most urgent first.
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let class = self.class(&self.running[i], now);
            let mut n = self.chunk(&self.running[i], budget, class, interactive_active);
            if let Some(load) = &load
                && class == 1
                && self.running[i].deferrals < self.config.kda.max_deferrals
            {
                match self.balanced_chunk(load, &self.running[i], n) {
                    0 => {
                        self.running[i].deferrals += 1;
                        self.deferrals += 1;
                        i += 1;
                        continue;
                    }
                    fit => n = fit,
                }
            }
            let n_draft = self.plan_draft(i, n, budget, &mut draft_rows);
            n += n_draft;
            let need = self.running[i].num_computed + n;
            let mut ok = self.running[i].block_table.reserve(need);
            if !ok && self.release_waiting_holds() {
                ok = self.running[i].block_table.reserve(need);
            }
            while !ok && self.running.len() - 1 > i {
                let victim = self.running.pop().expect("non-empty");
                self.preempt(victim);
                ok = self.running[i].block_table.reserve(need);
            }
            if !ok {
                let seq = self.running.remove(i);
                if self.running.is_empty() {
                    // Alone and still out of blocks: it can never grow.
                    out.ended.push((seq, FinishReason::Length));
                } else {
                    self.preempt(seq);
                }
                continue;
            }
            let seq = &mut self.running[i];
            seq.deferrals = 0;
            if let Some(load) = &mut load {
                load.add(seq.experts.load(), n);
            }
            out.scheduled.push(ScheduledSeq {
                index: i,
                n_tokens: n,
                n_draft,
            });
            budget -= n;
            i += 1;
        }

        // Admission.
        while budget > 0 && self.running.len() < self.config.max_num_seqs {
            let Some(q) = self.next_queue(now) else { break };
            let class = self.class(&self.waiting[q][0], now);
            let seq = self.waiting[q].front_mut().expect("non-empty");
            // A sequence may come holding its prefix already (brought up from the tiers).
            let matched_now = seq.num_computed == 0 && seq.prefix_cacheable;
            if matched_now {
                seq.num_computed = seq.block_table.match_prefix(&seq.tokens);
            }
            let mut n = self.chunk(&self.waiting[q][0], budget, class, interactive_active);
            if let Some(load) = &load
                && class == 1
            {
                n = self.balanced_chunk(load, &self.waiting[q][0], n).max(1);
            }
            let seq = self.waiting[q].front_mut().expect("non-empty");
            // Its whole prompt must fit in the free blocks, not just this chunk: a sequence
            // admitted on its first chunk alone grows into the others' blocks and preempts them,
            // and they it, recomputing each other's prompts without end.
            let whole = (seq.block_table)
                .blocks_to_reach(seq.tokens.len(), self.config.max_num_batched_tokens);
            let alone = self.running.is_empty() && out.scheduled.is_empty();
            if !alone && self.kv.borrow().num_free_blocks() < whole {
                if matched_now {
                    seq.block_table.release();
                    seq.num_computed = 0;
                }
                break;
            }
            if !seq.block_table.reserve(seq.num_computed + n) {
                // Give back any prefix blocks it took; try again next step.
                seq.block_table.release();
                seq.num_computed = 0;
                if alone && self.release_waiting_holds() {
                    continue; // with the blocks the others waiting held
                }
                if alone {
                    let seq = self.waiting[q].pop_front().expect("non-empty");
                    out.ended.push((seq, FinishReason::Length));
                    continue;
                }
                break;
            }
            let seq = self.waiting[q].pop_front().expect("non-empty");
            if let Some(load) = &mut load {
                load.add(seq.experts.load(), n);
            }
            self.running.push(seq);
            out.scheduled.push(ScheduledSeq {
                index: self.running.len() - 1,
                n_tokens: n,
                n_draft: 0,
            });
            budget -= n;
        }
        tracing::trace!(
            running = self.running.len(),
            waiting = self.num_waiting(),
            tokens = self.config.max_num_batched_tokens - budget,
            free_blocks = self.kv.borrow().num_free_blocks(),
            "planned"
        );
        out
    }

    /// Drafts for running sequence `i` when it decodes (`n` is its one token) and speculates:
    /// at most what `budget` and `rows_left` (the draft rows the step has left) allow, and
    /// never past its `max_tokens` or the context. Returns the draft's length.
    fn plan_draft(&mut self, i: usize, n: usize, budget: usize, rows_left: &mut usize) -> usize {
        let seq = &mut self.running[i];
        let decodes = n == 1 && seq.uncomputed() == 1;
        // A step yields at most one token more than it drafted.
        let to_come = (seq
            .sampler
            .params()
            .max_tokens
            .saturating_sub(seq.generated()))
        .min(seq.max_len.saturating_sub(seq.tokens.len()));
        let Some(spec) = seq.speculation.as_mut() else {
            return 0;
        };
        if !decodes {
            spec.drop_draft();
            return 0;
        }
        let cap = (to_come.saturating_sub(1)).min(budget - 1).min(*rows_left);
        let k = spec.plan(&seq.tokens, cap);
        *rows_left -= k;
        k
    }

    /// Gives back the blocks that waiting sequences hold (a prefix brought up from the tiers
    /// and kept for them until they run): a running sequence, or one that would run alone,
    /// needs them more. They stay cached, so their owners usually find them again, or look
    /// for them below the pool. Returns whether any were held.
    fn release_waiting_holds(&mut self) -> bool {
        let mut any = false;
        for seq in self.waiting.iter_mut().flatten() {
            if !seq.block_table.is_empty() {
                seq.block_table.release();
                seq.num_computed = 0;
                seq.look_below = true;
                any = true;
            }
        }
        any
    }

    /// Preempts running batch sequences (newest first) while interactive work waits for a seat
    /// or for the KV blocks of its first chunk.
    fn make_room_for_interactive(&mut self, now: Instant) {
        if self.config.policy == SchedulingPolicy::Fcfs {
            return;
        }
        let Some(q) = self.next_queue(now) else {
            return;
        };
        let head = &self.waiting[q][0];
        if self.class(head, now) != 0 {
            return;
        }
        let first_chunk = head.uncomputed().min(self.config.max_num_batched_tokens);
        let needed_blocks = head
            .block_table
            .blocks_needed(head.num_computed + first_chunk);
        loop {
            let no_seat = self.running.len() >= self.config.max_num_seqs;
            let no_memory = self.kv.borrow().num_free_blocks() < needed_blocks;
            if !(no_seat || no_memory) {
                return;
            }
            match self.running.iter().rposition(|s| self.class(s, now) == 1) {
                Some(v) => {
                    let victim = self.running.remove(v);
                    self.preempt(victim);
                }
                None => return,
            }
        }
    }
}

#[cfg(test)]
mod tests;
