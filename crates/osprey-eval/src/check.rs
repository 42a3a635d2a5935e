//! Checkers: what an answer must satisfy. Each is pure over an [`Answer`]; the two that need a
//! model's help (perplexity, judge) read what the runner measured into the answer first.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One checker, as written in a suite (`{"type": "contains", "value": "Paris"}`).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Check {
    /// The answer, trimmed, equals `value` trimmed.
    Exact {
        /// The expected text.
        value: String,
    },
    /// The answer contains `value`.
    Contains {
        /// The expected text.
        value: String,
        /// Compare lower-cased.
        #[serde(default)]
        ignore_case: bool,
    },
    /// The answer matches `pattern` (Rust regex syntax, unanchored).
    Regex {
        /// The pattern.
        pattern: String,
    },
    /// The answer parses as JSON and is valid under `schema`.
    JsonSchema {
        /// A JSON Schema.
        schema: Value,
    },
    /// The last number in the answer is within `tolerance` of `value`.
    Numeric {
        /// The expected number.
        value: f64,
        /// Largest accepted absolute difference.
        #[serde(default)]
        tolerance: f64,
    },
    /// The answer calls tool `name`, with at least these `arguments` (a subset match).
    ToolCall {
        /// The function's name.
        name: String,
        /// Fields the call's arguments must have, with these values.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        arguments: Option<Value>,
    },
    /// The answer's citations (`osprey.citations`) include document `document`.
    RetrievalHit {
        /// The document id.
        document: String,
    },
    /// The target model's perplexity on `text` is at most `max`.
    Perplexity {
        /// The text scored.
        text: String,
        /// Highest accepted perplexity.
        max: f64,
    },
    /// The answer means what `value` says: cosine similarity of their embeddings (the
    /// target server's `/v1/embeddings`) at least `min`.
    Similar {
        /// The reference text.
        value: String,
        /// Lowest accepted similarity, in [-1, 1].
        min: f64,
    },
    /// The request is refused (a guard's block, a validation error), with `code` if given.
    Error {
        /// The error envelope's `code`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        code: Option<String>,
    },
    /// A judge model grades the answer against `rubric` (PASS or FAIL).
    Judge {
        /// What a passing answer does.
        rubric: String,
    },
}

/// What a target answered, and what was measured for the checkers that need a model.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Answer {
    /// The generated text (empty for an error or a measurement-only case).
    pub text: String,
    /// Tool calls: `(name, arguments)`, arguments parsed from their JSON string.
    pub tool_calls: Vec<(String, Value)>,
    /// Document ids the answer's citations point to.
    pub citations: Vec<String>,
    /// The request's failure: HTTP status, the envelope's code and message.
    pub error: Option<Failure>,
    /// Perplexity of each perplexity checker's text.
    pub perplexity: HashMap<String, f64>,
    /// Similarity of the answer to each similar checker's reference text.
    pub similarity: HashMap<String, f64>,
    /// The judge's verdict and reason, by rubric.
    pub verdicts: HashMap<String, (bool, String)>,
}

/// A refused or failed request.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Failure {
    /// HTTP status (0: no answer at all).
    pub status: u16,
    /// The OpenAI envelope's `code`, if any.
    pub code: Option<String>,
    /// Its message, or the transport error.
    pub message: String,
}

/// One checker's verdict on one answer.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct CheckOutcome {
    /// The checker's type (`contains`, `json_schema`, ...).
    pub kind: String,
    /// Whether it passed.
    pub pass: bool,
    /// Why, when it did not (or what was measured).
    pub detail: String,
}

