//! The orchestrator: a run's state machine.
//!
//! ```text
//!            ┌──────────────────────────────────────────────┐
//!            ▼                                              │
//!   ──▶ Decide ──answer──▶ Completed                        │
//!         │  └─budget out─▶ Incomplete (stop reason)        │
//!         │ calls                                           │
//!         ▼                                                 │
//!        Act: per call ── unknown / bad arguments / scope ──┤ (refusal observed)
//!         │              └─ destructive or flagged ─▶ AwaitApproval ─approve/reject─┐
//!         │              └─ the client's function ─▶ AwaitClient ─outputs──────────┤
//!         ▼                                                                        │
//!     run it (retried within budget) ─▶ Observe (result screened, capped) ─────────┘
//! ```
//!
//! The phase is read off the run's transcript ([`Run::phase`]), so a run paused for approval
//! or for the client resumes where it stopped, in this process or another. Every transition
//! is a [`Step`] and every call a [`ToolAudit`], handed to a [`RunSink`] as they happen.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use osprey_core::api::ToolMode;
use osprey_policy::pipeline::Pipeline;
use osprey_policy::redact::Redactor;
use osprey_policy::{Action, Source};
use serde_json::{Value, json};

use crate::audit::{ToolAudit, Verdict};
use crate::budget::StopReason;
use crate::run::{Item, Phase, Run, RunStatus, Step};
use crate::scope::{Scope, Scopes};
use crate::tool::{ToolError, ToolSet, ToolSpec};

/// Longest tool result the model reads, in bytes; the rest is cut with a note.
pub const MAX_RESULT_BYTES: usize = 16 << 10;

/// What the model chose to do.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Decision {
    /// Its text (the answer, when there are no calls).
    pub text: String,
    /// The calls it made: tool name and arguments (JSON text).
    pub calls: Vec<(String, String)>,
    /// Prompt tokens it read.
    pub prompt_tokens: u64,
    /// Tokens it wrote.
    pub output_tokens: u64,
}

/// The model that decides a run's next step.
pub trait Model: Send + Sync {
    /// Given the transcript and the tools, answer or call tools. `choice` says whether a call
    /// is required, forbidden, or of one tool.
    fn decide<'a>(
        &'a self,
        items: &'a [Item],
        tools: &'a [ToolSpec],
        choice: &'a ToolMode,
    ) -> BoxFuture<'a, Result<Decision, String>>;
}

/// Where a run's steps, audits and items go as they happen (the store, a stream, a test).
pub trait RunSink: Send + Sync {
    /// A step was taken; `run` is as it stands after it.
    fn step<'a>(&'a self, run: &'a Run, step: &'a Step) -> BoxFuture<'a, ()>;
    /// A call was audited.
    fn audit<'a>(&'a self, record: &'a ToolAudit) -> BoxFuture<'a, ()>;
}

/// A sink that keeps nothing.
pub struct NoSink;

impl RunSink for NoSink {
    fn step<'a>(&'a self, _: &'a Run, _: &'a Step) -> BoxFuture<'a, ()> {
        Box::pin(async {})
    }
    fn audit<'a>(&'a self, _: &'a ToolAudit) -> BoxFuture<'a, ()> {
        Box::pin(async {})
    }
}

/// Everything a run is driven with.
#[derive(Clone)]
pub struct Orchestrator {
    /// Decides each step.
    pub model: Arc<dyn Model>,
    /// The tools offered.
    pub tools: ToolSet,
    /// The scopes the caller is granted.
    pub grant: Scopes,
    /// Screens arguments (PII, injections) and results (indirect injections, PII); none
    /// means no screening.
    pub policy: Option<Arc<Pipeline>>,
    /// Where steps and audits go.
    pub sink: Arc<dyn RunSink>,
    /// Cost of 1,000 model tokens, in the budget's currency.
    pub price_per_1k_tokens: f64,
}

/// What became of one call's checks.
enum Gate {
    /// Run it (`approved` if a person said so).
    Run { approved: bool },
    /// Do not run it: its output is this text, audited with this verdict.
    Refuse(Verdict, String),
    /// Wait for approval, for this reason.
    Ask(String),
}

impl Orchestrator {
    /// Drives `run` until it finishes or pauses (for approval, or for the client's outputs).
    pub async fn advance(&self, run: &mut Run) {
        if !run.status.is_open() {
            return;
        }
        run.status = RunStatus::InProgress;
        let started = Instant::now();
        let before = run.spent.working;
        let specs = self.tools.specs();
        loop {
            run.spent.working = before + started.elapsed();
            match run.phase(|name| self.tools.is_client(name)) {
                Phase::AwaitApproval => return self.pause(run, RunStatus::RequiresApproval).await,
                Phase::AwaitClient => return self.pause(run, RunStatus::RequiresAction).await,
                Phase::Act(calls) => {
                    for call_id in calls {
                        if let Err(reason) = self.act(run, &call_id).await {
                            return self.stop(run, reason).await;
                        }
                    }
                }
                Phase::Decide => {
                    if let Some(reason) = run.budget.exhausted(&run.spent) {
                        return self.stop(run, reason).await;
                    }
                    if !self.decide(run, &specs).await {
                        return;
                    }
                }
            }
        }
    }

