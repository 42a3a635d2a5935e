//! The backend stage: a request sent where its model is served (an upstream and its
//! fallbacks, a worker pool, or the local engine), and the answer check of `auto`.

use std::sync::Arc;

use axum::http::HeaderValue;
use axum::response::Response;
use futures_util::StreamExt;
use osprey_core::UsageReport;
use osprey_core::api::JsonBody;
use osprey_core::backend::{GenEvent, GenRequest, GenStream};

use super::Routed;
use crate::edge::{Admitted, Caller};
use crate::error::ApiError;
use crate::replay;
use crate::state::{ServedBy, Services};
use osprey_router::auto;
use osprey_router::events::Source;
use osprey_router::fallback::{Fallback, Forwarded, RoutePlan};
use osprey_router::upstream::{ROUTE_REASON, SERVED_BY, Upstream};
use osprey_router::workers::SERVED_BY_WORKER;

/// Sends an `auto` request to its tier; with an answer check, asks for logprobs and, when the
/// answer's mean token logprob is below the floor, asks the tier above instead (`routed` then
/// names that tier). The logprobs stay only if the client asked for them.
pub(super) async fn checked<R: Routed>(
    state: &Services,
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

/// Sends a generation request where the model its body names is served: to an upstream (or
/// its fallbacks), a worker of the pool or the local engine, whose events are written here.
pub(super) async fn dispatch<R: Routed>(
    state: &Services,
    admitted: Admitted,
    mut body: JsonBody,
    path: &str,
) -> Result<Response, ApiError> {
    let Admitted { caller, usage, .. } = admitted;
    // Typed in full first, so a malformed body is reported as such even when it also names an
    // unknown model.
    let mut asked = body.typed::<R>()?.asked();
    let mut writer = crate::write::Writer::of(&asked)?;
    let mut reason = None;
    if let Ok(ServedBy::Upstream(upstream)) = state.served_by(asked.model()) {
        let plan = route_plan(state, &caller, upstream);
        let prompt = osprey_core::tokens::estimate_body(body.received_len()) as usize;
        let source = Source::of(asked.model(), &asked, prompt)?;
        let headers = crate::telemetry::outgoing();
        match plan.forward(path, &body, source, headers).await? {
            Forwarded::Answered { by, events, why } => {
                let events = usage_reported(events, usage);
                let mut response = writer.answer(events).await?;
                let headers = response.headers_mut();
                (HeaderValue::from_str(&by).ok()).map(|v| headers.insert(SERVED_BY, v));
                let why = why.and_then(|r| HeaderValue::from_str(&r).ok());
                why.map(|v| headers.insert(ROUTE_REASON, v));
                return Ok(response);
            }
            Forwarded::Here { name, why } => {
                body.set_model(&name);
                reason = Some(why);
                asked = body.typed::<R>()?.asked();
                writer = crate::write::Writer::of(&asked)?;
            }
        }
    }
    let served = state.served_by(asked.model());
    let tenant = &caller.tenant;
    let request = GenRequest {
        priority: caller.priority_of(asked.osprey()),
        cache_salt: tenant.cache_salt.clone(),
        asked,
        body,
    };
    let mut response = match served {
        Ok(ServedBy::Pool(pool)) => {
            let headers = crate::telemetry::outgoing();
            let (worker, events) = pool.generate_with(request, headers).await?;
            let events = usage_reported(events, usage);
            let mut response = writer.answer(events).await?;
            let headers = response.headers_mut();
            (HeaderValue::from_str(pool.name()).ok()).map(|v| headers.insert(SERVED_BY, v));
            (HeaderValue::from_str(&worker).ok()).map(|v| headers.insert(SERVED_BY_WORKER, v));
            response
        }
        _ => {
            let served_by = (state.model_name()).and_then(|m| HeaderValue::from_str(m).ok());
            let mut response = crate::local::serve(state, &caller, usage, request, writer).await?;
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

/// `events`, whose usage goes to `usage` as it passes; if the answer ends without one (the
/// worker broke off, the client left), the tokens of its deltas so far.
fn usage_reported(events: GenStream, usage: Arc<UsageReport>) -> GenStream {
    let mut meter = Meter {
        usage,
        counted: 0,
        reported: false,
    };
    Box::pin(events.inspect(move |event| match event {
        Ok(GenEvent::Delta(d)) => meter.counted += d.tokens as u64,
        Ok(GenEvent::Usage(u)) => {
            meter.reported = true;
            (meter.usage).set(u.prompt_tokens as u64, u.completion_tokens as u64);
        }
        Err(_) => {}
    }))
}

/// Tokens of an answer seen so far, reported on drop unless its usage was.
struct Meter {
    usage: Arc<UsageReport>,
    counted: u64,
    reported: bool,
}

impl Drop for Meter {
    fn drop(&mut self) {
        if !self.reported {
            self.usage.set_completion_only(self.counted);
        }
    }
}

/// `upstream`'s plan: its fallbacks that serve now (not the local engine while it loads) and
/// that the caller's tenant may use.
fn route_plan(state: &Services, caller: &Caller, upstream: Arc<Upstream>) -> RoutePlan {
    let allowed =
        |m: &str| (caller.tenant.models.as_ref()).is_none_or(|ms| ms.iter().any(|a| a == m));
    let fallbacks = (upstream.fallbacks.iter())
        .filter(|name| allowed(name))
        .filter_map(|name| match state.served_by(name).ok()? {
            ServedBy::Upstream(fallback) => Some(Fallback::Upstream(fallback)),
            ServedBy::Local(_) | ServedBy::Pool(_) => Some(Fallback::Here(name.clone())),
        })
        .collect();
    RoutePlan {
        first: upstream,
        fallbacks,
    }
}
