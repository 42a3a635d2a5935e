//! The Responses API's wire format, as Osprey speaks it: the request (`input`, `tools`,
//! `tool_choice`, `previous_response_id`, Osprey's `budget`), and a run shown as a response
//! object with OpenAI's output item types.

use crate::{Budget, Item, Run, RunStatus};
use osprey_core::Error;
use osprey_core::api::ToolMode;
use serde::Deserialize;
use serde_json::{Value, json};

/// `POST /v1/responses`.
#[derive(Clone, Debug, Deserialize, utoipa::ToSchema)]
pub struct ResponsesRequest {
    /// The model that decides each step.
    pub model: String,
    /// A text, or a list of input items.
    pub input: Input,
    /// A system message for this response only.
    #[serde(default)]
    pub instructions: Option<String>,
    /// Tools: `function` (run by the client), `mcp` (a configured server, by
    /// `server_label`), `file_search` (collections), and the built-ins by type
    /// (`calculator`, `http_fetch`, `sql_query`, `wasm_exec`, an operator module's name).
    #[serde(default)]
    pub tools: Vec<Value>,
    /// How the first step may use tools.
    #[serde(default)]
    pub tool_choice: Option<Value>,
    /// Continue from this response's transcript.
    #[serde(default)]
    pub previous_response_id: Option<String>,
    /// Stream the run's events.
    #[serde(default)]
    pub stream: bool,
    /// Most tool calls (a budget).
    #[serde(default)]
    pub max_tool_calls: Option<u32>,
    /// Most output tokens of each step.
    #[serde(default)]
    pub max_output_tokens: Option<u32>,
    /// Sampling temperature of each step (default 0: the run is reproducible).
    #[serde(default)]
    pub temperature: Option<f32>,
    /// Kept and returned.
    #[serde(default)]
    pub metadata: Option<Value>,
    /// Osprey's options: `{"budget": {...}}`.
    #[serde(default)]
    pub osprey: Option<OspreyRunOptions>,
}

/// Osprey's run options.
#[derive(Clone, Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OspreyRunOptions {
    /// Limits of this run, each capped by the operator's.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub budget: Option<Budget>,
}

/// `input`.
#[derive(Clone, Debug, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum Input {
    /// One user message.
    Text(String),
    /// Items: messages, `function_call_output`, `mcp_approval_response`.
    Items(Vec<Value>),
}

/// What `input` asks for besides messages.
#[derive(Debug, Default)]
pub struct ParsedInput {
    /// Messages, in order.
    pub messages: Vec<Item>,
    /// `(call_id, output)` of the client's functions.
    pub outputs: Vec<(String, String)>,
    /// `(approval_request_id, approve, reason)`.
    pub approvals: Vec<(String, bool, Option<String>)>,
}

impl ResponsesRequest {
    /// The input, checked: an error names the item and field.
    pub fn parse_input(&self) -> Result<ParsedInput, Error> {
        let mut out = ParsedInput::default();
        if let Some(text) = &self.instructions {
            out.messages.push(message("system", text.clone()));
        }
        let items = match &self.input {
            Input::Text(t) => {
                out.messages.push(message("user", t.clone()));
                return Ok(out);
            }
            Input::Items(items) => items,
        };
        for (i, item) in items.iter().enumerate() {
            let at = |f: &str| format!("input[{i}]{f}");
            let kind = item["type"].as_str().unwrap_or("message");
            match kind {
                "message" => {
                    let role = item["role"].as_str().unwrap_or_default();
                    if !["user", "system", "developer", "assistant"].contains(&role) {
                        return Err(Error::invalid(
                            at(".role"),
                            format!(
                                "{} must be user, system, developer or assistant",
                                at(".role")
                            ),
                        ));
                    }
                    let text = content_text(&item["content"]).ok_or_else(|| {
                        Error::invalid(
                            at(".content"),
                            format!("{} must be text or text parts", at(".content")),
                        )
                    })?;
                    out.messages.push(message(role, text));
                }
                "function_call_output" => {
                    let call = item["call_id"].as_str().ok_or_else(|| {
                        Error::invalid(at(".call_id"), "a function_call_output needs its call_id")
                    })?;
                    let output = match &item["output"] {
                        Value::String(s) => s.clone(),
                        Value::Null => String::new(),
                        other => other.to_string(),
                    };
                    out.outputs.push((call.to_owned(), output));
                }
                "mcp_approval_response" | "approval_response" => {
                    let id = item["approval_request_id"].as_str().ok_or_else(|| {
                        Error::invalid(
                            at(".approval_request_id"),
                            "an approval response names its request",
                        )
                    })?;
                    let approve = item["approve"].as_bool().ok_or_else(|| {
                        Error::invalid(at(".approve"), "`approve` must be true or false")
                    })?;
                    let reason = item["reason"].as_str().map(str::to_owned);
                    out.approvals.push((id.to_owned(), approve, reason));
                }
                other => {
                    return Err(Error::invalid(
                        at(".type"),
                        format!("input items of type `{other}` are not supported"),
                    ));
                }
            }
        }
        let continues = self.previous_response_id.is_some();
        let continuing = !(out.outputs.is_empty() && out.approvals.is_empty());
        if continuing && !continues {
            return Err(Error::invalid(
                "previous_response_id",
                "function outputs and approvals continue a response: give previous_response_id",
            ));
        }
        if out.messages.is_empty() && !continues {
            return Err(Error::invalid(
                "input",
                "`input` must contain at least one message",
            ));
        }
        Ok(out)
    }

