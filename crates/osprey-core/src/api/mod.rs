//! The OpenAI-compatible wire format.
//!
//! Request types ignore fields they do not know (as OpenAI's API does) and turn into validated
//! [`SamplingParams`](crate::SamplingParams) with `sampling_params()`. Response types serialize
//! to exactly OpenAI's shapes.

mod chat;
mod common;
mod completions;
mod models;

pub use chat::*;
pub use common::*;
pub use completions::*;
pub use models::*;

use crate::error::{Error, Result};

/// Parses a JSON request body, naming the offending field in the error.
pub fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T> {
    let de = &mut serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let what = match inner.classify() {
            serde_json::error::Category::Syntax | serde_json::error::Category::Eof => {
                return Error::invalid(
                    "body",
                    format!("The request body is not valid JSON: {inner}"),
                );
            }
            serde_json::error::Category::Io => "could not be read",
            serde_json::error::Category::Data => "is invalid",
        };
        if path == "." {
            Error::invalid("body", format!("The request body {what}: {inner}"))
        } else {
            Error::invalid(path.clone(), format!("Field `{path}` {what}: {inner}"))
        }
    })
}
