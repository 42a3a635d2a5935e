//! Session memory: a chat request that names a conversation (`"osprey": {"conversation":
//! ID}`) is answered with the conversation's recent turns in its prompt, and its turn is kept.
//!
//! - **In** ([`session`]): the turns no summary covers yet. While they fit the history budget
//!   they all go in. Past it, the older ones are folded into the conversation's summary (by
//!   the [`SummaryWriter`]), keeping verbatim only the newest turns that fit half the budget,
//!   so a summary is made once per half a budget of conversation, and the summary goes in too
//!   (within its own budget). With `summary_tokens: 0` nothing is folded: the newest turns
//!   that fit go in and older ones are left out. The prompt builder ([`crate::memory`]) puts
//!   them in place.
//! - **Out** ([`Turn`]): once the answer is complete, the request's own messages and the
//!   answer (choice 0) are appended in one transaction. The server does it before the client
//!   sees the end of the answer, so a failed append fails the answer (or ends its stream with
//!   an error instead of `[DONE]`); a failed answer appends nothing.

use osprey_core::Error;
use std::sync::Arc;

use osprey_store::{ItemPage, ItemRecord, NewItem, Owner, SummaryRecord};

use crate::store::ContextStore;

use crate::builder::{Budgets, HistoryPlan, MESSAGE_OVERHEAD, plan_history};
use crate::memory::Memory;
use crate::prompt::Message;
use crate::summary::summarize;

/// Items read from the store per page.
const PAGE: i64 = 100;
/// Tokens of older turns read beyond the history budget to fold into a summary at once: about
/// what the summarising model reads well. Older turns than these, never summarised (a
/// conversation held with summaries off), are left out of the summary.
const FOLD_WINDOW: usize = 1536;

/// A turn of a conversation in progress: what to append once the answer is in.
pub struct Turn {
    store: Arc<dyn ContextStore>,
    owner: Owner,
    id: String,
    asked: Vec<NewItem>,
    /// The answer (choice 0) heard so far.
    answer: String,
}

/// The session layers of a conversation.
pub struct Session {
    /// The summary of its older turns.
    pub summary: Option<String>,
    /// Its turns no summary covers, oldest first (the builder keeps the newest that fit).
    pub history: Vec<Message>,
}

/// The session layers of conversation `id` of `owner` within `budgets`, folding older turns
/// into its summary when they no longer fit (see the module docs).
pub async fn session(
    memory: &Memory<'_>,
    store: &dyn ContextStore,
    owner: &Owner,
    id: &str,
    budgets: &Budgets,
) -> Result<Session, Error> {
    let summary = store.summary(owner, id).await?;
    let since = summary.as_ref().map_or(0, |s| s.through_seq);
    let window = match budgets.summary {
        0 => budgets.history,
        _ => budgets.history + FOLD_WINDOW,
    };
    let (items, costs) = unsummarised(memory, store, owner, id, since, window).await?;
    let message = |i: &ItemRecord| Message {
        role: i.role.clone(),
        content: i.content.clone(),
    };
    // Nothing is folded without room for a summary, nor with no history wanted (each request
    // would fold).
    let folding = budgets.summary > 0 && budgets.history > 0;
    let fold = match plan_history(&costs, budgets.history) {
        HistoryPlan::Fold { fold } if folding => fold,
        _ => 0,
    };
    let mut summary = summary.map(|s| s.content);
    if fold > 0 {
        let folded: Vec<Message> = items[..fold].iter().map(message).collect();
        let written = summarize(
            memory.summaries,
            summary.as_deref(),
            &folded,
            budgets.summary,
        );
        match written.await {
            Ok(text) => {
                metrics::counter!(osprey_core::metrics::SUMMARIES, "result" => "ok").increment(1);
                let record = SummaryRecord {
                    through_seq: items[fold - 1].seq,
                    content: text.clone(),
                };
                store.set_summary(owner, id, &record).await?;
                summary = Some(text);
                return Ok(Session {
                    summary,
                    history: items[fold..].iter().map(message).collect(),
                });
            }
            // Without a new summary the old one stays, and the builder keeps the newest turns
            // that fit.
            Err(e) => {
                metrics::counter!(osprey_core::metrics::SUMMARIES, "result" => "failed")
                    .increment(1);
                tracing::warn!(error = %e.message, conversation = id, "summary failed");
            }
        }
    }
    Ok(Session {
        summary,
        history: items.iter().map(message).collect(),
    })
}

