//! Text completion answers: one `text_completion` object whole, or one per delta streamed
//! (the finish in the choice's last one).

use axum::body::Bytes;
use osprey_core::Error;
use osprey_core::api::{
    Completion, CompletionChoice, CompletionLogprobs, CompletionRequest, Usage,
};
use osprey_core::backend::{ChoiceDelta, GenStream, Logprobs};

use super::{Chunks, Head, collect, fingerprint, whole_response};
use crate::outbound::Outbound;
use crate::sse::json_frame;
use axum::response::Response;
use serde_json::Value;

pub struct CompletionWriter {
    pub(super) head: Head,
    /// Every prompt's `n` choices.
    choices: usize,
}

impl CompletionWriter {
    pub(super) fn new(request: &CompletionRequest) -> Result<Self, Error> {
        let logprobs = request.sampling_params()?.logprobs.is_some();
        Ok(Self {
            head: Head::new("cmpl", &request.model, &request.sampling, logprobs),
            choices: request.prompts()?.len() * request.sampling.choices()?,
        })
    }

    /// The whole answer, through the steps of `out`.
    pub(super) async fn whole(self, events: GenStream, out: Outbound) -> Result<Response, Error> {
        let mut choices: Vec<CompletionChoice> = (0..self.choices)
            .map(|index| CompletionChoice {
                index,
                text: String::new(),
                logprobs: self.head.logprobs.then(CompletionLogprobs::default),
                finish_reason: None,
            })
            .collect();
        let (usage, osprey) = collect(&self.head, events, out, |delta| {
            let choice = &mut choices[delta.index];
            choice.text.push_str(&delta.text);
            if let (Some(all), Some(Logprobs::Completion(more))) =
                (choice.logprobs.as_mut(), delta.logprobs)
            {
                all.extend(more);
            }
            choice.finish_reason = delta.finish.or(choice.finish_reason);
        })
        .await?;
        Ok(whole_response(
            self.object(choices, Some(Some(usage))),
            osprey,
        ))
    }

    fn object(&self, choices: Vec<CompletionChoice>, usage: Option<Option<Usage>>) -> Completion {
        Completion {
            id: self.head.id.clone(),
            object: "text_completion".into(),
            created: self.head.created,
            model: self.head.model.clone(),
            choices,
            usage,
            system_fingerprint: fingerprint(),
        }
    }

    fn chunk(&self, choices: Vec<CompletionChoice>, usage: Option<Usage>) -> Bytes {
        json_frame(&self.object(choices, self.head.include_usage.then_some(usage)))
    }
}

impl Chunks for CompletionWriter {
    fn head(&self) -> &Head {
        &self.head
    }

    fn opening(&self) -> Vec<Bytes> {
        Vec::new()
    }

    fn delta(&mut self, delta: ChoiceDelta) -> Vec<Bytes> {
        if delta.is_empty() {
            return Vec::new();
        }
        let logprobs = match delta.logprobs {
            Some(Logprobs::Completion(l)) => Some(l),
            _ => None,
        };
        let choice = CompletionChoice {
            index: delta.index,
            text: delta.text,
            logprobs,
            finish_reason: delta.finish,
        };
        vec![self.chunk(vec![choice], None)]
    }

    fn empty(&self, usage: Option<Usage>) -> Value {
        let chunk = self.object(Vec::new(), self.head.include_usage.then_some(usage));
        serde_json::to_value(chunk).expect("a chunk serialises")
    }
}