    /// One decision: the model's answer ends the run; its calls join the transcript. False
    /// when the run ended.
    async fn decide(&self, run: &mut Run, specs: &[ToolSpec]) -> bool {
        let t = Instant::now();
        let choice = match run.steps {
            0 => run.tool_choice.clone(),
            _ => ToolMode::Auto,
        };
        let left = run.budget.wall_time().saturating_sub(run.spent.working);
        let decided =
            tokio::time::timeout(left, self.model.decide(&run.items, specs, &choice)).await;
        run.spent.working += t.elapsed();
        let decision = match decided {
            Err(_) => {
                self.stop(run, StopReason::MaxWallTime).await;
                return false;
            }
            Ok(Err(e)) => {
                run.status = RunStatus::Failed;
                run.error = Some(format!("the model failed: {e}"));
                self.record(
                    run,
                    "finish",
                    json!({"status": "failed", "error": run.error}),
                    0,
                    t,
                )
                .await;
                return false;
            }
            Ok(Ok(d)) => d,
        };
        let tokens = decision.prompt_tokens + decision.output_tokens;
        run.spent.steps += 1;
        run.spent.tokens += tokens;
        run.spent.output_tokens += decision.output_tokens;
        run.spent.cost += tokens as f64 * self.price_per_1k_tokens / 1000.0;
        let detail = json!({
            "text": decision.text,
            "calls": decision.calls.iter().map(|(n, a)| json!({"name": n, "arguments": a})).collect::<Vec<_>>(),
        });
        if !decision.text.is_empty() || decision.calls.is_empty() {
            run.items.push(Item::Message {
                role: "assistant".into(),
                content: decision.text.clone(),
            });
        }
        for (name, arguments) in &decision.calls {
            run.items.push(Item::FunctionCall {
                call_id: new_id("call"),
                name: name.clone(),
                arguments: arguments.clone(),
            });
        }
        self.record(run, "decide", detail, tokens, t).await;
        if decision.calls.is_empty() {
            run.status = RunStatus::Completed;
            self.record(
                run,
                "finish",
                json!({"status": "completed"}),
                0,
                Instant::now(),
            )
            .await;
            return false;
        }
        true
    }

