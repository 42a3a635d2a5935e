//! `"model": "auto"`: the router picks the tier. The request's last user message (or prompt)
//! goes through the task classifier; [`Tiers::choose`] turns the task and the classifier's
//! confidence (and `reasoning_effort`, `"osprey": {"quality": "premium"}`) into a tier among
//! those the tenant may use; the body then names that tier's model and goes on as if the client
//! had named it. The response says so in `x-osprey-tier` and `x-osprey-route-reason`.

use axum::body::Bytes;
use osprey_core::Error;
use osprey_router::classifier::TaskClassifier;
use osprey_router::tiers::{Asks, Tiers};
use serde_json::Value;

use crate::edge::Caller;
use crate::upstream::rename_model;

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
}

/// Chooses the tier of an `auto` request.
/// Under degradation `level` 3 and above nothing escalates; at 2 and above the request goes
/// one tier smaller than it would.
pub fn route(
    tiers: Option<&Tiers>,
    caller: &Caller,
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
    let allowed =
        |m: &str| (caller.tenant.models.as_ref()).is_none_or(|ms| ms.iter().any(|a| a == m));
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
    Ok(AutoRoute {
        body: rename_model(body, &tier.model)?,
        model: tier.model.clone(),
        tier: tier.name.clone(),
        reason,
    })
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
