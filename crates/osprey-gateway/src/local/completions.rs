//! `POST /v1/completions`.

use std::sync::Arc;

use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use osprey_core::api::{
    Completion, CompletionChoice, CompletionLogprobs, CompletionRequest, Prompt, Usage,
};
use osprey_core::{Error, FinishReason};
use osprey_engine::{Delta, Engine, GenerateRequest, Prompter};

use super::generation::{CompletionLogprobsBuilder, Deltas, RequestTimer, merge, start_choices};
use crate::edge::Caller;
use crate::error::ApiError;
use crate::pipeline::Routed;
use crate::sse::{FINGERPRINT, async_stream, done_event, json_event, new_id, stream_response};
use crate::state::{AppState, unix_now};
use osprey_core::UsageReport;

/// One prompt of the request, tokenized.
struct PromptInfo {
    ids: Vec<u32>,
    text: String,
}

impl Routed for CompletionRequest {
    fn model(&self) -> &str {
        &self.model
    }

    async fn serve_locally(
        self,
        state: AppState,
        caller: Caller,
        usage: Arc<UsageReport>,
    ) -> Result<Response, ApiError> {
        completions(state, self, caller, usage).await
    }

    fn prompt_tokens(&self, prompter: &Prompter) -> Result<Vec<u32>, Error> {
        self.sampling_params()?;
        self.sampling.choices()?;
        Ok(match self.prompts()?.into_iter().next() {
            Some(Prompt::Text(text)) => prompter.tokenizer().encode(&text, true),
            Some(Prompt::Tokens(ids)) => ids,
            None => Vec::new(),
        })
    }
}

/// Text completion on the local engine, streamed or not.
pub async fn completions(
    state: AppState,
    req: CompletionRequest,
    caller: Caller,
    usage: Arc<UsageReport>,
) -> Result<Response, ApiError> {
    let engine = state.engine_for(&req.model)?;
    let params = req.sampling_params()?;
    let n = req.sampling.choices()?;
    let prompts: Vec<PromptInfo> = req
        .prompts()?
        .into_iter()
        .map(|p| match p {
            Prompt::Text(text) => PromptInfo {
                ids: engine.tokenizer().encode(&text, true),
                text,
            },
            Prompt::Tokens(ids) => PromptInfo {
                text: engine.tokenizer().decode(&ids),
                ids,
            },
        })
        .collect();
    let prompt_logprobs = req.echo && params.logprobs.is_some();
    let priority = caller.priority_of(&req.osprey);
    let grammar = req.output_grammar()?;
    let grammar_param = match req.response_format {
        Some(_) => "response_format",
        None => "osprey.grammar",
    };
    let mut choices = Vec::new();
    for (i, p) in prompts.iter().enumerate() {
        let request = GenerateRequest {
            prompt_logprobs,
            priority,
            deadline: osprey_core::api::deadline_of(&req.osprey),
            cache_salt: caller.tenant.cache_salt.clone(),
            grammar: grammar.clone(),
            ..GenerateRequest::new(p.ids.clone(), params.clone())
        };
        let started =
            start_choices(&engine, &request, n, i * n).map_err(|e| match e.param.as_deref() {
                Some("grammar") => e.with_param(grammar_param),
                _ => e,
            })?;
        choices.extend(started);
    }
    let ctx = CompletionContext {
        id: new_id("cmpl"),
        created: unix_now(),
        model: req.model.clone(),
        engine,
        prompt_tokens: prompts.iter().map(|p| p.ids.len()).sum(),
        choices: prompts
            .iter()
            .flat_map(|p| std::iter::repeat_n(p, n))
            .map(|p| ChoiceState::new(p, req.echo))
            .collect(),
        top_logprobs: params.logprobs,
        timer: RequestTimer::new(&req.model, priority, usage)
            .watched_by(state.degradation().clone())
            .recorded_in(caller.record.clone()),
    };
    let deltas = merge(choices);
    if req.sampling.streaming() {
        Ok(stream_response(
            ctx.stream(deltas, req.sampling.include_usage()),
        ))
    } else {
        Ok(axum::Json(ctx.collect(deltas).await?).into_response())
    }
}

/// Per-choice progress.
struct ChoiceState {
    prompt_ids: Vec<u32>,
    prompt_text: String,
    echo: bool,
    /// Prompt positions whose log-probabilities have arrived.
    prompt_seen: usize,
    text: String,
    logprobs: CompletionLogprobsBuilder,
    finish: Option<FinishReason>,
}

