//! Speculative decoding: cheap guesses at a sequence's next tokens, which one forward pass
//! then verifies.
//!
//! On a CPU, decoding one token reads every weight once, so a pass that checks `k` guessed
//! tokens beside the real one costs little more than the plain step; each guess the model
//! agrees with is a token gained. This module holds the guessing side:
//! - [`NgramProposer`]: prompt-lookup drafts. The sequence's latest tokens are looked up in its
//!   own prompt and output, longest n-gram first, and the tokens that followed the latest
//!   earlier occurrence are the draft. Copy-heavy work (quoting, rewriting, code edits, JSON
//!   with repeated keys) drafts well; open-ended text rarely finds a match, and then nothing is
//!   drafted.
//! - [`DraftLength`]: how many tokens to draft next, from the sequence's recent acceptance.
//!
//! - [`Speculation`]: a sequence's proposer, draft length and planned draft.
//!
//! The scheduler plans a decoding sequence's draft and gives it one row per drafted token; the
//! engine's forward pass computes them beside everything else, and
//! [`crate::sampler::Sampler::verify`] keeps the drafted tokens the target agrees with. The
//! design and its invariants are in this module's `README.md`.

mod draft_length;
mod ngram;
mod speculation;

pub use draft_length::DraftLength;
pub use ngram::NgramProposer;
pub use speculation::{DraftTally, Speculation};

/// How the engine speculates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpeculationConfig {
    /// Most tokens a sequence drafts a step; 0 turns speculation off.
    pub max_draft: usize,
    /// Drafts are given only while a step has fewer rows than this: past it a forward pass is
    /// bound by compute rather than by reading the weights, and drafted rows are not nearly
    /// free any more.
    pub max_step_rows: usize,
}

impl SpeculationConfig {
    /// No speculation.
    pub const OFF: Self = Self {
        max_draft: 0,
        max_step_rows: 0,
    };
}

impl Default for SpeculationConfig {
    fn default() -> Self {
        Self {
            max_draft: 7,
            max_step_rows: 16,
        }
    }
}
