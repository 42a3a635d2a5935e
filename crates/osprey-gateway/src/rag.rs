//! Retrieval for the gateway: opening a tenant's collections, searching them off the serving
//! threads, and answering chat from them.
//!
//! A chat request with `"osprey": {"rag": {"collection": C, "top_k": K}}` has its last user
//! message searched in C (hybrid, reranked, one passage per document, under the caller's
//! groups). Each passage is screened as untrusted text by the tenant's injection guard: one
//! the policy would block never reaches the prompt (counted in
//! `osprey_rag_passages_dropped_total`). The rest are numbered `[1]`, `[2]`… and go in as a
//! system message after the request's own, or, with `"prompt": NAME`, as the variables
//! `context` and `question` of that registered prompt. The answer carries
//! `osprey.citations`: each passage's marker, document and chunk, and whether the answer cites
//! it (on a stream, in one last chunk before `[DONE]`). `x-osprey-rag` says how many passages
//! went in and how many were dropped.

use std::sync::Arc;

use axum::http::{HeaderMap, HeaderValue};
use futures_util::future::BoxFuture;
use osprey_core::api::JsonBody;
use osprey_core::{Error, ErrorKind};
use osprey_policy::pipeline::Pipeline;
use osprey_policy::{Action, Source};
use osprey_rag::{Collection, Hit, RagError, SearchQuery};
use serde_json::{Value, json};
use tracing::Instrument;

use crate::edge::Caller;
use crate::outbound::{Seen, Step};
use crate::state::Services;
use osprey_core::api::{choice_text, content_text};

/// The response header saying what retrieval put in the prompt.
pub const RAG_HEADER: &str = "x-osprey-rag";
/// Passages put in when the request does not say.
const DEFAULT_TOP_K: usize = 4;
/// Passages a request may ask for.
const MAX_TOP_K: usize = 20;
/// What the model is told, above the passages.
const INSTRUCTION: &str = "Answer the user's question using only the numbered passages \
below. Cite the passages you use by their number in brackets, like [1]. If the passages do \
not contain the answer, say that you do not know.";

/// A tenant's collection `name`: created if `create`, else a 404 if it does not exist.
pub async fn collection(
    state: &Services,
    caller: &Caller,
    name: &str,
    create: bool,
) -> Result<Arc<Collection>, Error> {
    let (library, tenant, owned) = (
        state.library().clone(),
        caller.tenant.name.clone(),
        name.to_owned(),
    );
    let found = tokio::task::spawn_blocking(move || library.get(&tenant, &owned, create))
        .await
        .map_err(|_| Error::new(ErrorKind::Internal, "opening the collection failed"))?
        .map_err(rag_error)?;
    found.ok_or_else(|| {
        Error::new(ErrorKind::NotFound, format!("No collection {name}."))
            .with_code("collection_not_found")
    })
}

/// Searches the tenant's collection `name`.
pub async fn search(
    state: &Services,
    caller: &Caller,
    name: &str,
    query: SearchQuery,
) -> Result<Vec<Hit>, Error> {
    let collection = collection(state, caller, name, false).await?;
    let embedder = state.embedder().await.ok_or_else(|| {
        Error::new(
            ErrorKind::Unavailable,
            "The embedding model is not available.",
        )
    })?;
    let rerank = if query.rerank.is_some() {
        "true"
    } else {
        "false"
    };
    let started = std::time::Instant::now();
    let hits = tokio::task::spawn_blocking(move || collection.search(&query, embedder.as_ref()))
        .await
        .map_err(|_| Error::new(ErrorKind::Internal, "the search failed"))?
        .map_err(rag_error)?;
    metrics::histogram!(osprey_core::metrics::RAG_SEARCH_DURATION, "rerank" => rerank)
        .record(started.elapsed().as_secs_f64());
    Ok(hits)
}

/// A retrieval error, as the caller sees it.
pub fn rag_error(e: RagError) -> Error {
    match e {
        RagError::Name(why) | RagError::Document(why) => Error::invalid("collection", why),
        RagError::Busy(why) => Error::new(ErrorKind::Unavailable, why).with_code("collection_busy"),
        e => {
            tracing::error!(error = %e, "retrieval failed");
            Error::new(ErrorKind::Internal, format!("Retrieval failed: {e}"))
        }
    }
}

/// Whether a chat body asks for retrieval.
pub fn wanted(body: &JsonBody) -> bool {
    !body.osprey("rag").is_null()
}

/// What retrieval put in a prompt.
#[derive(Clone, Debug, Default)]
pub struct Retrieved {
    passages: Vec<Hit>,
    dropped: usize,
    /// The answer (its first choice) streamed so far.
    answer: String,
    /// The first chunk of a stream: its id, creation time and model head the citations' chunk.
    head: Option<Value>,
}

