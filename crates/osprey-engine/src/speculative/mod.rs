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
//! Both are pure, per-sequence state: no model, no I/O. The target's side of a drafted
//! position is [`crate::sampler::Sampler::verify`]. The engine does not draft yet: the design
//! of verification inside the batched step is in this module's `README.md`.

mod draft_length;
mod ngram;

pub use draft_length::DraftLength;
pub use ngram::NgramProposer;
