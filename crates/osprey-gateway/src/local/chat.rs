//! `POST /v1/chat/completions`.

use std::sync::Arc;

use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use osprey_core::api::{
    AssistantMessage, ChatChoice, ChatChunkChoice, ChatCompletion, ChatCompletionChunk,
    ChatCompletionRequest, ChatDelta, ChatLogprobs, FunctionCall, FunctionCallDelta, ToolCall,
    ToolCallDelta, ToolMode, Usage,
};
use osprey_core::{Error, FinishReason, Grammar};
use osprey_engine::tools::{self, ToolCallParser, ToolEvent};
use osprey_engine::{Engine, GenerateRequest, Prompter};

use super::generation::{Deltas, RequestTimer, chat_logprob, merge, start_choices};
use crate::edge::Caller;
use crate::error::ApiError;
use crate::pipeline::Routed;
use crate::sse::{FINGERPRINT, async_stream, done_event, json_event, new_id, stream_response};
use crate::state::{AppState, unix_now};
use osprey_core::UsageReport;

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
    let answer = AnswerShape::of(&req)?;
    let request = GenerateRequest {
        priority,
        deadline: osprey_core::api::deadline_of(&req.osprey),
        cache_salt: caller.tenant.cache_salt.clone(),
        grammar: answer.grammar.clone(),
        ..GenerateRequest::new(prompt.clone(), params.clone())
    };
    let choices = start_choices(&engine, &request, n, 0).map_err(|e| match e.param.as_deref() {
        Some("prompt") => e.with_param("messages"),
        Some("grammar") => e.with_param(answer.grammar_param),
        _ => e,
    })?;
    let ctx = ChatContext {
        id: new_id("chatcmpl"),
        created: unix_now(),
        model: req.model.clone(),
        engine,
        prompt_tokens: prompt.len(),
        logprobs: params.logprobs.is_some(),
        calls: answer.calls,
        timer: RequestTimer::new(&req.model, priority, usage)
            .watched_by(state.degradation().clone())
            .recorded_in(caller.record.clone()),
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

    async fn serve_locally(
        self,
        state: AppState,
        caller: Caller,
        usage: Arc<UsageReport>,
    ) -> Result<Response, ApiError> {
        chat_completions(state, self, caller, usage).await
    }

    fn prompt_tokens(&self, prompter: &Prompter) -> Result<Vec<u32>, Error> {
        self.validate_messages()?;
        self.sampling_params()?;
        self.sampling.choices()?;
        let tools = self.tools.as_deref().unwrap_or(&[]);
        let messages = tools::template_messages(&self.messages, tools, &self.tool_mode()?)?;
        prompter.chat_tokens(&messages)
    }
}

/// What an answer may be: the grammar it is generated under (its text's `response_format`
/// or Osprey grammar, and the tools it may call), and whether its text is read for calls.
struct AnswerShape {
    grammar: Option<Grammar>,
    /// The request field a grammar error is about.
    grammar_param: &'static str,
    calls: bool,
}

impl AnswerShape {
    fn of(req: &ChatCompletionRequest) -> Result<Self, Error> {
        let mode = req.tool_mode()?;
        let tools = req.tools.as_deref().unwrap_or(&[]);
        let text = req.output_grammar()?;
        let calls = !tools.is_empty() && mode != ToolMode::None;
        let grammar_param = match (calls, &req.response_format) {
            (true, _) => "tools",
            (false, Some(_)) => "response_format",
            (false, None) => "osprey.grammar",
        };
        let grammar = match calls {
            true => tools::answer_grammar(tools, &mode, req.parallel_tool_calls(), text.as_ref())?,
            false => text,
        };
        Ok(Self {
            grammar,
            grammar_param,
            calls,
        })
    }
}