/// Puts passages from the body's `rag` collection in (and takes the `rag` option out): what
/// they were. `pipeline` screens them as untrusted text.
pub async fn augment(
    state: &Services,
    caller: &Caller,
    pipeline: Option<&Pipeline>,
    body: &mut JsonBody,
) -> Result<Retrieved, Error> {
    let v = body.edit();
    let rag = v["osprey"]
        .as_object_mut()
        .and_then(|o| o.remove("rag"))
        .unwrap_or_default();
    let Some(name) = rag["collection"].as_str() else {
        return Err(Error::invalid(
            "osprey.rag.collection",
            "name the collection to search",
        ));
    };
    let top_k = match &rag["top_k"] {
        Value::Null => DEFAULT_TOP_K,
        k => (k.as_u64().map(|k| k as usize))
            .filter(|k| (1..=MAX_TOP_K).contains(k))
            .ok_or_else(|| {
                Error::invalid("osprey.rag.top_k", format!("top_k is 1 to {MAX_TOP_K}"))
            })?,
    };
    let prompt = match &rag["prompt"] {
        Value::Null => None,
        Value::String(p) => Some(p.clone()),
        _ => {
            return Err(Error::invalid(
                "osprey.rag.prompt",
                "the name of a registered prompt",
            ));
        }
    };
    let question = (v["messages"].as_array())
        .and_then(|m| m.iter().rev().find(|m| m["role"] == "user"))
        .and_then(|m| content_text(&m["content"]))
        .filter(|q| !q.trim().is_empty())
        .ok_or_else(|| {
            Error::invalid("messages", "retrieval needs a user message to search for")
        })?;
    let started = std::time::Instant::now();
    let span = tracing::info_span!("retrieval", collection = name, hits = tracing::field::Empty);
    let hits = search(
        state,
        caller,
        name,
        SearchQuery::new(&question, top_k, caller.groups.clone()),
    )
    .instrument(span.clone())
    .await?;
    span.record("hits", hits.len());
    caller.record.note(|n| {
        n.retrieval = Some(crate::record::RetrievalNote {
            collection: name.to_owned(),
            hits: hits
                .iter()
                .map(|h| format!("{}#{}", h.document_id, h.chunk_id))
                .collect(),
            ms: started.elapsed().as_secs_f64() * 1e3,
        })
    });
    let mut retrieved = Retrieved::default();
    for mut hit in hits {
        if let Some(pipeline) = pipeline {
            let verdict = pipeline.check(&hit.text, Source::Untrusted);
            match verdict.action {
                Action::Block => {
                    tracing::warn!(document = %hit.document_id, chunk = %hit.chunk_id, "a retrieved passage was kept out of the prompt by the injection guard");
                    metrics::counter!(osprey_core::metrics::RAG_PASSAGES_DROPPED).increment(1);
                    retrieved.dropped += 1;
                    continue;
                }
                Action::Redact => {
                    hit.text = osprey_policy::redact::Redactor::default().redact(&hit.text, None);
                }
                Action::Allow | Action::Flag => {}
            }
        }
        retrieved.passages.push(hit);
    }
    let context = retrieved.context();
    match prompt {
        Some(name) => {
            let osprey = v["osprey"].as_object_mut().map(|o| {
                o.entry("prompt").or_insert_with(|| json!({"name": name}));
            });
            if osprey.is_none() {
                v["osprey"] = json!({"prompt": {"name": name}});
            }
            let vars = &mut v["osprey"]["prompt"]["variables"];
            if vars.is_null() {
                *vars = json!({});
            }
            vars["context"] = context.into();
            vars["question"] = question.into();
        }
        None => {
            let Some(messages) = v["messages"].as_array_mut() else {
                return Err(Error::invalid("messages", "messages must be a list"));
            };
            let lead = (messages.iter())
                .take_while(|m| matches!(m["role"].as_str(), Some("system" | "developer")))
                .count();
            let content = format!("{INSTRUCTION}\n\n{context}");
            messages.insert(lead, json!({"role": "system", "content": content}));
        }
    }
    Ok(retrieved)
}

impl Retrieved {
    /// The passages, numbered, as the model reads them.
    fn context(&self) -> String {
        if self.passages.is_empty() {
            return "(no passages were found)".into();
        }
        let numbered: Vec<String> = (self.passages.iter().enumerate())
            .map(|(i, p)| format!("[{}] {}\n{}", i + 1, p.title, p.text.trim()))
            .collect();
        numbered.join("\n\n")
    }

    /// The citations of `answer`: every passage, and whether the answer cites it.
    fn citations(&self, answer: &str) -> Value {
        let list: Vec<Value> = (self.passages.iter().enumerate())
            .map(|(i, p)| {
                let marker = format!("[{}]", i + 1);
                json!({
                    "marker": marker,
                    "cited": answer.contains(&marker),
                    "document_id": p.document_id,
                    "chunk_id": p.chunk_id,
                    "title": p.title,
                    "source": p.source,
                    "score": p.score,
                })
            })
            .collect();
        Value::Array(list)
    }
}

/// Citations, a step of the way out ([`crate::outbound`]): the answer marked with what went in
/// (`x-osprey-rag`) and given `osprey.citations` (a stream, in one last chunk before `[DONE]`).
impl Step for Retrieved {
    fn headers(&mut self, headers: &mut HeaderMap) {
        let said = format!("passages={}; dropped={}", self.passages.len(), self.dropped);
        if let Ok(v) = HeaderValue::from_str(&said) {
            headers.insert(RAG_HEADER, v);
        }
    }

    fn chunk(&mut self, chunk: &mut Value) -> Seen {
        if let Some(text) = choice_text(&chunk["choices"][0]) {
            self.answer.push_str(text);
        }
        if self.head.is_none() {
            self.head = Some(
                json!({"id": chunk["id"], "created": chunk["created"], "model": chunk["model"]}),
            );
        }
        Seen::Send
    }

    fn end(&mut self) -> BoxFuture<'_, Result<Option<Value>, Error>> {
        let head = self.head.take().unwrap_or_default();
        let chunk = json!({
            "id": head["id"],
            "object": "chat.completion.chunk",
            "created": head["created"],
            "model": head["model"],
            "choices": [],
            "osprey": {"citations": self.citations(&self.answer)},
        });
        Box::pin(std::future::ready(Ok(Some(chunk))))
    }

    fn whole<'a>(&'a mut self, answer: &'a mut Value) -> BoxFuture<'a, Result<(), Error>> {
        let text = answer["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or_default();
        let citations = self.citations(text);
        answer["osprey"]["citations"] = citations;
        Box::pin(std::future::ready(Ok(())))
    }
}
