//! A chat completion request on the engine: its messages (and tools) templated into a prompt,
//! its answer generated under the grammar its `response_format` or tools ask for, and the
//! text read for tool calls when it may make them.

use osprey_core::api::{ChatCompletionRequest, ToolCallDelta, ToolMode, Usage};
use osprey_core::backend::{ChoiceDelta, GenEvent, GenStream, Logprobs};
use osprey_core::{Error, FinishReason, Grammar, Priority};

use super::{Answer, events, start_choices};
use crate::tools::{self, ToolCallParser, ToolEvent};
use crate::{Delta, Engine, GenerateRequest, Prompter, TokenLogprob, Tokenizer};

/// The token ids of `request`'s prompt, as the engine will see them; errors for messages or
/// sampling parameters the engine would refuse.
pub fn prompt_tokens(
    request: &ChatCompletionRequest,
    prompter: &Prompter,
) -> Result<Vec<u32>, Error> {
    request.validate_messages()?;
    request.sampling_params()?;
    request.sampling.choices()?;
    let tools = request.tools.as_deref().unwrap_or(&[]);
    let messages = tools::template_messages(&request.messages, tools, &request.tool_mode()?)?;
    prompter.chat_tokens(&messages)
}

/// Starts every choice of `request`.
pub(super) fn start(
    engine: &Engine,
    request: &ChatCompletionRequest,
    priority: Priority,
    cache_salt: String,
) -> Result<GenStream, Error> {
    let prompt = prompt_tokens(request, engine.prompter())?;
    let params = request.sampling_params()?;
    let n = request.sampling.choices()?;
    let shape = AnswerShape::of(request)?;
    let logprobs = params.logprobs.is_some();
    let generate = GenerateRequest {
        priority,
        deadline: osprey_core::api::deadline_of(&request.osprey),
        cache_salt,
        grammar: shape.grammar,
        speculative: osprey_core::api::speculative_of(&request.osprey),
        ..GenerateRequest::new(prompt.clone(), params)
    };
    let choices = start_choices(engine, &generate, n, 0).map_err(|e| match e.param.as_deref() {
        Some("prompt") => e.with_param("messages"),
        Some("grammar") => e.with_param(shape.grammar_param),
        _ => e,
    })?;
    let answer = ChatAnswer {
        engine: engine.clone(),
        prompt_tokens: prompt.len(),
        completion_tokens: 0,
        logprobs,
        calls: (0..n)
            .map(|_| shape.calls.then(ToolCallParser::default))
            .collect(),
    };
    Ok(events(answer, choices, generate.drafts))
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

struct ChatAnswer {
    engine: Engine,
    prompt_tokens: usize,
    completion_tokens: usize,
    logprobs: bool,
    /// Each choice's reader of tool calls, when its text is read for them.
    calls: Vec<Option<ToolCallParser>>,
}

impl Answer for ChatAnswer {
    fn events(&mut self, index: usize, delta: Delta) -> Vec<GenEvent> {
        let tokens = usize::from(delta.token.is_some());
        self.completion_tokens += tokens;
        let logprobs = match (&delta.token, self.logprobs) {
            (Some(token), true) => Some(Logprobs::Chat(
                (token.logprob.iter())
                    .map(|lp| chat_logprob(self.engine.tokenizer(), lp))
                    .collect(),
            )),
            _ => None,
        };
        let last = delta.finish.is_some();
        let mut pieces = match self.calls[index].as_mut() {
            Some(parser) => pieces(parser, &delta.text, last),
            None if delta.text.is_empty() => Vec::new(),
            None => vec![ChoiceDelta {
                text: delta.text,
                ..ChoiceDelta::default()
            }],
        };
        if pieces.is_empty() {
            // Nothing to show yet; the token still counts, and log-probabilities still go.
            pieces.push(ChoiceDelta::default());
        }
        pieces[0].tokens = tokens;
        pieces[0].logprobs = logprobs;
        if let Some(mut reason) = delta.finish {
            let called = self.calls[index].as_ref().is_some_and(|p| p.calls() > 0);
            if reason == FinishReason::Stop && called {
                reason = FinishReason::ToolCalls;
            }
            pieces.last_mut().expect("one piece at least").finish = Some(reason);
        }
        (pieces.into_iter())
            .map(|piece| GenEvent::Delta(ChoiceDelta { index, ..piece }))
            .collect()
    }

    fn usage(&self) -> Usage {
        Usage::new(self.prompt_tokens, self.completion_tokens)
    }
}

/// A piece of a choice's text read for tool calls: content, or the increments of calls in
/// OpenAI's shape (the first of a call with its id, type and name).
fn pieces(parser: &mut ToolCallParser, text: &str, last: bool) -> Vec<ChoiceDelta> {
    let mut events = parser.push(text);
    if last {
        events.extend(parser.finish());
    }
    let call = |call: ToolCallDelta| ChoiceDelta {
        tool_call: Some(call),
        ..ChoiceDelta::default()
    };
    (events.into_iter())
        .map(|event| match event {
            ToolEvent::Content(text) => ChoiceDelta {
                text,
                ..ChoiceDelta::default()
            },
            ToolEvent::CallStart { index, name } => call(ToolCallDelta {
                index,
                id: Some(call_id()),
                kind: Some("function".into()),
                function: osprey_core::api::FunctionCallDelta {
                    name: Some(name),
                    arguments: Some(String::new()),
                },
            }),
            ToolEvent::Arguments { index, text } => call(ToolCallDelta {
                index,
                id: None,
                kind: None,
                function: osprey_core::api::FunctionCallDelta {
                    name: None,
                    arguments: Some(text),
                },
            }),
        })
        .collect()
}

/// A fresh tool call id, `call_…` as OpenAI writes them.
fn call_id() -> String {
    format!("call_{:024x}", rand::random::<u128>() >> 32)
}

/// A generated token in the chat API's log-probability format.
fn chat_logprob(tok: &Tokenizer, lp: &TokenLogprob) -> osprey_core::api::ChatTokenLogprob {
    let top = |&(id, logprob): &(u32, f32)| osprey_core::api::TopLogprob {
        token: tok.token_text(id),
        logprob,
        bytes: tok.token_bytes(id).to_vec(),
    };
    osprey_core::api::ChatTokenLogprob {
        token: tok.token_text(lp.id),
        logprob: lp.logprob,
        bytes: tok.token_bytes(lp.id).to_vec(),
        top_logprobs: lp.top.iter().map(top).collect(),
    }
}