impl ChoiceState {
    fn new(p: &PromptInfo, echo: bool) -> Self {
        Self {
            prompt_ids: p.ids.clone(),
            prompt_text: p.text.clone(),
            echo,
            prompt_seen: 0,
            text: if echo { p.text.clone() } else { String::new() },
            // Offsets are into the choice's `text`, which starts with the prompt when echoing.
            logprobs: CompletionLogprobsBuilder::new(0),
            finish: None,
        }
    }
}

struct CompletionContext {
    id: String,
    created: u64,
    model: String,
    engine: Engine,
    prompt_tokens: usize,
    choices: Vec<ChoiceState>,
    top_logprobs: Option<usize>,
    timer: RequestTimer,
}

impl CompletionContext {
    /// Applies a delta to its choice; returns the text it added. Counts generated tokens.
    fn apply(&mut self, index: usize, delta: &Delta) -> String {
        let tok = self.engine.tokenizer();
        let c = &mut self.choices[index];
        if let (Some(lps), Some(top)) = (&delta.prompt_logprobs, self.top_logprobs) {
            for lp in lps {
                let id = c.prompt_ids[c.prompt_seen];
                c.logprobs.push(tok, id, lp.as_ref(), top);
                c.prompt_seen += 1;
            }
        }
        if let Some(token) = &delta.token {
            self.timer.token();
            if let Some(top) = self.top_logprobs {
                c.logprobs.push(tok, token.id, token.logprob.as_ref(), top);
            }
        }
        c.text.push_str(&delta.text);
        c.finish = delta.finish.or(c.finish);
        delta.text.clone()
    }

    fn logprobs_of(&mut self, index: usize) -> Option<CompletionLogprobs> {
        self.top_logprobs
            .map(|_| self.choices[index].logprobs.take())
    }

    async fn collect(mut self, mut deltas: Deltas) -> Result<Completion, Error> {
        let mut completion_tokens = 0;
        while let Some((index, delta)) = deltas.next().await {
            let delta = delta?;
            completion_tokens += usize::from(delta.token.is_some());
            self.apply(index, &delta);
        }
        self.timer.finish(self.prompt_tokens, completion_tokens);
        let choices = (0..self.choices.len())
            .map(|index| CompletionChoice {
                index,
                logprobs: self.logprobs_of(index),
                text: std::mem::take(&mut self.choices[index].text),
                finish_reason: self.choices[index].finish,
            })
            .collect();
        Ok(Completion {
            id: self.id,
            object: "text_completion".into(),
            created: self.created,
            model: self.model,
            choices,
            usage: Some(Some(Usage::new(self.prompt_tokens, completion_tokens))),
            system_fingerprint: Some(FINGERPRINT.into()),
        })
    }

    fn chunk(&self, choices: Vec<CompletionChoice>, usage: Option<Option<Usage>>) -> Completion {
        Completion {
            id: self.id.clone(),
            object: "text_completion".into(),
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
        include_usage: bool,
    ) -> impl futures_util::Stream<Item = Event> + Send + 'static {
        let usage_field = move |u: Option<Usage>| include_usage.then_some(u);
        async_stream(move |tx| async move {
            for index in 0..self.choices.len() {
                let c = &self.choices[index];
                if c.echo && !c.prompt_text.is_empty() && self.top_logprobs.is_none() {
                    let choice = CompletionChoice {
                        index,
                        text: c.prompt_text.clone(),
                        logprobs: None,
                        finish_reason: None,
                    };
                    tx.send(json_event(&self.chunk(vec![choice], usage_field(None))))
                        .await?;
                }
            }
            let mut completion_tokens = 0;
            while let Some((index, delta)) = deltas.next().await {
                let delta = match delta {
                    Ok(d) => d,
                    Err(e) => {
                        self.timer.note(|n| n.error = Some(e.message.clone()));
                        tx.send(json_event(&e.envelope())).await?;
                        return Ok(());
                    }
                };
                completion_tokens += usize::from(delta.token.is_some());
                let mut text = self.apply(index, &delta);
                if delta.prompt_logprobs.is_some() && self.choices[index].echo {
                    // With log-probabilities the echoed prompt travels with its tokens' scores.
                    let c = &self.choices[index];
                    if c.prompt_seen == c.prompt_ids.len() {
                        text = c.prompt_text.clone();
                    } else {
                        continue;
                    }
                }
                let logprobs = self.logprobs_of(index);
                if text.is_empty()
                    && logprobs.as_ref().is_none_or(|l| l.tokens.is_empty())
                    && delta.finish.is_none()
                {
                    continue;
                }
                let choice = CompletionChoice {
                    index,
                    text,
                    logprobs,
                    finish_reason: delta.finish,
                };
                tx.send(json_event(&self.chunk(vec![choice], usage_field(None))))
                    .await?;
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
