//! What goes into a model's prompt besides the caller's own messages. Today that is the
//! prompt registry's side ([`prompt`]): a versioned prompt's definition (messages whose text
//! is a template, and default model settings), rendering it with a request's variables,
//! choosing a version of a label that splits traffic (sticky per user), and diffing two
//! versions. The records live in `osprey-store`; the gateway applies them to requests.
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

pub mod prompt;
