//! A run: its transcript of [`Item`]s (in the shape of OpenAI's Responses API), its status,
//! budget and spending, and the [`Step`]s it took. The phase a run is in is read off its
//! transcript ([`Run::phase`]), so a stored run resumes exactly where it paused.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::budget::{Budget, Spent, StopReason};
use osprey_core::api::ToolMode;

/// One entry of a run's transcript.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Item {
    /// Text from the user, the system or the assistant.
    Message {
        /// `system`, `developer`, `user` or `assistant`.
        role: String,
        /// The text.
        content: String,
    },
    /// A call the model made.
    FunctionCall {
        /// `call_…`.
        call_id: String,
        /// The tool.
        name: String,
        /// Its arguments, JSON text.
        arguments: String,
    },
    /// A call's result (or why there is none), as the model reads it.
    FunctionCallOutput {
        /// The call it answers.
        call_id: String,
        /// The text.
        output: String,
    },
    /// A call waiting for a person's approval.
    ApprovalRequest {
        /// `apr_…`, what an approval names.
        id: String,
        /// The call.
        call_id: String,
        /// The tool.
        name: String,
        /// Its arguments, redacted of PII.
        arguments: String,
        /// Why it needs approval.
        reason: String,
    },
    /// A person's answer to an approval request.
    ApprovalResponse {
        /// The request answered.
        approval_request_id: String,
        /// Whether the call may run.
        approve: bool,
        /// Why, if they said.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
}

/// Where a run is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// Working.
    InProgress,
    /// Paused: a call waits for approval (`/approve` or `/reject`).
    RequiresApproval,
    /// Paused: calls to the client's own functions wait for their outputs.
    RequiresAction,
    /// Finished with an answer.
    Completed,
    /// Stopped by a budget ([`Run::stop_reason`] says which).
    Incomplete,
    /// Failed ([`Run::error`] says why).
    Failed,
    /// Cancelled by the caller.
    Cancelled,
}

impl RunStatus {
    /// Its name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InProgress => "in_progress",
            Self::RequiresApproval => "requires_approval",
            Self::RequiresAction => "requires_action",
            Self::Completed => "completed",
            Self::Incomplete => "incomplete",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }

    /// Whether the run can go on (paused or working).
    pub fn is_open(self) -> bool {
        matches!(
            self,
            Self::InProgress | Self::RequiresApproval | Self::RequiresAction
        )
    }
}

/// What the orchestrator does next, read off the transcript.
#[derive(Clone, Debug, PartialEq)]
pub enum Phase {
    /// Ask the model what to do (answer, or call tools).
    Decide,
    /// Run these calls (by `call_id`): check, maybe ask for approval, act, observe.
    Act(Vec<String>),
    /// Paused until an approval request is answered.
    AwaitApproval,
    /// Paused until the client sends its functions' outputs.
    AwaitClient,
}

/// One transition of a run, as stored and shown.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Step {
    /// Its number in the run, from 1.
    pub n: u32,
    /// `decide`, `act`, `observe`, `approval` or `finish`.
    pub kind: String,
    /// What happened (the decision, the call and its verdict, the result's size…).
    pub detail: Value,
    /// Model tokens it used.
    pub tokens: u64,
    /// How long it took, ms.
    pub duration_ms: u64,
}

/// A run: what it was asked, what it did, where it is.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Run {
    /// `resp_…`.
    pub id: String,
    /// Where it is.
    pub status: RunStatus,
    /// Everything said and done, the input first.
    pub items: Vec<Item>,
    /// How many of `items` were given as input (the rest is output).
    pub input_items: usize,
    /// What it may spend.
    pub budget: Budget,
    /// What it has spent.
    pub spent: Spent,
    /// How the first decision may use tools (later ones choose freely: `auto`).
    #[serde(with = "mode")]
    pub tool_choice: ToolMode,
    /// Why it stopped early.
    pub stop_reason: Option<StopReason>,
    /// Why it failed.
    pub error: Option<String>,
    /// Steps taken so far.
    pub steps: u32,
}

mod mode {
    use osprey_core::api::ToolMode;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(m: &ToolMode, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&match m {
            ToolMode::None => "none".into(),
            ToolMode::Auto => "auto".into(),
            ToolMode::Required => "required".into(),
            ToolMode::Named(n) => format!("function:{n}"),
        })
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<ToolMode, D::Error> {
        let s = String::deserialize(d)?;
        Ok(match s.as_str() {
            "none" => ToolMode::None,
            "required" => ToolMode::Required,
            other => match other.strip_prefix("function:") {
                Some(name) => ToolMode::Named(name.to_owned()),
                None => ToolMode::Auto,
            },
        })
    }
}