    /// Checks, and if it may, runs the open call `call_id`, adding its output (or an approval
    /// request) to the transcript. An error is a budget that ran out.
    async fn act(&self, run: &mut Run, call_id: &str) -> Result<(), StopReason> {
        let Some((_, name, arguments)) =
            (run.open_calls().into_iter()).find(|(id, _, _)| *id == call_id)
        else {
            return Ok(());
        };
        let (name, arguments) = (name.to_owned(), arguments.to_owned());
        let redacted = redact(&arguments);
        let run_id = run.id.clone();
        let audit = |verdict, detail: String, result_bytes, duration_ms| ToolAudit {
            run_id: run_id.clone(),
            call_id: call_id.to_owned(),
            tool: name.clone(),
            arguments: redacted.clone(),
            result_bytes,
            duration_ms,
            verdict,
            detail,
        };
        let t = Instant::now();
        let (approved, args) = match self.gate(run, call_id, &name, &arguments) {
            (Gate::Refuse(verdict, why), _) => {
                self.sink.audit(&audit(verdict, why.clone(), 0, 0)).await;
                let detail = json!({"call_id": call_id, "tool": name, "verdict": verdict.as_str(), "why": why});
                self.observe(run, call_id, format!("error: {why}"));
                self.record(run, "act", detail, 0, t).await;
                return Ok(());
            }
            (Gate::Ask(why), _) => {
                let id = new_id("apr");
                self.sink
                    .audit(&audit(Verdict::ApprovalRequested, why.clone(), 0, 0))
                    .await;
                run.items.push(Item::ApprovalRequest {
                    id: id.clone(),
                    call_id: call_id.to_owned(),
                    name: name.clone(),
                    arguments: redacted.clone(),
                    reason: why.clone(),
                });
                let detail = json!({"call_id": call_id, "tool": name, "approval_request_id": id, "why": why});
                self.record(run, "approval", detail, 0, t).await;
                return Ok(());
            }
            (Gate::Run { approved }, args) => (approved, args),
        };
        if approved {
            let why = "a person approved the call".to_owned();
            self.sink.audit(&audit(Verdict::Approved, why, 0, 0)).await;
        }
        if run.spent.tool_calls >= run.budget.tool_calls {
            return Err(StopReason::MaxToolCalls);
        }
        let Some(tool) = self.tools.get(&name).cloned() else {
            return Ok(());
        };
        run.spent.tool_calls += 1;
        run.spent.cost += tool.spec().cost;
        let result = loop {
            let left = run
                .budget
                .wall_time()
                .saturating_sub(run.spent.working + t.elapsed());
            let limit = tool.spec().timeout.min(left);
            let call = tracing::Instrument::instrument(
                tool.call(args.clone()),
                tracing::info_span!("tool", tool = %name, attempt = run.spent.retries),
            );
            let outcome = match tokio::time::timeout(limit, call).await {
                Ok(r) => r,
                Err(_) if limit < tool.spec().timeout => {
                    run.spent.working += t.elapsed();
                    return Err(StopReason::MaxWallTime);
                }
                Err(_) => Err(ToolError::transient(format!(
                    "`{name}` did not answer within {:.1} s",
                    limit.as_secs_f64()
                ))),
            };
            match outcome {
                Err(e) if e.retryable && run.spent.retries < run.budget.retries => {
                    run.spent.retries += 1;
                    let ms = t.elapsed().as_millis() as u64;
                    self.sink
                        .audit(&audit(Verdict::Retried, e.message, 0, ms))
                        .await;
                    tokio::time::sleep(Duration::from_millis(50 << run.spent.retries.min(4))).await;
                }
                other => break other,
            }
        };
        let duration_ms = t.elapsed().as_millis() as u64;
        run.spent.working += t.elapsed();
        let (verdict, why, output, bytes) = match result {
            Err(e) => (
                Verdict::Failed,
                e.message.clone(),
                format!("error: {}", e.message),
                0,
            ),
            Ok(text) => {
                let bytes = text.len();
                let (verdict, why, text) = self.screen_result(text);
                (verdict, why, cap(text), bytes)
            }
        };
        self.sink
            .audit(&audit(verdict, why.clone(), bytes, duration_ms))
            .await;
        let act = json!({"call_id": call_id, "tool": name, "arguments": redacted, "verdict": verdict.as_str(), "why": why, "duration_ms": duration_ms});
        self.record(run, "act", act, 0, t).await;
        let observed = json!({"call_id": call_id, "result_bytes": bytes, "output": output});
        self.observe(run, call_id, output);
        self.record(run, "observe", observed, 0, Instant::now())
            .await;
        Ok(())
    }

    /// The checks before a call, in order: the tool exists, its arguments parse and fit its
    /// schema, the caller holds its scopes, the policy lets its arguments through, and, for a
    /// destructive or flagged call, a person approved it.
    fn gate(&self, run: &Run, call_id: &str, name: &str, arguments: &str) -> (Gate, Value) {
        let refuse = |v, why: String| (Gate::Refuse(v, why), Value::Null);
        let Some(tool) = self.tools.get(name) else {
            return refuse(
                Verdict::UnknownTool,
                format!("there is no tool named `{name}`"),
            );
        };
        let spec = tool.spec();
        let args: Value = match serde_json::from_str(arguments) {
            Ok(v) => v,
            Err(e) => {
                return refuse(
                    Verdict::InvalidArguments,
                    format!("the arguments are not JSON: {e}"),
                );
            }
        };
        if let Err(why) = check_schema(&spec.parameters, &args) {
            return refuse(
                Verdict::InvalidArguments,
                format!("the arguments do not fit `{name}`: {why}"),
            );
        }
        let missing = self.grant.missing(spec.scopes);
        if !missing.is_empty() {
            let names: Vec<&str> = missing.iter().map(|s| s.as_str()).collect();
            let why = format!(
                "`{name}` needs the scope(s) {} , which this caller is not granted",
                names.join(", ")
            );
            return refuse(Verdict::Denied, why);
        }
        let flagged = match self
            .policy
            .as_deref()
            .map(|p| p.check(arguments, Source::Model))
        {
            Some(v) if v.action == Action::Block => {
                let rules: Vec<&str> = v.findings.iter().map(|(f, _)| f.rule).collect();
                let why = format!("the policy blocks these arguments ({})", rules.join(", "));
                return refuse(Verdict::Blocked, why);
            }
            Some(v) if v.action > Action::Allow => {
                let rules: Vec<&str> = v.findings.iter().map(|(f, _)| f.rule).collect();
                Some(format!("its arguments were flagged ({})", rules.join(", ")))
            }
            _ => None,
        };
        let why = match (
            spec.scopes.contains(Scope::Destructive),
            spec.require_approval,
            flagged,
        ) {
            (_, _, Some(f)) => Some(f),
            (true, _, _) => Some(format!("`{name}` is destructive")),
            (_, true, _) => Some(format!("every call of `{name}` needs approval")),
            _ => None,
        };
        match (why, run.approval_of(call_id)) {
            (None, _) => (Gate::Run { approved: false }, args),
            (Some(_), Some((_, Some(true)))) => (Gate::Run { approved: true }, args),
            (Some(_), Some((request, Some(false)))) => {
                let reason = run.items.iter().find_map(|i| match i {
                    Item::ApprovalResponse {
                        approval_request_id,
                        reason,
                        ..
                    } if approval_request_id == request => reason.clone(),
                    _ => None,
                });
                let why = match reason {
                    Some(r) => format!("the call was rejected by its approver: {r}"),
                    None => "the call was rejected by its approver".to_owned(),
                };
                refuse(Verdict::Rejected, why)
            }
            (Some(why), _) => (Gate::Ask(why), args),
        }
    }

