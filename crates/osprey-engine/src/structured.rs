//! Structured output: a request's [`Grammar`] compiled by llguidance into a [`Constraint`],
//! which says before every sampled token which tokens may come next.
//!
//! The [`GrammarCompiler`] is built once per model from the tokenizer (a trie of every token's
//! bytes; control tokens by name). Compiling a grammar happens on the request's task, so a bad
//! schema is a 400 before anything is queued. On the engine thread the masks of a step's
//! constrained sequences are computed on a thread of their own while the forward pass runs
//! ([`crate::engine_loop`]), so constrained decoding costs little more than the mask's
//! application to the logits.

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
pub use llguidance::toktrie::SimpleVob;
use llguidance::toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};
use llguidance::{Matcher, ParserFactory};
use osprey_core::{Error, Grammar};
use serde_json::Value;

use crate::tokenizer::Tokenizer;

/// How JSON is written under a schema: compact separators with one space, the way models
/// saw JSON in training, and no free whitespace (which small models fill without end).
fn json_options(strict: bool) -> Value {
    serde_json::json!({
        "whitespace_flexible": false,
        "item_separator": ", ",
        "key_separator": ": ",
        "lenient": !strict,
    })
}

/// Characters a string may have when its schema sets no `maxLength` (as in
/// [`Grammar::JsonObject`]).
pub const DEFAULT_MAX_STRING: usize = STRING_CHARS;

/// Narrows a schema to what generation needs, so that whatever is generated still validates
/// under the schema as given:
/// - a string type without a `maxLength` (or an `enum` or `const`) gets a `maxLength` of
///   [`DEFAULT_MAX_STRING`]: an unbounded string is where a model loops without end;
/// - an object that lists `properties` and says nothing of other members (no
///   `additionalProperties`, `patternProperties` or `unevaluatedProperties`, and not a part
///   of an `allOf`) gets `additionalProperties: false`: the members it names are the ones
///   asked for, and a small model otherwise invents members until `max_tokens`.
///
/// Conditions and negations (`if`, `not`) are left as they are: narrowing them would widen
/// what the schema accepts.
fn narrow_for_generation(schema: &mut Value, in_all_of: bool) {
    let Value::Object(map) = schema else {
        if let Value::Array(items) = schema {
            items
                .iter_mut()
                .for_each(|s| narrow_for_generation(s, in_all_of));
        }
        return;
    };
    let is_string = match map.get("type") {
        Some(Value::String(t)) => t == "string",
        Some(Value::Array(ts)) => ts.iter().any(|t| t == "string"),
        _ => false,
    };
    let bounded = ["maxLength", "enum", "const"]
        .iter()
        .any(|k| map.contains_key(*k));
    if is_string && !bounded {
        map.insert("maxLength".into(), DEFAULT_MAX_STRING.into());
    }
    let open = [
        "additionalProperties",
        "patternProperties",
        "unevaluatedProperties",
    ]
    .iter()
    .any(|k| map.contains_key(*k));
    if map.contains_key("properties") && !open && !in_all_of {
        map.insert("additionalProperties".into(), false.into());
    }
    for (key, value) in map.iter_mut() {
        match key.as_str() {
            // Maps of names to schemas: every value is a schema, whatever its name.
            "properties" | "patternProperties" | "$defs" | "definitions" | "dependentSchemas" => {
                if let Value::Object(named) = value {
                    named
                        .values_mut()
                        .for_each(|s| narrow_for_generation(s, false));
                }
            }
            "allOf" => narrow_for_generation(value, true),
            // Narrowing a condition or a negation would widen what the schema accepts.
            "not" | "if" => {}
            // Values of these keys are data, not schemas.
            "enum" | "const" | "default" | "examples" | "required" => {}
            _ => narrow_for_generation(value, false),
        }
    }
}

/// A JSON schema as Osprey compiles it: Osprey's writing options (see [`json_options`]) set,
/// unless the schema sets its own `x-guidance`, and narrowed for generation (see
/// [`narrow_for_generation`]).
pub fn with_json_options(schema: &Value, strict: bool) -> Value {
    match schema {
        Value::Object(map) if !map.contains_key("x-guidance") => {
            let mut schema = Value::Object(map.clone());
            narrow_for_generation(&mut schema, false);
            if let Value::Object(map) = &mut schema {
                map.insert("x-guidance".into(), json_options(strict));
            }
            schema
        }
        // `true`: any JSON value.
        Value::Bool(true) => serde_json::json!({"x-guidance": json_options(strict)}),
        other => other.clone(),
    }
}

