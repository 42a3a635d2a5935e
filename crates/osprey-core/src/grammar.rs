//! What a request's output must match, whatever asked for it: `response_format`, Osprey's
//! `grammar` option, or the tools a chat may call. The engine compiles it into a token-level
//! constraint; this type only names it.

use serde_json::Value;

/// A structure the whole output must follow.
#[derive(Clone, Debug, PartialEq)]
pub enum Grammar {
    /// JSON valid under `schema`. With `strict`, a schema keyword that cannot be enforced is
    /// an error; without it, such a keyword is ignored (the rest is still enforced).
    JsonSchema {
        /// The JSON Schema.
        schema: Value,
        /// Refuse schemas with keywords that cannot be enforced.
        strict: bool,
    },
    /// Any JSON object (`response_format: {"type": "json_object"}`), within bounds that keep a
    /// model from writing one without end: keys of at most 64 characters, strings of at most
    /// 500, at most 32 members per object and 64 items per array, nesting at most 6 deep.
    JsonObject,
    /// Text matched in full by a regular expression.
    Regex(String),
    /// Text derived from a grammar in llguidance's Lark dialect (which can embed JSON schemas
    /// with `%json { ... }`).
    Lark(String),
}
