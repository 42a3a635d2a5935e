//! One sequence's speculation: its n-gram index, its draft length, and the draft the planned
//! step verifies.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{DraftLength, Drafter, NgramProposer};

/// The shortest n-gram a draft is looked up by: one token matches too often to be worth a row.
const MIN_NGRAM: usize = 2;
/// The longest: a longer match is rarely more right than a 4-gram.
const MAX_NGRAM: usize = 4;

/// Drafted and accepted tokens over a request's choices: the engine counts, the request's
/// answer reads them for its usage and log row.
#[derive(Debug, Default)]
pub struct DraftTally {
    drafted: AtomicU64,
    accepted: AtomicU64,
}

impl DraftTally {
    /// `(drafted, accepted)` so far.
    pub fn get(&self) -> (u64, u64) {
        (
            self.drafted.load(Ordering::Relaxed),
            self.accepted.load(Ordering::Relaxed),
        )
    }

    fn add(&self, drafted: usize, accepted: usize) {
        self.drafted.fetch_add(drafted as u64, Ordering::Relaxed);
        self.accepted.fetch_add(accepted as u64, Ordering::Relaxed);
    }
}

/// What a speculating sequence keeps between steps.
pub struct Speculation {
    /// Prompt lookup's index; `None` when the engine drafts with the model's first layers.
    proposer: Option<NgramProposer>,
    length: DraftLength,
    /// The draft the step being planned verifies (empty when it verifies none).
    draft: Vec<u32>,
    tally: Arc<DraftTally>,
}

impl Speculation {
    /// Speculation for a sequence drafting at most `max_draft` tokens a step from `drafter`,
    /// counted in `tally`.
    pub fn new(drafter: Drafter, max_draft: usize, tally: Arc<DraftTally>) -> Self {
        Self {
            proposer: (drafter == Drafter::Ngram).then(|| NgramProposer::new(MIN_NGRAM, MAX_NGRAM)),
            length: DraftLength::new(max_draft, max_draft),
            draft: Vec::new(),
            tally,
        }
    }

    /// Drafts what follows `tokens` (the sequence so far): at most `cap` tokens, and no more
    /// than its recent acceptance earns. Returns the draft's length (0: nothing to verify).
    ///
    /// A self-drafting sequence gets its length only: the engine then guesses that many
    /// tokens with the model's first layers and hands each to [`Self::push_draft`].
    pub fn plan(&mut self, tokens: &[u32], cap: usize) -> usize {
        let k = self.length.next().min(cap);
        self.draft.clear();
        let Some(proposer) = &mut self.proposer else {
            return k;
        };
        if proposer.len() < tokens.len() {
            proposer.extend(&tokens[proposer.len()..]);
        }
        self.draft.extend_from_slice(proposer.propose(k));
        self.draft.len()
    }

    /// Whether the engine drafts for this sequence (with the model's first layers).
    pub fn self_drafts(&self) -> bool {
        self.proposer.is_none()
    }

    /// Appends a token the engine guessed to the planned draft.
    pub fn push_draft(&mut self, token: u32) {
        self.draft.push(token);
    }

    /// The planned draft.
    pub fn draft(&self) -> &[u32] {
        &self.draft
    }

    /// Records that the first `accepted` tokens of the planned draft were accepted, and
    /// forgets the draft.
    pub fn verified(&mut self, accepted: usize) {
        let drafted = self.draft.len();
        self.length.record(drafted, accepted);
        self.tally.add(drafted, accepted);
        self.draft.clear();
    }

    /// Forgets the planned draft unverified (the sequence was preempted).
    pub fn drop_draft(&mut self) {
        self.draft.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copying_sequence_drafts_longer_and_counts_what_it_verified() {
        let tally = Arc::new(DraftTally::default());
        let mut s = Speculation::new(Drafter::Ngram, 4, tally.clone());
        let passage = [10, 11, 12, 13, 14, 15, 16, 17];
        let mut tokens: Vec<u32> = passage.iter().chain(&[1, 10, 11]).copied().collect();
        assert_eq!(s.plan(&tokens, 8), 4, "starts at the most");
        assert_eq!(s.draft(), &[12, 13, 14, 15]);
        s.verified(1);
        tokens.extend([12, 13]);
        assert_eq!(s.plan(&tokens, 8), 2, "one more than was accepted");
        assert_eq!(s.draft(), &[14, 15]);
        assert_eq!(s.plan(&tokens, 1), 1, "capped");
        s.verified(1);
        assert_eq!(tally.get(), (5, 2));
        assert!(s.draft().is_empty());
        tokens.push(99);
        assert_eq!(s.plan(&tokens, 8), 0, "no match, no draft");
    }
}