struct ChatContext {
    id: String,
    created: u64,
    model: String,
    engine: Engine,
    prompt_tokens: usize,
    logprobs: bool,
    /// Whether the text is read for tool calls.
    calls: bool,
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
                    tool_calls: None,
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
        if self.calls {
            for choice in &mut choices {
                read_calls(choice);
                let names =
                    (choice.message.tool_calls.iter().flatten()).map(|c| c.function.name.clone());
                self.timer.note(|n| n.tool_calls.extend(names));
            }
        }
        Ok(ChatCompletion {
            id: self.id,
            object: "chat.completion".into(),
            created: self.created,
            model: self.model,
            choices,
            usage: Usage::new(self.prompt_tokens, completion_tokens),
            system_fingerprint: Some(FINGERPRINT.into()),
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
            system_fingerprint: Some(FINGERPRINT.into()),
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
                        tool_calls: None,
                    },
                    logprobs: None,
                    finish_reason: None,
                };
                tx.send(json_event(&self.chunk(vec![first], usage_field(None))))
                    .await?;
            }
            let mut completion_tokens = 0;
            let mut calls: Vec<Option<CallStream>> = (0..n)
                .map(|_| self.calls.then(CallStream::default))
                .collect();
            while let Some((index, delta)) = deltas.next().await {
                let delta = match delta {
                    Ok(d) => d,
                    Err(e) => {
                        self.timer.note(|n| n.error = Some(e.message.clone()));
                        tx.send(json_event(&e.envelope())).await?;
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
                let mut pieces = match calls[index].as_mut() {
                    Some(stream) => stream.push(&delta.text, delta.finish.is_some()),
                    None if delta.text.is_empty() => Vec::new(),
                    None => vec![ChatDelta {
                        content: Some(delta.text),
                        ..ChatDelta::default()
                    }],
                };
                if pieces.is_empty() && logprobs.is_some() {
                    pieces.push(ChatDelta {
                        content: Some(String::new()),
                        ..ChatDelta::default()
                    });
                }
                let mut logprobs = logprobs;
                let names = (pieces.iter())
                    .flat_map(|p| p.tool_calls.iter().flatten())
                    .filter_map(|c| c.function.name.clone());
                self.timer.note(|n| n.tool_calls.extend(names));
                for piece in pieces {
                    let choice = ChatChunkChoice {
                        index,
                        delta: piece,
                        logprobs: logprobs.take(),
                        finish_reason: None,
                    };
                    tx.send(json_event(&self.chunk(vec![choice], usage_field(None))))
                        .await?;
                }
                if let Some(mut reason) = delta.finish {
                    if reason == FinishReason::Stop
                        && calls[index].as_ref().is_some_and(|c| c.parser.calls() > 0)
                    {
                        reason = FinishReason::ToolCalls;
                    }
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

/// Turns a choice's text into its tool calls, if it made any (the content is then null
/// unless text came with them) and the finish reason `tool_calls`.
fn read_calls(choice: &mut ChatChoice) {
    let text = choice.message.content.take().unwrap_or_default();
    let (content, calls) = tools::parse_output(&text);
    if calls.is_empty() {
        choice.message.content = Some(content);
        return;
    }
    choice.message.content = (!content.is_empty()).then_some(content);
    choice.message.tool_calls = Some(
        calls
            .into_iter()
            .map(|(name, arguments)| ToolCall {
                id: call_id(),
                kind: "function".into(),
                function: FunctionCall { name, arguments },
            })
            .collect(),
    );
    if choice.finish_reason == Some(FinishReason::Stop) {
        choice.finish_reason = Some(FinishReason::ToolCalls);
    }
}

/// A streamed choice read for tool calls: its text becomes content deltas or call deltas in
/// OpenAI's shape (the first of a call with its id, type and name).
#[derive(Default)]
struct CallStream {
    parser: ToolCallParser,
}

impl CallStream {
    fn push(&mut self, text: &str, last: bool) -> Vec<ChatDelta> {
        let mut events = self.parser.push(text);
        if last {
            events.extend(self.parser.finish());
        }
        events
            .into_iter()
            .map(|event| match event {
                ToolEvent::Content(text) => ChatDelta {
                    content: Some(text),
                    ..ChatDelta::default()
                },
                ToolEvent::CallStart { index, name } => call_delta(ToolCallDelta {
                    index,
                    id: Some(call_id()),
                    kind: Some("function".into()),
                    function: FunctionCallDelta {
                        name: Some(name),
                        arguments: Some(String::new()),
                    },
                }),
                ToolEvent::Arguments { index, text } => call_delta(ToolCallDelta {
                    index,
                    id: None,
                    kind: None,
                    function: FunctionCallDelta {
                        name: None,
                        arguments: Some(text),
                    },
                }),
            })
            .collect()
    }
}

/// A fresh tool call id, `call_…` as OpenAI writes them.
fn call_id() -> String {
    format!("call_{:024x}", rand::random::<u128>() >> 32)
}

fn call_delta(call: ToolCallDelta) -> ChatDelta {
    ChatDelta {
        tool_calls: Some(vec![call]),
        ..ChatDelta::default()
    }
}
