//! The backend stage: a request sent where its model is served (an upstream and its
//! fallbacks, a worker pool, or the local engine), and the answer check of `auto`.

use std::sync::Arc;

use axum::http::{HeaderMap, HeaderValue};
use futures_util::StreamExt;
use osprey_core::UsageReport;
use osprey_core::api::JsonBody;
use osprey_core::backend::{GenEvent, GenRequest, GenStream};

use super::Routed;
use crate::edge::{Admitted, Caller};
use crate::error::ApiError;
use crate::state::{ServedBy, Services};
use crate::write::Answered;
use osprey_router::auto;
use osprey_router::events::Source;
use osprey_router::fallback::{Fallback, Forwarded, RoutePlan};
use osprey_router::upstream::{ROUTE_REASON, SERVED_BY, Upstream};
use osprey_router::workers::SERVED_BY_WORKER;

/// Sends an `auto` request to its tier; with an answer check, asks a whole answer for
/// logprobs and, when the answer's mean token logprob is below the floor, asks the tier above
/// instead (`routed` then names that tier). The logprobs stay only if the client asked for them.
pub(super) async fn checked<R: Routed>(
    state: &Services,
    mut admitted: Admitted,
    mut body: JsonBody,
    path: &str,
    routed: &mut auto::AutoRoute,
) -> Result<Answered, ApiError> {
    let check = routed.check.take().filter(|_| !body.streamed());
    let Some(check) = check else {
        return dispatch::<R>(state, admitted, body, path).await;
    };
    let mut asking = body.clone();
    let asked = auto::ask_logprobs(&mut asking);
    let first = dispatch::<R>(state, admitted.clone(), asking, path).await?;
    let mut events: Vec<_> = first.events.collect().await;
    match auto::mean_logprob(&events) {
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
            let writer = match asked {
                true => first.writer,
                false => {
                    for event in &mut events {
                        if let Ok(GenEvent::Delta(delta)) = event {
                            delta.logprobs = None;
                        }
                    }
                    let typed = body.typed::<R>()?.asked();
                    crate::write::Writer::of(&typed)?
                }
            };
            Ok(Answered {
                writer,
                events: Box::pin(futures_util::stream::iter(events)),
                headers: first.headers,
            })
        }
    }
}

/// Sends a generation request where the model its body names is served: to an upstream (or
/// its fallbacks), a worker of the pool or the local engine: its answer, begun, with the
/// headers that say where it was served.
pub(super) async fn dispatch<R: Routed>(
    state: &Services,
    admitted: Admitted,
    mut body: JsonBody,
    path: &str,
) -> Result<Answered, ApiError> {
    let Admitted { caller, usage, .. } = admitted;
    // Typed in full first, so a malformed body is reported as such even when it also names an
    // unknown model.
    let mut asked = body.typed::<R>()?.asked();
    let mut writer = crate::write::Writer::of(&asked)?;
    let mut headers = HeaderMap::new();
    let mut mark = |name: &'static str, value: &str| {
        (HeaderValue::from_str(value).ok()).map(|v| headers.insert(name, v));
    };
    if let Ok(ServedBy::Upstream(upstream)) = state.served_by(asked.model()) {
        let plan = route_plan(state, &caller, upstream);
        let prompt = osprey_core::tokens::estimate_body(body.received_len()) as usize;
        let source = Source::of(asked.model(), &asked, prompt)?;
        let outgoing = crate::telemetry::outgoing();
        match plan.forward(path, &body, source, outgoing).await? {
            Forwarded::Answered { by, events, why } => {
                mark(SERVED_BY, &by);
                why.inspect(|why| mark(ROUTE_REASON, why));
                let events = usage_reported(events, usage);
                return Ok(Answered {
                    writer,
                    events,
                    headers,
                });
            }
            Forwarded::Here { name, why } => {
                body.set_model(&name);
                mark(ROUTE_REASON, &why);
                asked = body.typed::<R>()?.asked();
                writer = crate::write::Writer::of(&asked)?;
            }
        }
    }
    let served = state.served_by(asked.model());
    let whole = !asked.sampling().streaming();
    let tenant = &caller.tenant;
    let request = GenRequest {
        priority: caller.priority_of(asked.osprey()),
        cache_salt: tenant.cache_salt.clone(),
        asked,
        body,
    };
    match served {
        Ok(ServedBy::Pool(pool)) => {
            let outgoing = crate::telemetry::outgoing();
            let (worker, events) = pool.generate_with(request, outgoing).await?;
            mark(SERVED_BY, pool.name());
            mark(SERVED_BY_WORKER, &worker);
            let events = usage_reported(events, usage);
            Ok(Answered {
                writer,
                events,
                headers,
            })
        }
        _ => {
            let model = request.asked.model();
            if state.is_local(model) {
                mark(SERVED_BY, model);
            }
            let mut answered = crate::local::serve(state, &caller, usage, request, writer).await?;
            answered.headers.extend(headers);
            if whole {
                // Read to its end here, so that one failing halfway is this stage's error.
                answered.events = osprey_router::events::to_end(answered.events).await?;
            }
            Ok(answered)
        }
    }
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
