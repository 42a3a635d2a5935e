//! Each stage of [`super::run`]: what it reads of the [`Prepared`] request, what it changes, and
//! what it hands to the way out.

use std::sync::Arc;

use axum::http::{HeaderMap, HeaderValue};
use axum::response::Response;
use osprey_context::memory::Context;
use osprey_context::registry::Applied;
use osprey_policy::pipeline::Pipeline;
use osprey_policy::redact::Redactor;
use osprey_store::Owner;
use tracing::Instrument;

use super::{Prepared, Routed, dispatch};
use crate::cache::{CacheKeep, ResponseCache};
use crate::error::ApiError;
use crate::rag::Citations;
use crate::replay::{self, Key};
use crate::safety::{Auditor, GuardOut};
use crate::semantic_cache::SIMILARITY_HEADER;
use crate::semantic_cache::Similar;
use crate::state::Services;
use crate::write::{Answered, Writer};
use osprey_core::Error;
use osprey_router::auto;
use osprey_router::degrade::DEGRADED;
use osprey_router::events::Source;
use osprey_router::upstream::{ROUTE_REASON, SERVED_BY, warrants_fallback};

/// What the body asks of the stages, read before any of them changes it.
pub(super) struct Asked {
    prompt: bool,
    context: bool,
    rag: bool,
}

impl Asked {
    pub(super) fn of(p: &Prepared) -> Self {
        let chat = p.is_chat();
        Self {
            prompt: chat && osprey_context::registry::named(&p.body),
            context: chat && osprey_context::memory::wanted(&p.body, &p.flags),
            rag: chat && osprey_context::retrieval::wanted(&p.body),
        }
    }

    /// The key of the request among the recent answers, if its answer can be given again: one
    /// given with a user's context, a label's prompt version, or passages retrieved now is not
    /// an answer to the body alone, and a stream is not kept.
    pub(super) fn recent_key(&self, p: &Prepared) -> Option<Key> {
        let personal = self.context || self.prompt || self.rag;
        let salt = &p.admitted.caller.tenant.cache_salt;
        (!p.body.streamed() && !personal).then(|| replay::key(salt, p.path, "", &p.body.bytes()))
    }
}

/// The safety policy a request was screened under, to filter its answer with.
pub(super) struct Guard {
    pipeline: Arc<Pipeline>,
    restore: Option<Arc<Redactor>>,
    auditor: Auditor,
}

impl Guard {
    /// Whether the answer gets values redacted from the caller's input put back.
    pub(super) fn restores(&self) -> bool {
        self.restore.is_some()
    }
}

/// Guard-in: screens the input under the tenant's policy (or the one its flags name),
/// redacting it in place.
pub(super) async fn guard_in(state: &Services, p: &mut Prepared) -> Result<Option<Guard>, Error> {
    let Some(policies) = state.policies() else {
        return Ok(None);
    };
    let caller = &p.admitted.caller;
    let flagged = osprey_store::tenant_flags::policy(&p.flags).filter(|name| policies.has(name));
    let pipeline = policies
        .get(flagged.or(caller.tenant.policy.as_deref()))
        .clone();
    let auditor = Auditor::new(state.audit_store(), pipeline.config().audit, caller);
    let screened = crate::safety::screen(state, &pipeline, &auditor, &mut p.body)
        .instrument(tracing::info_span!("guard.input"))
        .await?;
    Ok(Some(Guard {
        pipeline,
        restore: screened.restore,
        auditor,
    }))
}

/// Retrieve: puts passages from the collection the request names into its prompt.
pub(super) async fn retrieve(
    state: &Services,
    p: &mut Prepared,
    asked: &Asked,
    guard: Option<&Guard>,
) -> Result<Option<Citations>, Error> {
    if !asked.rag {
        return Ok(None);
    }
    let pipeline = guard.map(|g| g.pipeline.as_ref());
    let retrieved = crate::rag::augment(state, &p.admitted.caller, pipeline, &mut p.body).await?;
    Ok(Some(retrieved))
}

/// Prompt: applies the registered prompt the request names (retrieval may name one too).
pub(super) async fn prompt(
    state: &Services,
    p: &mut Prepared,
    asked: &Asked,
) -> Result<Option<Applied>, Error> {
    let named = asked.prompt || (asked.rag && osprey_context::registry::named(&p.body));
    if !named {
        return Ok(None);
    }
    let applied = crate::prompts::apply(state, &p.admitted.caller, &p.flags, &mut p.body)
        .instrument(tracing::info_span!("prompt"))
        .await?;
    Ok(Some(applied))
}

