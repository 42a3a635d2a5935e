//! Starting, resuming and showing runs: what the Responses API routes and the admin routes
//! share.
//!
//! A run is stored before its first step and saved with every step after, so it can be read
//! while it works and resumed after a pause by any replica. It is driven on a task of its
//! own: a client that disconnects does not cut a run off between a tool call and its record.
//! Resuming a paused run first claims it in the store (`requires_approval` → `in_progress`),
//! so two approvals cannot both run it.

use std::sync::Arc;

use axum::Json;
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use osprey_agent::orchestrator::new_id;
use osprey_agent::{Item, Orchestrator, Run, RunStatus};
use osprey_core::{Error, ErrorKind};
use osprey_store::{Owner, RunRecord};
use serde_json::{Value, json};

use super::model::ServedModel;
use crate::edge::Caller;
use crate::state::Services;
use osprey_agent::responses::{
    Agents, ResponsesRequest, RunCaller, RunEvent, Shown, StoreSink, response_object,
};

/// Most output tokens of one decision when the request does not say.
const DEFAULT_STEP_TOKENS: u32 = 512;

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

fn store(state: &Services) -> Result<&osprey_store::Store, Error> {
    state
        .store()
        .ok_or_else(|| Error::new(ErrorKind::Unavailable, "Agent runs need a store (--store)."))
}

