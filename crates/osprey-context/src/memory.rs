//! A chat request's memory: the layers of its user's context put in by the prompt builder
//! ([`crate::builder`]), each within its own token budget.
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
//! message ([`crate::facts`]) are kept as episodic memory. The options are taken out of the
//! body, so whatever serves the request gets plain messages.

use osprey_core::api::{JsonBody, content_text};
use osprey_core::{Error, ErrorKind};
use std::sync::Arc;

use osprey_store::{Owner, StoreError};

use crate::store::ContextStore;
use serde_json::{Map, Value, json};

use crate::builder::{Budgets, Fact, Injected, Layers, PromptBuilder};
use crate::conversation::{Turn, session};
use crate::prompt::Message;
use crate::summary::SummaryWriter;

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

/// What memory is made of: where it is kept, how a text is counted in tokens, and who writes
/// a conversation's summary.
pub struct Memory<'a> {
    /// Where facts, scratchpads and conversations are kept (`None`: a server without one).
    pub store: Option<&'a Arc<dyn ContextStore>>,
    /// Tokens of a text, for the model that will read the prompt.
    pub tokens: &'a (dyn Fn(&str) -> usize + Sync),
    /// The model that folds older turns into a summary.
    pub summaries: &'a dyn SummaryWriter,
}

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
    /// Whether the prompt holds anything of its user's (so its answer is theirs alone).
    pub fn is_personal(&self) -> bool {
        self.conversation.is_some() || self.injected != Injected::default()
    }

    /// What went in, said in short (`facts=2; working=plan; summary=40; history=6`); `None`
    /// when nothing did.
    pub fn summary(&self) -> Option<String> {
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
        (!parts.is_empty()).then(|| parts.join("; "))
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

/// Puts the body's context in, for the user `owner` names (given the body's `user`): what
/// went in.
pub async fn prepare(
    memory: &Memory<'_>,
    owner: impl FnOnce(Option<&str>) -> Owner,
    flags: &Map<String, Value>,
    body: &mut JsonBody,
) -> Result<Context, Error> {
    let v = body.edit();
    let asked = asked(&v["osprey"], flags)?;
    let owner = owner(v["user"].as_str());
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
    let Some(store) = memory.store else {
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
        let facts = store.facts(&owner).await?;
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
            Err(e) => return Err(e.into()),
        }
    }
    let turn = match &asked.conversation {
        Some(id) => {
            let session = session(memory, &**store, &owner, id, &asked.budgets).await?;
            layers.summary = session.summary;
            layers.history = session.history;
            Some(Turn::new(store.clone(), owner.clone(), id.clone(), &own))
        }
        None => None,
    };
    if asked.extract && !owner.user.is_empty() {
        extract_facts(&**store, &owner, &own).await;
    }
    let built = PromptBuilder::new(asked.budgets, memory.tokens).build(layers);
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

/// Keeps the facts the user states in their newest message; a failure is logged, never the
/// request's.
async fn extract_facts(store: &dyn ContextStore, owner: &Owner, own: &[Message]) {
    let Some(said) = own.iter().rev().find(|m| m.role == "user") else {
        return;
    };
    for fact in crate::facts::extract(&said.content) {
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
