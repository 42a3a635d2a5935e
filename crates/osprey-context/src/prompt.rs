//! A versioned prompt: its definition, rendered with a request's variables; the version a
//! label's split gives a caller; and the difference between two versions.

use std::collections::BTreeSet;

use minijinja::{Environment, UndefinedBehavior};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

/// What can go wrong with a prompt.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PromptError {
    /// The definition does not parse or is not valid.
    #[error("invalid prompt: {0}")]
    Invalid(String),
    /// Rendering failed (a variable missing, a template error).
    #[error("{0}")]
    Render(String),
}

/// Roles a prompt's messages may have.
const ROLES: [&str; 4] = ["system", "developer", "user", "assistant"];

/// Request settings a prompt may give (requests that set one themselves win).
pub const SETTINGS: [&str; 10] = [
    "model",
    "temperature",
    "top_p",
    "max_tokens",
    "max_completion_tokens",
    "stop",
    "presence_penalty",
    "frequency_penalty",
    "seed",
    "response_format",
];

/// A message of a prompt: its role and a template of its text.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TemplateMessage {
    /// `system`, `developer`, `user` or `assistant`.
    pub role: String,
    /// The text, a minijinja template: `{{ name }}` is the request's variable `name`.
    pub content: String,
}

/// A rendered message.
#[derive(Clone, Debug, PartialEq)]
pub struct Message {
    /// Its role.
    pub role: String,
    /// Its text.
    pub content: String,
}

/// One version of a prompt, as pushed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PromptDef {
    /// The messages put before the request's own.
    pub messages: Vec<TemplateMessage>,
    /// Default request settings ([`SETTINGS`]).
    #[serde(default)]
    pub settings: Map<String, Value>,
}

impl PromptDef {
    /// Parses a prompt file: JSON (starting with `{`) or TOML, then checks it.
    pub fn parse(text: &str) -> Result<Self, PromptError> {
        let def: Self = match text.trim_start().starts_with('{') {
            true => serde_json::from_str(text).map_err(|e| PromptError::Invalid(e.to_string()))?,
            false => toml::from_str(text).map_err(|e| PromptError::Invalid(e.to_string()))?,
        };
        def.validate()?;
        Ok(def)
    }

    /// Checks roles, settings and that every template compiles.
    pub fn validate(&self) -> Result<(), PromptError> {
        if self.messages.is_empty() {
            return Err(PromptError::Invalid(
                "a prompt needs at least one message".into(),
            ));
        }
        for (i, m) in self.messages.iter().enumerate() {
            if !ROLES.contains(&m.role.as_str()) {
                return Err(PromptError::Invalid(format!(
                    "messages[{i}].role must be one of {ROLES:?}, got `{}`",
                    m.role
                )));
            }
            environment()
                .template_from_str(&m.content)
                .map_err(|e| PromptError::Invalid(format!("messages[{i}].content: {e}")))?;
        }
        if let Some(k) = self
            .settings
            .keys()
            .find(|k| !SETTINGS.contains(&k.as_str()))
        {
            return Err(PromptError::Invalid(format!(
                "settings.{k} is not a setting a prompt can give (one of {SETTINGS:?})"
            )));
        }
        Ok(())
    }

    /// The variables its templates use.
    pub fn variables(&self) -> BTreeSet<String> {
        let env = environment();
        (self.messages.iter())
            .filter_map(|m| env.template_from_str(&m.content).ok())
            .flat_map(|t| t.undeclared_variables(false))
            .collect()
    }

    /// The messages with `variables` filled in; every variable a template uses must be given.
    pub fn render(&self, variables: &Map<String, Value>) -> Result<Vec<Message>, PromptError> {
        let missing: Vec<String> = (self.variables().into_iter())
            .filter(|v| !variables.contains_key(v))
            .collect();
        if !missing.is_empty() {
            return Err(PromptError::Render(format!(
                "the prompt needs the variables {missing:?}"
            )));
        }
        let env = environment();
        self.messages
            .iter()
            .map(|m| {
                let t = (env.template_from_str(&m.content))
                    .map_err(|e| PromptError::Render(e.to_string()))?;
                Ok(Message {
                    role: m.role.clone(),
                    content: t
                        .render(minijinja::value::Serde(variables))
                        .map_err(|e| PromptError::Render(e.to_string()))?,
                })
            })
            .collect()
    }

    /// As stored: JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("JSON serialises")
    }

    /// As people read it: TOML.
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).unwrap_or_else(|_| self.to_json())
    }
}

/// Templates render strictly: an unknown variable is an error, never an empty string.
fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_undefined_behavior(UndefinedBehavior::Strict);
    env
}