impl Check {
    /// The checker's type, as written in suites.
    pub fn kind(&self) -> &'static str {
        match self {
            Check::Exact { .. } => "exact",
            Check::Contains { .. } => "contains",
            Check::Regex { .. } => "regex",
            Check::JsonSchema { .. } => "json_schema",
            Check::Numeric { .. } => "numeric",
            Check::ToolCall { .. } => "tool_call",
            Check::RetrievalHit { .. } => "retrieval_hit",
            Check::Perplexity { .. } => "perplexity",
            Check::Similar { .. } => "similar",
            Check::Error { .. } => "error",
            Check::Judge { .. } => "judge",
        }
    }

    /// Whether it looks at a generated answer (perplexity alone does not).
    pub fn reads_answer(&self) -> bool {
        !matches!(self, Check::Perplexity { .. })
    }

    /// Errors a suite author should hear about at load time.
    pub fn validate(&self) -> Result<(), String> {
        match self {
            Check::Regex { pattern } => (regex::Regex::new(pattern).map(drop))
                .map_err(|e| format!("bad regex `{pattern}`: {e}")),
            Check::JsonSchema { schema } => (jsonschema::validator_for(schema).map(drop))
                .map_err(|e| format!("bad JSON schema: {e}")),
            Check::Numeric { tolerance, .. } if *tolerance < 0.0 => {
                Err("`tolerance` is negative".into())
            }
            Check::Perplexity { text, max } if text.is_empty() || *max <= 0.0 => {
                Err("perplexity needs a `text` and a positive `max`".into())
            }
            _ => Ok(()),
        }
    }

    /// This checker's verdict on `answer`.
    pub fn evaluate(&self, answer: &Answer) -> CheckOutcome {
        let (pass, detail) = self.judge(answer);
        CheckOutcome {
            kind: self.kind().into(),
            pass,
            detail,
        }
    }

    fn judge(&self, a: &Answer) -> (bool, String) {
        if let Check::Error { code } = self {
            return match (&a.error, code) {
                (None, _) => (false, "the request was answered".into()),
                (Some(f), Some(want)) if f.code.as_ref() != Some(want) => {
                    (false, format!("refused with code {:?}, not {want}", f.code))
                }
                (Some(f), _) => (true, format!("HTTP {}", f.status)),
            };
        }
        if let Some(f) = &a.error
            && self.reads_answer()
        {
            return (
                false,
                format!("request failed: HTTP {} {}", f.status, f.message),
            );
        }
        let text = a.text.trim();
        match self {
            Check::Exact { value } => verdict(text == value.trim(), || format!("got {text:?}")),
            Check::Contains { value, ignore_case } => {
                let found = match ignore_case {
                    true => text.to_lowercase().contains(&value.to_lowercase()),
                    false => text.contains(value.as_str()),
                };
                verdict(found, || format!("{value:?} not in {:?}", clip(text)))
            }
            Check::Regex { pattern } => match regex::Regex::new(pattern) {
                Ok(re) => verdict(re.is_match(text), || {
                    format!("no match in {:?}", clip(text))
                }),
                Err(e) => (false, e.to_string()),
            },
            Check::JsonSchema { schema } => json_schema(schema, text),
            Check::Numeric { value, tolerance } => match last_number(text) {
                Some(got) => verdict((got - value).abs() <= *tolerance, || format!("got {got}")),
                None => (false, format!("no number in {:?}", clip(text))),
            },
            Check::ToolCall { name, arguments } => {
                let called = a.tool_calls.iter().find(|(n, _)| n == name);
                match (called, arguments) {
                    (None, _) => {
                        let names: Vec<&str> =
                            a.tool_calls.iter().map(|(n, _)| n.as_str()).collect();
                        (false, format!("no call to {name} (calls: {names:?})"))
                    }
                    (Some((_, args)), Some(want)) => {
                        verdict(subset(want, args), || format!("arguments {args}"))
                    }
                    (Some(_), None) => (true, String::new()),
                }
            }
            Check::RetrievalHit { document } => verdict(a.citations.contains(document), || {
                format!("cited {:?}", a.citations)
            }),
            Check::Perplexity { text, max } => match a.perplexity.get(text) {
                Some(ppl) => (ppl <= max, format!("perplexity {ppl:.3}")),
                None => (false, "perplexity not measured".into()),
            },
            Check::Similar { value, min } => match a.similarity.get(value) {
                Some(sim) => (sim >= min, format!("similarity {sim:.3}")),
                None => (false, "similarity not measured".into()),
            },
            Check::Judge { rubric } => match a.verdicts.get(rubric) {
                Some((pass, why)) => (*pass, why.clone()),
                None => (false, "no verdict".into()),
            },
            Check::Error { .. } => unreachable!("handled above"),
        }
    }
}

fn verdict(pass: bool, why: impl FnOnce() -> String) -> (bool, String) {
    (pass, if pass { String::new() } else { why() })
}

fn clip(text: &str) -> String {
    text.chars().take(120).collect()
}

fn json_schema(schema: &Value, text: &str) -> (bool, String) {
    let text = (text
        .strip_prefix("```json")
        .or_else(|| text.strip_prefix("```")))
    .and_then(|t| t.strip_suffix("```"))
    .unwrap_or(text);
    let value: Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => return (false, format!("not JSON ({e}): {:?}", clip(text))),
    };
    match jsonschema::validator_for(schema) {
        Ok(v) => match v.iter_errors(&value).next() {
            None => (true, String::new()),
            Some(e) => (false, format!("{e} at {}", e.instance_path())),
        },
        Err(e) => (false, format!("bad schema: {e}")),
    }
}

/// The last number written in `text` (`-3`, `1,234.5`, `84.`), if any.
fn last_number(text: &str) -> Option<f64> {
    static NUMBER: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
        regex::Regex::new(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?|-?\d+(?:\.\d+)?").expect("a regex")
    });
    let m = NUMBER.find_iter(text).last()?;
    m.as_str().replace(',', "").parse().ok()
}