    /// A result as the model may read it: withheld when the policy finds it would steer the
    /// model (an indirect injection), PII redacted when the policy says so.
    fn screen_result(&self, text: String) -> (Verdict, String, String) {
        let ran = Verdict::Allowed;
        let Some(policy) = self.policy.as_deref() else {
            return (ran, String::new(), text);
        };
        let verdict = policy.check(&text, Source::Untrusted);
        let rules = || {
            let r: Vec<&str> = verdict.findings.iter().map(|(f, _)| f.rule).collect();
            r.join(", ")
        };
        match verdict.action {
            Action::Block => {
                let why = format!(
                    "the result looks like instructions to the model ({})",
                    rules()
                );
                let shown = format!("[the tool's result was withheld: {why}]");
                (Verdict::Withheld, why, shown)
            }
            Action::Redact => {
                let redacted = redact(&text);
                (ran, format!("redacted ({})", rules()), redacted)
            }
            Action::Flag => (ran, format!("flagged ({})", rules()), text),
            Action::Allow => (ran, String::new(), text),
        }
    }

    fn observe(&self, run: &mut Run, call_id: &str, output: String) {
        run.items.push(Item::FunctionCallOutput {
            call_id: call_id.to_owned(),
            output,
        });
    }

    async fn pause(&self, run: &mut Run, status: RunStatus) {
        run.status = status;
        let open: Vec<&str> = run.open_calls().into_iter().map(|(id, _, _)| id).collect();
        let detail = json!({"status": status.as_str(), "waiting": open});
        self.record(run, "finish", detail, 0, Instant::now()).await;
    }

    async fn stop(&self, run: &mut Run, reason: StopReason) {
        run.status = RunStatus::Incomplete;
        run.stop_reason = Some(reason);
        let detail = json!({"status": "incomplete", "stop_reason": reason.as_str()});
        self.record(run, "finish", detail, 0, Instant::now()).await;
    }

    async fn record(&self, run: &mut Run, kind: &str, detail: Value, tokens: u64, since: Instant) {
        run.steps += 1;
        let step = Step {
            n: run.steps,
            kind: kind.to_owned(),
            detail,
            tokens,
            duration_ms: since.elapsed().as_millis() as u64,
        };
        self.sink.step(run, &step).await;
    }
}

/// `text` with PII replaced by typed placeholders (for the audit log, approvers, and results
/// the policy redacts).
fn redact(text: &str) -> String {
    Redactor::default().redact(text, None)
}

/// Checks `args` against a tool's JSON schema; the error says where it fails.
fn check_schema(schema: &Value, args: &Value) -> Result<(), String> {
    let validator = jsonschema::validator_for(schema).map_err(|e| format!("bad schema: {e}"))?;
    let errors: Vec<String> = (validator.iter_errors(args).take(3))
        .map(|e| match e.instance_path().to_string() {
            at if at.is_empty() => e.to_string(),
            at => format!("{e} (at `{at}`)"),
        })
        .collect();
    match errors.is_empty() {
        true => Ok(()),
        false => Err(errors.join("; ")),
    }
}

/// A result cut to [`MAX_RESULT_BYTES`] on a character boundary, saying so.
fn cap(mut text: String) -> String {
    if text.len() <= MAX_RESULT_BYTES {
        return text;
    }
    let mut end = MAX_RESULT_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let total = text.len();
    text.truncate(end);
    text.push_str(&format!("\n[cut: {total} bytes in all]"));
    text
}

/// A fresh id with `prefix` (`call_…`, `apr_…`, `resp_…`).
pub fn new_id(prefix: &str) -> String {
    format!("{prefix}_{:024x}", rand::random::<u128>() >> 32)
}
