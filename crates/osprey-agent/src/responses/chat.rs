//! A run's transcript as an OpenAI chat request, and a chat answer as the model's decision:
//! calls as assistant `tool_calls`, their results as `tool` messages, the run's tools as
//! functions. Any server that can answer a chat request can decide a run's steps.

use osprey_core::api::ToolMode;
use serde_json::{Value, json};

use crate::{Decision, Item, ToolSpec};

/// The chat request that asks `model` for the next decision of a run at `items`, with `tools`
/// offered as `mode` says.
pub fn chat_request(
    model: &str,
    items: &[Item],
    tools: &[ToolSpec],
    mode: &ToolMode,
    temperature: f32,
    max_tokens: u32,
) -> Value {
    let mut body = json!({
        "model": model,
        "messages": messages(items),
        "temperature": temperature,
        "max_tokens": max_tokens,
    });
    if !tools.is_empty() {
        body["tools"] = tools
            .iter()
            .map(|t| {
                json!({"type": "function", "function": {
                "name": t.name, "description": t.description, "parameters": t.parameters}})
            })
            .collect();
        body["tool_choice"] = choice(mode);
    }
    body
}

/// The decision a chat completion's first choice makes.
pub fn decision(answer: &Value) -> Decision {
    let message = &answer["choices"][0]["message"];
    let calls = (message["tool_calls"].as_array().into_iter().flatten())
        .filter_map(|c| {
            let f = &c["function"];
            Some((
                f["name"].as_str()?.to_owned(),
                f["arguments"].as_str()?.to_owned(),
            ))
        })
        .collect();
    Decision {
        text: message["content"].as_str().unwrap_or_default().to_owned(),
        calls,
        prompt_tokens: answer["usage"]["prompt_tokens"].as_u64().unwrap_or(0),
        output_tokens: answer["usage"]["completion_tokens"].as_u64().unwrap_or(0),
    }
}

/// The chat messages of a transcript.
pub fn messages(items: &[Item]) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::new();
    for item in items {
        match item {
            Item::Message { role, content } => out.push(json!({"role": role, "content": content})),
            Item::FunctionCall {
                call_id,
                name,
                arguments,
            } => {
                // A call cut short (the model ran out of tokens) has arguments that are not
                // JSON; the model is shown `{}` and, in the call's output, why it failed.
                let arguments = match serde_json::from_str::<Value>(arguments) {
                    Ok(_) => arguments.as_str(),
                    Err(_) => "{}",
                };
                let call = json!({"id": call_id, "type": "function",
                    "function": {"name": name, "arguments": arguments}});
                // Calls of one decision join the assistant message before them.
                match out.last_mut() {
                    Some(last) if last["role"] == "assistant" && last["tool_calls"].is_array() => {
                        if let Some(calls) = last["tool_calls"].as_array_mut() {
                            calls.push(call);
                        }
                    }
                    Some(last)
                        if last["role"] == "assistant" && last.get("tool_calls").is_none() =>
                    {
                        last["tool_calls"] = json!([call]);
                    }
                    _ => out
                        .push(json!({"role": "assistant", "content": null, "tool_calls": [call]})),
                }
            }
            Item::FunctionCallOutput { call_id, output } => {
                out.push(json!({"role": "tool", "tool_call_id": call_id, "content": output}))
            }
            Item::ApprovalRequest { .. } | Item::ApprovalResponse { .. } => {}
        }
    }
    out
}

/// OpenAI's `tool_choice` for a mode.
fn choice(mode: &ToolMode) -> Value {
    match mode {
        ToolMode::None => "none".into(),
        ToolMode::Auto => "auto".into(),
        ToolMode::Required => "required".into(),
        ToolMode::Named(name) => json!({"type": "function", "function": {"name": name}}),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_transcript_becomes_chat_messages() {
        let items = vec![
            Item::Message {
                role: "user".into(),
                content: "2+2?".into(),
            },
            Item::FunctionCall {
                call_id: "call_1".into(),
                name: "calculator".into(),
                arguments: "{}".into(),
            },
            Item::FunctionCall {
                call_id: "call_2".into(),
                name: "calculator".into(),
                arguments: "{}".into(),
            },
            Item::ApprovalRequest {
                id: "apr_1".into(),
                call_id: "call_2".into(),
                name: "x".into(),
                arguments: "{}".into(),
                reason: "r".into(),
            },
            Item::FunctionCallOutput {
                call_id: "call_1".into(),
                output: "4".into(),
            },
            Item::Message {
                role: "assistant".into(),
                content: "Let me check.".into(),
            },
            Item::FunctionCall {
                call_id: "call_3".into(),
                name: "calculator".into(),
                arguments: "{}".into(),
            },
        ];
        let m = messages(&items);
        assert_eq!(m.len(), 4);
        assert_eq!(m[1]["tool_calls"].as_array().unwrap().len(), 2);
        assert_eq!(
            (m[2]["role"].as_str(), m[2]["tool_call_id"].as_str()),
            (Some("tool"), Some("call_1"))
        );
        assert_eq!(m[3]["content"], "Let me check.");
        assert_eq!(m[3]["tool_calls"][0]["id"], "call_3");
    }
}
