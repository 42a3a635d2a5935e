//! Retrieval for the gateway: opening a tenant's collections, searching them off the serving
//! threads, and the retrieval stage of chat ([`osprey_context::retrieval`] does the prompt and
//! the citations): `x-osprey-rag` says how many passages went in and how many were dropped.

use std::sync::Arc;

use axum::http::{HeaderMap, HeaderValue};
use futures_util::future::BoxFuture;
use osprey_context::retrieval::{RagAsked, Retrieved};
use osprey_core::api::JsonBody;
use osprey_core::backend::ChoiceDelta;
use osprey_core::{Error, ErrorKind};
use osprey_policy::pipeline::Pipeline;
use osprey_rag::{Collection, Hit, RagError, SearchQuery};
use tracing::Instrument;

use crate::edge::Caller;
use crate::outbound::{Added, Complete, Seen, Step};
use crate::state::Services;

/// The response header saying what retrieval put in the prompt.
pub const RAG_HEADER: &str = "x-osprey-rag";

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

/// Puts passages from the body's `rag` collection in (and takes the `rag` option out): what
/// they were, as the citations step of the way out. `pipeline` screens them as untrusted
/// text.
pub async fn augment(
    state: &Services,
    caller: &Caller,
    pipeline: Option<&Pipeline>,
    body: &mut JsonBody,
) -> Result<Citations, Error> {
    let asked = RagAsked::take(body)?;
    let name = asked.collection.as_str();
    let started = std::time::Instant::now();
    let span = tracing::info_span!("retrieval", collection = name, hits = tracing::field::Empty);
    let query = SearchQuery::new(&asked.question, asked.top_k, caller.groups.clone());
    let hits = search(state, caller, name, query)
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
    let retrieved = Retrieved::screened(hits, pipeline);
    retrieved.put_in(asked, body)?;
    Ok(Citations { retrieved })
}

/// Citations, a step of the way out ([`crate::outbound`]): the answer marked with what went in
/// (`x-osprey-rag`), its text (choice 0) heard as it passes, and given `osprey.citations`.
pub struct Citations {
    retrieved: Retrieved,
}

impl Step for Citations {
    fn headers(&mut self, headers: &mut HeaderMap) {
        if let Ok(v) = HeaderValue::from_str(&self.retrieved.summary()) {
            headers.insert(RAG_HEADER, v);
        }
    }

    fn delta(&mut self, delta: &mut ChoiceDelta) -> Seen {
        if delta.index == 0 {
            self.retrieved.hear(&delta.text);
        }
        Seen::Send
    }

    fn end<'a>(&'a mut self, _answer: &'a Complete<'a>) -> BoxFuture<'a, Result<Added, Error>> {
        let citations = self.retrieved.citations_heard();
        Box::pin(std::future::ready(Ok(Some(("citations", citations)))))
    }
}
