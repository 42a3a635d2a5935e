//! A scripted [`Model`] for the agent's orchestrator: it answers each decision with the next
//! entry of its script and remembers what it was shown, so tests can drive every transition
//! of a run without a real model.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use futures_util::future::BoxFuture;
use osprey_agent::{Decision, Item, Model, ToolSpec};
use osprey_core::api::ToolMode;

/// What the model was shown for one decision.
#[derive(Clone, Debug)]
pub struct Seen {
    /// The transcript.
    pub items: Vec<Item>,
    /// The tools' names.
    pub tools: Vec<String>,
    /// The tool choice.
    pub choice: ToolMode,
}

/// One scripted decision.
#[derive(Clone, Debug)]
pub enum Scripted {
    /// Answer with this text.
    Answer(&'static str),
    /// Call these tools: (name, arguments JSON).
    Call(Vec<(&'static str, String)>),
    /// Fail with this message.
    Fail(&'static str),
    /// Take this long, then call the tool with these arguments.
    Slow(Duration, &'static str, String),
}

/// A model that follows a script; each decision costs `tokens` prompt tokens and 10 output
/// tokens.
pub struct ScriptedModel {
    script: Mutex<VecDeque<Scripted>>,
    seen: Mutex<Vec<Seen>>,
    tokens: u64,
}

impl ScriptedModel {
    /// A model that plays `script` in order (and fails once it runs out).
    pub fn new(script: Vec<Scripted>) -> Self {
        Self {
            script: Mutex::new(script.into()),
            seen: Mutex::default(),
            tokens: 100,
        }
    }

    /// The same model, each decision reading `tokens` prompt tokens.
    pub fn with_prompt_tokens(mut self, tokens: u64) -> Self {
        self.tokens = tokens;
        self
    }

    /// What each decision was shown, in order.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

impl Model for ScriptedModel {
    fn decide<'a>(
        &'a self,
        items: &'a [Item],
        tools: &'a [ToolSpec],
        choice: &'a ToolMode,
    ) -> BoxFuture<'a, Result<Decision, String>> {
        self.seen.lock().unwrap().push(Seen {
            items: items.to_vec(),
            tools: tools.iter().map(|t| t.name.clone()).collect(),
            choice: choice.clone(),
        });
        let next = self.script.lock().unwrap().pop_front();
        let tokens = self.tokens;
        Box::pin(async move {
            let decision = |text: &str, calls: Vec<(&str, String)>| Decision {
                text: text.to_owned(),
                calls: calls.into_iter().map(|(n, a)| (n.to_owned(), a)).collect(),
                prompt_tokens: tokens,
                output_tokens: 10,
            };
            match next {
                None => Err("the script has ended".to_owned()),
                Some(Scripted::Answer(text)) => Ok(decision(text, Vec::new())),
                Some(Scripted::Call(calls)) => Ok(decision("", calls)),
                Some(Scripted::Fail(why)) => Err(why.to_owned()),
                Some(Scripted::Slow(wait, name, args)) => {
                    tokio::time::sleep(wait).await;
                    Ok(decision("", vec![(name, args)]))
                }
            }
        })
    }
}