    /// `tool_choice`, as the first step's mode.
    pub fn tool_mode(&self) -> Result<ToolMode, Error> {
        Ok(match &self.tool_choice {
            None => ToolMode::Auto,
            Some(Value::String(s)) => match s.as_str() {
                "auto" => ToolMode::Auto,
                "none" => ToolMode::None,
                "required" => ToolMode::Required,
                other => {
                    return Err(Error::invalid(
                        "tool_choice",
                        format!(
                            "tool_choice must be auto, none, required or a named tool, got `{other}`"
                        ),
                    ));
                }
            },
            Some(v) => match v["name"].as_str().or(v["function"]["name"].as_str()) {
                Some(name) => ToolMode::Named(name.to_owned()),
                None => {
                    return Err(Error::invalid(
                        "tool_choice",
                        "a named tool_choice needs a `name`",
                    ));
                }
            },
        })
    }
}

fn message(role: &str, content: String) -> Item {
    Item::Message {
        role: role.to_owned(),
        content,
    }
}

/// A message's text: a string, or its text parts joined.
fn content_text(content: &Value) -> Option<String> {
    match content {
        Value::String(s) => Some(s.clone()),
        Value::Array(parts) => parts
            .iter()
            .map(|p| p["text"].as_str().map(str::to_owned))
            .collect::<Option<Vec<_>>>()
            .map(|t| t.concat()),
        _ => None,
    }
}

/// What the response object shows besides the run.
pub struct Shown<'a> {
    /// The model.
    pub model: &'a str,
    /// Unix seconds of creation.
    pub created_at: i64,
    /// The run it continues.
    pub previous_response_id: Option<&'a str>,
    /// The request's metadata.
    pub metadata: Option<&'a Value>,
    /// Which server runs each MCP tool (`LABEL__TOOL` → label), for approval items.
    pub server_of: &'a dyn Fn(&str) -> Option<String>,
}

/// `run` as a response object.
pub fn response_object(run: &Run, shown: &Shown) -> Value {
    let output: Vec<Value> = (run.output().iter().enumerate())
        .map(|(i, item)| output_item(&run.id, i, item, shown))
        .collect();
    let status = match run.status {
        RunStatus::InProgress => "in_progress",
        other => other.as_str(),
    };
    let pending: Vec<Value> = (run.output().iter())
        .filter_map(|i| match i {
            Item::ApprovalRequest { id, call_id, .. }
                if run.approval_of(call_id).is_some_and(|(_, a)| a.is_none()) =>
            {
                Some(Value::String(id.clone()))
            }
            _ => None,
        })
        .collect();
    json!({
        "id": run.id,
        "object": "response",
        "created_at": shown.created_at,
        "status": status,
        "model": shown.model,
        "output": output,
        "output_text": run.output_text().unwrap_or_default(),
        "previous_response_id": shown.previous_response_id,
        "incomplete_details": run.stop_reason.map(|r| json!({"reason": r.as_str()})),
        "error": run.error.as_ref().map(|e| json!({"code": "run_failed", "message": e})),
        "usage": {
            "input_tokens": run.spent.tokens - run.spent.output_tokens,
            "output_tokens": run.spent.output_tokens,
            "total_tokens": run.spent.tokens,
        },
        "metadata": shown.metadata.cloned().unwrap_or(json!({})),
        "osprey": {
            "budget": run.budget,
            "spent": run.spent,
            "steps": run.steps,
            "pending_approvals": pending,
        },
    })
}

/// One transcript item in OpenAI's output shape.
pub fn output_item(run_id: &str, index: usize, item: &Item, shown: &Shown) -> Value {
    let id = format!("{}_{index}", run_id.replacen("resp_", "item_", 1));
    match item {
        Item::Message { role, content } => json!({
            "type": "message", "id": id, "role": role, "status": "completed",
            "content": [{"type": "output_text", "text": content, "annotations": []}],
        }),
        Item::FunctionCall {
            call_id,
            name,
            arguments,
        } => json!({
            "type": "function_call", "id": id, "call_id": call_id, "name": name,
            "arguments": arguments, "status": "completed",
        }),
        Item::FunctionCallOutput { call_id, output } => json!({
            "type": "function_call_output", "id": id, "call_id": call_id, "output": output,
        }),
        Item::ApprovalRequest {
            id: request,
            call_id,
            name,
            arguments,
            reason,
        } => json!({
            "type": "mcp_approval_request", "id": request, "call_id": call_id,
            "server_label": (shown.server_of)(name).unwrap_or_else(|| "osprey".into()),
            "name": name, "arguments": arguments, "reason": reason,
        }),
        Item::ApprovalResponse {
            approval_request_id,
            approve,
            reason,
        } => json!({
            "type": "mcp_approval_response", "id": id,
            "approval_request_id": approval_request_id, "approve": approve, "reason": reason,
        }),
    }
}
