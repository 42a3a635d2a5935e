//! The safety policy in the request path ([`osprey_policy`]): each tenant's pipeline (its
//! `policy` names one of the config file's `[policies.NAME]`; without one, the standard policy)
//! screens a generation request's input before it is routed. User messages and prompts are read
//! as the caller's; `tool` messages as untrusted text, where an instruction is an indirect
//! injection. A text the policy blocks is refused (400 `content_policy_violation`, naming the
//! rules, never the text); one it redacts goes on with its PII replaced by placeholders; every
//! finding acted on is counted (`osprey_guard_verdicts_total`) and logged without the text.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Bytes;
use osprey_core::Error;
use osprey_policy::pipeline::{Pipeline, PolicyConfig};
use osprey_policy::redact::Redactor;
use osprey_policy::{Action, Source, Verdict};
use serde_json::Value;

/// The pipelines by policy name, and the standard one.
#[derive(Clone)]
pub struct Policies {
    named: BTreeMap<String, Arc<Pipeline>>,
    standard: Arc<Pipeline>,
}

impl Default for Policies {
    fn default() -> Self {
        Self::new(BTreeMap::new())
    }
}

impl Policies {
    /// Pipelines for `configs` by name; `standard` (if named) replaces the standard policy.
    pub fn new(configs: BTreeMap<String, PolicyConfig>) -> Self {
        let mut named: BTreeMap<String, Arc<Pipeline>> = configs
            .into_iter()
            .map(|(name, c)| (name, Arc::new(Pipeline::new(c))))
            .collect();
        let standard = named
            .remove(STANDARD)
            .unwrap_or_else(|| Arc::new(Pipeline::default()));
        Self { named, standard }
    }

    /// The pipeline of policy `name` (the standard one for `None` or an unknown name).
    pub fn get(&self, name: Option<&str>) -> &Arc<Pipeline> {
        name.and_then(|n| self.named.get(n))
            .unwrap_or(&self.standard)
    }

    /// Whether a policy `name` is defined (`standard` always is).
    pub fn has(&self, name: &str) -> bool {
        name == STANDARD || self.named.contains_key(name)
    }
}

/// The name of the standard policy.
pub const STANDARD: &str = "standard";

/// Screens the input of a generation request (`body`, already known to be JSON from the
/// edge's reading, or not: a body that is not a JSON object is left to the handler to refuse)
/// under `pipeline` for `tenant`. Returns the body to go on with: the same, or redacted.
pub fn screen_input(pipeline: &Pipeline, tenant: &str, body: &Bytes) -> Result<Bytes, Error> {
    let Ok(mut v) = serde_json::from_slice::<Value>(body) else {
        return Ok(body.clone());
    };
    let mut redactor = Redactor::default();
    let mut redacted = false;
    let mut screen = |text: &mut String, source: Source| -> Result<(), Error> {
        let verdict = pipeline.check(text, source);
        record(tenant, source, &verdict);
        match verdict.action {
            Action::Block => Err(blocked(&verdict)),
            Action::Redact => {
                *text = redactor.redact(text, None);
                redacted = true;
                Ok(())
            }
            Action::Allow | Action::Flag => Ok(()),
        }
    };
    if let Some(messages) = v.get_mut("messages").and_then(Value::as_array_mut) {
        for m in messages {
            let source = match m["role"].as_str() {
                Some("user") => Source::User,
                Some("tool" | "function") => Source::Untrusted,
                _ => continue,
            };
            for text in texts(&mut m["content"]) {
                screen(text, source)?;
            }
        }
    } else if let Some(prompt) = v.get_mut("prompt") {
        for text in texts(prompt) {
            screen(text, Source::User)?;
        }
    }
    Ok(match redacted {
        true => serde_json::to_vec(&v).expect("JSON serialises").into(),
        false => body.clone(),
    })
}

/// The strings of a message content or a prompt: a string, text parts, or a list of strings.
fn texts(content: &mut Value) -> Vec<&mut String> {
    match content {
        Value::String(s) => vec![s],
        Value::Array(items) => items
            .iter_mut()
            .filter_map(|item| match item {
                Value::String(s) => Some(s),
                Value::Object(part) => match part.get_mut("text") {
                    Some(Value::String(s)) => Some(s),
                    _ => None,
                },
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// Counts and logs the findings acted on (never the text).
pub fn record(tenant: &str, source: Source, verdict: &Verdict) {
    for (finding, action) in verdict.findings.iter().filter(|(_, a)| *a > Action::Allow) {
        metrics::counter!(
            osprey_core::metrics::GUARD_VERDICTS,
            "category" => finding.category.as_str(),
            "action" => action_name(*action),
            "source" => source_name(source),
        )
        .increment(1);
        tracing::warn!(
            tenant,
            source = source_name(source),
            category = finding.category.as_str(),
            rule = finding.rule,
            score = finding.score,
            action = action_name(*action),
            "guard verdict"
        );
    }
}

/// The refusal of a blocked input, naming the rules that blocked it.
fn blocked(verdict: &Verdict) -> Error {
    let rules: Vec<&str> = (verdict.findings.iter())
        .filter(|(_, a)| *a == Action::Block)
        .map(|(f, _)| f.rule)
        .collect();
    Error::invalid(
        "messages",
        format!(
            "The request was refused by the safety policy ({}).",
            rules.join(", ")
        ),
    )
    .with_code("content_policy_violation")
}

/// An action's name.
pub fn action_name(action: Action) -> &'static str {
    match action {
        Action::Allow => "allow",
        Action::Flag => "flag",
        Action::Redact => "redact",
        Action::Block => "block",
    }
}

fn source_name(source: Source) -> &'static str {
    match source {
        Source::User => "user",
        Source::Untrusted => "untrusted",
        Source::Model => "model",
    }
}