/// The version of `split` (`(version, weight)` pairs) that `sticky` (a user, a key) gets: the
/// same one every time, and across callers in proportion to the weights.
pub fn pick(split: &[(i64, u32)], sticky: &str) -> Option<i64> {
    let total: u64 = split.iter().map(|(_, w)| u64::from(*w)).sum();
    if total == 0 {
        return split.first().map(|(v, _)| *v);
    }
    let digest = Sha256::digest(sticky.as_bytes());
    let mut at = u64::from_le_bytes(digest[..8].try_into().expect("8 bytes")) % total;
    for (version, weight) in split {
        if at < u64::from(*weight) {
            return Some(*version);
        }
        at -= u64::from(*weight);
    }
    None
}

/// A label's assignment written as people write it: `3` (that version), or `3:90,4:10`
/// (versions and their weights).
pub fn parse_split(text: &str) -> Result<Vec<(i64, u32)>, PromptError> {
    let bad = || {
        PromptError::Invalid(format!(
            "`{text}` is not a version (3) or a split (3:90,4:10)"
        ))
    };
    let split: Vec<(i64, u32)> = text
        .split(',')
        .map(|part| {
            let (version, weight) = part.trim().split_once(':').unwrap_or((part.trim(), "1"));
            Ok((
                version.trim().parse().map_err(|_| bad())?,
                weight.trim().parse().map_err(|_| bad())?,
            ))
        })
        .collect::<Result<_, PromptError>>()?;
    match split.iter().all(|(v, _)| *v >= 1) && split.iter().any(|(_, w)| *w > 0) {
        true => Ok(split),
        false => Err(bad()),
    }
}

/// A unified diff of two versions, as TOML, with `from` and `to` naming them.
pub fn diff(a: &PromptDef, b: &PromptDef, from: &str, to: &str) -> String {
    similar::TextDiff::from_lines(&a.to_toml(), &b.to_toml())
        .unified_diff()
        .header(from, to)
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn def(system: &str) -> PromptDef {
        PromptDef {
            messages: vec![TemplateMessage {
                role: "system".into(),
                content: system.into(),
            }],
            settings: Map::new(),
        }
    }

    #[test]
    fn templates_render_strictly() {
        let d = def("Help {{ user_name }} with {{ product | upper }}.");
        assert_eq!(
            d.variables(),
            BTreeSet::from(["product".to_owned(), "user_name".to_owned()])
        );
        let vars = json!({"user_name": "Ada", "product": "osprey"});
        let out = d.render(vars.as_object().unwrap()).unwrap();
        assert_eq!(out[0].content, "Help Ada with OSPREY.");
        let err = d.render(json!({"user_name": "Ada"}).as_object().unwrap());
        assert!(matches!(err, Err(PromptError::Render(m)) if m.contains("product")));
    }

    #[test]
    fn bad_definitions_are_refused() {
        assert!(PromptDef::parse("[[messages]]\nrole = \"wizard\"\ncontent = \"x\"").is_err());
        assert!(PromptDef::parse("[[messages]]\nrole = \"system\"\ncontent = \"{{ x\"").is_err());
        assert!(
            PromptDef::parse(
                "[settings]\nlogit_bias = 1\n[[messages]]\nrole = \"system\"\ncontent = \"x\""
            )
            .is_err()
        );
        assert!(PromptDef::parse(r#"{"messages": []}"#).is_err());
        let ok = PromptDef::parse(
            r#"{"messages": [{"role": "system", "content": "x"}], "settings": {"temperature": 0}}"#,
        );
        assert_eq!(ok.unwrap().settings["temperature"], 0);
    }

    #[test]
    fn a_split_is_sticky_and_follows_its_weights() {
        let split = [(1, 90), (2, 10)];
        assert_eq!(pick(&split, "alice"), pick(&split, "alice"));
        let twos = (0..10_000)
            .filter(|i| pick(&split, &format!("user-{i}")) == Some(2))
            .count();
        assert!((800..1200).contains(&twos), "{twos} of 10000 got version 2");
        assert_eq!(pick(&[(7, 1)], "anyone"), Some(7));
    }

    #[test]
    fn splits_parse_as_written() {
        assert_eq!(parse_split("3"), Ok(vec![(3, 1)]));
        assert_eq!(parse_split("3:90, 4:10"), Ok(vec![(3, 90), (4, 10)]));
        for bad in ["", "x", "0", "3:0", "3:-1", "3:90,x"] {
            assert!(parse_split(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_diff_shows_what_changed() {
        let d = diff(&def("Be brief."), &def("Be thorough."), "v1", "v2");
        assert!(d.contains("-content = \"Be brief.\""), "{d}");
        assert!(d.contains("+content = \"Be thorough.\""), "{d}");
    }
}
