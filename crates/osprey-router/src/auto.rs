//! `"model": "auto"`: the router picks the tier. The request's last user message (or prompt)
//! goes through the task classifier; [`Tiers::choose`] turns the task and the classifier's
//! confidence (and `reasoning_effort`, `"osprey": {"quality": "premium"}`) into a tier among
//! those the tenant may use; the body then names that tier's model and goes on as if the client
//! had named it. The response says so in `x-osprey-tier` and `x-osprey-route-reason`.
//!
//! With an answer floor (`--auto-min-logprob`), a non-streamed request below the top tier is
//! asked with logprobs; an answer whose mean token logprob is below the floor is dropped and
//! the request asked again of the next tier up ([`AnswerCheck`]). The logprobs are removed
//! again unless the client asked for them.

use axum::http::{HeaderMap, HeaderValue};
use osprey_core::Error;
use osprey_core::api::JsonBody;
use osprey_core::backend::{GenEvent, Logprobs};
use serde_json::Value;

use crate::classifier::TaskClassifier;
use crate::tiers::{Asks, Tiers};
use crate::upstream::ROUTE_REASON;

/// The model name that asks the router to choose.
pub const AUTO: &str = "auto";
/// The header naming the tier that served an `auto` request.
pub const TIER: &str = "x-osprey-tier";

/// Where an `auto` request goes.
pub struct AutoRoute {
    /// The tier's model.
    pub model: String,
    /// The tier's name.
    pub tier: String,
    /// Why: the task, the confidence, any escalation.
    pub reason: String,
    /// How to check its answer, if answers are checked.
    pub check: Option<AnswerCheck>,
}

/// The check of an `auto` answer before it is given: below `floor`, ask the tier above.
pub struct AnswerCheck {
    /// The mean token logprob an answer must reach.
    pub floor: f64,
    /// The model of the tier above.
    pub model: String,
    /// The name of the tier above.
    pub tier: String,
}

/// Chooses the tier of an `auto` request among those whose model is in `models` (all, for a
/// tenant without a list) and that are not `off` (by the tenant's flags).
/// Under degradation `level` 3 and above nothing escalates; at 2 and above the request goes
/// one tier smaller than it would.
pub fn route(
    tiers: Option<&Tiers>,
    (models, off): (Option<&[String]>, impl Fn(&str) -> bool),
    body: &JsonBody,
    level: u8,
) -> Result<AutoRoute, Error> {
    let Some(tiers) = tiers else {
        return Err(Error::model_not_found(AUTO));
    };
    let v = body.value();
    let (task, confidence) = TaskClassifier::shipped().classify(&request_text(v));
    let mut asks = Asks {
        reasoning: matches!(v["reasoning_effort"].as_str(), Some("medium" | "high")),
        premium: v["osprey"]["quality"].as_str() == Some("premium"),
    };
    let mut sure = confidence;
    if level >= 3 {
        (asks, sure) = (Asks::default(), 1.0);
    }
    // The tenant's models, less those of tiers its flags turn off.
    let off: Vec<&str> = (tiers.tiers().iter())
        .filter(|t| off(&t.name))
        .map(|t| t.model.as_str())
        .collect();
    let allowed = |m: &str| models.is_none_or(|ms| ms.iter().any(|a| a == m)) && !off.contains(&m);
    let choice = tiers.choose(task, sure, asks, allowed).ok_or_else(|| {
        Error::invalid(
            "model",
            "No tier of `auto` serves a model this tenant may use.",
        )
        .with_code("model_not_allowed")
    })?;
    let (mut tier, mut reason) = (choice.tier, choice.reason);
    if level >= 3 {
        reason = format!(
            "auto: {} {confidence:.2}, no escalation (degraded)",
            task.as_str()
        );
    }
    let at = tiers.tiers().iter().position(|t| t == tier).unwrap_or(0);
    if level >= 2 && at > 0 && allowed(&tiers.tiers()[at - 1].model) {
        tier = &tiers.tiers()[at - 1];
        reason.push_str(", one tier smaller (degraded)");
    }
    metrics::counter!(osprey_core::metrics::AUTO_ROUTED, "tier" => tier.name.clone(), "task" => task.as_str())
        .increment(1);
    let checked = level < 3 && !body.streamed();
    let check = (tiers.answer_floor().filter(|_| checked)).and_then(|floor| {
        let up = tiers.above(tier, allowed)?;
        Some(AnswerCheck {
            floor,
            model: up.model.clone(),
            tier: up.name.clone(),
        })
    });
    Ok(AutoRoute {
        model: tier.model.clone(),
        tier: tier.name.clone(),
        reason,
        check,
    })
}

/// Makes `body` ask for the logprobs of the sampled tokens: whether it asked already.
pub fn ask_logprobs(body: &mut JsonBody) -> bool {
    let chat = body.value().get("messages").is_some();
    let asked = match body.get("logprobs") {
        Value::Bool(b) => chat && *b,
        Value::Number(_) => !chat,
        _ => false,
    };
    if !asked {
        body.edit()["logprobs"] = if chat {
            Value::Bool(true)
        } else {
            Value::from(0)
        };
    }
    asked
}

