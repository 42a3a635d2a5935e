//! Summaries of a conversation's older turns, written by the smallest tier's model (the
//! request's own model when no tiers are configured), greedily, within the summary's token
//! budget. The previous summary is carried into the next, so a summary covers everything
//! before the turns kept verbatim.

use osprey_context::prompt::Message;
use osprey_core::Error;
use serde_json::json;

use crate::edge::Caller;
use crate::state::AppState;

/// Characters of one turn the summariser reads (its head); longer turns are cut.
const TURN_CHARS: usize = 1200;
/// Characters of turns the summariser reads in all (the newest, when there are more).
const TRANSCRIPT_CHARS: usize = 6000;

const INSTRUCTIONS: &str = "You summarise conversations between a user and an assistant. \
Write a short summary in the third person of what the user said and asked and what the \
assistant answered. Keep names, numbers, preferences and decisions. No preamble.";

/// A summary of `previous` (the summary so far) and then `turns`, in at most `max_tokens`, for
/// a request to `asked_model`.
pub async fn summarize(
    state: &AppState,
    caller: &Caller,
    asked_model: &str,
    previous: Option<&str>,
    turns: &[Message],
    max_tokens: usize,
) -> Result<String, Error> {
    let mut transcript = String::new();
    for turn in turns.iter().rev() {
        let speaker = match turn.role.as_str() {
            "assistant" => "Assistant",
            "user" => "User",
            other => other,
        };
        let text: String = turn.content.chars().take(TURN_CHARS).collect();
        let line = format!("{speaker}: {}\n", text.trim());
        if transcript.len() + line.len() > TRANSCRIPT_CHARS && !transcript.is_empty() {
            break;
        }
        transcript.insert_str(0, &line);
    }
    let mut asked = String::new();
    if let Some(previous) = previous {
        asked.push_str(&format!("Summary so far: {previous}\n\n"));
    }
    asked.push_str(&format!("Conversation:\n{transcript}\nSummary:"));
    let body = json!({
        "model": model(state, caller, asked_model),
        "messages": [
            {"role": "system", "content": INSTRUCTIONS},
            {"role": "user", "content": asked},
        ],
        "max_tokens": max_tokens,
        "temperature": 0,
        // Small models loop on their own phrases without it.
        "frequency_penalty": 0.5,
    });
    let text = crate::pipeline::complete_chat(state, caller, body).await?;
    Ok(text.trim().to_owned())
}

/// The model that writes summaries: the smallest tier's the caller may use, else the local
/// one, else the one the request asked for.
fn model(state: &AppState, caller: &Caller, asked_model: &str) -> String {
    let allowed =
        |m: &str| (caller.tenant.models.as_ref()).is_none_or(|ms| ms.iter().any(|a| a == m));
    (state.tiers().into_iter())
        .flat_map(|t| t.tiers())
        .map(|t| t.model.clone())
        .find(|m| allowed(m))
        .or_else(|| state.model_name().map(str::to_owned))
        .unwrap_or_else(|| asked_model.to_owned())
}