impl Run {
    /// A new run of `input` within `budget`.
    pub fn new(id: String, input: Vec<Item>, budget: Budget, tool_choice: ToolMode) -> Self {
        Self {
            id,
            status: RunStatus::InProgress,
            input_items: input.len(),
            items: input,
            budget,
            spent: Spent::default(),
            tool_choice,
            stop_reason: None,
            error: None,
            steps: 0,
        }
    }

    /// The items the run produced (after its input).
    pub fn output(&self) -> &[Item] {
        &self.items[self.input_items.min(self.items.len())..]
    }

    /// The last assistant text of the run's output.
    pub fn output_text(&self) -> Option<&str> {
        self.output().iter().rev().find_map(|i| match i {
            Item::Message { role, content } if role == "assistant" => Some(content.as_str()),
            _ => None,
        })
    }

    /// Calls without an output yet, in order.
    pub fn open_calls(&self) -> Vec<(&str, &str, &str)> {
        let answered = |id: &str| {
            self.items
                .iter()
                .any(|i| matches!(i, Item::FunctionCallOutput { call_id, .. } if call_id == id))
        };
        (self.items.iter())
            .filter_map(|i| match i {
                Item::FunctionCall {
                    call_id,
                    name,
                    arguments,
                } if !answered(call_id) => {
                    Some((call_id.as_str(), name.as_str(), arguments.as_str()))
                }
                _ => None,
            })
            .collect()
    }

    /// The approval request of call `call_id` and its answer, if any.
    pub fn approval_of(&self, call_id: &str) -> Option<(&str, Option<bool>)> {
        let id = self.items.iter().find_map(|i| match i {
            Item::ApprovalRequest { id, call_id: c, .. } if c == call_id => Some(id.as_str()),
            _ => None,
        })?;
        let answer = self.items.iter().find_map(|i| match i {
            Item::ApprovalResponse {
                approval_request_id,
                approve,
                ..
            } if approval_request_id == id => Some(*approve),
            _ => None,
        });
        Some((id, answer))
    }

    /// What to do next. `is_client` says which tools the client runs itself.
    pub fn phase(&self, is_client: impl Fn(&str) -> bool) -> Phase {
        let open = self.open_calls();
        if open.is_empty() {
            return Phase::Decide;
        }
        let mut actionable = Vec::new();
        let mut awaiting_approval = false;
        for (call_id, name, _) in &open {
            match self.approval_of(call_id) {
                Some((_, None)) => awaiting_approval = true,
                _ if is_client(name) => {}
                _ => actionable.push((*call_id).to_owned()),
            }
        }
        if !actionable.is_empty() {
            Phase::Act(actionable)
        } else if awaiting_approval {
            Phase::AwaitApproval
        } else {
            Phase::AwaitClient
        }
    }

    /// Answers approval request `id`; an error says why it cannot be answered.
    pub fn answer_approval(
        &mut self,
        id: &str,
        approve: bool,
        reason: Option<String>,
    ) -> Result<(), String> {
        let call_id = self.items.iter().find_map(|i| match i {
            Item::ApprovalRequest { id: r, call_id, .. } if r == id => Some(call_id.clone()),
            _ => None,
        });
        let Some(call_id) = call_id else {
            return Err(format!("run {} has no approval request `{id}`", self.id));
        };
        if let Some((_, Some(_))) = self.approval_of(&call_id) {
            return Err(format!("approval request `{id}` was already answered"));
        }
        if !self.status.is_open() {
            return Err(format!(
                "run {} has ended ({})",
                self.id,
                self.status.as_str()
            ));
        }
        self.items.push(Item::ApprovalResponse {
            approval_request_id: id.to_owned(),
            approve,
            reason,
        });
        Ok(())
    }

    /// Adds the client's output of one of its functions' calls.
    pub fn add_client_output(&mut self, call_id: &str, output: String) -> Result<(), String> {
        if !self.open_calls().iter().any(|(id, _, _)| *id == call_id) {
            return Err(format!("no call `{call_id}` is waiting for an output"));
        }
        self.items.push(Item::FunctionCallOutput {
            call_id: call_id.to_owned(),
            output,
        });
        Ok(())
    }
}
