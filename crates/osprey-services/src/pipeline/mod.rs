//! The stages a generation request passes, in order; [`run`] reads as their list.
//!
//! The body is parsed once, where it arrives (the edge, or the handler of a route without
//! one), into a [`JsonBody`]. Every stage reads and changes that one value, held with the
//! caller, the tenant's flags and the degradation level in a [`Prepared`]; none parses bytes.
//! On the way in: guard-in ([`crate::safety`]), retrieve ([`crate::rag`]), prompt
//! ([`crate::prompts`]), memory ([`crate::context`]), cache lookup ([`crate::cache`] and
//! [`crate::semantic_cache`]), the degradation ladder ([`osprey_router::degrade`]), route
//! ([`osprey_router::auto`]) and backend ([`dispatch`]: an upstream and its fallbacks, a worker
//! pool, or the local engine through [`crate::local::serve`]), whose answer comes back as
//! typed events ([`crate::write::Answered`]); a cache hit is read into the same events. On the
//! way out, one chain of steps over those events ([`crate::outbound`]), run by the writer as it
//! writes the answer once: guard-out, cache keep, turn keep, citations and the request log's
//! text; then the marks of what went in, and the recent answers.
//!
//! Internal callers (summaries, the agent loop) go through [`own`], not through a route.

mod dispatch;
mod own;
mod stages;

use axum::response::Response;
use osprey_core::api::{ChatCompletionRequest, CompletionRequest, JsonBody};
use osprey_core::backend;

use crate::edge::Admitted;
use crate::error::ApiError;
use crate::outbound::Outbound;
use crate::request_log::{LogText, Noted};
use crate::state::Services;
use osprey_store::tenant_flags::TenantFlags;

pub use own::{chat_answer, complete_chat};
use stages::{Asked, Lookup};

/// The path of chat completions below `/v1`.
pub const CHAT_PATH: &str = "chat/completions";
/// The path of text completions below `/v1`.
pub const COMPLETIONS_PATH: &str = "completions";

/// A typed generation request, as the pipeline hands it to a backend.
pub trait Routed: osprey_core::api::ApiRequest + Send {
    /// The model it names.
    fn model(&self) -> &str;
    /// It, as a backend is asked it.
    fn asked(self) -> backend::Asked;
}

impl Routed for ChatCompletionRequest {
    fn model(&self) -> &str {
        &self.model
    }
    fn asked(self) -> backend::Asked {
        backend::Asked::Chat(self)
    }
}

impl Routed for CompletionRequest {
    fn model(&self) -> &str {
        &self.model
    }
    fn asked(self) -> backend::Asked {
        backend::Asked::Completion(self)
    }
}

/// A generation request as the stages see it: parsed once, changed in place.
pub struct Prepared {
    /// Who asks and where usage is reported.
    pub admitted: Admitted,
    /// The route below `/v1`: [`CHAT_PATH`] or [`COMPLETIONS_PATH`].
    pub path: &'static str,
    /// The body, as it will go to the model.
    pub body: JsonBody,
    /// The tenant's feature flags.
    pub flags: TenantFlags,
    /// The degradation level that applies to it (0 when the service is not degraded).
    pub level: u8,
}

impl Prepared {
    async fn new(state: &Services, admitted: Admitted, body: JsonBody, path: &'static str) -> Self {
        let tenant = &admitted.caller.tenant;
        let level = osprey_router::degrade::level_for(state.degradation().level(), tenant.premium);
        let flags = state.flags(&tenant.name).await;
        Self {
            admitted,
            path,
            body,
            flags,
            level,
        }
    }

    /// Whether it is a chat request.
    fn is_chat(&self) -> bool {
        self.path == CHAT_PATH
    }
}

/// Answers a generation request: where its model is served (for `auto`, the model of the tier
/// the router picks; the response names the tier in `x-osprey-tier`), degraded as the ladder's
/// level says (`x-osprey-degraded`). A non-streamed request's successful answer is kept among
/// the recent answers: at level 5, and when every backend failed, the same request is given
/// it again ([`crate::replay`]).
pub async fn run<R: Routed>(
    state: &Services,
    admitted: Admitted,
    body: JsonBody,
    path: &'static str,
) -> Result<Response, ApiError> {
    let mut p = Prepared::new(state, admitted, body, path).await;
    let asked = Asked::of(&p);
    let recent = asked.recent_key(&p);
    let whole = !p.body.streamed();
    let guard = stages::guard_in(state, &mut p).await?;
    let retrieved = stages::retrieve(state, &mut p, &asked, guard.as_ref()).await?;
    let applied = stages::prompt(state, &mut p, &asked).await?;
    let mut context = stages::memory(state, &mut p, &asked).await?;
    let lookup = Lookup::new(state, &p, context.as_ref()).await;
    let mut out = Outbound::default();
    let answered = match lookup.found::<R>(&p)? {
        Some(found) => found,
        None => match stages::backend::<R>(state, &mut p, recent.as_ref()).await? {
            stages::Answer::Fresh(answered) => {
                // An answer with the caller's redacted values put back is theirs: not kept.
                let restores = guard.as_ref().is_some_and(stages::Guard::restores);
                out.push_some(stages::guard_out(guard, whole));
                out.push_some(lookup.keeper(p.level).filter(|_| !restores));
                answered
            }
            stages::Answer::Recent(response) => return Ok(logged(state, &p, response).await),
        },
    };
    out.push_some(context.as_mut().and_then(|c| c.turn.take()));
    out.push_some(retrieved);
    out.push_some(log_text(state, &p));
    let mut response = answered.write(out).await?;
    let mut noted = Noted::default();
    if let Some(context) = context.as_mut() {
        crate::context::mark(context, &mut response);
        crate::context::note(context, &mut noted);
    }
    if let Some(applied) = applied {
        crate::prompts::mark(&applied, &mut response);
        noted.prompt = Some((applied.name, applied.version));
    }
    response.extensions_mut().insert(noted);
    Ok(match recent {
        Some(key) => state.recent().keep(key, response).await,
        None => response,
    })
}

/// The request log's step, when the request's text is sampled.
fn log_text(state: &Services, p: &Prepared) -> Option<LogText> {
    state.request_log()?;
    LogText::new(p.admitted.caller.record.clone())
}

/// `response`, given again as it is, with its text noted for the request log.
async fn logged(state: &Services, p: &Prepared, response: Response) -> Response {
    let Some(log) = log_text(state, p) else {
        return response;
    };
    match crate::replay::Answer::read(response).await {
        Ok(answer) => {
            answer.json().inspect(|json| log.note_whole(json));
            answer.response()
        }
        Err(response) => response,
    }
}
