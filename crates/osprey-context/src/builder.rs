//! The prompt builder: a request's own messages plus the layers of memory, each within its
//! own token budget, in one order:
//!
//! ```text
//! [the request's leading system messages]
//! [one system message: facts about the user | the task's scratchpad | summary of older turns]
//! [the conversation's recent turns, verbatim]
//! [the request's other messages]
//! ```
//!
//! - **facts** (episodic): newest first, whole facts, as many as fit;
//! - **working**: the scratchpad's text, cut to its budget;
//! - **summary** (session): the summary of the turns older than those kept verbatim, cut to
//!   its budget;
//! - **history** (session): the newest whole turns that fit.
//!
//! The builder counts tokens with the caller's counter (the model's tokenizer) and reports what
//! it put in ([`Injected`]) for the request log. [`plan_history`] decides when older turns
//! are folded into the summary.

use serde::Serialize;

use crate::prompt::Message;

/// Tokens a message costs beyond its text: the chat template's role markers.
pub const MESSAGE_OVERHEAD: usize = 4;

/// Token budget of each layer; 0 leaves a layer out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budgets {
    /// Recent turns, verbatim.
    pub history: usize,
    /// The summary of older turns.
    pub summary: usize,
    /// Facts about the user.
    pub facts: usize,
    /// The task's scratchpad.
    pub working: usize,
}

impl Default for Budgets {
    fn default() -> Self {
        Self {
            history: 2048,
            summary: 256,
            facts: 256,
            working: 512,
        }
    }
}

/// A durable fact about the user.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fact {
    /// Its id in the store.
    pub id: String,
    /// Its text.
    pub content: String,
}

/// What the builder may put in, besides the request's own messages.
#[derive(Clone, Debug, Default)]
pub struct Layers {
    /// Facts about the user, newest first.
    pub facts: Vec<Fact>,
    /// The task's scratchpad: its name and text.
    pub working: Option<(String, String)>,
    /// The summary of the conversation's older turns.
    pub summary: Option<String>,
    /// The conversation's recent turns, oldest first.
    pub history: Vec<Message>,
}

/// What the builder made of the layers.
#[derive(Clone, Debug, Default)]
pub struct Built {
    /// One system message with the facts, the scratchpad and the summary, if any went in.
    pub memory: Option<Message>,
    /// The recent turns that went in, oldest first.
    pub history: Vec<Message>,
    /// What went in.
    pub injected: Injected,
}

impl Built {
    /// `messages` with the layers put in: after the leading system (or developer) messages,
    /// the memory message, then the recent turns, then the rest.
    pub fn splice<T: From<Message>>(
        self,
        messages: Vec<T>,
        is_lead: impl Fn(&T) -> bool,
    ) -> Vec<T> {
        let lead = messages.iter().take_while(|m| is_lead(m)).count();
        let mut out = Vec::with_capacity(messages.len() + self.history.len() + 1);
        let mut messages = messages.into_iter();
        out.extend(messages.by_ref().take(lead));
        out.extend(self.memory.into_iter().map(T::from));
        out.extend(self.history.into_iter().map(T::from));
        out.extend(messages);
        out
    }
}

/// What the builder put in, per layer (the request log's `injected`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Injected {
    /// Ids of the facts put in.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub facts: Vec<String>,
    /// Tokens of the facts section.
    #[serde(skip_serializing_if = "is_zero")]
    pub facts_tokens: usize,
    /// The scratchpad's name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub working: Option<String>,
    /// Tokens of the scratchpad section.
    #[serde(skip_serializing_if = "is_zero")]
    pub working_tokens: usize,
    /// Tokens of the summary section.
    #[serde(skip_serializing_if = "is_zero")]
    pub summary_tokens: usize,
    /// Recent turns put in.
    #[serde(skip_serializing_if = "is_zero")]
    pub history_items: usize,
    /// Their tokens.
    #[serde(skip_serializing_if = "is_zero")]
    pub history_tokens: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// Builds prompts, counting tokens with `count`.
pub struct PromptBuilder<F> {
    count: F,
    budgets: Budgets,
}

impl<F: Fn(&str) -> usize> PromptBuilder<F> {
    /// A builder with `budgets`, counting a text's tokens with `count`.
    pub fn new(budgets: Budgets, count: F) -> Self {
        Self { count, budgets }
    }