impl AutoRoute {
    /// Names the tier in `headers` (`x-osprey-tier`) with the reason (`x-osprey-route-reason`,
    /// after any reason a fallback gave), and logs the choice.
    pub fn mark(self, headers: &mut HeaderMap, level: u8) {
        let reason = match headers.get(ROUTE_REASON).and_then(|r| r.to_str().ok()) {
            Some(then) => format!("{}; {then}", self.reason),
            None => self.reason,
        };
        tracing::info!(tier = %self.tier, model = %self.model, %reason, level, "auto routed");
        if let (Ok(tier), Ok(reason)) = (
            HeaderValue::from_str(&self.tier),
            HeaderValue::from_str(&reason),
        ) {
            headers.insert(TIER, tier);
            headers.insert(ROUTE_REASON, reason);
        }
    }
}

/// The mean logprob of the tokens of an answer's `events` (every choice); `None` if they
/// carry none.
pub fn mean_logprob(events: &[Result<GenEvent, Error>]) -> Option<f64> {
    let logprobs = events.iter().flat_map(|event| {
        let (chat, text) = match event {
            Ok(GenEvent::Delta(delta)) => match &delta.logprobs {
                Some(Logprobs::Chat(tokens)) => (&tokens[..], &[][..]),
                Some(Logprobs::Completion(c)) => (&[][..], &c.token_logprobs[..]),
                None => (&[][..], &[][..]),
            },
            _ => (&[][..], &[][..]),
        };
        let chat = chat.iter().map(|t| f64::from(t.logprob));
        chat.chain(text.iter().flatten().map(|&lp| f64::from(lp)))
    });
    let (sum, n) = logprobs.fold((0.0, 0usize), |(s, n), lp| (s + lp, n + 1));
    (n > 0).then(|| sum / n as f64)
}

/// What the classifier reads: the last user message of a chat (its text parts), or the first
/// prompt of a completion.
fn request_text(v: &Value) -> String {
    let text_of = |content: &Value| match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => (parts.iter())
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    };
    if let Some(messages) = v["messages"].as_array() {
        let user = messages.iter().rev().find(|m| m["role"] == "user");
        return user.map(|m| text_of(&m["content"])).unwrap_or_default();
    }
    match &v["prompt"] {
        Value::String(s) => s.clone(),
        Value::Array(items) => items
            .first()
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned(),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use osprey_core::backend::ChoiceDelta;

    #[test]
    fn answers_are_asked_with_logprobs_and_measured_by_their_mean() {
        let parse = |json: &'static str| {
            JsonBody::parse(axum::body::Bytes::from_static(json.as_bytes())).unwrap()
        };
        let mut chat = parse(r#"{"messages": []}"#);
        assert!(!ask_logprobs(&mut chat));
        assert_eq!(chat.get("logprobs"), &Value::Bool(true));
        let raw = r#"{"prompt": "x", "logprobs": 2}"#;
        let mut text = parse(raw);
        assert!(ask_logprobs(&mut text));
        assert_eq!(text.bytes(), raw.as_bytes(), "unchanged");
        let mut text = parse(r#"{"prompt": "x"}"#);
        assert!(!ask_logprobs(&mut text));
        assert_eq!(text.get("logprobs"), 0);

        let token = |logprob| osprey_core::api::ChatTokenLogprob {
            token: "t".into(),
            logprob,
            bytes: Vec::new(),
            top_logprobs: Vec::new(),
        };
        let delta = |logprobs| {
            Ok(GenEvent::Delta(ChoiceDelta {
                logprobs: Some(logprobs),
                ..ChoiceDelta::default()
            }))
        };
        let chat = [delta(Logprobs::Chat(vec![token(-0.5), token(-1.5)]))];
        assert_eq!(mean_logprob(&chat), Some(-1.0));
        let text = |lp: f32| {
            delta(Logprobs::Completion(osprey_core::api::CompletionLogprobs {
                token_logprobs: vec![Some(lp)],
                ..Default::default()
            }))
        };
        let usage = Ok(GenEvent::Usage(osprey_core::api::Usage::new(1, 2)));
        assert_eq!(mean_logprob(&[text(-2.0), text(0.0), usage]), Some(-1.0));
        assert_eq!(mean_logprob(&[]), None);
    }

    #[test]
    fn the_classifier_reads_the_last_user_message_or_the_prompt() {
        let chat = serde_json::json!({"messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "first"},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": [{"type": "text", "text": "second"}]},
        ]});
        assert_eq!(request_text(&chat), "second");
        assert_eq!(
            request_text(&serde_json::json!({"prompt": ["a", "b"]})),
            "a"
        );
        assert_eq!(request_text(&serde_json::json!({"prompt": [1, 2]})), "");
    }
}
