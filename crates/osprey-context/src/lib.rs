//! What goes into a model's prompt besides the caller's own messages:
//! - the prompt registry's side ([`prompt`]): a versioned prompt's definition (messages whose
//!   text is a template, and default model settings), rendering it with a request's
//!   variables, choosing a version of a label that splits traffic (sticky per user), and
//!   diffing two versions;
//! - the prompt builder ([`builder`]): layered memory (facts about the user, a task's
//!   scratchpad, the summary of older turns, recent turns) put in, each layer within its own
//!   token budget, with a report of what went in;
//! - [`facts`]: durable facts a user states about themselves, found in their words.
//!
//! The records live in `osprey-store`; the gateway reads them and applies these to requests.
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
pub mod facts;
pub mod prompt;