/// The newest items of conversation `id` after `since`, up to `window` tokens' worth (and
/// the one that crosses it), oldest first, with what each costs in a prompt.
async fn unsummarised(
    memory: &Memory<'_>,
    store: &dyn ContextStore,
    owner: &Owner,
    id: &str,
    since: i64,
    window: usize,
) -> Result<(Vec<ItemRecord>, Vec<usize>), Error> {
    let (mut kept, mut costs, mut used, mut after) = (Vec::new(), Vec::new(), 0, None::<String>);
    'pages: loop {
        let page = ItemPage {
            after: after.as_deref(),
            limit: PAGE,
            newest_first: true,
        };
        let items = store.items(owner, id, page).await?;
        for item in &items {
            if item.seq <= since || used > window {
                break 'pages;
            }
            let cost = (memory.tokens)(&item.content) + MESSAGE_OVERHEAD;
            used += cost;
            costs.push(cost);
            kept.push(item.clone());
        }
        match items.last() {
            Some(last) if items.len() as i64 == PAGE => after = Some(last.id.clone()),
            _ => break,
        }
    }
    kept.reverse();
    costs.reverse();
    Ok((kept, costs))
}

impl Turn {
    /// The turn of `asked` (the request's own messages) in conversation `id` of `owner`.
    pub fn new(store: Arc<dyn ContextStore>, owner: Owner, id: String, asked: &[Message]) -> Self {
        let asked = (asked.iter())
            .map(|m| NewItem::new(&m.role, &m.content))
            .collect();
        Self {
            store,
            owner,
            id,
            asked,
            answer: String::new(),
        }
    }

    /// Hears more of the answer (choice 0) as it streams.
    pub fn hear(&mut self, text: &str) {
        self.answer.push_str(text);
    }

    /// Appends the turn with the answer heard.
    pub async fn keep_heard(&mut self) -> Result<(), Error> {
        let answer = std::mem::take(&mut self.answer);
        self.keep(answer).await
    }

    /// Appends the turn with `answer`, the whole answer's text.
    pub async fn keep(&self, answer: String) -> Result<(), Error> {
        let mut items = self.asked.clone();
        items.push(NewItem {
            role: "assistant".into(),
            content: answer,
        });
        self.store
            .append_items(&self.owner, &self.id, &items)
            .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use futures_util::future::BoxFuture;
    use osprey_store::{FactRecord, PromptVersion, Split, StoreError, WorkingRecord};

    use super::*;
    use crate::store::Kept;
    use crate::summary::SummaryWriter;

    /// A conversation's items and summary, in memory.
    #[derive(Default)]
    struct Kept1 {
        items: Mutex<Vec<ItemRecord>>,
        summary: Mutex<Option<SummaryRecord>>,
    }

    fn ready<'a, T: Send + 'a>(value: Result<T, StoreError>) -> Kept<'a, T> {
        Box::pin(std::future::ready(value))
    }

