//! A chat request's context beyond its own messages: the layers of memory of its user, put in
//! by the prompt builder ([`osprey_context::builder`]), each within its own token budget.
//!
//! | `osprey` option | layer | default |
//! |---|---|---|
//! | `conversation: ID` | session: the conversation's recent turns, verbatim | none |
//! | `history_tokens: N` | budget of those turns | 2,048 |
//! | `summary_tokens: N` | budget of the summary of older turns (0: no summary) | 256 |
//! | `memory: true\|false` | episodic: facts about the user | the tenant's `memory` flag |
//! | `memory_tokens: N` | budget of the facts | 256 |
//! | `working_memory: NAME` | working: the user's scratchpad NAME | none |
//! | `working_memory_tokens: N` | budget of the scratchpad | 512 |
//!
//! With the tenant's `memory.extract` flag on, the facts a named user states in their newest
//! message ([`osprey_context::facts`]) are kept as episodic memory. What went in is said in
//! `x-osprey-memory` and kept in the request log. The options are taken out of the body, so
//! a worker or upstream behind this gateway gets plain messages.

use axum::http::HeaderValue;
use axum::response::Response;
use osprey_context::builder::{Budgets, Fact, Injected, Layers, PromptBuilder};
use osprey_context::prompt::Message;
use osprey_core::api::JsonBody;
use osprey_core::{Error, ErrorKind};
use osprey_store::{Owner, Store, StoreError};
use serde_json::{Map, Value, json};

use crate::conversation::Turn;
use crate::edge::Caller;
use crate::error::store_error;
use crate::request_log::Noted;
use crate::state::AppState;
use osprey_core::api::content_text;

/// The response header saying what memory went into the prompt.
pub const MEMORY_HEADER: &str = "x-osprey-memory";

/// The `osprey` options this module reads (and takes out of the body).
const OPTIONS: [&str; 7] = [
    "conversation",
    "history_tokens",
    "summary_tokens",
    "memory",
    "memory_tokens",
    "working_memory",
    "working_memory_tokens",
];

/// What a request asks of its context.
struct Asked {
    conversation: Option<String>,
    budgets: Budgets,
    facts: bool,
    working: Option<String>,
    extract: bool,
}

/// What went into a request's context, and what its answer leaves there.
pub struct Context {
    /// The conversation's turn, to keep once answered.
    pub turn: Option<Turn>,
    /// Whose context it is.
    pub owner: Owner,
    /// The conversation it is part of.
    pub conversation: Option<String>,
    /// What went in.
    pub injected: Injected,
}

impl Context {
    /// Notes what went in for the request log.
    pub fn note(&mut self, noted: &mut Noted) {
        noted.conversation = self.conversation.clone();
        noted.user = Some(self.owner.user.clone());
        noted.injected = std::mem::take(&mut self.injected);
    }

    /// Whether the prompt holds anything of its user's (so its answer is theirs alone).
    pub fn is_personal(&self) -> bool {
        self.conversation.is_some() || self.injected != Injected::default()
    }

    /// Marks `response` with what went in.
    pub fn mark(&self, response: &mut Response) {
        let i = &self.injected;
        let mut parts = Vec::new();
        if !i.facts.is_empty() {
            parts.push(format!("facts={}", i.facts.len()));
        }
        if let Some(name) = &i.working {
            parts.push(format!("working={name}"));
        }
        if i.summary_tokens > 0 {
            parts.push(format!("summary={}", i.summary_tokens));
        }
        if self.conversation.is_some() {
            parts.push(format!("history={}", i.history_items));
        }
        if let Ok(v) = HeaderValue::from_str(&parts.join("; "))
            && !parts.is_empty()
        {
            response.headers_mut().insert(MEMORY_HEADER, v);
        }
    }
}

/// Whether a chat body (of a tenant with `flags`) needs its context prepared.
pub fn wanted(body: &JsonBody, flags: &Map<String, Value>) -> bool {
    let on = |flag: &str| flags.get(flag).and_then(Value::as_bool) == Some(true);
    on("memory")
        || on("memory.extract")
        || (body.get("osprey").as_object())
            .is_some_and(|o| OPTIONS.iter().any(|k| o.contains_key(*k)))
}