    /// The messages `layers` become within their budgets, and what went in.
    pub fn build(&self, layers: Layers) -> Built {
        let mut injected = Injected::default();
        let mut sections = Vec::new();
        sections.extend(self.facts(&layers.facts, &mut injected));
        if let Some((name, text)) = &layers.working {
            let head = format!("Notes for the current task ({name}):\n");
            if let Some(section) = self.cut(&head, text, self.budgets.working) {
                injected.working = Some(name.clone());
                injected.working_tokens = (self.count)(&section);
                sections.push(section);
            }
        }
        if let Some(summary) = &layers.summary {
            let head = "Summary of the earlier conversation:\n";
            if let Some(section) = self.cut(head, summary, self.budgets.summary) {
                injected.summary_tokens = (self.count)(&section);
                sections.push(section);
            }
        }
        let history = self.recent(layers.history, &mut injected);
        let memory = (!sections.is_empty()).then(|| Message {
            role: "system".into(),
            content: sections.join("\n\n"),
        });
        Built {
            memory,
            history,
            injected,
        }
    }

    fn facts(&self, facts: &[Fact], injected: &mut Injected) -> Option<String> {
        let mut section = String::from("Known about the user:");
        let mut used = (self.count)(&section);
        for fact in facts {
            let line = format!("\n- {}", fact.content);
            let cost = (self.count)(&line);
            if used + cost > self.budgets.facts {
                break;
            }
            used += cost;
            section.push_str(&line);
            injected.facts.push(fact.id.clone());
        }
        if injected.facts.is_empty() {
            return None;
        }
        injected.facts_tokens = used;
        Some(section)
    }

    /// `head` and as much of `text` as fits `budget` tokens with it (cut at a char boundary,
    /// marked `…`); `None` if not even the head fits.
    fn cut(&self, head: &str, text: &str, budget: usize) -> Option<String> {
        let whole = format!("{head}{text}");
        if (self.count)(&whole) <= budget {
            return Some(whole);
        }
        let bounds: Vec<usize> = text.char_indices().map(|(i, _)| i).collect();
        let fits = |n: usize| (self.count)(&format!("{head}{}…", &text[..bounds[n]])) <= budget;
        // The longest prefix that fits, by bisection over char boundaries.
        let (mut lo, mut hi) = (0, bounds.len());
        while lo + 1 < hi {
            let mid = (lo + hi) / 2;
            match fits(mid) {
                true => lo = mid,
                false => hi = mid,
            }
        }
        (lo > 0 || fits(0)).then(|| format!("{head}{}…", &text[..bounds[lo]]))
    }

    fn recent(&self, history: Vec<Message>, injected: &mut Injected) -> Vec<Message> {
        let costs: Vec<usize> = history.iter().map(|m| self.cost(m)).collect();
        let keep = newest_within(&costs, self.budgets.history);
        injected.history_items = keep;
        injected.history_tokens = costs[costs.len() - keep..].iter().sum();
        let skip = history.len() - keep;
        history.into_iter().skip(skip).collect()
    }

    /// Tokens `message` costs in a prompt.
    pub fn cost(&self, message: &Message) -> usize {
        (self.count)(&message.content) + MESSAGE_OVERHEAD
    }
}

/// How many of the newest of `costs` (oldest first) fit `budget` together.
fn newest_within(costs: &[usize], budget: usize) -> usize {
    let mut used = 0;
    costs
        .iter()
        .rev()
        .take_while(|&&c| {
            used += c;
            used <= budget
        })
        .count()
}

/// What to do with a conversation's turns that no summary covers yet (costs oldest first).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HistoryPlan {
    /// They all fit the history budget: no summary is needed.
    KeepAll,
    /// Fold the `fold` oldest into the summary; the rest are kept verbatim. Only the newest
    /// turns that fit half the budget are kept, so the next turns fit without another
    /// summary and summaries are made once per half a budget of conversation.
    Fold {
        /// How many of the oldest turns to fold.
        fold: usize,
    },
}

