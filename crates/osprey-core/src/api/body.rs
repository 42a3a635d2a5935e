//! A generation request's body, parsed once.

use bytes::Bytes;
use serde_json::{Map, Value};

use super::ApiRequest;
use crate::error::{Error, Result};

/// A JSON request body, parsed once where it arrives and then read and changed by field.
///
/// It keeps the bytes it was parsed from until something changes it, so a body passed on
/// unchanged (to an upstream, a worker) is forwarded as it came, without being written again.
/// [`JsonBody::typed`] builds the typed request for the local engine from the parsed value.
#[derive(Clone, Debug, Default)]
pub struct JsonBody {
    /// A JSON object (`Null` only in the empty default, which is taken to be `{}`).
    value: Value,
    /// The bytes `value` was parsed from, while it is unchanged.
    raw: Option<Bytes>,
    /// How many bytes it came as.
    received: usize,
}

impl JsonBody {
    /// Parses `raw`, which must be a JSON object.
    pub fn parse(raw: Bytes) -> Result<Self> {
        match super::parse_json::<Value>(&raw)? {
            value @ Value::Object(_) => Ok(Self {
                value,
                received: raw.len(),
                raw: Some(raw),
            }),
            _ => Err(Error::invalid(
                "body",
                "The request body must be a JSON object.",
            )),
        }
    }

    /// A body built from `object` (a request of the server's own).
    pub fn from_object(object: Map<String, Value>) -> Self {
        Self {
            value: Value::Object(object),
            raw: None,
            received: 0,
        }
    }

    /// The field `name`, `Null` when absent.
    pub fn get(&self, name: &str) -> &Value {
        &self.value[name]
    }

    /// Osprey's option `name` (`{"osprey": {name: ...}}`), `Null` when absent.
    pub fn osprey(&self, name: &str) -> &Value {
        &self.value["osprey"][name]
    }

    /// The body, to read (a JSON object: indexing a field it lacks gives `Null`).
    pub fn value(&self) -> &Value {
        &self.value
    }

    /// The body, to change (a JSON object): it is written anew when it is next sent.
    pub fn edit(&mut self) -> &mut Value {
        self.raw = None;
        if self.value.is_null() {
            self.value = Value::Object(Map::new());
        }
        &mut self.value
    }

    /// Changes the body with `f`, which returns whether it changed anything and a result: a
    /// body left as it was keeps the bytes it came as.
    pub fn change<T>(&mut self, f: impl FnOnce(&mut Value) -> (bool, T)) -> T {
        let raw = self.raw.take();
        let (changed, out) = f(self.edit());
        if !changed {
            self.raw = raw;
        }
        out
    }

    /// How many bytes it came as (0 for a body built by the server).
    pub fn received_len(&self) -> usize {
        self.received
    }

    /// The model it names (empty when it names none).
    pub fn model(&self) -> &str {
        self.get("model").as_str().unwrap_or_default()
    }

    /// Names `model` instead.
    pub fn set_model(&mut self, model: &str) {
        if self.model() != model {
            self.edit()["model"] = model.into();
        }
    }

    /// Whether it asks for a stream.
    pub fn streamed(&self) -> bool {
        self.get("stream") == &Value::Bool(true)
    }

    /// Whether a streamed request asks for the usage chunk (`stream_options.include_usage`).
    pub fn include_usage(&self) -> bool {
        self.get("stream_options")["include_usage"] == true
    }

    /// Whether it asks for batch priority (or, when it says nothing, `default` does).
    pub fn is_batch(&self, default: crate::Priority) -> bool {
        match self.osprey("priority").as_str() {
            Some(p) => p == "batch",
            None => default == crate::Priority::Batch,
        }
    }

    /// The most tokens it asks for (`max_completion_tokens`, else `max_tokens`).
    pub fn max_tokens(&self) -> Option<u64> {
        ["max_completion_tokens", "max_tokens"]
            .into_iter()
            .find_map(|f| self.get(f).as_u64())
    }

