//! Replay: sampled production requests from a server's request log (their text redacted, kept
//! at the tenant's sampling rate) sent again to a candidate route, and compared with what
//! production answered.
//!
//! Each logged chat request becomes a case whose checkers are the original answer (`exact`
//! and `similar`), so the replay's run report says how often the candidate reproduces the
//! answer and how close it comes; the originals become a baseline report (their latency,
//! tokens, cost), so [`crate::Comparison`] gives the latency and cost deltas.

use rand::SeedableRng;
use rand::seq::SliceRandom;
use serde_json::{Value, json};

use crate::EvalError;
use crate::check::{Check, CheckOutcome};
use crate::run::{CaseResult, RunReport, run_id};
use crate::suite::{Case, Suite};
use crate::target::{Prices, Target};

/// Where the log is and what to take from it.
#[derive(Clone, Debug)]
pub struct ReplaySource {
    /// The server whose request log is read (base URL, without `/v1`).
    pub url: String,
    /// Its admin key.
    pub admin_key: Option<String>,
    /// Only requests logged at or after this Unix second.
    pub since: Option<i64>,
    /// Only this tenant's requests.
    pub tenant: Option<String>,
    /// How many requests to replay (a seeded random sample of the eligible ones).
    pub sample: usize,
    /// The sample's seed.
    pub seed: u64,
    /// The similarity `similar` requires.
    pub min_similarity: f64,
}

/// A logged chat request that kept its text.
#[derive(Clone, Debug)]
pub struct Logged {
    /// The request id.
    pub id: String,
    /// The model that answered.
    pub model: String,
    /// The messages, as logged (redacted).
    pub messages: Vec<Value>,
    /// The answer, as logged (redacted).
    pub response: String,
    /// Its total time, ms.
    pub total_ms: f64,
    /// Its usage.
    pub prompt_tokens: u64,
    /// Its usage.
    pub completion_tokens: u64,
}

/// Reads the log newest first, page by page, keeping successful chat requests with text, and
/// samples `source.sample` of them.
pub async fn fetch(source: &ReplaySource) -> Result<Vec<Logged>, EvalError> {
    let client = reqwest::Client::new();
    let mut eligible = Vec::new();
    let mut before: Option<i64> = None;
    // Enough to sample from without reading a month of traffic.
    let cap = (source.sample * 20).max(1000);
    let mut read = 0;
    while read < cap {
        let mut query = vec![("limit", "500".to_string()), ("status", "200".to_string())];
        query.extend(source.since.map(|s| ("since", s.to_string())));
        query.extend(source.tenant.clone().map(|t| ("tenant", t)));
        query.extend(before.map(|b| ("before", b.to_string())));
        let url =
            reqwest::Url::parse_with_params(&format!("{}/admin/requests", source.url), &query)
                .map_err(|e| EvalError::Http(format!("{}: {e}", source.url)))?;
        let mut req = client.get(url);
        if let Some(key) = &source.admin_key {
            req = req.bearer_auth(key);
        }
        let resp = req
            .send()
            .await
            .map_err(|e| EvalError::Http(format!("reading the request log: {e}")))?;
        let status = resp.status();
        let page: Value = resp
            .json()
            .await
            .map_err(|e| EvalError::Http(format!("reading the request log: {e}")))?;
        if !status.is_success() {
            return Err(EvalError::Http(format!(
                "reading the request log: HTTP {status}: {}",
                page["error"]["message"]
            )));
        }
        let rows = page["data"].as_array().cloned().unwrap_or_default();
        read += rows.len();
        eligible.extend(rows.iter().filter_map(logged));
        match page["next"].as_i64() {
            Some(next) if !rows.is_empty() => before = Some(next),
            _ => break,
        }
    }
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(source.seed);
    eligible.shuffle(&mut rng);
    eligible.truncate(source.sample);
    Ok(eligible)
}

fn logged(row: &Value) -> Option<Logged> {
    if row["route"].as_str()?.trim_start_matches("/v1/") != "chat/completions" {
        return None;
    }
    let prompt = row["text"]["prompt"].as_str()?;
    let response = row["text"]["response"].as_str()?;
    Some(Logged {
        id: row["id"].as_str()?.to_owned(),
        model: row["model"].as_str().unwrap_or_default().to_owned(),
        messages: messages_from_log(prompt),
        response: response.to_owned(),
        total_ms: (row["timings"]["total_ms"].as_f64())
            .or(row["latency_ms"].as_f64())
            .unwrap_or(0.0),
        prompt_tokens: row["tokens"]["prompt"].as_u64().unwrap_or(0),
        completion_tokens: row["tokens"]["completion"].as_u64().unwrap_or(0),
    })
}

