//! Suites: files of cases, each an input and the checkers its answer must pass.
//!
//! A suite is JSONL (one case a line) or TOML (`[[case]]` tables). A case's input is chat
//! `messages`, a completions `prompt`, or neither when its only checkers measure the model
//! itself (perplexity). `params` are extra request fields (`max_tokens`, `response_format`,
//! `tools`, ...) and `osprey` is passed through as the request's `osprey` object (prompt
//! reference with variables, RAG collection), merged over the target's.

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::EvalError;
use crate::check::Check;

/// A named list of cases.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Suite {
    /// The file's stem, unless the TOML names it.
    pub name: String,
    /// The cases, in file order.
    pub cases: Vec<Case>,
}

/// One input and what its answer must satisfy.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Case {
    /// Unique in the suite: comparisons pair cases by it.
    pub id: String,
    /// Chat input (`/v1/chat/completions`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub messages: Vec<Value>,
    /// Completions input (`/v1/completions`), instead of `messages`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    /// Extra request fields, over the target's.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub params: Map<String, Value>,
    /// The request's `osprey` object (prompt reference, RAG), merged over the target's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub osprey: Option<Value>,
    /// What the answer must satisfy; all must pass for the case to pass.
    pub checks: Vec<Check>,
    /// Free labels, for reading reports.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
}

impl Case {
    /// Whether answering the case needs a generation (some checker looks at an answer).
    pub fn generates(&self) -> bool {
        self.checks.iter().any(Check::reads_answer)
    }

    fn validate(&self) -> Result<(), String> {
        if self.id.trim().is_empty() {
            return Err("`id` is empty".into());
        }
        if self.checks.is_empty() {
            return Err("no `checks`".into());
        }
        match (self.messages.is_empty(), &self.prompt) {
            (false, Some(_)) => return Err("give `messages` or `prompt`, not both".into()),
            (true, None) if self.generates() => {
                return Err(
                    "its checkers read an answer, but it has no `messages` or `prompt`".into(),
                );
            }
            _ => {}
        }
        for m in &self.messages {
            if !m.is_object() || !m["role"].is_string() {
                return Err(format!("a message is not {{\"role\", \"content\"}}: {m}"));
            }
        }
        if self.osprey.as_ref().is_some_and(|o| !o.is_object()) {
            return Err("`osprey` must be an object".into());
        }
        self.checks.iter().try_for_each(Check::validate)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TomlSuite {
    name: Option<String>,
    case: Vec<Case>,
}

impl Suite {
    /// Reads a `.jsonl` or `.toml` suite; an error names the case (line) at fault.
    pub fn load(path: &Path) -> Result<Suite, EvalError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| EvalError::Io(format!("reading {}: {e}", path.display())))?;
        let stem = (path.file_stem()).map_or("suite".into(), |s| s.to_string_lossy().into_owned());
        let bad =
            |at: String, why: String| EvalError::Suite(format!("{}: {at}: {why}", path.display()));
        let suite = if path.extension().is_some_and(|e| e == "toml") {
            let t: TomlSuite =
                toml::from_str(&text).map_err(|e| bad("TOML".into(), e.to_string()))?;
            Suite {
                name: t.name.unwrap_or(stem),
                cases: t.case,
            }
        } else {
            let mut cases = Vec::new();
            for (n, line) in text.lines().enumerate() {
                if line.trim().is_empty() || line.trim_start().starts_with("//") {
                    continue;
                }
                let case = serde_json::from_str(line)
                    .map_err(|e| bad(format!("line {}", n + 1), e.to_string()))?;
                cases.push(case);
            }
            Suite { name: stem, cases }
        };
        suite.validate().map_err(|e| bad(e.0, e.1))?;
        Ok(suite)
    }

    /// Checks every case and that ids are unique: `Err((where, why))`.
    pub fn validate(&self) -> Result<(), (String, String)> {
        if self.cases.is_empty() {
            return Err(("suite".into(), "it has no cases".into()));
        }
        let mut seen = std::collections::HashSet::new();
        for case in &self.cases {
            let at = format!("case `{}`", case.id);
            case.validate().map_err(|why| (at.clone(), why))?;
            if !seen.insert(&case.id) {
                return Err((at, "the id is used twice".into()));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(name: &str, text: &str) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        (dir, path)
    }

    #[test]
    fn jsonl_and_toml_suites_load() {
        let (_d, p) = write(
            "qa.jsonl",
            r#"{"id": "a", "messages": [{"role": "user", "content": "2+2?"}], "checks": [{"type": "numeric", "value": 4}]}

{"id": "b", "prompt": "The sky is", "params": {"max_tokens": 4}, "checks": [{"type": "contains", "value": "blue"}]}
"#,
        );
        let s = Suite::load(&p).unwrap();
        assert_eq!(s.name, "qa");
        assert_eq!(s.cases.len(), 2);
        assert_eq!(s.cases[1].params["max_tokens"], 4);

        let (_d, p) = write(
            "t.toml",
            r#"name = "tools"
[[case]]
id = "weather"
messages = [{role = "user", content = "Weather in Oslo?"}]
checks = [{type = "tool_call", name = "get_weather", arguments = {city = "Oslo"}}]
"#,
        );
        let s = Suite::load(&p).unwrap();
        assert_eq!(
            (s.name.as_str(), s.cases[0].id.as_str()),
            ("tools", "weather")
        );
    }

    #[test]
    fn bad_suites_name_the_case_at_fault() {
        for (text, want) in [
            (
                r#"{"id": "a", "checks": [{"type": "contains", "value": "x"}]}"#,
                "no `messages` or `prompt`",
            ),
            (
                r#"{"id": "a", "prompt": "x", "checks": [{"type": "regex", "pattern": "("}]}"#,
                "regex",
            ),
            (r#"{"id": "a", "prompt": "x", "checks": []}"#, "no `checks`"),
            (
                r#"{"id": "a", "prompt": "x", "checks": [{"type": "nope"}]}"#,
                "line 1",
            ),
            (
                "{\"id\": \"a\", \"prompt\": \"x\", \"checks\": [{\"type\": \"exact\", \"value\": \"y\"}]}\n{\"id\": \"a\", \"prompt\": \"x\", \"checks\": [{\"type\": \"exact\", \"value\": \"y\"}]}",
                "used twice",
            ),
        ] {
            let (_d, p) = write("s.jsonl", text);
            let e = Suite::load(&p).unwrap_err().to_string();
            assert!(e.contains(want), "{e} lacks {want}");
        }
    }
}
