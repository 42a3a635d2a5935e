//! What every tool call leaves behind: the tool, its arguments with PII redacted, the size of
//! its result, how long it took, and the [`Verdict`] on it.

use serde::{Deserialize, Serialize};

/// What was decided about a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// It ran and its result went to the model.
    Allowed,
    /// A person approved it (the entry after says how it ran).
    Approved,
    /// It waits for a person's approval.
    ApprovalRequested,
    /// A person rejected it.
    Rejected,
    /// Its tool needs a scope the caller is not granted.
    Denied,
    /// The policy refused its arguments.
    Blocked,
    /// No tool of that name is offered.
    UnknownTool,
    /// Its arguments do not match the tool's schema.
    InvalidArguments,
    /// It failed and will be tried again (within the retry budget).
    Retried,
    /// It failed.
    Failed,
    /// It ran, but its result was kept from the model (the policy found an injection in it).
    Withheld,
}

impl Verdict {
    /// Its name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Allowed => "allowed",
            Self::Approved => "approved",
            Self::ApprovalRequested => "approval_requested",
            Self::Rejected => "rejected",
            Self::Denied => "denied",
            Self::Blocked => "blocked",
            Self::UnknownTool => "unknown_tool",
            Self::InvalidArguments => "invalid_arguments",
            Self::Retried => "retried",
            Self::Failed => "failed",
            Self::Withheld => "withheld",
        }
    }
}

/// One audited call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolAudit {
    /// The run.
    pub run_id: String,
    /// The call.
    pub call_id: String,
    /// The tool.
    pub tool: String,
    /// Its arguments, PII replaced by typed placeholders.
    pub arguments: String,
    /// Bytes of its result (0 when it did not run).
    pub result_bytes: usize,
    /// How long it ran, ms.
    pub duration_ms: u64,
    /// What was decided.
    pub verdict: Verdict,
    /// Why (the missing scope, the error, the policy's finding…).
    pub detail: String,
}
