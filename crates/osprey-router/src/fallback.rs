//! A request for a model an upstream serves, and where it goes when that upstream fails before
//! its answer: the upstream's fallbacks, in the order configured, each another upstream or the
//! model served here.
//!
//! The gateway builds a [`RoutePlan`] from what is serving now and what the tenant may use;
//! [`RoutePlan::forward`] walks it. Only failures another model might not have (the upstream
//! failed, timed out or was cut off: [`warrants_fallback`]) move on; a request the upstream
//! refused is the client's answer. An answer from a fallback says why in
//! [`ROUTE_REASON`](crate::upstream::ROUTE_REASON), and [`FALLBACKS`](names::FALLBACKS) counts
//! it.

use std::sync::Arc;

use axum::http::HeaderMap;
use osprey_core::Error;
use osprey_core::api::JsonBody;
use osprey_core::backend::GenStream;
use osprey_core::metrics as names;

use crate::events::Source;
use crate::upstream::{Upstream, warrants_fallback};

/// Where a fallback is served.
pub enum Fallback {
    /// By another upstream.
    Upstream(Arc<Upstream>),
    /// Here (the local engine or the worker pool), under this model name.
    Here(String),
}

/// A request's way through an upstream and its fallbacks.
pub struct RoutePlan {
    /// The upstream of the model the request names.
    pub first: Arc<Upstream>,
    /// Its fallbacks that serve now and that the tenant may use, in order.
    pub fallbacks: Vec<Fallback>,
}

/// Where a request sent along a [`RoutePlan`] ended up.
pub enum Forwarded {
    /// Answered by the first upstream or a fallback upstream.
    Answered {
        /// The model that answers, as served here.
        by: String,
        /// Its answer's events.
        events: GenStream,
        /// The route reason, for a fallback: which upstream failed, and how.
        why: Option<String>,
    },
    /// To be served here as model `name`, a fallback, for the reason `why`.
    Here {
        /// The model it is served as.
        name: String,
        /// The route reason: which upstream failed, and how.
        why: String,
    },
}

impl RoutePlan {
    /// Asks the first upstream for `body`'s answer (read as `source` says), and on a failure
    /// before the answer each fallback in turn (`body` renamed for it), sending `headers` with
    /// every request; the first upstream's error if every fallback fails too.
    pub async fn forward(
        &self,
        path: &str,
        body: &JsonBody,
        source: Source,
        headers: HeaderMap,
    ) -> Result<Forwarded, Error> {
        let first = &self.first;
        let ask = async |upstream: &Upstream, body: &JsonBody| {
            let source = Source {
                model: upstream.name.clone(),
                ..source.clone()
            };
            let events = upstream.answer(path, body, headers.clone(), source).await?;
            match body.streamed() {
                true => Ok(events),
                false => upstream.read_to_end(events, None).await,
            }
        };
        let error = match ask(first, body).await {
            Ok(events) => {
                let by = first.name.clone();
                let why = None;
                return Ok(Forwarded::Answered { by, events, why });
            }
            Err(e) if warrants_fallback(&e) => e,
            Err(e) => return Err(e),
        };
        let why = format!(
            "fallback from {}: {}",
            first.name,
            error.code.as_deref().unwrap_or("failed")
        );
        for fallback in &self.fallbacks {
            let to = match fallback {
                Fallback::Upstream(upstream) => &upstream.name,
                Fallback::Here(name) => name,
            };
            let counted = || {
                metrics::counter!(names::FALLBACKS, "from" => first.name.clone(), "to" => to.clone())
                    .increment(1);
            };
            let upstream = match fallback {
                Fallback::Upstream(upstream) => upstream,
                Fallback::Here(name) => {
                    counted();
                    let name = name.clone();
                    return Ok(Forwarded::Here { name, why });
                }
            };
            let mut renamed = body.clone();
            renamed.set_model(to);
            match ask(upstream, &renamed).await {
                Ok(events) => {
                    counted();
                    let (by, why) = (to.clone(), Some(why));
                    return Ok(Forwarded::Answered { by, events, why });
                }
                Err(e) if warrants_fallback(&e) => continue,
                Err(e) => return Err(e),
            }
        }
        Err(error)
    }
}
