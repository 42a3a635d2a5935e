//! Starting, resuming and showing runs, for a server ([`Host`]) that supplies the model, the
//! `file_search` tool, the safety policy and the store.
//!
//! A run is stored before its first step and saved with every step after, so it can be read
//! while it works and resumed after a pause by any replica. It is driven on a task of its
//! own: a client that disconnects does not cut a run off between a tool call and its record.
//! Resuming a paused run first claims it in the store (`requires_approval` → `in_progress`),
//! so two approvals cannot both run it.

use std::sync::Arc;

use futures_util::future::BoxFuture;
use osprey_core::{Error, ErrorKind};
use osprey_policy::pipeline::Pipeline;
use osprey_store::{Owner, RunRecord, Store};
use serde_json::{Value, json};
use tokio::sync::mpsc::UnboundedReceiver;

use super::{Agents, ResponsesRequest, RunCaller, RunEvent, Shown, StoreSink, response_object};
use crate::orchestrator::new_id;
use crate::{Item, Model, Orchestrator, Run, RunStatus, ToolSet};

/// Most output tokens of one decision when the request does not say.
const DEFAULT_STEP_TOKENS: u32 = 512;

/// What a run needs of the server it runs in.
pub trait Host: Send + Sync {
    /// Where runs are kept.
    fn store(&self) -> Result<&Store, Error>;
    /// An error unless `model` is served here.
    fn serves(&self, model: &str) -> Result<(), Error>;
    /// The model deciding `caller`'s run: `model`, sampled at `temperature`, at most
    /// `max_tokens` a decision.
    fn model(
        &self,
        caller: &RunCaller,
        model: &str,
        temperature: f32,
        max_tokens: u32,
    ) -> Arc<dyn Model>;
    /// The tools a request's `tools` name, for `caller` (`file_search` over their
    /// collections).
    fn toolset<'a>(
        &'a self,
        agents: &'a Agents,
        caller: &'a RunCaller,
        tools: &'a [Value],
    ) -> BoxFuture<'a, Result<ToolSet, Error>>;
    /// The safety policy screening `caller`'s tool calls, if any.
    fn policy(&self, caller: &RunCaller) -> Option<Arc<Pipeline>>;
}

/// A stored run, read back.
pub struct Stored {
    /// As stored.
    pub record: RunRecord,
    /// Its state.
    pub run: Run,
    /// The request that started it.
    pub request: ResponsesRequest,
    /// Who started it.
    pub caller: RunCaller,
}

/// What driving a run gave: its events as they happen (a streamed request), or its response
/// object once it ended or paused, with the model tokens it spent.
pub enum Driven {
    /// The run's events; the run goes on whether or not they are read.
    Events(UnboundedReceiver<RunEvent>),
    /// The response object.
    Done {
        /// The run, shown.
        response: Value,
        /// Model tokens spent.
        tokens: u64,
    },
}

/// Reads run `id` from `store` as `owner` sees it (`None`: the admin).
pub async fn load(store: &Store, owner: Option<&Owner>, id: &str) -> Result<Stored, Error> {
    let record = store.run(owner, id).await.map_err(|e| match e {
        osprey_store::StoreError::NotFound(_) => {
            Error::new(ErrorKind::NotFound, format!("No response {id}."))
                .with_code("response_not_found")
        }
        e => Error::from(e),
    })?;
    let broken =
        |what: &str| Error::internal(format!("run {id}: its stored {what} does not parse"));
    let run: Run = serde_json::from_str(&record.state).map_err(|_| broken("state"))?;
    let stored: Value = serde_json::from_str(&record.request).map_err(|_| broken("request"))?;
    let request = serde_json::from_value(stored["body"].clone()).map_err(|_| broken("request"))?;
    let caller = serde_json::from_value(stored["caller"].clone()).map_err(|_| broken("caller"))?;
    Ok(Stored {
        record,
        run,
        request,
        caller,
    })
}

/// The response object of a stored run (`agents` names the MCP servers of its calls).
pub fn show(agents: Option<&Agents>, stored: &Stored) -> Value {
    render(
        agents,
        &stored.record,
        stored.request.metadata.as_ref(),
        &stored.run,
    )
}

/// `run` (stored as `record`) as a response object.
fn render(
    agents: Option<&Agents>,
    record: &RunRecord,
    metadata: Option<&Value>,
    run: &Run,
) -> Value {
    let server_of = |name: &str| agents.and_then(|a| a.server_of(name));
    response_object(
        run,
        &Shown {
            model: &record.model,
            created_at: record.created_at / 1000,
            previous_response_id: record.previous_id.as_deref(),
            metadata,
            server_of: &server_of,
        },
    )
}

