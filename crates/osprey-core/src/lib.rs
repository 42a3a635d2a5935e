//! Osprey's shared vocabulary, depended on by every other crate and depending on none.
//!
//! - [`api`]: the OpenAI wire format (requests, responses, stream chunks, the error envelope),
//!   lenient where OpenAI is (unknown fields are ignored) and precise in its error messages;
//!   a request's body parsed once ([`api::JsonBody`]); the text of a message or a choice;
//! - [`sampling`]: [`SamplingParams`], the validated form of a request's decoding options;
//! - [`grammar`]: [`Grammar`], the structure an output must follow (JSON schema, regex, Lark);
//! - [`backend`]: the [`backend::Backend`] trait every backend implements: a typed request in,
//!   a stream of typed [`backend::GenEvent`]s out;
//! - [`error`]: [`Error`], the error contract: every failure is a kind plus a message a person
//!   understands; only the gateway turns a kind into an HTTP status;
//! - [`tokens`]: the token estimate used where no tokenizer is at hand.
//!
//! ```
//! use osprey_core::api::ChatCompletionRequest;
//! let req: ChatCompletionRequest = osprey_core::api::parse_request(
//!     br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":0}"#,
//! ).unwrap();
//! let params = req.sampling_params().unwrap();
//! assert_eq!(params.temperature, 0.0);
//! ```
#![deny(missing_docs)]

pub mod api;
pub mod backend;
pub mod error;
pub mod grammar;
pub mod metrics;
pub mod sampling;
pub mod tokens;
pub mod usage;

pub use error::{Error, ErrorKind};
pub use grammar::Grammar;
pub use sampling::{FinishReason, Priority, SamplingParams};
pub use usage::UsageReport;
