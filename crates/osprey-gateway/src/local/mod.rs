//! The engine this process loaded, as a backend: a typed chat or text completion request
//! served by it, streamed or whole (each request type's [`crate::pipeline::Routed`] impl).

mod chat;
mod completions;
pub mod generation;