/// Puts the body's context in: what went in.
pub async fn prepare(
    state: &AppState,
    caller: &Caller,
    flags: &Map<String, Value>,
    body: &mut JsonBody,
) -> Result<Context, Error> {
    let v = body.edit();
    let asked = asked(&v["osprey"], flags)?;
    let owner = caller.owner(v["user"].as_str());
    if let Some(osprey) = v["osprey"].as_object_mut() {
        for option in OPTIONS {
            osprey.remove(option);
        }
    }
    let unchanged = |owner: Owner| Context {
        turn: None,
        owner,
        conversation: None,
        injected: Injected::default(),
    };
    let Some(store) = state.store().cloned() else {
        if asked.conversation.is_some() || asked.working.is_some() {
            return Err(Error::new(
                ErrorKind::Unavailable,
                "This server has no store for conversations and memory.",
            ));
        }
        return Ok(unchanged(owner));
    };
    let Some(messages) = v["messages"].as_array() else {
        return Err(Error::invalid("messages", "messages must be a list"));
    };
    let lead = messages
        .iter()
        .take_while(|m| matches!(m["role"].as_str(), Some("system" | "developer")))
        .count();
    let own: Vec<Message> = (messages[lead..].iter())
        .map(|m| Message {
            role: m["role"].as_str().unwrap_or("user").to_owned(),
            content: content_text(&m["content"]).unwrap_or_default(),
        })
        .collect();
    let mut layers = Layers::default();
    if asked.facts {
        let facts = (store.facts(&owner).await).map_err(store_error)?;
        layers.facts = (facts.into_iter())
            .map(|f| Fact {
                id: f.id,
                content: f.content,
            })
            .collect();
    }
    if let Some(name) = &asked.working {
        // An expired scratchpad is an empty one.
        match store.working(&owner, name).await {
            Ok(w) => layers.working = Some((w.name, w.content)),
            Err(StoreError::NotFound(_)) => {}
            Err(e) => return Err(store_error(e)),
        }
    }
    let turn = match &asked.conversation {
        Some(id) => {
            let model = v["model"].as_str().unwrap_or_default();
            let session = crate::conversation::session(
                state,
                caller,
                model,
                &store,
                &owner,
                id,
                &asked.budgets,
            )
            .await?;
            layers.summary = session.summary;
            layers.history = session.history;
            Some(Turn::new(store.clone(), owner.clone(), id.clone(), &own))
        }
        None => None,
    };
    if asked.extract && !owner.user.is_empty() {
        extract_facts(&store, &owner, &own).await;
    }
    let built = PromptBuilder::new(asked.budgets, |t: &str| count_tokens(state, t)).build(layers);
    let injected = built.injected.clone();
    let messages = v["messages"].take();
    let messages = (messages.as_array().cloned().unwrap_or_default().into_iter())
        .map(Part)
        .collect();
    let spliced = built.splice(messages, |m: &Part| {
        matches!(m.0["role"].as_str(), Some("system" | "developer"))
    });
    v["messages"] = Value::Array(spliced.into_iter().map(|p| p.0).collect());
    Ok(Context {
        turn,
        conversation: asked.conversation,
        injected,
        ..unchanged(owner)
    })
}

/// A message of a request body, as the builder splices it.
struct Part(Value);

impl From<Message> for Part {
    fn from(m: Message) -> Self {
        Self(json!({"role": m.role, "content": m.content}))
    }
}

/// Tokens of `text` for the local model's tokenizer, or a quarter of its characters when no
/// model is local.
pub fn count_tokens(state: &AppState, text: &str) -> usize {
    match state.engine() {
        Some(engine) => engine.prompter().tokenizer().encode(text, false).len(),
        None => osprey_core::tokens::estimate(text),
    }
}

/// Keeps the facts the user states in their newest message; a failure is logged, never the
/// request's.
async fn extract_facts(store: &Store, owner: &Owner, own: &[Message]) {
    let Some(said) = own.iter().rev().find(|m| m.role == "user") else {
        return;
    };
    for fact in osprey_context::facts::extract(&said.content) {
        if let Err(e) = store.add_fact(owner, &fact, "extracted").await {
            tracing::warn!(error = %e, tenant = %owner.tenant, "an extracted fact was not kept");
            return;
        }
        metrics::counter!(osprey_core::metrics::FACTS_EXTRACTED).increment(1);
    }
}

fn asked(osprey: &Value, flags: &Map<String, Value>) -> Result<Asked, Error> {
    let tokens = |name: &str, default: usize| match &osprey[name] {
        Value::Null => Ok(default),
        n => (n.as_u64().map(|n| n as usize)).ok_or_else(|| {
            Error::invalid(
                format!("osprey.{name}"),
                format!("{name} must be a non-negative integer"),
            )
        }),
    };
    let text = |name: &str| match &osprey[name] {
        Value::Null => Ok(None),
        Value::String(s) if !s.is_empty() => Ok(Some(s.clone())),
        _ => Err(Error::invalid(
            format!("osprey.{name}"),
            format!("{name} must be a non-empty string"),
        )),
    };
    let flag = |name: &str| flags.get(name).and_then(Value::as_bool) == Some(true);
    let defaults = Budgets::default();
    Ok(Asked {
        conversation: text("conversation")?,
        budgets: Budgets {
            history: tokens("history_tokens", defaults.history)?,
            summary: tokens("summary_tokens", defaults.summary)?,
            facts: tokens("memory_tokens", defaults.facts)?,
            working: tokens("working_memory_tokens", defaults.working)?,
        },
        facts: match &osprey["memory"] {
            Value::Null => flag("memory"),
            Value::Bool(b) => *b,
            _ => {
                return Err(Error::invalid(
                    "osprey.memory",
                    "memory must be true or false",
                ));
            }
        },
        working: text("working_memory")?,
        extract: flag("memory.extract"),
    })
}
