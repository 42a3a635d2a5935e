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
//! - A self-draft ([`Drafter::Layers`]): the model's own first layers and its output head
//!   guess the next tokens one at a time. It reads and writes the target's own keys and values
//!   for those layers (they are the same numbers), so it needs no memory of its own; the
//!   engine runs it before the step (`engine_loop::self_draft`).
//! - [`DraftLength`]: how many tokens to draft next, from the sequence's recent acceptance.
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

/// Where drafts come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Drafter {
    /// Prompt lookup: n-grams of the sequence's own prompt and output.
    Ngram,
    /// The model's first `n` layers, then its output head (`layers:N` on the command line).
    Layers(usize),
}

impl std::str::FromStr for Drafter {
    type Err = String;

    /// `ngram` or `layers:N` (N at least 1).
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "ngram" {
            return Ok(Self::Ngram);
        }
        match s.strip_prefix("layers:").map(str::parse::<usize>) {
            Some(Ok(n)) if n > 0 => Ok(Self::Layers(n)),
            _ => Err(format!(
                "unknown drafter {s:?}: expected ngram or layers:N with N >= 1"
            )),
        }
    }
}

/// How the engine speculates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpeculationConfig {
    /// Where drafts come from.
    pub drafter: Drafter,
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
        drafter: Drafter::Ngram,
        max_draft: 0,
        max_step_rows: 0,
    };
}

impl Default for SpeculationConfig {
    fn default() -> Self {
        Self {
            drafter: Drafter::Ngram,
            max_draft: 7,
            max_step_rows: 16,
        }
    }
}