/// Reads run `id` as `owner` sees it (`None`: the admin).
pub async fn load(state: &Services, owner: Option<&Owner>, id: &str) -> Result<Stored, Error> {
    let record = store(state)?.run(owner, id).await.map_err(|e| match e {
        osprey_store::StoreError::NotFound(_) => {
            Error::new(ErrorKind::NotFound, format!("No response {id}."))
                .with_code("response_not_found")
        }
        e => osprey_core::Error::from(e),
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

/// The response object of a stored run.
pub fn show(state: &Services, stored: &Stored) -> Value {
    render(
        state,
        &stored.record,
        stored.request.metadata.as_ref(),
        &stored.run,
    )
}

/// `run` (stored as `record`) as a response object.
fn render(state: &Services, record: &RunRecord, metadata: Option<&Value>, run: &Run) -> Value {
    let agents = state.agents().ok();
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

/// Starts a run of `request` for `caller` (a replay of `replay_of`, if given): the response
/// once it ends or pauses, or its events as they happen.
pub async fn start(
    state: &Services,
    caller: &Caller,
    request: ResponsesRequest,
    body: Value,
    replay_of: Option<String>,
) -> Result<(Response, u64), Error> {
    let agents = state.agents()?.clone();
    state.served_by(&request.model)?;
    let input = request.parse_input()?;
    let owner = caller.owner(None);
    let mut items = Vec::new();
    if let Some(prev) = &request.previous_response_id {
        let previous = load(state, Some(&owner), prev).await?;
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
    let run_caller = RunCaller {
        tenant: owner.tenant.clone(),
        key_id: caller.key_id.clone(),
        user: owner.user.clone(),
        groups: caller.groups.clone(),
        grant: super::grant(&agents, caller)?,
    };
    let now = osprey_store::now_ms();
    let record = RunRecord {
        id: run.id.clone(),
        tenant: owner.tenant.clone(),
        user_id: owner.user.clone(),
        key_id: caller.key_id.clone(),
        model: request.model.clone(),
        status: run.status.as_str().to_owned(),
        request: json!({"body": body, "caller": run_caller}).to_string(),
        state: serde_json::to_string(&run).unwrap_or_default(),
        previous_id: request.previous_response_id.clone(),
        replay_of,
        created_at: now,
        updated_at: now,
    };
    // The tools are set up (MCP servers listed) before the run is stored, so a request naming
    // a tool that is not there leaves nothing behind.
    let tools = super::toolset(&agents, state, caller, &request.tools).await?;
    store(state)?
        .create_run(&record)
        .await
        .map_err(osprey_core::Error::from)?;
    let stored = Stored {
        record,
        run,
        request,
        caller: run_caller,
    };
    drive(state, &agents, stored, tools).await
}

/// Answers approval request `approval` (the run's only pending one when `None`) of a run
/// paused for approval, and drives it on.
pub async fn resume(
    state: &Services,
    mut stored: Stored,
    approval: Option<&str>,
    approve: bool,
    reason: Option<String>,
) -> Result<(Response, u64), Error> {
    let agents = state.agents()?.clone();
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
    let id = match (approval, pending.as_slice()) {
        (Some(id), _) => id.to_owned(),
        (None, [only]) => only.clone(),
        (None, []) => {
            return Err(Error::new(
                ErrorKind::InvalidRequest,
                format!("response {} is not waiting for an approval", stored.run.id),
            )
            .with_code("not_awaiting_approval"));
        }
        (None, _) => {
            return Err(Error::invalid(
                "approval_request_id",
                format!(
                    "response {} waits for several approvals: name one",
                    stored.run.id
                ),
            ));
        }
    };
    stored
        .run
        .answer_approval(&id, approve, reason)
        .map_err(|e| Error::invalid("approval_request_id", e))?;
    let claimed = store(state)?
        .claim_run(&stored.run.id, RunStatus::RequiresApproval.as_str())
        .await
        .map_err(osprey_core::Error::from)?;
    if !claimed {
        return Err(Error::new(
            ErrorKind::InvalidRequest,
            format!(
                "response {} is not waiting for approval (any more)",
                stored.run.id
            ),
        )
        .with_code("not_awaiting_approval"));
    }
    let caller = super::caller_of(state, &stored.caller);
    let tools = super::toolset(&agents, state, &caller, &stored.request.tools).await?;
    stored.request.stream = false;
    drive(state, &agents, stored, tools).await
}

/// Runs `stored` on a task of its own until it ends or pauses: its response object, or (for
/// a streamed request) its events. Also the model tokens it spent.
async fn drive(
    state: &Services,
    agents: &Arc<Agents>,
    stored: Stored,
    tools: osprey_agent::ToolSet,
) -> Result<(Response, u64), Error> {
    let caller = super::caller_of(state, &stored.caller);
    let policy = match state.policies() {
        Some(p) => Some(p.get(caller.tenant.policy.as_deref()).clone()),
        None => None,
    };
    let request = &stored.request;
    let model = ServedModel {
        state: state.clone(),
        caller: caller.clone(),
        model: request.model.clone(),
        temperature: request.temperature.unwrap_or(0.0),
        max_tokens: request
            .max_output_tokens
            .unwrap_or(DEFAULT_STEP_TOKENS)
            .max(1),
    };
    let shown = (
        state.clone(),
        stored.record.clone(),
        stored.request.metadata.clone(),
    );
    let render = Box::new(move |run: &Run| {
        let (state, record, metadata) = &shown;
        render(state, record, metadata.as_ref(), run)
    });
    let sink = StoreSink::new(
        store(state)?.clone(),
        caller.tenant.name.clone(),
        caller.key_id.clone(),
        render,
    );
    let (events, stream) = match request.stream {
        true => {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<RunEvent>();
            (Some(rx), Some(tx))
        }
        false => (None, None),
    };
    let sink = Arc::new(match stream {
        Some(tx) => sink.streaming(tx, stored.run.output().len()),
        None => sink,
    });
    let orchestrator = Orchestrator {
        model: Arc::new(model),
        tools,
        grant: stored.caller.grant,
        policy,
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
        Some(rx) => {
            let events = tokio_stream::wrappers::UnboundedReceiverStream::new(rx)
                .map(|e| Event::default().event(e.kind).data(e.data));
            Ok((crate::sse::stream_response(events), 0))
        }
        None => {
            let (run, sink) = task
                .await
                .map_err(|_| Error::internal("the run's task failed"))?;
            let tokens = run.spent.tokens;
            Ok((Json((sink.render)(&run)).into_response(), tokens))
        }
    }
}
