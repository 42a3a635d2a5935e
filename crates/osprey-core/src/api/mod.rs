//! The OpenAI-compatible wire format.
//!
//! Request types ignore fields they do not know (as OpenAI's API does) and turn into validated
//! [`SamplingParams`](crate::SamplingParams) with `sampling_params()`. Response types serialize
//! to exactly OpenAI's shapes.

mod body;
mod chat;
mod common;
mod completions;
mod models;
mod text;
mod tools;

pub use body::JsonBody;
pub use chat::*;
pub use common::*;
pub use completions::*;
pub use models::*;
pub use text::{choice_text, choice_text_mut, content_text, set_choice_text};
pub use tools::*;

use crate::error::{Error, Result};

/// A request body that carries the shared [`SamplingFields`].
pub trait ApiRequest: serde::de::DeserializeOwned {
    /// Where the sampling fields go.
    fn sampling_mut(&mut self) -> &mut SamplingFields;
}

/// Parses a request body into `T` and its sampling fields, naming the offending field in any
/// error. (The two parts are read separately rather than with `#[serde(flatten)]`, which would
/// lose the field paths.)
pub fn parse_request<T: ApiRequest>(body: &[u8]) -> Result<T> {
    match parse_json(body)? {
        serde_json::Value::Object(object) => from_object(&object),
        other => from_value(other),
    }
}

/// The typed request of a parsed JSON object, with its sampling fields.
fn from_object<T: ApiRequest>(object: &serde_json::Map<String, serde_json::Value>) -> Result<T> {
    let mut request: T = from_value(object)?;
    *request.sampling_mut() = from_value(object)?;
    Ok(request)
}

fn from_value<'de, T: serde::de::DeserializeOwned>(
    value: impl serde::Deserializer<'de, Error = serde_json::Error>,
) -> Result<T> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path == "." {
            Error::invalid("body", format!("The request body is invalid: {inner}"))
        } else {
            Error::invalid(path.clone(), format!("Field `{path}` is invalid: {inner}"))
        }
    })
}

/// Parses a JSON body, naming the offending field in the error.
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