/// The messages of a logged prompt text: the log keeps them as `role: content` lines, a
/// message's continuation lines following it.
pub fn messages_from_log(text: &str) -> Vec<Value> {
    const ROLES: [&str; 5] = ["system", "user", "assistant", "tool", "developer"];
    let mut messages: Vec<(String, String)> = Vec::new();
    for line in text.split('\n') {
        let starts = ROLES.iter().find_map(|r| {
            line.strip_prefix(r)?
                .strip_prefix(": ")
                .map(|rest| (*r, rest))
        });
        if let Some((role, rest)) = starts {
            messages.push((role.into(), rest.into()));
        } else if let Some((_, content)) = messages.last_mut() {
            content.push('\n');
            content.push_str(line);
        } else {
            messages.push(("user".into(), line.into()));
        }
    }
    messages
        .into_iter()
        .map(|(role, content)| json!({"role": role, "content": content}))
        .collect()
}

/// The suite a replay runs: one case per logged request, checked against its original answer.
pub fn suite(logged: &[Logged], min_similarity: f64) -> Suite {
    let cases = (logged.iter())
        .map(|l| Case {
            id: l.id.clone(),
            messages: l.messages.clone(),
            prompt: None,
            params: serde_json::Map::from_iter([(
                "max_tokens".to_string(),
                json!(l.completion_tokens.max(16)),
            )]),
            osprey: None,
            checks: vec![
                Check::Exact {
                    value: l.response.clone(),
                },
                Check::Similar {
                    value: l.response.clone(),
                    min: min_similarity,
                },
            ],
            tags: vec![l.model.clone()],
        })
        .collect();
    Suite {
        name: "replay".into(),
        cases,
    }
}

/// The originals as a run report, the baseline a replay is compared with; their cost at the
/// candidate's `prices`, so the cost delta is the change in tokens.
pub fn originals(logged: &[Logged], source: &ReplaySource, prices: Prices) -> RunReport {
    let cases = (logged.iter())
        .map(|l| CaseResult {
            id: l.id.clone(),
            tags: vec![l.model.clone()],
            pass: true,
            checks: vec![CheckOutcome {
                kind: "logged".into(),
                pass: true,
                detail: String::new(),
            }],
            output: l.response.clone(),
            error: None,
            prompt_tokens: l.prompt_tokens,
            completion_tokens: l.completion_tokens,
            latency_ms: l.total_ms,
            cost: prices.of(l.prompt_tokens, l.completion_tokens),
        })
        .collect();
    RunReport {
        id: run_id("log", "production"),
        kind: "log".into(),
        suite: "replay".into(),
        target: Target::new(&source.url, "as logged"),
        started_at: 0,
        duration_s: 0.0,
        cases,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logged_prompts_become_messages_again() {
        let m = messages_from_log(
            "system: Be brief.\nuser: Two lines:\nsecond line\nassistant: ok\nuser: and?",
        );
        let roles: Vec<&str> = m.iter().map(|m| m["role"].as_str().unwrap()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "user"]);
        assert_eq!(m[1]["content"], "Two lines:\nsecond line");
        assert_eq!(
            messages_from_log("no role")[0],
            json!({"role": "user", "content": "no role"})
        );
    }

    #[test]
    fn rows_without_text_or_not_chat_are_skipped() {
        let row = json!({"id": "r1", "route": "chat/completions", "model": "m",
            "text": {"prompt": "user: hi", "response": "Hello"},
            "timings": {"total_ms": 120}, "tokens": {"prompt": 9, "completion": 2}});
        let l = logged(&row).unwrap();
        assert_eq!(
            (l.total_ms, l.completion_tokens, l.response.as_str()),
            (120.0, 2, "Hello")
        );
        let mut no_text = row.clone();
        no_text["text"]["prompt"] = Value::Null;
        assert!(logged(&no_text).is_none());
        let mut embeddings = row.clone();
        embeddings["route"] = json!("embeddings");
        assert!(logged(&embeddings).is_none());
        let s = suite(&[l], 0.8);
        assert_eq!(s.cases[0].checks.len(), 2);
        assert!(s.validate().is_ok());
    }
}