/// Whether every field of `want` is in `got` with an equal value (recursively for objects).
fn subset(want: &Value, got: &Value) -> bool {
    match (want, got) {
        (Value::Object(w), Value::Object(g)) => w
            .iter()
            .all(|(k, v)| g.get(k).is_some_and(|gv| subset(v, gv))),
        (Value::String(w), Value::String(g)) => w.trim().eq_ignore_ascii_case(g.trim()),
        (Value::Number(w), Value::Number(g)) => w.as_f64() == g.as_f64(),
        _ => want == got,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn check(v: Value) -> Check {
        let c: Check = serde_json::from_value(v).unwrap();
        c.validate().unwrap();
        c
    }

    fn says(text: &str) -> Answer {
        Answer {
            text: text.into(),
            ..Answer::default()
        }
    }

    fn passes(c: &Check, a: &Answer) -> bool {
        c.evaluate(a).pass
    }

    #[test]
    fn text_checkers() {
        let exact = check(json!({"type": "exact", "value": "Paris."}));
        assert!(passes(&exact, &says(" Paris.\n")));
        assert!(!passes(&exact, &says("Paris is")));
        let contains = check(json!({"type": "contains", "value": "paris", "ignore_case": true}));
        assert!(passes(&contains, &says("It is Paris.")));
        assert!(!passes(
            &check(json!({"type": "contains", "value": "paris"})),
            &says("Paris")
        ));
        let re = check(json!({"type": "regex", "pattern": r"^\d{4}-\d{2}-\d{2}$"}));
        assert!(passes(&re, &says("2026-12-03")));
        assert!(!passes(&re, &says("Dec 3")));
    }

    #[test]
    fn numeric_reads_the_last_number() {
        let c = check(json!({"type": "numeric", "value": 84, "tolerance": 0.5}));
        assert!(passes(&c, &says("12 times 7 is 84.")));
        assert!(!passes(&c, &says("12 times 7 is 96")));
        assert!(!passes(&c, &says("I cannot say")));
        assert_eq!(last_number("about 1,234.5 people, or -3"), Some(-3.0));
        assert_eq!(last_number("1,234.5 people"), Some(1234.5));
    }

    #[test]
    fn json_schema_checks_parse_and_validity() {
        let c = check(json!({"type": "json_schema", "schema": {
            "type": "object", "required": ["age"], "properties": {"age": {"type": "integer"}}}}));
        assert!(passes(&c, &says(r#"{"age": 31}"#)));
        assert!(passes(&c, &says("```json\n{\"age\": 31}\n```")));
        let e = c.evaluate(&says(r#"{"age": "old"}"#));
        assert!(!e.pass && e.detail.contains("age"), "{e:?}");
        assert!(!passes(&c, &says("age: 31")));
    }

    #[test]
    fn tool_calls_match_by_name_and_argument_subset() {
        let c = check(
            json!({"type": "tool_call", "name": "get_weather", "arguments": {"city": "oslo"}}),
        );
        let mut a = says("");
        a.tool_calls = vec![("get_weather".into(), json!({"city": "Oslo", "unit": "c"}))];
        assert!(passes(&c, &a));
        a.tool_calls = vec![("get_weather".into(), json!({"city": "Bergen"}))];
        assert!(!passes(&c, &a));
        a.tool_calls = vec![("get_time".into(), json!({"city": "Oslo"}))];
        assert!(!passes(&c, &a));
    }

    #[test]
    fn measured_checkers_read_the_answer_measurements() {
        let hit = check(json!({"type": "retrieval_hit", "document": "ls.1"}));
        let mut a = says("See [1].");
        a.citations = vec!["cp.1".into(), "ls.1".into()];
        assert!(passes(&hit, &a));
        a.citations.pop();
        assert!(!passes(&hit, &a));

        let ppl = check(json!({"type": "perplexity", "text": "abc", "max": 30}));
        assert!(!passes(&ppl, &a), "unmeasured fails");
        a.perplexity.insert("abc".into(), 29.1);
        assert!(passes(&ppl, &a));
        a.perplexity.insert("abc".into(), 31.0);
        assert!(!passes(&ppl, &a));

        let similar = check(json!({"type": "similar", "value": "Paris.", "min": 0.8}));
        assert!(!passes(&similar, &a), "unmeasured fails");
        a.similarity.insert("Paris.".into(), 0.93);
        assert!(passes(&similar, &a));

        let judge = check(json!({"type": "judge", "rubric": "polite"}));
        a.verdicts.insert("polite".into(), (true, "PASS".into()));
        assert!(passes(&judge, &a));
    }

    #[test]
    fn errors_fail_answer_checkers_and_pass_error_checkers() {
        let mut a = says("");
        a.error = Some(Failure {
            status: 400,
            code: Some("content_blocked".into()),
            message: "no".into(),
        });
        assert!(!passes(
            &check(json!({"type": "contains", "value": ""})),
            &a
        ));
        assert!(passes(&check(json!({"type": "error"})), &a));
        assert!(passes(
            &check(json!({"type": "error", "code": "content_blocked"})),
            &a
        ));
        assert!(!passes(
            &check(json!({"type": "error", "code": "rate_limited"})),
            &a
        ));
        assert!(!passes(&check(json!({"type": "error"})), &says("Sure!")));
    }
}