/// Starts a run of `request` (as it came: `body`) for `caller` (a replay of `replay_of`, if
/// given), and drives it.
pub async fn start(
    host: &dyn Host,
    agents: &Arc<Agents>,
    caller: RunCaller,
    request: ResponsesRequest,
    body: Value,
    replay_of: Option<String>,
) -> Result<Driven, Error> {
    host.serves(&request.model)?;
    let input = request.parse_input()?;
    let owner = Owner {
        tenant: caller.tenant.clone(),
        user: caller.user.clone(),
    };
    let mut items = Vec::new();
    if let Some(prev) = &request.previous_response_id {
        let previous = load(host.store()?, Some(&owner), prev).await?;
        if previous.run.status == RunStatus::InProgress {
            return Err(Error::invalid(
                "previous_response_id",
                format!("response {prev} is still in progress"),
            ));
        }
        // Instructions apply to one response: the previous one's are not carried over.
        items.extend(
            (previous.run.items.into_iter())
                .filter(|i| !matches!(i, Item::Message { role, .. } if role == "system")),
        );
    }
    items.extend(input.messages);
    let budget = agents.budget(
        request.osprey.as_ref().and_then(|o| o.budget.as_ref()),
        request.max_tool_calls,
    )?;
    let mut run = Run::new(new_id("resp"), items, budget, request.tool_mode()?);
    for (call_id, output) in &input.outputs {
        run.add_client_output(call_id, output.clone())
            .map_err(|e| Error::invalid("input", e))?;
    }
    for (id, approve, reason) in &input.approvals {
        run.answer_approval(id, *approve, reason.clone())
            .map_err(|e| Error::invalid("input", e))?;
    }
    run.input_items = run.items.len();
    let now = osprey_store::now_ms();
    let record = RunRecord {
        id: run.id.clone(),
        tenant: owner.tenant.clone(),
        user_id: owner.user.clone(),
        key_id: caller.key_id.clone(),
        model: request.model.clone(),
        status: run.status.as_str().to_owned(),
        request: json!({"body": body, "caller": caller}).to_string(),
        state: serde_json::to_string(&run).unwrap_or_default(),
        previous_id: request.previous_response_id.clone(),
        replay_of,
        created_at: now,
        updated_at: now,
    };
    // The tools are set up (MCP servers listed) before the run is stored, so a request naming
    // a tool that is not there leaves nothing behind.
    let tools = host.toolset(agents, &caller, &request.tools).await?;
    host.store()?.create_run(&record).await?;
    let stored = Stored {
        record,
        run,
        request,
        caller,
    };
    drive(host, agents, stored, tools).await
}

/// Answers approval request `approval` (the run's only pending one when `None`) of a run
/// paused for approval, and drives it on (never streamed).
pub async fn resume(
    host: &dyn Host,
    agents: &Arc<Agents>,
    mut stored: Stored,
    approval: Option<&str>,
    approve: bool,
    reason: Option<String>,
) -> Result<Driven, Error> {
    let pending: Vec<String> = (stored.run.items.iter())
        .filter_map(|i| match i {
            Item::ApprovalRequest { id, call_id, .. }
                if stored
                    .run
                    .approval_of(call_id)
                    .is_some_and(|(_, a)| a.is_none()) =>
            {
                Some(id.clone())
            }
            _ => None,
        })
        .collect();
    let run_id = stored.run.id.clone();
    let not_waiting = |what: &str| {
        Error::new(
            ErrorKind::InvalidRequest,
            format!("response {run_id} is not waiting for {what}"),
        )
        .with_code("not_awaiting_approval")
    };
    let id = match (approval, pending.as_slice()) {
        (Some(id), _) => id.to_owned(),
        (None, [only]) => only.clone(),
        (None, []) => return Err(not_waiting("an approval")),
        (None, _) => {
            return Err(Error::invalid(
                "approval_request_id",
                format!("response {run_id} waits for several approvals: name one"),
            ));
        }
    };
    stored
        .run
        .answer_approval(&id, approve, reason)
        .map_err(|e| Error::invalid("approval_request_id", e))?;
    let claimed = host
        .store()?
        .claim_run(&stored.run.id, RunStatus::RequiresApproval.as_str())
        .await?;
    if !claimed {
        return Err(not_waiting("approval (any more)"));
    }
    let tools = host
        .toolset(agents, &stored.caller, &stored.request.tools)
        .await?;
    stored.request.stream = false;
    drive(host, agents, stored, tools).await
}

/// Runs `stored` on a task of its own until it ends or pauses.
async fn drive(
    host: &dyn Host,
    agents: &Arc<Agents>,
    stored: Stored,
    tools: ToolSet,
) -> Result<Driven, Error> {
    let request = &stored.request;
    let model = host.model(
        &stored.caller,
        &request.model,
        request.temperature.unwrap_or(0.0),
        request
            .max_output_tokens
            .unwrap_or(DEFAULT_STEP_TOKENS)
            .max(1),
    );
    let shown = (
        agents.clone(),
        stored.record.clone(),
        stored.request.metadata.clone(),
    );
    let render = Box::new(move |run: &Run| {
        let (agents, record, metadata) = &shown;
        render(Some(agents), record, metadata.as_ref(), run)
    });
    let sink = StoreSink::new(
        host.store()?.clone(),
        stored.caller.tenant.clone(),
        stored.caller.key_id.clone(),
        render,
    );
    let (events, sink) = match request.stream {
        true => {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<RunEvent>();
            (Some(rx), sink.streaming(tx, stored.run.output().len()))
        }
        false => (None, sink),
    };
    let sink = Arc::new(sink);
    let orchestrator = Orchestrator {
        model,
        tools,
        policy: host.policy(&stored.caller),
        grant: stored.caller.grant,
        sink: sink.clone(),
        price_per_1k_tokens: agents.config().price_per_1k_tokens,
    };
    let mut run = stored.run;
    let task = tokio::spawn(async move {
        let created = (sink.render)(&run);
        sink.send("response.created", json!({"response": created}));
        orchestrator.advance(&mut run).await;
        metrics::counter!(osprey_core::metrics::AGENT_RUNS, "status" => run.status.as_str())
            .increment(1);
        sink.send_end(&run);
        (run, sink)
    });
    match events {
        Some(rx) => Ok(Driven::Events(rx)),
        None => {
            let (run, sink) = task
                .await
                .map_err(|_| Error::internal("the run's task failed"))?;
            Ok(Driven::Done {
                response: (sink.render)(&run),
                tokens: run.spent.tokens,
            })
        }
    }
}
