//! A scripted [`Backend`]: it answers every request with the same events, and remembers the
//! requests it got, so the code that writes, filters or keeps an answer can be tested on
//! answers no real model would give on cue (tool calls, an error halfway, several choices).

use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;

use osprey_core::Error;
use osprey_core::api::{FunctionCallDelta, ToolCallDelta, Usage};
use osprey_core::backend::{Backend, ChoiceDelta, GenEvent, GenRequest, GenStream};

/// A backend that streams its script.
#[derive(Default)]
pub struct ScriptedBackend {
    script: Vec<Result<GenEvent, Error>>,
    asked: Mutex<Vec<GenRequest>>,
}

impl ScriptedBackend {
    /// A backend that answers with `script`, in order.
    pub fn new(script: Vec<Result<GenEvent, Error>>) -> Self {
        Self {
            script,
            asked: Mutex::default(),
        }
    }

    /// The requests it got, in order.
    pub fn asked(&self) -> Vec<GenRequest> {
        self.asked.lock().expect("not poisoned").clone()
    }
}

impl Backend for ScriptedBackend {
    fn generate(
        &self,
        request: GenRequest,
    ) -> Pin<Box<dyn Future<Output = Result<GenStream, Error>> + Send + '_>> {
        self.asked.lock().expect("not poisoned").push(request);
        let events: GenStream = Box::pin(futures_util::stream::iter(self.script.clone()));
        Box::pin(std::future::ready(Ok(events)))
    }
}

/// Text added to choice `index`, from `tokens` generated tokens.
pub fn text(index: usize, text: &str, tokens: usize) -> Result<GenEvent, Error> {
    Ok(GenEvent::Delta(ChoiceDelta {
        index,
        text: text.to_owned(),
        tokens,
        ..ChoiceDelta::default()
    }))
}

/// Call `call` of choice `index` begun (with `name`) or continued (`name` `None`), with a
/// piece of its `arguments`.
pub fn call(
    index: usize,
    call: usize,
    name: Option<&str>,
    arguments: &str,
) -> Result<GenEvent, Error> {
    let first = name.is_some();
    Ok(GenEvent::Delta(ChoiceDelta {
        index,
        tool_call: Some(ToolCallDelta {
            index: call,
            id: first.then(|| format!("call_{index}_{call}")),
            kind: first.then(|| "function".to_owned()),
            function: FunctionCallDelta {
                name: name.map(str::to_owned),
                arguments: Some(arguments.to_owned()),
            },
        }),
        tokens: 1,
        ..ChoiceDelta::default()
    }))
}

/// Choice `index` ends, for `reason`.
pub fn finish(index: usize, reason: osprey_core::FinishReason) -> Result<GenEvent, Error> {
    Ok(GenEvent::Delta(ChoiceDelta {
        index,
        finish: Some(reason),
        ..ChoiceDelta::default()
    }))
}

/// The usage that ends a complete answer.
pub fn usage(prompt_tokens: usize, completion_tokens: usize) -> Result<GenEvent, Error> {
    Ok(GenEvent::Usage(Usage::new(
        prompt_tokens,
        completion_tokens,
    )))
}