/// Memory: puts in the user's facts, scratchpad and conversation, each within its budget.
pub(super) async fn memory(
    state: &Services,
    p: &mut Prepared,
    asked: &Asked,
) -> Result<Option<Context>, Error> {
    if !asked.context {
        return Ok(None);
    }
    let context = crate::context::prepare(state, &p.admitted.caller, &p.flags, &mut p.body)
        .instrument(tracing::info_span!("memory"))
        .await?;
    Ok(Some(context))
}

/// The response cache's view of a request: where its answer is (or will be) kept, and the
/// answer it found.
pub(super) struct Lookup {
    cache: Option<Arc<ResponseCache>>,
    key: Option<Key>,
    owner: Option<Owner>,
    hit: Option<serde_json::Value>,
    similar: Option<Similar>,
}

impl Lookup {
    /// Looks the request up by its exact key, then (for tenants with the semantic cache) by
    /// meaning. A user's context makes the answer theirs: cached in their scope, and forgotten
    /// with them.
    pub(super) async fn new(state: &Services, p: &Prepared, context: Option<&Context>) -> Self {
        let owner = context.filter(|c| c.is_personal()).map(|c| c.owner.clone());
        let mut lookup = Self {
            cache: state.response_cache().cloned(),
            key: None,
            owner,
            hit: None,
            similar: None,
        };
        let Some(cache) = &lookup.cache else {
            return lookup;
        };
        let salt = &p.admitted.caller.tenant.cache_salt;
        let scope = match &lookup.owner {
            Some(o) => format!("{salt}\u{0}user\u{0}{}", o.user),
            None => salt.clone(),
        };
        lookup.key = crate::cache::key(&scope, p.path, p.body.value());
        let Some(key) = &lookup.key else {
            return lookup;
        };
        lookup.hit = cache.get(key).await;
        if let Some(threshold) = crate::semantic_cache::threshold(&p.flags)
            && lookup.hit.is_none()
            && p.is_chat()
        {
            lookup.similar =
                crate::semantic_cache::similar(state, &scope, p.path, p.body.value(), threshold)
                    .await;
        }
        lookup
    }

    /// The answer found, as typed events for the request's writer (which writes it under
    /// the kept id, streamed if the request asks for a stream), marked as a hit from the model
    /// that answered, with its similarity when it was found by meaning.
    pub(super) fn found<R: Routed>(&self, p: &Prepared) -> Result<Option<Answered>, Error> {
        let mut headers = HeaderMap::new();
        let answer = match (&self.hit, &self.similar, &self.cache) {
            (Some(answer), _, _) => answer.clone(),
            (None, Some(similar), Some(cache)) => match cache.similar(similar) {
                Some((answer, similarity)) => {
                    let similarity = format!("{similarity:.3}");
                    (HeaderValue::from_str(&similarity).ok())
                        .map(|v| headers.insert(SIMILARITY_HEADER, v));
                    Arc::unwrap_or_clone(answer)
                }
                None => return Ok(None),
            },
            _ => return Ok(None),
        };
        headers.insert(replay::CACHE, HeaderValue::from_static("hit"));
        let model = answer["model"]
            .as_str()
            .and_then(|m| HeaderValue::from_str(m).ok());
        model.map(|m| headers.insert(SERVED_BY, m));
        let asked = p.body.typed::<R>()?.asked();
        let writer = Writer::of(&asked)?.kept_as(&answer);
        let source = Source::of(asked.model(), &asked, 0)?;
        let events = osprey_router::events::whole(answer, source);
        Ok(Some(Answered {
            writer,
            events,
            headers,
        }))
    }

    /// Cache keep: the step keeping the answer under the request's key. A degraded answer
    /// (capped, a smaller tier) is not the answer to the request as asked, and is not kept.
    pub(super) fn keeper(self, level: u8) -> Option<CacheKeep> {
        match (self.cache, self.key) {
            (Some(cache), Some(key)) if level == 0 => {
                let slot = crate::cache::Slot {
                    key,
                    owner: self.owner,
                    similar: self.similar,
                };
                Some(CacheKeep::new(cache, slot))
            }
            _ => None,
        }
    }
}

