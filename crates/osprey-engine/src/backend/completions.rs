//! A text completion request on the engine: each of its prompts `n` times (choice
//! `prompt_index * n + i`), the prompt echoed first when asked, with its tokens' scores when
//! log-probabilities are asked for too.

use std::collections::BTreeMap;

use osprey_core::api::{CompletionLogprobs, CompletionRequest, Prompt, Usage};
use osprey_core::backend::{ChoiceDelta, GenEvent, GenStream, Logprobs};
use osprey_core::{Error, Priority};

use super::{Answer, events, start_choices};
use crate::{Delta, Engine, GenerateRequest, Prompter, TokenLogprob, Tokenizer};

/// The token ids of `request`'s first prompt, as the engine will see them; errors for
/// sampling parameters the engine would refuse.
pub fn prompt_tokens(request: &CompletionRequest, prompter: &Prompter) -> Result<Vec<u32>, Error> {
    request.sampling_params()?;
    request.sampling.choices()?;
    Ok(match request.prompts()?.into_iter().next() {
        Some(Prompt::Text(text)) => prompter.tokenizer().encode(&text, true),
        Some(Prompt::Tokens(ids)) => ids,
        None => Vec::new(),
    })
}

/// Starts every choice of every prompt of `request`.
pub(super) fn start(
    engine: &Engine,
    request: &CompletionRequest,
    priority: Priority,
    cache_salt: String,
) -> Result<GenStream, Error> {
    let params = request.sampling_params()?;
    let n = request.sampling.choices()?;
    let tokenizer = engine.tokenizer();
    let prompts: Vec<(Vec<u32>, String)> = (request.prompts()?.into_iter())
        .map(|p| match p {
            Prompt::Text(text) => (tokenizer.encode(&text, true), text),
            Prompt::Tokens(ids) => {
                let text = tokenizer.decode(&ids);
                (ids, text)
            }
        })
        .collect();
    let grammar = request.output_grammar()?;
    let grammar_param = match request.response_format {
        Some(_) => "response_format",
        None => "osprey.grammar",
    };
    let mut started = Vec::new();
    let drafts = std::sync::Arc::<crate::speculative::DraftTally>::default();
    for (i, (ids, _)) in prompts.iter().enumerate() {
        let generate = GenerateRequest {
            prompt_logprobs: request.echo && params.logprobs.is_some(),
            priority,
            deadline: osprey_core::api::deadline_of(&request.osprey),
            cache_salt: cache_salt.clone(),
            grammar: grammar.clone(),
            speculative: osprey_core::api::speculative_of(&request.osprey),
            drafts: drafts.clone(),
            ..GenerateRequest::new(ids.clone(), params.clone())
        };
        let choices =
            start_choices(engine, &generate, n, i * n).map_err(|e| match e.param.as_deref() {
                Some("grammar") => e.with_param(grammar_param),
                _ => e,
            })?;
        started.extend(choices);
    }
    let answer = CompletionAnswer {
        engine: engine.clone(),
        prompt_tokens: prompts.iter().map(|(ids, _)| ids.len()).sum(),
        completion_tokens: 0,
        top_logprobs: params.logprobs,
        choices: (prompts.into_iter())
            .flat_map(|p| std::iter::repeat_n(p, n))
            .map(|(ids, text)| ChoiceState::new(ids, text, request.echo))
            .collect(),
    };
    let echoes = answer.echoes();
    let events = events(answer, started, drafts);
    Ok(Box::pin(futures_util::StreamExt::chain(
        futures_util::stream::iter(echoes.into_iter().map(Ok)),
        events,
    )))
}

/// One choice's progress.
struct ChoiceState {
    prompt_ids: Vec<u32>,
    prompt_text: String,
    echo: bool,
    /// Prompt positions whose log-probabilities have arrived.
    prompt_seen: usize,
    /// Log-probabilities not yet sent; offsets are into the choice's text, which starts with
    /// the prompt when echoing.
    logprobs: LogprobsBuilder,
}

