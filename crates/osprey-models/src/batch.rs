//! The unit of work of one forward pass: new tokens of several sequences, flattened.

/// Which of a sequence's new tokens need next-token logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogitsWanted {
    /// None: a prefill chunk that is not the prompt's last.
    None,
    /// The last new token only: what sampling needs.
    Last,
    /// Every new token: prompt log-probabilities (`echo`) and perplexity.
    All,
}

/// One sequence's part of a [`ForwardBatch`].
#[derive(Clone, Copy, Debug)]
pub struct BatchSeq<'a> {
    /// New tokens of this sequence in the batch (consecutive in `ForwardBatch::tokens`).
    pub n_tokens: usize,
    /// Tokens of this sequence already in the KV cache: the first new token's position.
    pub start_pos: usize,
    /// Pages holding this sequence's KV, one table per KV group ([`crate::KvLayout`]), each
    /// enough for `start_pos + n_tokens` positions (a windowed group's may hold
    /// [`crate::NO_BLOCK`] before the window).
    pub block_tables: &'a [Vec<u32>],
    /// Which logits to return.
    pub logits: LogitsWanted,
}

/// Tokens of several sequences at different positions, computed in one pass.
#[derive(Clone, Copy, Debug)]
pub struct ForwardBatch<'a> {
    /// New tokens of all sequences, sequence after sequence.
    pub tokens: &'a [u32],
    /// The sequences, in the order of their tokens.
    pub seqs: &'a [BatchSeq<'a>],
}

impl ForwardBatch<'_> {
    /// Rows of logits the pass returns, in order: for each sequence, per [`LogitsWanted`].
    pub fn logit_rows(&self) -> usize {
        self.seqs
            .iter()
            .map(|s| match s.logits {
                LogitsWanted::None => 0,
                LogitsWanted::Last => 1,
                LogitsWanted::All => s.n_tokens,
            })
            .sum()
    }
}
