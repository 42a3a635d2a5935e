//! Summaries of a conversation's older turns, written greedily within the summary's token
//! budget by a [`SummaryWriter`] (the server's choice of model: the smallest tier's). The
//! previous summary is carried into the next, so a summary covers everything before the turns
//! kept verbatim.

use futures_util::future::BoxFuture;
use osprey_core::Error;
use serde_json::{Value, json};

use crate::prompt::Message;

/// Characters of one turn the summariser reads (its head); longer turns are cut.
const TURN_CHARS: usize = 1200;
/// Characters of turns the summariser reads in all (the newest, when there are more).
const TRANSCRIPT_CHARS: usize = 6000;

const INSTRUCTIONS: &str = "You summarise conversations between a user and an assistant. \
Write a short summary in the third person of what the user said and asked and what the \
assistant answered. Keep names, numbers, preferences and decisions. No preamble.";

/// The model that writes summaries.
pub trait SummaryWriter: Send + Sync {
    /// The text of the answer to `request`, a chat completion request without its `model`
    /// (the writer names it).
    fn write(&self, request: Value) -> BoxFuture<'_, Result<String, Error>>;
}

/// A summary of `previous` (the summary so far) and then `turns`, in at most `max_tokens`.
pub async fn summarize(
    writer: &dyn SummaryWriter,
    previous: Option<&str>,
    turns: &[Message],
    max_tokens: usize,
) -> Result<String, Error> {
    let text = writer.write(request(previous, turns, max_tokens)).await?;
    Ok(text.trim().to_owned())
}

/// The chat request asking for the summary: the newest turns that fit, each cut to its head.
fn request(previous: Option<&str>, turns: &[Message], max_tokens: usize) -> Value {
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
    json!({
        "messages": [
            {"role": "system", "content": INSTRUCTIONS},
            {"role": "user", "content": asked},
        ],
        "max_tokens": max_tokens,
        "temperature": 0,
        // Small models loop on their own phrases without it.
        "frequency_penalty": 0.5,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turn(role: &str, content: &str) -> Message {
        Message {
            role: role.into(),
            content: content.into(),
        }
    }

    #[test]
    fn the_request_carries_the_summary_so_far_and_the_newest_turns_that_fit() {
        let long = "x".repeat(TURN_CHARS * 2);
        let mut turns = vec![turn("user", "the oldest words")];
        turns.extend((0..10).map(|_| turn("assistant", &long)));
        turns.push(turn("user", "my name is Ada"));
        let r = request(Some("They met."), &turns, 64);
        let asked = r["messages"][1]["content"].as_str().unwrap();
        assert!(asked.starts_with("Summary so far: They met.\n\nConversation:\n"));
        assert!(asked.contains("User: my name is Ada\n"));
        // Each turn is cut to its head, and the oldest ones give way to the newest.
        assert!(!asked.contains("the oldest words"));
        assert!(asked.len() <= TRANSCRIPT_CHARS + 100, "{}", asked.len());
        assert_eq!(r["max_tokens"], 64);
        assert!(r.get("model").is_none());
    }
}