    fn none<'a, T: Send + 'a>() -> Kept<'a, T> {
        ready(Err(StoreError::NotFound("it".into())))
    }

    impl ContextStore for Kept1 {
        fn items<'a>(
            &'a self,
            _: &'a Owner,
            _: &'a str,
            page: ItemPage<'a>,
        ) -> Kept<'a, Vec<ItemRecord>> {
            let mut items = self.items.lock().unwrap().clone();
            if page.newest_first {
                items.reverse();
            }
            let start = (page.after)
                .and_then(|after| items.iter().position(|i| i.id == after))
                .map_or(0, |p| p + 1);
            let page = items.into_iter().skip(start).take(page.limit as usize);
            ready(Ok(page.collect()))
        }
        fn append_items<'a>(
            &'a self,
            _: &'a Owner,
            id: &'a str,
            new: &'a [NewItem],
        ) -> Kept<'a, Vec<ItemRecord>> {
            let mut items = self.items.lock().unwrap();
            let mut added = Vec::new();
            for n in new {
                let item = ItemRecord {
                    seq: items.len() as i64 + 1,
                    id: format!("msg_{}", items.len()),
                    conversation_id: id.to_owned(),
                    role: n.role.clone(),
                    content: n.content.clone(),
                    created_at: 0,
                };
                items.push(item.clone());
                added.push(item);
            }
            ready(Ok(added))
        }
        fn summary<'a>(&'a self, _: &'a Owner, _: &'a str) -> Kept<'a, Option<SummaryRecord>> {
            ready(Ok(self.summary.lock().unwrap().clone()))
        }
        fn set_summary<'a>(
            &'a self,
            _: &'a Owner,
            _: &'a str,
            summary: &'a SummaryRecord,
        ) -> Kept<'a, ()> {
            *self.summary.lock().unwrap() = Some(summary.clone());
            ready(Ok(()))
        }
        fn facts<'a>(&'a self, _: &'a Owner) -> Kept<'a, Vec<FactRecord>> {
            none()
        }
        fn add_fact<'a>(&'a self, _: &'a Owner, _: &'a str, _: &'a str) -> Kept<'a, FactRecord> {
            none()
        }
        fn working<'a>(&'a self, _: &'a Owner, _: &'a str) -> Kept<'a, WorkingRecord> {
            none()
        }
        fn prompt_version<'a>(&'a self, _: &'a str, _: i64) -> Kept<'a, PromptVersion> {
            none()
        }
        fn prompt_versions<'a>(&'a self, _: &'a str) -> Kept<'a, Vec<PromptVersion>> {
            none()
        }
        fn label<'a>(&'a self, _: &'a str, _: &'a str) -> Kept<'a, Split> {
            none()
        }
    }

    /// Writes "folded N" for a transcript of N turns.
    struct Folder;

    impl SummaryWriter for Folder {
        fn write(&self, request: serde_json::Value) -> BoxFuture<'_, Result<String, Error>> {
            let asked = request["messages"][1]["content"]
                .as_str()
                .unwrap_or_default();
            let turns = asked.lines().filter(|l| l.contains(": ")).count();
            Box::pin(std::future::ready(Ok(format!("folded {turns}"))))
        }
    }

    #[tokio::test]
    async fn kept_turns_come_back_as_history_and_the_oldest_are_folded_into_a_summary() {
        let kept = Arc::new(Kept1::default());
        let owner = Owner {
            tenant: "t".into(),
            user: "u".into(),
        };
        let words = |n: usize| vec!["word"; n].join(" ");
        for i in 0..6 {
            let asked = [Message {
                role: "user".into(),
                content: format!("question {i} {}", words(40)),
            }];
            let turn = Turn::new(kept.clone(), owner.clone(), "c".into(), &asked);
            turn.keep(format!("answer {i} {}", words(40)))
                .await
                .unwrap();
        }
        let tokens = |text: &str| text.split(' ').count();
        let memory = Memory {
            store: None,
            tokens: &tokens,
            summaries: &Folder,
        };
        let budgets = Budgets {
            history: 200,
            summary: 64,
            ..Budgets::default()
        };
        let first = session(&memory, &*kept, &owner, "c", &budgets)
            .await
            .unwrap();
        // 12 items of 46 tokens (50 in a prompt) do not fit 200: the newest that fit half of it
        // (the last turn) are kept, the ten before are folded.
        assert_eq!(first.history.len(), 2);
        assert!(first.history[0].content.starts_with("question 5"));
        assert!(first.history[1].content.starts_with("answer 5"));
        assert_eq!(first.summary.as_deref(), Some("folded 10"));
        let written = kept.summary.lock().unwrap().clone().unwrap();
        assert_eq!(
            (written.through_seq, written.content.as_str()),
            (10, "folded 10")
        );
        // Read again, the summary stands and nothing more is folded.
        let again = session(&memory, &*kept, &owner, "c", &budgets)
            .await
            .unwrap();
        assert_eq!(again.summary.as_deref(), Some("folded 10"));
        assert_eq!(again.history.len(), 2);
    }
}
