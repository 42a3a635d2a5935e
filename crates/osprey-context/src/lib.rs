//! What goes into a model's prompt besides the caller's own messages:
//! - the prompt registry's side ([`prompt`]): a versioned prompt's definition (messages whose
//!   text is a template, and default model settings), rendering it with a request's
//!   variables, choosing a version of a label that splits traffic (sticky per user), and
//!   diffing two versions;
//! - the prompt builder ([`builder`]): layered memory (facts about the user, a task's
//!   scratchpad, the summary of older turns, recent turns) put in, each layer within its own
//!   token budget, with a report of what went in;
//! - [`facts`]: durable facts a user states about themselves, found in their words;
//! - applied to a request's body: [`registry`] (the registered prompt it names), [`memory`]
//!   (its user's facts, scratchpad and conversation, within budgets), [`conversation`] (a
//!   conversation's turns in, its new turn kept once answered), [`summary`] (older turns
//!   folded into a summary by a [`summary::SummaryWriter`]) and [`retrieval`] (passages found
//!   put in, screened as untrusted text, and the answer's citations).
//!
//! The records are kept behind a trait ([`store::ContextStore`]), which `osprey-store`'s
//! `Store` implements. The gateway calls these stages and marks its responses with what they
//! did.
//!
//! ```
//! use osprey_context::prompt::PromptDef;
//! let def = PromptDef::parse(r#"
//!     [settings]
//!     temperature = 0.2
//!     [[messages]]
//!     role = "system"
//!     content = "You answer questions about {{ product }}."
//! "#).unwrap();
//! let vars = serde_json::json!({"product": "Osprey"});
//! let messages = def.render(vars.as_object().unwrap()).unwrap();
//! assert_eq!(messages[0].content, "You answer questions about Osprey.");
//! ```
#![deny(missing_docs)]

pub mod builder;
pub mod conversation;
pub mod facts;
pub mod memory;
pub mod prompt;
pub mod registry;
pub mod retrieval;
pub mod store;
pub mod summary;
