//! `POST /v1/chat/completions`.

use std::sync::Arc;

use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use osprey_core::Error;
use osprey_core::api::{
    AssistantMessage, ChatChoice, ChatChunkChoice, ChatCompletion, ChatCompletionChunk,
    ChatCompletionRequest, ChatDelta, ChatLogprobs, Usage,
};
use osprey_engine::{Engine, GenerateRequest, Prompter, TemplateMessage};

use super::{Routed, async_stream, done_event, json_event, new_id, stream_response};
use crate::edge::{Caller, UsageReport};
use crate::error::ApiError;
use crate::generation::{Deltas, RequestTimer, chat_logprob, merge, start_choices};
use crate::state::{AppState, unix_now};

/// Chat completion on the local engine, streamed or not.
pub async fn chat_completions(
    state: AppState,
    req: ChatCompletionRequest,
    caller: Caller,
    usage: Arc<UsageReport>,
) -> Result<Response, ApiError> {
    let engine = state.engine_for(&req.model)?;
    let prompt = req.prompt_tokens(engine.prompter())?;
    let params = req.sampling_params()?;
    let n = req.sampling.choices()?;
    let priority = caller.priority_of(&req.osprey);
    let request = GenerateRequest {
        priority,
        cache_salt: caller.tenant.cache_salt.clone(),
        ..GenerateRequest::new(prompt.clone(), params.clone())
    };
    let choices = start_choices(&engine, &request, n, 0).map_err(|e| match e.param.as_deref() {
        Some("prompt") => e.with_param("messages"),
        _ => e,
    })?;
    let ctx = ChatContext {
        id: new_id("chatcmpl"),
        created: unix_now(),
        model: req.model.clone(),
        engine,
        prompt_tokens: prompt.len(),
        logprobs: params.logprobs.is_some(),
        timer: RequestTimer::new(&req.model, priority, usage)
            .watched_by(state.degradation().clone()),
    };
    let deltas = merge(choices);
    if req.sampling.streaming() {
        Ok(stream_response(ctx.stream(
            deltas,
            n,
            req.sampling.include_usage(),
        )))
    } else {
        Ok(axum::Json(ctx.collect(deltas, n).await?).into_response())
    }
}

impl Routed for ChatCompletionRequest {
    fn model(&self) -> &str {
        &self.model
    }

    fn prompt_tokens(&self, prompter: &Prompter) -> Result<Vec<u32>, Error> {
        self.validate_messages()?;
        self.sampling_params()?;
        self.sampling.choices()?;
        let messages = self
            .messages
            .iter()
            .map(|m| {
                Ok(TemplateMessage {
                    role: m.role.clone(),
                    content: m.text()?,
                })
            })
            .collect::<Result<Vec<_>, Error>>()?;
        prompter.chat_tokens(&messages)
    }
}

struct ChatContext {
    id: String,
    created: u64,
    model: String,
    engine: Engine,
    prompt_tokens: usize,
    logprobs: bool,
    timer: RequestTimer,
}

impl ChatContext {
    async fn collect(mut self, mut deltas: Deltas, n: usize) -> Result<ChatCompletion, Error> {
        let mut choices: Vec<ChatChoice> = (0..n)
            .map(|index| ChatChoice {
                index,
                message: AssistantMessage {
                    role: "assistant".into(),
                    content: Some(String::new()),
                },
                logprobs: self.logprobs.then(ChatLogprobs::default),
                finish_reason: None,
            })
            .collect();
        let mut completion_tokens = 0;
        while let Some((index, delta)) = deltas.next().await {
            let delta = delta?;
            let choice = &mut choices[index];
            if let Some(content) = choice.message.content.as_mut() {
                content.push_str(&delta.text);
            }
            if let Some(token) = &delta.token {
                completion_tokens += 1;
                self.timer.token();
                if let (Some(lps), Some(lp)) = (choice.logprobs.as_mut(), &token.logprob) {
                    lps.content.push(chat_logprob(self.engine.tokenizer(), lp));
                }
            }
            choice.finish_reason = delta.finish.or(choice.finish_reason);
        }
        self.timer.finish(self.prompt_tokens, completion_tokens);
        Ok(ChatCompletion {
            id: self.id,
            object: "chat.completion".into(),
            created: self.created,
            model: self.model,
            choices,
            usage: Usage::new(self.prompt_tokens, completion_tokens),
            system_fingerprint: Some(super::FINGERPRINT.into()),
        })
    }

    fn chunk(
        &self,
        choices: Vec<ChatChunkChoice>,
        usage: Option<Option<Usage>>,
    ) -> ChatCompletionChunk {
        ChatCompletionChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk".into(),
            created: self.created,
            model: self.model.clone(),
            choices,
            usage,
            system_fingerprint: Some(super::FINGERPRINT.into()),
        }
    }

    fn stream(
        mut self,
        mut deltas: Deltas,
        n: usize,
        include_usage: bool,
    ) -> impl futures_util::Stream<Item = Event> + Send + 'static {
        let usage_field = move |u: Option<Usage>| include_usage.then_some(u);
        async_stream(move |tx| async move {
            for index in 0..n {
                let first = ChatChunkChoice {
                    index,
                    delta: ChatDelta {
                        role: Some("assistant".into()),
                        content: Some(String::new()),
                    },
                    logprobs: None,
                    finish_reason: None,
                };
                tx.send(json_event(&self.chunk(vec![first], usage_field(None))))
                    .await?;
            }
            let mut completion_tokens = 0;
            while let Some((index, delta)) = deltas.next().await {
                let delta = match delta {
                    Ok(d) => d,
                    Err(e) => {
                        tx.send(json_event(&crate::error::error_body(&e))).await?;
                        return Ok(());
                    }
                };
                let logprobs = match (&delta.token, self.logprobs) {
                    (Some(token), true) => Some(ChatLogprobs {
                        content: token
                            .logprob
                            .iter()
                            .map(|lp| chat_logprob(self.engine.tokenizer(), lp))
                            .collect(),
                    }),
                    _ => None,
                };
                if delta.token.is_some() {
                    completion_tokens += 1;
                    self.timer.token();
                }
                if delta.text.is_empty() && logprobs.is_none() && delta.finish.is_none() {
                    continue;
                }
                let choice = ChatChunkChoice {
                    index,
                    delta: ChatDelta {
                        role: None,
                        content: (!delta.text.is_empty() || logprobs.is_some())
                            .then_some(delta.text),
                    },
                    logprobs,
                    finish_reason: None,
                };
                if !choice.delta.content.as_deref().unwrap_or("").is_empty()
                    || choice.logprobs.is_some()
                {
                    tx.send(json_event(&self.chunk(vec![choice], usage_field(None))))
                        .await?;
                }
                if let Some(reason) = delta.finish {
                    let last = ChatChunkChoice {
                        index,
                        delta: ChatDelta::default(),
                        logprobs: None,
                        finish_reason: Some(reason),
                    };
                    tx.send(json_event(&self.chunk(vec![last], usage_field(None))))
                        .await?;
                }
            }
            self.timer.finish(self.prompt_tokens, completion_tokens);
            if include_usage {
                let usage = Usage::new(self.prompt_tokens, completion_tokens);
                tx.send(json_event(&self.chunk(Vec::new(), Some(Some(usage)))))
                    .await?;
            }
            tx.send(done_event()).await?;
            Ok(())
        })
    }
}
