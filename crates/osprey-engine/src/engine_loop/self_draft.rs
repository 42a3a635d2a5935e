//! The self-draft: before a step, the model's own first layers and its output head guess the
//! next tokens of the sequences that draft this way, one token a round.
//!
//! Each round is one shallow forward pass over every such sequence still drafting: round `j`
//! feeds position `num_computed + j` (the sequence's last token, then its guesses) and takes the
//! most likely next token. The pass stores those layers' keys and values where the step's full
//! pass stores them again, the same bits, so the draft needs no cache of its own and leaves
//! nothing behind: a rejected position is rolled back like any other draft row. The guess is a
//! deterministic function of the context, which is what [`crate::sampler::Sampler::verify`]
//! needs to keep sampling exact.

use osprey_models::eval::argmax;
use osprey_models::{BatchSeq, ForwardBatch, ForwardScratch, KvCache, LogitsWanted, Transformer};

use crate::scheduler::ScheduledSeq;
use crate::sequence::Sequence;

/// What a self-draft's shallow passes run on.
pub(super) struct Pass<'a> {
    pub model: &'a Transformer,
    pub kv: &'a mut KvCache,
    pub scratch: &'a mut ForwardScratch,
    pub pool: &'a rayon::ThreadPool,
    /// The layers the draft runs through.
    pub layers: usize,
}

impl Pass<'_> {
    /// Fills the planned draft of each scheduled self-drafting sequence (`n_draft` tokens)
    /// with the guesses of the model's first layers.
    pub(super) fn guess(self, running: &mut [Sequence], scheduled: &[ScheduledSeq]) {
        let Pass {
            model,
            kv,
            scratch,
            pool,
            layers,
        } = self;
        let drafting: Vec<&ScheduledSeq> = (scheduled.iter())
            .filter(|s| s.n_draft > 0)
            .filter(|s| (running[s.index].speculation.as_ref()).is_some_and(|p| p.self_drafts()))
            .collect();
        let rounds = drafting.iter().map(|s| s.n_draft).max().unwrap_or(0);
        let vocab = model.config().vocab_size;
        scratch.set_sample_heat(false);
        for round in 0..rounds {
            let active: Vec<usize> = (drafting.iter())
                .filter(|s| s.n_draft > round)
                .map(|s| s.index)
                .collect();
            let (mut tokens, mut seqs) = (Vec::new(), Vec::new());
            for &i in &active {
                let seq = &running[i];
                let fed = match round {
                    0 => seq.tokens[seq.num_computed],
                    _ => seq.speculation.as_ref().expect("drafting").draft()[round - 1],
                };
                tokens.push(fed);
                seqs.push(BatchSeq {
                    n_tokens: 1,
                    start_pos: seq.num_computed + round,
                    block_tables: seq.block_table.tables(),
                    logits: LogitsWanted::Last,
                });
            }
            let batch = ForwardBatch {
                tokens: &tokens,
                seqs: &seqs,
            };
            let logits = pool.install(|| model.forward_layers(&batch, kv, scratch, layers));
            let guesses: Vec<u32> = logits.chunks_exact(vocab).map(argmax).collect();
            drop(seqs);
            for (&i, token) in active.iter().zip(guesses) {
                let spec = running[i].speculation.as_mut().expect("drafting");
                spec.push_draft(token);
            }
        }
    }
}