/// The bounds of [`Grammar::JsonObject`].
const KEY_CHARS: usize = 64;
const STRING_CHARS: usize = 500;
const MEMBERS: usize = 32;
const ITEMS: usize = 64;
const DEPTH: usize = 6;

/// Lark rules for a bounded JSON object (see [`Grammar::JsonObject`]), written the way the
/// schema grammar writes JSON (`", "` and `": "`), its start rule named `{prefix}object0`.
/// Nesting is unrolled level by level, so depth is bounded without a counter.
pub fn json_object_rules(prefix: &str) -> String {
    // Rules are lower case; terminals (single lexemes, which is what keeps strings cheap) are
    // upper case.
    let (p, t) = (prefix, prefix.to_uppercase());
    let mut lark = format!(
        r#"{t}KEY: "\"" {t}CHAR{{1,{KEY_CHARS}}} "\""
{t}STRING: "\"" {t}CHAR{{0,{STRING_CHARS}}} "\""
{t}CHAR: /[^"\\\x00-\x1f]/ | /\\["\\\/bfnrt]/ | /\\u[0-9a-fA-F]{{4}}/
{t}NUMBER: /-?(0|[1-9][0-9]{{0,15}})(\.[0-9]{{1,10}})?([eE][+-]?[0-9]{{1,3}})?/
{p}scalar: {t}STRING | {t}NUMBER | "true" | "false" | "null"
"#
    );
    for d in 0..DEPTH {
        let value = match d + 1 < DEPTH {
            true => format!("{p}scalar | {p}object{n} | {p}array{n}", n = d + 1),
            false => format!("{p}scalar"),
        };
        let (m, i) = (MEMBERS - 1, ITEMS - 1);
        lark.push_str(&format!(
            r#"{p}value{d}: {value}
{p}member{d}: {t}KEY ": " {p}value{d}
{p}object{d}: "{{" ({p}member{d} (", " {p}member{d}){{0,{m}}})? "}}"
{p}array{d}: "[" ({p}value{d} (", " {p}value{d}){{0,{i}}})? "]"
"#
        ));
    }
    lark
}

/// Compiles grammars for one model's vocabulary.
pub struct GrammarCompiler {
    factory: ParserFactory,
}

impl GrammarCompiler {
    /// A compiler for `tokenizer`'s vocabulary; every end-of-generation token counts as the end.
    pub fn new(tokenizer: &Tokenizer) -> Result<Self, Error> {
        let words: Vec<Vec<u8>> = (0..tokenizer.vocab_size() as u32)
            .map(|id| match tokenizer.is_control(id) {
                // Control tokens are written `\xff<name>`, as llguidance expects.
                true => {
                    let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    w.extend_from_slice(tokenizer.id_to_token(id).unwrap_or_default().as_bytes());
                    w
                }
                false => tokenizer.token_bytes(id).to_vec(),
            })
            .collect();
        let ends = tokenizer.end_of_generation();
        let eos = ends
            .first()
            .copied()
            .or(tokenizer.eos())
            .ok_or_else(|| Error::internal("the model has no end-of-sequence token"))?;
        let info = TokRxInfo::new(words.len() as u32, eos);
        let mut trie = TokTrie::from(&info, &words);
        if !ends.is_empty() {
            trie = trie.with_eos_tokens(ends);
        }
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|e| Error::internal(format!("grammar compiler: {e}")))?;
        factory.quiet();
        Ok(Self { factory })
    }

    /// Compiles `grammar`; an error names the parameter `grammar` and says what is wrong.
    pub fn compile(&self, grammar: &Grammar) -> Result<Constraint, Error> {
        let kind = match grammar {
            Grammar::JsonSchema { .. } => "json_schema",
            Grammar::JsonObject => "json_object",
            Grammar::Regex(_) => "regex",
            Grammar::Lark(_) => "lark",
        };
        metrics::counter!(osprey_core::metrics::CONSTRAINED_REQUESTS, "grammar" => kind)
            .increment(1);
        let top = match grammar {
            Grammar::JsonSchema { schema, strict } => {
                TopLevelGrammar::from_json_schema(with_json_options(schema, *strict))
            }
            Grammar::JsonObject => TopLevelGrammar::from_lark(format!(
                "%llguidance {{}}\nstart: j_object0\n{}",
                json_object_rules("j_")
            )),
            Grammar::Regex(rx) => TopLevelGrammar::from_regex(rx),
            Grammar::Lark(lark) => TopLevelGrammar::from_lark(lark.clone()),
        };
        let parser = self
            .factory
            .create_parser(top)
            .map_err(|e| Error::invalid("grammar", format!("the grammar is invalid: {e}")))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(Error::invalid(
                "grammar",
                format!("the grammar is invalid: {e}"),
            ));
        }
        Ok(Constraint { matcher })
    }
}