/// What the backend stage answered.
pub(super) enum Answer {
    /// A new answer, to go out through every stage.
    Fresh(Answered),
    /// An answer given to the same request before, as it is (the service is degraded, or every
    /// backend failed).
    Recent(Response),
}

/// The degradation ladder, routing, and the backend: the ladder's actions at the request's
/// level ([`osprey_router::degrade::actions`]: answer from the recent answers, defer batch
/// work, cap the answer's length); `auto` picks its tier; then the request goes where its
/// model is served.
pub(super) async fn backend<R: Routed>(
    state: &Services,
    p: &mut Prepared,
    recent: Option<&Key>,
) -> Result<Answer, ApiError> {
    let level = p.level;
    let ladder = osprey_router::degrade::actions(level);
    if ladder.replay_recent
        && let Some(mut response) = recent_answer(state, recent, "degraded")
    {
        degraded(response.headers_mut(), level);
        return Ok(Answer::Recent(response));
    }
    if ladder.defer_batch && p.body.is_batch(p.admitted.caller.tenant.priority) {
        return Err(osprey_router::degrade::deferred().into());
    }
    if let Some(cap) = ladder.max_tokens {
        p.body.cap_max_tokens(cap);
    }
    let mut routed = match p.admitted.model.as_deref() {
        Some(auto::AUTO) => Some(tracing::info_span!("route").in_scope(|| {
            let tenant = &p.admitted.caller.tenant;
            let off = |tier: &str| osprey_store::tenant_flags::tier_off(&p.flags, tier);
            auto::route(
                state.tiers(),
                (tenant.models.as_deref(), off),
                &p.body,
                level,
            )
        })?),
        _ => None,
    };
    let span = tracing::info_span!(
        "backend",
        model = tracing::field::Empty,
        tier = tracing::field::Empty
    );
    let (mut admitted, mut body) = (p.admitted.clone(), std::mem::take(&mut p.body));
    let dispatched = match routed.as_mut() {
        Some(routed) => {
            span.record("model", routed.model.as_str());
            span.record("tier", routed.tier.as_str());
            body.set_model(&routed.model);
            admitted.model = Some(routed.model.clone());
            dispatch::checked::<R>(state, admitted, body, p.path, routed)
                .instrument(span)
                .await
        }
        None => {
            span.record("model", body.model());
            dispatch::dispatch::<R>(state, admitted, body, p.path)
                .instrument(span)
                .await
        }
    };
    let mut answered = match dispatched {
        Ok(answered) => answered,
        // The last step of every fallback chain: the answer given to this request before.
        Err(e) if warrants_fallback(&e.0) => match recent_answer(state, recent, "fallback") {
            Some(mut response) => {
                let why = format!("cached answer: {}", e.0.code.as_deref().unwrap_or("failed"));
                if let Ok(why) = HeaderValue::from_str(&why) {
                    response.headers_mut().insert(ROUTE_REASON, why);
                }
                degraded(response.headers_mut(), level);
                return Ok(Answer::Recent(response));
            }
            None => return Err(e),
        },
        Err(e) => return Err(e),
    };
    degraded(&mut answered.headers, level);
    if let Some(routed) = routed {
        routed.mark(&mut answered.headers, level);
    }
    Ok(Answer::Fresh(answered))
}

/// The answer given to the request before (`key`), if any, counted as given for `why`.
fn recent_answer(state: &Services, key: Option<&Key>, why: &'static str) -> Option<Response> {
    let answer = state.recent().get(key?)?;
    metrics::counter!(osprey_core::metrics::CACHED_ANSWERS, "why" => why).increment(1);
    let mut response = answer.marked(replay::CACHE, "hit");
    response.headers_mut().remove(DEGRADED);
    Some(response)
}

/// Marks an answer's `headers` degraded to `level`, if it was, and counts it.
fn degraded(headers: &mut HeaderMap, level: u8) {
    if level > 0 {
        metrics::counter!(osprey_core::metrics::DEGRADED, "level" => level.to_string())
            .increment(1);
        headers.insert(DEGRADED, HeaderValue::from(u16::from(level)));
    }
}

/// Guard-out: the step filtering the answer by the policy's output rules, with what guard-in
/// redacted put back (when the policy says so).
pub(super) fn guard_out(guard: Option<Guard>, whole: bool) -> Option<GuardOut> {
    let g = guard?;
    GuardOut::new(&g.pipeline, g.restore, g.auditor, whole)
}
