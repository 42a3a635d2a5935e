//! Where a run's steps and audits go: the store (the run's state saved with each step, in one
//! transaction, so a stored run is always where its last step left it), metrics, and, for a
//! streamed run, server-sent events in the Responses API's vocabulary.

use std::sync::Mutex;

use futures_util::future::BoxFuture;
use osprey_store::{StepRecord, Store, ToolAuditRecord};
use serde_json::{Value, json};

use crate::{Run, RunSink, RunStatus, Step, ToolAudit};

/// One server-sent event of a streamed run: its name (`response.created`, …) and its JSON.
#[derive(Clone, Debug, PartialEq)]
pub struct RunEvent {
    /// The event's name, also its data's `type`.
    pub kind: String,
    /// The data, serialised.
    pub data: String,
}

/// A run's sink.
pub struct StoreSink {
    store: Store,
    tenant: String,
    key_id: Option<String>,
    /// Turns a run into its response object (and an item into its output shape).
    pub render: Box<dyn Fn(&Run) -> Value + Send + Sync>,
    stream: Option<StreamState>,
}

struct StreamState {
    events: tokio::sync::mpsc::UnboundedSender<RunEvent>,
    /// Output items already sent, and the events' sequence number.
    sent: Mutex<(usize, u64)>,
}

impl StoreSink {
    /// A sink saving to `store` for `tenant`'s key.
    pub fn new(
        store: Store,
        tenant: String,
        key_id: Option<String>,
        render: Box<dyn Fn(&Run) -> Value + Send + Sync>,
    ) -> Self {
        Self {
            store,
            tenant,
            key_id,
            render,
            stream: None,
        }
    }

    /// The same sink, also sending events to `events`; `already` output items were shown.
    pub fn streaming(
        mut self,
        events: tokio::sync::mpsc::UnboundedSender<RunEvent>,
        already: usize,
    ) -> Self {
        self.stream = Some(StreamState {
            events,
            sent: Mutex::new((already, 0)),
        });
        self
    }

    /// Sends event `kind` with `data` (its `type` and `sequence_number` added).
    pub fn send(&self, kind: &str, mut data: Value) {
        let Some(s) = &self.stream else {
            return;
        };
        let mut sent = s.sent.lock().unwrap_or_else(|e| e.into_inner());
        data["type"] = kind.into();
        data["sequence_number"] = sent.1.into();
        sent.1 += 1;
        let _ = s.events.send(RunEvent {
            kind: kind.to_owned(),
            data: data.to_string(),
        });
    }

    /// The events of the output items added since the last call.
    fn send_new_items(&self, run: &Run) {
        let Some(s) = &self.stream else {
            return;
        };
        let response = (self.render)(run);
        let output = response["output"].as_array().cloned().unwrap_or_default();
        let start = {
            let mut sent = s.sent.lock().unwrap_or_else(|e| e.into_inner());
            let start = sent.0;
            sent.0 = output.len();
            start
        };
        for (index, item) in output.iter().enumerate().skip(start) {
            self.send(
                "response.output_item.added",
                json!({"output_index": index, "item": item}),
            );
            if item["type"] == "message" {
                let text = item["content"][0]["text"].clone();
                let ids = json!({"item_id": item["id"], "output_index": index, "content_index": 0});
                let mut delta = ids.clone();
                delta["delta"] = text.clone();
                self.send("response.output_text.delta", delta);
                let mut done = ids;
                done["text"] = text;
                self.send("response.output_text.done", done);
            }
            if item["type"] == "function_call" {
                let delta = json!({"item_id": item["id"], "output_index": index, "delta": item["arguments"]});
                self.send("response.function_call_arguments.delta", delta);
            }
            self.send(
                "response.output_item.done",
                json!({"output_index": index, "item": item}),
            );
        }
    }

    /// The last event of a stream: the response as it ended or paused.
    pub fn send_end(&self, run: &Run) {
        let kind = match run.status {
            RunStatus::Completed => "response.completed",
            RunStatus::Incomplete => "response.incomplete",
            RunStatus::Failed => "response.failed",
            RunStatus::RequiresApproval => "response.requires_approval",
            RunStatus::RequiresAction => "response.requires_action",
            RunStatus::Cancelled => "response.cancelled",
            RunStatus::InProgress => "response.in_progress",
        };
        self.send(kind, json!({"response": (self.render)(run)}));
    }
}

impl RunSink for StoreSink {
    fn step<'a>(&'a self, run: &'a Run, step: &'a Step) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            metrics::counter!(osprey_core::metrics::AGENT_STEPS, "kind" => step.kind.clone())
                .increment(1);
            let record = StepRecord {
                n: step.n as i64,
                kind: step.kind.clone(),
                detail: step.detail.to_string(),
                tokens: step.tokens as i64,
                duration_ms: step.duration_ms as i64,
                at: 0,
            };
            let state = serde_json::to_string(run).unwrap_or_default();
            let saved = self
                .store
                .save_run_step(&run.id, run.status.as_str(), &state, Some(&record))
                .await;
            if let Err(e) = saved {
                tracing::error!(run = %run.id, error = %e, "saving a run's step failed");
            }
            self.send_new_items(run);
        })
    }

    fn audit<'a>(&'a self, record: &'a ToolAudit) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            metrics::counter!(osprey_core::metrics::TOOL_CALLS, "tool" => tool_label(&record.tool), "verdict" => record.verdict.as_str())
                .increment(1);
            let row = ToolAuditRecord {
                at: 0,
                tenant: self.tenant.clone(),
                key_id: self.key_id.clone(),
                run_id: record.run_id.clone(),
                call_id: record.call_id.clone(),
                tool: record.tool.clone(),
                arguments: record.arguments.clone(),
                result_bytes: record.result_bytes as i64,
                duration_ms: record.duration_ms as i64,
                verdict: record.verdict.as_str().to_owned(),
                detail: record.detail.clone(),
            };
            if let Err(e) = self.store.audit_tool_calls(&[row]).await {
                tracing::error!(run = %record.run_id, error = %e, "auditing a tool call failed");
            }
        })
    }
}

/// A tool's metric label, from a bounded set: built-ins by name, an MCP server's tools by the
/// server, anything else (operator modules, names the model made up) as `other`.
fn tool_label(tool: &str) -> String {
    const BUILTIN: [&str; 5] = [
        "calculator",
        "http_fetch",
        "sql_query",
        "wasm_exec",
        "file_search",
    ];
    match tool.split_once("__") {
        Some((server, _)) => format!("mcp:{server}"),
        None if BUILTIN.contains(&tool) => tool.to_owned(),
        None => "other".to_owned(),
    }
}
