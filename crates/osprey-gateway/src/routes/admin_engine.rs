//! The local engine's scheduler, behind the admin key: `GET /admin/scheduler` shows the policy
//! in force and what it has done (deferrals, the expert load of an MoE model's steps);
//! `PUT /admin/scheduler` with `{"policy": "priority" | "fcfs" | "kda"}` switches it while the
//! server runs, from the engine's next step on. With several local models, `?model=NAME` picks
//! the engine (default: the first model's).

use axum::Json;
use axum::Router;
use axum::extract::{Query, State};
use axum::routing::get;
use osprey_core::{Error, ErrorKind};
use osprey_engine::{Engine, SchedulingPolicy};
use serde::Deserialize;
use serde_json::{Value, json};

use osprey_services::error::ApiError;
use osprey_services::state::Services;

pub fn routes() -> Router<Services> {
    Router::new().route("/admin/scheduler", get(show).put(switch))
}

/// Which local model's engine (`?model=NAME`; default: the first).
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
struct Which {
    /// A local model's name.
    model: Option<String>,
}

fn engine(state: &Services, which: &Which) -> Result<Engine, ApiError> {
    if let Some(model) = &which.model {
        return state.engine_for(model).map_err(ApiError);
    }
    state.engine().cloned().ok_or_else(|| {
        ApiError(Error::new(
            ErrorKind::NotFound,
            "This server runs no engine of its own (or it is still loading).",
        ))
    })
}

fn view(engine: &Engine) -> Value {
    let stats = engine.stats();
    let routing = stats.routing();
    let mean = |sum: f64| (routing.steps > 0).then(|| sum / routing.steps as f64);
    json!({
        "object": "scheduler",
        "policy": stats.policy().as_str(),
        "policies": ["priority", "fcfs", "kda"],
        "preemptions": stats.preemptions(),
        "deferrals": stats.deferrals(),
        "moe_steps": routing.steps,
        "mean_expert_load_imbalance": mean(routing.imbalance),
        "mean_experts_active": mean(routing.active_experts),
    })
}

/// The local engine's scheduling policy and what it has done.
#[utoipa::path(
    get,
    path = "/admin/scheduler",
    tag = "admin",
    operation_id = "getScheduler",
    params(Which),
    responses(
        (status = 200, description = "The scheduler (`policy`, `policies`, `preemptions`, \
            `deferrals`, the expert load of MoE steps)", body = Object),
        (status = 404, response = crate::openapi::NotFound),
        crate::openapi::AdminErrors,
    ),
    security(("admin_key" = []))
)]
async fn show(
    State(state): State<Services>,
    Query(which): Query<Which>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(view(&engine(&state, &which)?)))
}

/// The policy to switch to.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct Switch {
    /// `priority`, `fcfs` or `kda`.
    policy: String,
}

/// Switches the scheduling policy, from the engine's next step on.
#[utoipa::path(
    put,
    path = "/admin/scheduler",
    tag = "admin",
    operation_id = "setScheduler",
    params(Which),
    request_body = Switch,
    responses(
        (status = 200, description = "The scheduler", body = Object),
        (status = 400, response = crate::openapi::InvalidRequest),
        (status = 404, response = crate::openapi::NotFound),
        crate::openapi::AdminErrors,
    ),
    security(("admin_key" = []))
)]
async fn switch(
    State(state): State<Services>,
    Query(which): Query<Which>,
    body: axum::body::Bytes,
) -> Result<Json<Value>, ApiError> {
    let req: Switch = serde_json::from_slice(&body)
        .map_err(|e| Error::invalid("body", format!("Invalid scheduler request: {e}")))?;
    let policy = SchedulingPolicy::parse(&req.policy).ok_or_else(|| {
        Error::invalid(
            "policy",
            format!(
                "Unknown policy `{}`: use priority, fcfs or kda.",
                req.policy
            ),
        )
    })?;
    let engine = engine(&state, &which)?;
    engine.set_scheduling_policy(policy)?;
    Ok(Json(view(&engine)))
}
