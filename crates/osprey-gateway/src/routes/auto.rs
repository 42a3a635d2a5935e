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

use axum::body::Bytes;
use osprey_core::Error;
use osprey_router::classifier::TaskClassifier;
use osprey_router::tiers::{Asks, Tiers};
use serde_json::Value;

use crate::body::set_model;
use crate::edge::Caller;

/// The model name that asks the router to choose.
pub const AUTO: &str = "auto";
/// The header naming the tier that served an `auto` request.
pub const TIER: &str = "x-osprey-tier";

/// Where an `auto` request goes.
pub struct AutoRoute {
    /// The body, naming the tier's model.
    pub body: Bytes,
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
    /// The body, naming the model of the tier above.
    pub body: Bytes,
    /// The model of the tier above.
    pub model: String,
    /// The name of the tier above.
    pub tier: String,
}

/// Chooses the tier of an `auto` request.
/// Under degradation `level` 3 and above nothing escalates; at 2 and above the request goes
/// one tier smaller than it would.
pub fn route(
    tiers: Option<&Tiers>,
    caller: &Caller,
    flags: &serde_json::Map<String, Value>,
    body: &Bytes,
    level: u8,
) -> Result<AutoRoute, Error> {
    let Some(tiers) = tiers else {
        return Err(Error::model_not_found(AUTO));
    };
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| Error::invalid("body", format!("The request body is not valid JSON: {e}")))?;
    let (task, confidence) = TaskClassifier::shipped().classify(&request_text(&v));
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
        .filter(|t| crate::flags::tier_off(flags, &t.name))
        .map(|t| t.model.as_str())
        .collect();
    let allowed = |m: &str| {
        (caller.tenant.models.as_ref()).is_none_or(|ms| ms.iter().any(|a| a == m))
            && !off.contains(&m)
    };
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
    let checked = level < 3 && !crate::replay::is_streamed(body);
    let check = match tiers.answer_floor().filter(|_| checked) {
        Some(floor) => match tiers.above(tier, allowed) {
            Some(up) => Some(AnswerCheck {
                floor,
                body: set_model(body, &up.model)?,
                model: up.model.clone(),
                tier: up.name.clone(),
            }),
            None => None,
        },
        None => None,
    };
    Ok(AutoRoute {
        body: set_model(body, &tier.model)?,
        model: tier.model.clone(),
        tier: tier.name.clone(),
        reason,
        check,
    })
}

/// `body` asking for the logprobs of the sampled tokens, and whether it asked already.
pub fn asking_logprobs(body: &Bytes) -> Result<(Bytes, bool), Error> {
    let mut v: Value = serde_json::from_slice(body)
        .map_err(|e| Error::invalid("body", format!("The request body is not valid JSON: {e}")))?;
    let Some(object) = v.as_object_mut() else {
        return Err(Error::invalid(
            "body",
            "The request body must be a JSON object.",
        ));
    };
    let chat = object.contains_key("messages");
    let asked = match object.get("logprobs") {
        Some(Value::Bool(b)) => chat && *b,
        Some(Value::Number(_)) => !chat,
        _ => false,
    };
    if asked {
        return Ok((body.clone(), true));
    }
    let all = if chat {
        Value::Bool(true)
    } else {
        Value::from(0)
    };
    object.insert("logprobs".to_owned(), all);
    Ok((
        serde_json::to_vec(&v).expect("JSON serialises").into(),
        false,
    ))
}

/// The mean logprob of the tokens of every choice of a chat or text completion; `None` if it
/// has none.
pub fn mean_logprob(answer: &Value) -> Option<f64> {
    let choices = answer["choices"].as_array()?;
    let logprobs = choices.iter().flat_map(|c| {
        let chat = c["logprobs"]["content"].as_array().into_iter().flatten();
        let chat = chat.filter_map(|t| t["logprob"].as_f64());
        let text = (c["logprobs"]["token_logprobs"]
            .as_array()
            .into_iter()
            .flatten())
        .filter_map(Value::as_f64);
        chat.chain(text)
    });
    let (sum, n) = logprobs.fold((0.0, 0usize), |(s, n), lp| (s + lp, n + 1));
    (n > 0).then(|| sum / n as f64)
}

/// `answer` without the logprobs of its choices.
pub fn without_logprobs(answer: &mut Value) {
    for choice in answer["choices"].as_array_mut().into_iter().flatten() {
        if let Some(c) = choice.as_object_mut() {
            c.insert("logprobs".to_owned(), Value::Null);
        }
    }
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

    #[test]
    fn answers_are_asked_with_logprobs_and_measured_by_their_mean() {
        let chat = Bytes::from_static(br#"{"messages": []}"#);
        let (body, asked) = asking_logprobs(&chat).unwrap();
        assert!(!asked);
        assert!(String::from_utf8_lossy(&body).contains(r#""logprobs":true"#));
        let text = Bytes::from_static(br#"{"prompt": "x", "logprobs": 2}"#);
        assert_eq!(asking_logprobs(&text).unwrap(), (text.clone(), true));
        let (body, _) = asking_logprobs(&Bytes::from_static(br#"{"prompt": "x"}"#)).unwrap();
        assert!(String::from_utf8_lossy(&body).contains(r#""logprobs":0"#));
        assert!(asking_logprobs(&Bytes::from_static(b"[1]")).is_err());

        let mut chat = serde_json::json!({"choices": [{"logprobs": {"content": [
            {"logprob": -0.5}, {"logprob": -1.5}]}}]});
        assert_eq!(mean_logprob(&chat), Some(-1.0));
        let text = serde_json::json!({"choices": [{"logprobs": {"token_logprobs": [-2.0]}},
                                                  {"logprobs": {"token_logprobs": [0.0]}}]});
        assert_eq!(mean_logprob(&text), Some(-1.0));
        assert_eq!(mean_logprob(&serde_json::json!({"choices": [{}]})), None);
        without_logprobs(&mut chat);
        assert_eq!(chat["choices"][0]["logprobs"], Value::Null);
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