impl ChoiceState {
    fn new(prompt_ids: Vec<u32>, prompt_text: String, echo: bool) -> Self {
        Self {
            prompt_ids,
            prompt_text,
            echo,
            prompt_seen: 0,
            logprobs: LogprobsBuilder::default(),
        }
    }
}

struct CompletionAnswer {
    engine: Engine,
    prompt_tokens: usize,
    completion_tokens: usize,
    /// How many alternatives each token's log-probability comes with, when asked for.
    top_logprobs: Option<usize>,
    choices: Vec<ChoiceState>,
}

impl CompletionAnswer {
    /// The echoed prompts that go first: without log-probabilities, the prompt is known at
    /// once (with them, it goes when its tokens' scores have come).
    fn echoes(&self) -> Vec<GenEvent> {
        if self.top_logprobs.is_some() {
            return Vec::new();
        }
        (self.choices.iter().enumerate())
            .filter(|(_, c)| c.echo && !c.prompt_text.is_empty())
            .map(|(index, c)| {
                GenEvent::Delta(ChoiceDelta {
                    index,
                    text: c.prompt_text.clone(),
                    ..ChoiceDelta::default()
                })
            })
            .collect()
    }
}

impl Answer for CompletionAnswer {
    fn events(&mut self, index: usize, delta: Delta) -> Vec<GenEvent> {
        let (tok, top) = (self.engine.tokenizer(), self.top_logprobs);
        let c = &mut self.choices[index];
        let mut events = Vec::new();
        if let (Some(lps), Some(top_n)) = (&delta.prompt_logprobs, top) {
            for lp in lps {
                let id = c.prompt_ids[c.prompt_seen];
                c.logprobs.push(tok, id, lp.as_ref(), top_n);
                c.prompt_seen += 1;
            }
            if c.echo && c.prompt_seen == c.prompt_ids.len() {
                // With log-probabilities the echoed prompt travels with its tokens' scores.
                events.push(ChoiceDelta {
                    index,
                    text: c.prompt_text.clone(),
                    logprobs: c.logprobs.take(top),
                    ..ChoiceDelta::default()
                });
            }
        }
        let tokens = usize::from(delta.token.is_some());
        self.completion_tokens += tokens;
        if let (Some(token), Some(top_n)) = (&delta.token, top) {
            c.logprobs
                .push(tok, token.id, token.logprob.as_ref(), top_n);
        }
        if delta.prompt_logprobs.is_none() || tokens > 0 || delta.finish.is_some() {
            events.push(ChoiceDelta {
                index,
                text: delta.text,
                logprobs: c.logprobs.take(top),
                tokens,
                finish: delta.finish,
                ..ChoiceDelta::default()
            });
        }
        events.into_iter().map(GenEvent::Delta).collect()
    }

    fn usage(&self) -> Usage {
        Usage::new(self.prompt_tokens, self.completion_tokens)
    }
}

/// Appends tokens to a completions-API log-probability object, tracking text offsets.
#[derive(Default)]
struct LogprobsBuilder {
    logprobs: CompletionLogprobs,
    /// Characters of the choice's text so far.
    offset: usize,
}

impl LogprobsBuilder {
    /// Adds one token: its id, and its log-probability and alternatives if known.
    fn push(&mut self, tok: &Tokenizer, id: u32, lp: Option<&TokenLogprob>, top_n: usize) {
        let text = tok.token_text(id);
        let l = &mut self.logprobs;
        l.text_offset.push(self.offset);
        self.offset += text.chars().count();
        l.tokens.push(text);
        l.token_logprobs.push(lp.map(|lp| lp.logprob));
        l.top_logprobs.push(lp.map(|lp| {
            (lp.top.iter().take(top_n))
                .map(|&(id, logprob)| (tok.token_text(id), logprob))
                .collect::<BTreeMap<_, _>>()
        }));
    }

    /// The entries added so far, when log-probabilities were asked for (`top`), leaving the
    /// builder empty (offsets go on).
    fn take(&mut self, top: Option<usize>) -> Option<Logprobs> {
        top.map(|_| Logprobs::Completion(std::mem::take(&mut self.logprobs)))
    }
}
