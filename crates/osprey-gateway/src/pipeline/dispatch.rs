//! The backend stage: a request sent where its model is served (an upstream and its
//! fallbacks, a worker pool, or the local engine), and the answer check of `auto`.

use std::sync::Arc;

use axum::http::HeaderValue;
use axum::response::Response;
use osprey_core::api::JsonBody;

use super::Routed;
use crate::edge::{Admitted, Caller};
use crate::error::ApiError;
use crate::replay;
use crate::state::{AppState, Backend};
use osprey_core::UsageReport;
use osprey_router::auto;
use osprey_router::upstream::{ROUTE_REASON, SERVED_BY, Upstream, warrants_fallback};

/// Sends an `auto` request to its tier; with an answer check, asks for logprobs and, when the
/// answer's mean token logprob is below the floor, asks the tier above instead (`routed` then
/// names that tier). The logprobs stay only if the client asked for them.
pub(super) async fn checked<R: Routed>(
    state: &AppState,
    mut admitted: Admitted,
    mut body: JsonBody,
    path: &str,
    routed: &mut auto::AutoRoute,
) -> Result<Response, ApiError> {
    let Some(check) = routed.check.take() else {
        return dispatch::<R>(state, admitted, body, path).await;
    };
    let mut asking = body.clone();
    let asked = auto::ask_logprobs(&mut asking);
    let first = dispatch::<R>(state, admitted.clone(), asking, path).await?;
    if !first.status().is_success() {
        return Ok(first);
    }
    let answer = match replay::Answer::read(first).await {
        Ok(answer) => answer,
        Err(response) => return Ok(response),
    };
    let Some(mut json) = answer.json() else {
        return Ok(answer.response());
    };
    match auto::mean_logprob(&json) {
        Some(mean) if mean < check.floor => {
            metrics::counter!(osprey_core::metrics::AUTO_ANSWERS_ESCALATED, "from" => routed.tier.clone(), "to" => check.tier.clone())
                .increment(1);
            routed.reason.push_str(&format!(
                ", answer logprob {mean:.2} < {:.2}, escalated",
                check.floor
            ));
            body.set_model(&check.model);
            (routed.tier, routed.model) = (check.tier, check.model.clone());
            admitted.model = Some(check.model);
            dispatch::<R>(state, admitted, body, path).await
        }
        _ => {
            if !asked {
                auto::without_logprobs(&mut json);
            }
            Ok(answer.response_with(&json))
        }
    }
}

/// Sends a generation request where the model its body names is served: through an upstream
/// as it is (or to its fallbacks), to a worker of the pool, or typed for the local engine.
pub(super) async fn dispatch<R: Routed>(
    state: &AppState,
    admitted: Admitted,
    mut body: JsonBody,
    path: &str,
) -> Result<Response, ApiError> {
    let Admitted { caller, usage, .. } = admitted;
    let mut reason = None;
    if let Ok(Backend::Upstream(upstream)) = state.backend(body.model()) {
        match forward(state, &caller, upstream, path, &body, &usage).await? {
            Forwarded::Answered(response) => return Ok(response),
            Forwarded::ToLocal { name, why } => {
                body.set_model(&name);
                reason = Some(why);
            }
        }
    }
    // Anything else is typed in full first, so a malformed body is reported as such even
    // when it also names an unknown model.
    let request: R = body.typed()?;
    let mut response = match state.backend(request.model()) {
        Ok(Backend::Pool(pool)) => {
            let prompt = request.prompt_tokens(pool.prompter())?;
            let tenant = &caller.tenant;
            let sent = (tenant.cache_salt.as_str(), tenant.priority);
            let headers = crate::telemetry::outgoing();
            pool.forward((path, &body, &prompt), sent, usage, headers)
                .await?
        }
        _ => {
            let served_by = (state.model_name()).and_then(|m| HeaderValue::from_str(m).ok());
            let mut response = crate::local::serve(state, caller, usage, request.asked()).await?;
            if let Some(name) = served_by {
                response.headers_mut().insert(SERVED_BY, name);
            }
            response
        }
    };
    if let Some(why) = reason.and_then(|r| HeaderValue::from_str(&r).ok()) {
        response.headers_mut().insert(ROUTE_REASON, why);
    }
    Ok(response)
}

/// Where a request sent to an upstream ended up.
enum Forwarded {
    /// Answered by the upstream or one of its upstream fallbacks.
    Answered(Response),
    /// To be served by the local engine's model `name`, a fallback, for the reason `why`.
    ToLocal { name: String, why: String },
}

/// Forwards to `upstream`, and on a failure before the answer to its fallbacks in order (those
/// the tenant may use); a response from a fallback says so in `x-osprey-route-reason`.
async fn forward(
    state: &AppState,
    caller: &Caller,
    upstream: Arc<Upstream>,
    path: &str,
    body: &JsonBody,
    usage: &Arc<UsageReport>,
) -> Result<Forwarded, osprey_core::Error> {
    let error = match upstream
        .forward_with(path, body, usage.clone(), crate::telemetry::outgoing())
        .await
    {
        Ok(response) => return Ok(Forwarded::Answered(response)),
        Err(e) if warrants_fallback(&e) => e,
        Err(e) => return Err(e),
    };
    let why = format!(
        "fallback from {}: {}",
        upstream.name,
        error.code.as_deref().unwrap_or("failed")
    );
    let allowed =
        |m: &str| (caller.tenant.models.as_ref()).is_none_or(|ms| ms.iter().any(|a| a == m));
    for name in upstream.fallbacks.iter().filter(|m| allowed(m)) {
        let counted = || {
            metrics::counter!(osprey_core::metrics::FALLBACKS, "from" => upstream.name.clone(), "to" => name.clone())
                .increment(1);
        };
        let fallback = match state.backend(name) {
            Ok(Backend::Upstream(fallback)) => fallback,
            Ok(Backend::Local(_) | Backend::Pool(_)) => {
                counted();
                let name = name.clone();
                return Ok(Forwarded::ToLocal { name, why });
            }
            // Not serving (the local engine still loading): the next one.
            Err(_) => continue,
        };
        let mut renamed = body.clone();
        renamed.set_model(name);
        match fallback
            .forward_with(path, &renamed, usage.clone(), crate::telemetry::outgoing())
            .await
        {
            Ok(mut response) => {
                counted();
                if let Ok(v) = HeaderValue::from_str(&why) {
                    response.headers_mut().insert(ROUTE_REASON, v);
                }
                return Ok(Forwarded::Answered(response));
            }
            Err(e) if warrants_fallback(&e) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(error)
}