    /// Sets `max_tokens` (or `max_completion_tokens`, whichever it uses) to at most `cap`;
    /// whether it changed.
    pub fn cap_max_tokens(&mut self, cap: u64) -> bool {
        let field = match self.value.get("max_completion_tokens").is_some() {
            true => "max_completion_tokens",
            false => "max_tokens",
        };
        if self.get(field).as_u64().is_some_and(|m| m <= cap) {
            return false;
        }
        self.edit()[field] = cap.into();
        true
    }

    /// The body as bytes: those it came as, if unchanged.
    pub fn bytes(&self) -> Bytes {
        match &self.raw {
            Some(raw) => raw.clone(),
            None if self.value.is_null() => Bytes::from_static(b"{}"),
            None => serde_json::to_vec(&self.value)
                .expect("a JSON value serialises")
                .into(),
        }
    }

    /// The typed request, naming the offending field in any error.
    pub fn typed<T: ApiRequest>(&self) -> Result<T> {
        match &self.value {
            Value::Object(object) => super::from_object(object),
            _ => super::from_object(&Map::new()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(json: &str) -> JsonBody {
        JsonBody::parse(Bytes::copy_from_slice(json.as_bytes())).unwrap()
    }

    #[test]
    fn an_unchanged_body_is_sent_as_it_came() {
        let raw = r#"{ "model" : "m",  "stream": true }"#;
        let mut b = body(raw);
        b.set_model("m");
        assert_eq!(b.bytes(), raw.as_bytes());
        b.set_model("n");
        assert_eq!(b.bytes(), r#"{"model":"n","stream":true}"#.as_bytes());
        assert!(b.streamed());
    }

    #[test]
    fn max_tokens_is_capped_only_when_larger_in_the_field_in_use() {
        let mut b = body(r#"{"max_tokens": 16}"#);
        assert!(!b.cap_max_tokens(256));
        let mut b = body(r#"{"max_tokens": 900}"#);
        assert!(b.cap_max_tokens(256));
        assert_eq!(b.get("max_tokens"), 256);
        let mut b = body(r#"{"max_completion_tokens": 1000}"#);
        assert!(b.cap_max_tokens(64));
        assert_eq!(b.get("max_completion_tokens"), 64);
        assert!(b.get("max_tokens").is_null());
        let mut b = body(r#"{"model": "m"}"#);
        assert!(b.cap_max_tokens(64));
        assert_eq!(b.max_tokens(), Some(64));
    }

    #[test]
    fn only_a_json_object_is_a_body() {
        for bad in ["[1]", "{", "\"x\"", ""] {
            let e = JsonBody::parse(Bytes::copy_from_slice(bad.as_bytes())).unwrap_err();
            assert_eq!(e.param.as_deref(), Some("body"), "{bad}");
        }
    }

    #[test]
    fn a_change_that_changes_nothing_keeps_the_bytes() {
        let raw = r#"{"messages": [{"role": "user", "content": "hi"}]}"#;
        let mut b = body(raw);
        b.change(|v| (false, v["messages"][0]["content"].as_str().map(str::len)));
        assert_eq!(b.bytes(), raw.as_bytes());
        b.change(|v| (true, v["messages"][0]["content"] = "[redacted]".into()));
        assert!(String::from_utf8_lossy(&b.bytes()).contains("[redacted]"));
        assert_eq!(b.received_len(), raw.len());
    }

    #[test]
    fn options_are_read_under_osprey() {
        let b =
            body(r#"{"osprey": {"priority": "batch"}, "stream_options": {"include_usage": true}}"#);
        assert!(b.is_batch(crate::Priority::Interactive));
        assert!(b.include_usage());
        assert!(b.osprey("rag").is_null());
        assert!(!body("{}").is_batch(crate::Priority::Interactive));
    }
}
