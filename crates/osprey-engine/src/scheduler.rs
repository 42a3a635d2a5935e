//! Which sequences run in the next step, and how many of their tokens.
//!
//! Continuous batching with chunked prefill: every step, running sequences get one decode
//! token each (or the next chunk of their prompt), then waiting sequences are admitted in
//! arrival order while the step's token budget and sequence cap allow and the KV pool has
//! blocks. When a running sequence cannot get a block, the newest running sequence is
//! preempted: its blocks are freed and it goes back to the front of the queue, to be
//! recomputed later (vLLM's recompute preemption).

use std::collections::VecDeque;

use osprey_core::FinishReason;

use crate::sequence::Sequence;

/// Limits on one step.
#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    /// Most tokens (prefill and decode together) in one forward pass.
    pub max_num_batched_tokens: usize,
    /// Most sequences in one forward pass.
    pub max_num_seqs: usize,
}

/// A sequence's share of the next step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScheduledSeq {
    /// Index into [`Scheduler::running`].
    pub index: usize,
    /// Tokens to compute, starting at its `num_computed`.
    pub n_tokens: usize,
}

/// The plan for one step: sequences in batch order.
#[derive(Default)]
pub struct SchedulerOutput {
    /// Scheduled sequences.
    pub scheduled: Vec<ScheduledSeq>,
    /// Sequences that can never run (they need more KV than the pool has), to be failed.
    pub ended: Vec<(Sequence, FinishReason)>,
}

/// Waiting and running sequences.
pub struct Scheduler {
    config: SchedulerConfig,
    waiting: VecDeque<Sequence>,
    running: Vec<Sequence>,
}

impl Scheduler {
    /// An idle scheduler.
    pub fn new(config: SchedulerConfig) -> Self {
        Self {
            config,
            waiting: VecDeque::new(),
            running: Vec::new(),
        }
    }

    /// Queues a new sequence.
    pub fn add(&mut self, seq: Sequence) {
        self.waiting.push_back(seq);
    }

    /// Whether anything is queued or running.
    pub fn has_work(&self) -> bool {
        !self.waiting.is_empty() || !self.running.is_empty()
    }

    /// Sequences waiting for admission.
    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Running sequences, in admission order.
    pub fn running(&self) -> &[Sequence] {
        &self.running
    }

    /// Mutable access to running sequences, to apply a step's results.
    pub fn running_mut(&mut self) -> &mut [Sequence] {
        &mut self.running
    }

    /// Drops sequences whose clients have gone (their blocks return to the pool).
    pub fn remove_cancelled(&mut self) -> usize {
        let before = self.waiting.len() + self.running.len();
        self.waiting.retain(|s| !s.is_cancelled());
        self.running.retain(|s| !s.is_cancelled());
        before - self.waiting.len() - self.running.len()
    }

    /// Removes and returns the running sequences for which `done` is true.
    pub fn take_running(&mut self, mut done: impl FnMut(&Sequence) -> bool) -> Vec<Sequence> {
        let (finished, kept) = std::mem::take(&mut self.running)
            .into_iter()
            .partition(|s| done(s));
        self.running = kept;
        finished
    }

    /// Plans the next step.
    pub fn schedule(&mut self) -> SchedulerOutput {
        let mut out = SchedulerOutput::default();
        let mut budget = self.config.max_num_batched_tokens;

        // Running sequences first, oldest first: they hold KV and users are waiting on them.
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let n = self.running[i].uncomputed().min(budget);
            let need = self.running[i].num_computed + n;
            while !self.running[i].block_table.reserve(need) {
                if self.running.len() - 1 > i {
                    let mut victim = self.running.pop().expect("non-empty");
                    preempt(&mut victim);
                    self.waiting.push_front(victim);
                } else {
                    break;
                }
            }
            if self.running[i].block_table.blocks().len() * osprey_models::BLOCK_SIZE < need {
                // Alone and still out of blocks: this sequence cannot grow any further.
                let seq = self.running.remove(i);
                out.ended.push((seq, FinishReason::Length));
                continue;
            }
            out.scheduled.push(ScheduledSeq {
                index: i,
                n_tokens: n,
            });
            budget -= n;
            i += 1;
        }

        // Then admit waiting sequences in arrival order.
        while budget > 0 && self.running.len() < self.config.max_num_seqs {
            let Some(seq) = self.waiting.front_mut() else {
                break;
            };
            let n = seq.uncomputed().min(budget);
            if !seq.block_table.reserve(seq.num_computed + n) {
                if self.running.is_empty() && out.scheduled.is_empty() {
                    // Nothing will ever free a block for it.
                    let seq = self.waiting.pop_front().expect("non-empty");
                    out.ended.push((seq, FinishReason::Length));
                    continue;
                }
                break;
            }
            let seq = self.waiting.pop_front().expect("non-empty");
            out.scheduled.push(ScheduledSeq {
                index: self.running.len(),
                n_tokens: n,
            });
            self.running.push(seq);
            budget -= n;
        }
        out
    }
}

/// Frees a sequence's KV so it can be recomputed from its tokens later.
fn preempt(seq: &mut Sequence) {
    tracing::debug!(
        seq = seq.id,
        tokens = seq.tokens.len(),
        "preempted: out of KV blocks"
    );
    seq.block_table.release();
    seq.num_computed = 0;
}
