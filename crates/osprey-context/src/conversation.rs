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
use osprey_store::{ItemPage, ItemRecord, NewItem, Owner, Store, SummaryRecord};

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
    store: Store,
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
    store: &Store,
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
    store: &Store,
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
    pub fn new(store: Store, owner: Owner, id: String, asked: &[Message]) -> Self {
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