/// The plan for turns costing `costs` (oldest first) under a history budget of `budget`.
pub fn plan_history(costs: &[usize], budget: usize) -> HistoryPlan {
    if costs.iter().sum::<usize>() <= budget {
        return HistoryPlan::KeepAll;
    }
    HistoryPlan::Fold {
        fold: costs.len() - newest_within(costs, budget / 2),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One token a word.
    fn words(text: &str) -> usize {
        text.split_whitespace().count()
    }

    fn say(role: &str, content: &str) -> Message {
        Message {
            role: role.into(),
            content: content.into(),
        }
    }

    fn fact(id: &str, content: &str) -> Fact {
        Fact {
            id: id.into(),
            content: content.into(),
        }
    }

    #[test]
    fn each_layer_stays_within_its_budget_in_its_place() {
        let budgets = Budgets {
            history: 2 * (3 + MESSAGE_OVERHEAD),
            // Each head's words, plus what of its layer fits.
            summary: 5 + 4,
            facts: 4 + 2 * 4,
            working: 6 + 2,
        };
        let builder = PromptBuilder::new(budgets, words);
        let layers = Layers {
            facts: vec![
                fact("f3", "likes green tea"),
                fact("f2", "lives in Lisbon"),
                fact("f1", "is a nurse"),
            ],
            working: Some(("trip".into(), "day one museums then day two beach".into())),
            summary: Some("they talked about travel".into()),
            history: vec![
                say("user", "one two three"),
                say("assistant", "four five six"),
                say("user", "seven eight nine"),
            ],
        };
        let messages = vec![say("system", "be brief"), say("user", "and now?")];
        let built = builder.build(layers);
        let injected = built.injected.clone();
        let out = built.splice(messages, |m| m.role == "system");
        let roles: Vec<&str> = out.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(
            roles,
            ["system", "system", "assistant", "user", "user"],
            "{out:#?}"
        );
        assert_eq!(out[0].content, "be brief");
        let memory = &out[1].content;
        assert!(memory.contains("- likes green tea\n- lives in Lisbon"));
        assert!(!memory.contains("nurse"), "the oldest fact is over budget");
        assert!(memory.contains("Notes for the current task (trip):\nday one…"));
        assert!(memory.ends_with("Summary of the earlier conversation:\nthey talked about travel"));
        assert_eq!(out[2].content, "four five six");
        assert_eq!(out[4].content, "and now?");
        assert_eq!(injected.facts, ["f3", "f2"]);
        assert!(injected.facts_tokens <= budgets.facts);
        assert!(injected.working_tokens <= budgets.working);
        assert!(injected.summary_tokens <= budgets.summary);
        assert_eq!(injected.history_items, 2);
        assert_eq!(injected.history_tokens, 2 * (3 + MESSAGE_OVERHEAD));
    }

    #[test]
    fn no_layers_leave_the_messages_as_they_were() {
        let builder = PromptBuilder::new(Budgets::default(), words);
        let messages = vec![say("user", "hi")];
        let built = builder.build(Layers::default());
        let injected = built.injected.clone();
        assert_eq!(built.splice(messages.clone(), |_| true), messages);
        assert_eq!(injected, Injected::default());
        assert_eq!(serde_json::to_string(&injected).unwrap(), "{}");
    }

    #[test]
    fn a_budget_of_zero_leaves_its_layer_out() {
        let budgets = Budgets {
            history: 0,
            summary: 0,
            facts: 0,
            working: 0,
        };
        let layers = Layers {
            facts: vec![fact("f", "likes tea")],
            working: Some(("w".into(), "notes".into())),
            summary: Some("s".into()),
            history: vec![say("user", "old")],
        };
        let messages = vec![say("user", "hi")];
        let built = PromptBuilder::new(budgets, words).build(layers);
        let injected = built.injected.clone();
        assert_eq!(built.splice(messages.clone(), |_| false), messages);
        assert_eq!(injected, Injected::default());
    }

    #[test]
    fn older_turns_are_folded_only_past_the_budget_and_then_down_to_half() {
        assert_eq!(plan_history(&[10, 10, 10], 30), HistoryPlan::KeepAll);
        assert_eq!(plan_history(&[], 0), HistoryPlan::KeepAll);
        // 40 > 30: keep the newest within 15 (one turn), fold the rest.
        assert_eq!(
            plan_history(&[10, 10, 10, 10], 30),
            HistoryPlan::Fold { fold: 3 }
        );
        // A newest turn over half the budget alone: everything is folded.
        assert_eq!(plan_history(&[5, 20], 20), HistoryPlan::Fold { fold: 2 });
    }
}
