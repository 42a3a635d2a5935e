//! Offline evaluation: does a candidate route answer at least as well as the baseline, on the
//! cases that matter, before it takes traffic?
//!
//! - [`Suite`]: cases (chat messages, a completions prompt, or a text to score) with
//!   [`Check`]ers: exact, contains, regex, JSON-schema validity, numeric tolerance, tool-call
//!   match, retrieval hit, perplexity, similarity by embeddings, an expected refusal, and a
//!   judge model with a rubric.
//! - [`Target`]: any OpenAI-compatible route (a model, a tier, a prompt version or RAG setting
//!   through `osprey`, an upstream) with prices for the cost estimate.
//! - [`run_suite`] runs a suite with bounded concurrency into a [`RunReport`] (per case: each
//!   checker's verdict, tokens, cost, latency); [`report`] renders it as a table or HTML.
//! - [`Comparison`]: candidate against baseline, paired by case, with bootstrap confidence
//!   intervals per metric and the cases that flipped; [`Comparison::gate`] is the regression
//!   gate a rollout script calls.
//! - [`replay`]: sampled production requests from a server's request log, sent to a candidate
//!   and compared with the originals.
//!
//! ```no_run
//! # async fn demo() -> Result<(), osprey_eval::EvalError> {
//! use osprey_eval::{Comparison, RunConfig, Suite, Target, run_suite};
//! let suite = Suite::load("eval/suites/qa.jsonl".as_ref())?;
//! let base = Target::load("eval/targets/local.toml".as_ref())?;
//! let cand = Target { model: "auto".into(), ..base.clone() };
//! let a = run_suite(&suite, &base, RunConfig::default(), &|_| {}).await;
//! let b = run_suite(&suite, &cand, RunConfig::default(), &|_| {}).await;
//! let verdict = Comparison::new(&a, &b, 0.95).gate("pass", 0.05);
//! # Ok(()) }
//! ```
#![deny(missing_docs)]

pub mod check;
pub mod compare;
pub mod replay;
pub mod report;
pub mod run;
pub mod stats;
pub mod suite;
pub mod target;

pub use check::{Answer, Check, CheckOutcome, Failure};
pub use compare::{Comparison, Flip, MetricDelta};
pub use run::{CaseResult, RunConfig, RunReport, Summary, run_suite};
pub use suite::{Case, Suite};
pub use target::Target;

/// A failure of evaluation itself (not of a case: those are results).
#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    /// A file could not be read or written.
    #[error("{0}")]
    Io(String),
    /// A suite is malformed; the message names the file and the case.
    #[error("bad suite: {0}")]
    Suite(String),
    /// A target is malformed.
    #[error("bad target: {0}")]
    Target(String),
    /// A server could not be asked.
    #[error("{0}")]
    Http(String),
}