/// One sequence's progress through its grammar.
#[derive(Clone)]
pub struct Constraint {
    matcher: Matcher,
}

impl Constraint {
    /// The tokens that may come next (only the end tokens once the grammar is complete).
    pub fn allowed(&mut self) -> Result<SimpleVob, Error> {
        self.matcher
            .compute_mask_or_eos()
            .map_err(|e| Error::internal(format!("grammar: {e}")))
    }

    /// Records the sampled `token`.
    pub fn advance(&mut self, token: u32) -> Result<(), Error> {
        self.matcher
            .consume_token(token)
            .map_err(|e| Error::internal(format!("grammar: {e}")))
    }

    /// Whether nothing more may be generated.
    pub fn is_complete(&self) -> bool {
        self.matcher.is_stopped()
    }
}

/// Sets every logit whose token `allowed` excludes to −∞ (and those past its vocabulary).
pub fn apply_mask(logits: &mut [f32], allowed: &SimpleVob) {
    let words = allowed.as_slice();
    for (i, chunk) in logits.chunks_mut(32).enumerate() {
        let bits = words.get(i).copied().unwrap_or(0);
        if bits == u32::MAX {
            continue;
        }
        for (j, l) in chunk.iter_mut().enumerate() {
            if bits & (1 << j) == 0 {
                *l = f32::NEG_INFINITY;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unbounded_strings_get_a_bound_and_unnamed_members_are_not_generated() {
        let schema = serde_json::json!({"type": "object", "properties": {
            "a": {"type": "string"}, "b": {"type": "string", "maxLength": 5},
            "c": {"enum": ["x"]}, "d": {"type": ["string", "null"]},
            "e": {"type": "array", "items": {"type": "string"}}, "f": {"type": "integer"},
            "enum": {"type": "string"},
            "g": {"type": "object", "properties": {"h": {}}, "additionalProperties": true},
            "i": {"allOf": [{"properties": {"j": {}}}]},
            "k": {"type": "string", "not": {"type": "string", "properties": {"l": {}}}}}});
        let out = with_json_options(&schema, true);
        let p = &out["properties"];
        assert_eq!(out["additionalProperties"], false);
        assert_eq!(
            p["g"]["additionalProperties"], true,
            "a schema's own word is kept"
        );
        assert!(
            p["i"]["allOf"][0].get("additionalProperties").is_none(),
            "allOf parts intersect: closing one would refuse the others' members"
        );
        assert_eq!(
            p["enum"]["maxLength"], DEFAULT_MAX_STRING,
            "a property named like a keyword"
        );
        assert_eq!(
            p["k"]["not"], schema["properties"]["k"]["not"],
            "a negation is left as it is"
        );
        assert_eq!(p["a"]["maxLength"], DEFAULT_MAX_STRING);
        assert_eq!(p["b"]["maxLength"], 5);
        assert!(p["c"].get("maxLength").is_none() && p["f"].get("maxLength").is_none());
        assert_eq!(p["d"]["maxLength"], DEFAULT_MAX_STRING);
        assert_eq!(p["e"]["items"]["maxLength"], DEFAULT_MAX_STRING);
        assert_eq!(out["x-guidance"]["lenient"], false);
        let own =
            serde_json::json!({"type": "string", "x-guidance": {"whitespace_flexible": true}});
        assert_eq!(
            with_json_options(&own, true),
            own,
            "a schema's own options are kept"
        );
    }
}
