//! Requests of the gateway's own (a conversation's summary, a step of an agent run): sent
//! where their model is served, unscreened and uncounted by the edge, never through a route.

use std::sync::Arc;

use osprey_core::api::{ChatCompletionRequest, JsonBody};
use osprey_core::{Error, ErrorKind};
use serde_json::Value;

use super::{CHAT_PATH, dispatch};
use crate::edge::{Admitted, Caller};
use crate::outbound::Outbound;
use crate::replay;
use crate::state::Services;

/// Asks for a chat completion on behalf of `caller`: the text of its answer. `body` names the
/// model.
pub async fn complete_chat(
    state: &Services,
    caller: &Caller,
    body: Value,
) -> Result<String, Error> {
    let answer = chat_answer(state, caller, body).await?;
    Ok((answer["choices"][0]["message"]["content"].as_str())
        .unwrap_or_default()
        .to_owned())
}

/// Like [`complete_chat`], the whole answer (its message with any tool calls, its usage).
pub async fn chat_answer(state: &Services, caller: &Caller, body: Value) -> Result<Value, Error> {
    let Value::Object(object) = body else {
        return Err(Error::internal(
            "the gateway's own request is not a JSON object",
        ));
    };
    let body = JsonBody::from_object(object);
    let admitted = Admitted {
        caller: caller.with_fresh_record(),
        model: Some(body.model().to_owned()).filter(|m| !m.is_empty()),
        usage: Arc::default(),
    };
    let answered = dispatch::dispatch::<ChatCompletionRequest>(state, admitted, body, CHAT_PATH)
        .await
        .map_err(|e| e.0)?;
    let response = answered.write(Outbound::default()).await.map_err(|e| e.0)?;
    let status = response.status();
    let answer = match replay::Answer::read(response).await {
        Ok(answer) => answer.json(),
        Err(_) => None,
    };
    let answer = answer.unwrap_or_default();
    if !status.is_success() {
        let why = answer["error"]["message"].as_str().unwrap_or("failed");
        return Err(Error::new(
            ErrorKind::BadGateway,
            format!("the gateway's own request failed ({status}): {why}"),
        ));
    }
    Ok(answer)
}
