//! A chat request that names a conversation (`"osprey": {"conversation": ID}`) is answered
//! with the conversation's history in its prompt, and its turn is kept.
//!
//! - **In**: the request's leading system (or developer) messages stay first; then as much of
//!   the history as fits `osprey.history_tokens` (default [`HISTORY_TOKENS`]), newest kept,
//!   whole messages only; then the request's own messages. Tokens are counted with the local
//!   model's tokenizer, or as a quarter of the characters when no model is local.
//! - **Out**: once the answer is complete, the request's own messages and the answer (choice
//!   0) are appended in one transaction, before the client sees the end of it: the response
//!   of a non-streamed request, or the `[DONE]` of a stream, comes after the write. A failed
//!   answer, or a stream that ends without `[DONE]`, appends nothing. If the append fails,
//!   a non-streamed request fails with the store's error; a stream ends with an error event
//!   instead of `[DONE]`.

use std::sync::Arc;

use axum::body::Bytes;
use axum::response::{IntoResponse, Response};
use osprey_core::{Error, ErrorKind};
use osprey_store::{ItemPage, NewItem, Owner, Store};
use serde_json::Value;

use crate::edge::Caller;
use crate::error::{ApiError, store_error};
use crate::routes::conversations::message_text;
use crate::state::AppState;

/// History tokens put in the prompt when the request does not say.
pub const HISTORY_TOKENS: usize = 2048;
/// Items read from the store per page while filling the budget.
const PAGE: i64 = 100;

/// A turn of a conversation in progress: what to append once the answer is in.
pub struct Turn {
    store: Store,
    owner: Owner,
    id: String,
    asked: Vec<NewItem>,
}

/// The conversation a chat body names, if any.
pub fn named(body: &[u8]) -> Option<String> {
    let v: Value = serde_json::from_slice(body).ok()?;
    v["osprey"]["conversation"].as_str().map(str::to_owned)
}

/// The body with the history of its conversation in its messages, and the turn to keep.
pub async fn prepare(
    state: &AppState,
    caller: &Caller,
    body: &Bytes,
    id: String,
) -> Result<(Bytes, Turn), Error> {
    let store = (state.store().cloned()).ok_or_else(|| {
        Error::new(
            ErrorKind::Unavailable,
            "This server has no store for conversations.",
        )
    })?;
    let mut v: Value = serde_json::from_slice(body)
        .map_err(|e| Error::invalid("body", format!("Invalid request body: {e}")))?;
    let owner = caller.owner(v["user"].as_str());
    let budget = match &v["osprey"]["history_tokens"] {
        Value::Null => HISTORY_TOKENS,
        n => n.as_u64().map(|n| n as usize).ok_or_else(|| {
            Error::invalid(
                "osprey.history_tokens",
                "history_tokens must be a non-negative integer",
            )
        })?,
    };
    let Some(messages) = v["messages"].as_array() else {
        return Err(Error::invalid("messages", "messages must be a list"));
    };
    let lead = messages
        .iter()
        .take_while(|m| matches!(m["role"].as_str(), Some("system" | "developer")))
        .count();
    let asked = messages[lead..]
        .iter()
        .map(|m| NewItem {
            role: m["role"].as_str().unwrap_or("user").to_owned(),
            content: message_text(&m["content"]).unwrap_or_default(),
        })
        .collect();
    let history = history(state, &store, &owner, &id, budget).await?;
    let mut assembled: Vec<Value> = messages[..lead].to_vec();
    assembled.extend(
        history
            .into_iter()
            .map(|(role, content)| serde_json::json!({"role": role, "content": content})),
    );
    assembled.extend_from_slice(&messages[lead..]);
    v["messages"] = Value::Array(assembled);
    // Done here: a worker or upstream behind this gateway gets plain messages.
    if let Some(osprey) = v["osprey"].as_object_mut() {
        osprey.remove("conversation");
        osprey.remove("history_tokens");
    }
    let body = serde_json::to_vec(&v).expect("JSON serialises").into();
    Ok((
        body,
        Turn {
            store,
            owner,
            id,
            asked,
        },
    ))
}

/// The newest messages of the conversation that fit `budget` tokens, oldest first.
async fn history(
    state: &AppState,
    store: &Store,
    owner: &Owner,
    id: &str,
    budget: usize,
) -> Result<Vec<(String, String)>, Error> {
    let count = |text: &str| match state.engine() {
        Some(engine) => engine.prompter().tokenizer().encode(text, false).len(),
        None => text.chars().count().div_ceil(4),
    };
    let (mut kept, mut used, mut after) = (Vec::new(), 0, None::<String>);
    'pages: loop {
        let page = ItemPage {
            after: after.as_deref(),
            limit: PAGE,
            newest_first: true,
        };
        let items = (store.items(owner, id, page).await).map_err(store_error)?;
        for item in &items {
            // A few tokens more per message for the template's role markers.
            used += count(&item.content) + 4;
            if used > budget {
                break 'pages;
            }
            kept.push((item.role.clone(), item.content.clone()));
        }
        match items.last() {
            Some(last) if items.len() as i64 == PAGE => after = Some(last.id.clone()),
            _ => break,
        }
    }
    kept.reverse();
    Ok(kept)
}

impl Turn {
    /// `response` with the turn appended once it is complete (see the module docs).
    pub async fn keep(self, response: Response) -> Response {
        if !response.status().is_success() {
            return response;
        }
        match crate::sse_tap::is_stream(&response) {
            true => self.keep_stream(response),
            false => self.keep_answer(response).await,
        }
    }

    async fn keep_answer(self, response: Response) -> Response {
        let answer = match crate::replay::Answer::read(response).await {
            Ok(answer) => answer,
            Err(response) => return response,
        };
        let Some(json) = answer.json() else {
            return answer.response();
        };
        let text = json["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or_default();
        match self.append(text.to_owned()).await {
            Ok(()) => answer.response(),
            Err(e) => ApiError(e).into_response(),
        }
    }

    fn keep_stream(self, response: Response) -> Response {
        let turn = Arc::new(self);
        let mut text = String::new();
        crate::sse_tap::tap(response, move |data| {
            if data == "[DONE]" {
                let (turn, text) = (turn.clone(), std::mem::take(&mut text));
                return Box::pin(async move {
                    match turn.append(text).await {
                        Ok(()) => data,
                        Err(e) => {
                            serde_json::to_string(&crate::error::error_body(&e)).unwrap_or_default()
                        }
                    }
                });
            }
            if let Ok(v) = serde_json::from_str::<Value>(&data) {
                for choice in v["choices"].as_array().into_iter().flatten() {
                    if choice["index"].as_u64().unwrap_or(0) == 0
                        && let Some(t) = choice["delta"]["content"].as_str()
                    {
                        text.push_str(t);
                    }
                }
            }
            Box::pin(std::future::ready(data))
        })
    }

    async fn append(&self, answer: String) -> Result<(), Error> {
        let mut items = self.asked.clone();
        items.push(NewItem {
            role: "assistant".into(),
            content: answer,
        });
        (self.store.append_items(&self.owner, &self.id, &items).await).map_err(store_error)?;
        Ok(())
    }
}
