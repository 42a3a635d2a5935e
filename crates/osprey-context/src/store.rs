//! What a prompt's context needs kept, as a trait: a conversation's items and summary, a user's
//! facts and scratchpads, and the prompt registry's versions and labels.
//! [`osprey_store::Store`] (SQLite or Postgres) is the one the server uses; anything else that
//! keeps them (a test's map in memory) can stand in.

use futures_util::future::BoxFuture;
use osprey_store::{
    FactRecord, ItemPage, ItemRecord, NewItem, Owner, PromptVersion, Split, Store, StoreError,
    SummaryRecord, WorkingRecord,
};

/// A store's answer.
pub type Kept<'a, T> = BoxFuture<'a, Result<T, StoreError>>;

/// Where a prompt's context is kept. Every method is [`Store`]'s of the same name.
pub trait ContextStore: Send + Sync {
    /// A page of conversation `id`'s items (`NotFound` if `owner` has no such conversation).
    fn items<'a>(
        &'a self,
        owner: &'a Owner,
        id: &'a str,
        page: ItemPage<'a>,
    ) -> Kept<'a, Vec<ItemRecord>>;
    /// Appends `items` to conversation `id`.
    fn append_items<'a>(
        &'a self,
        owner: &'a Owner,
        id: &'a str,
        items: &'a [NewItem],
    ) -> Kept<'a, Vec<ItemRecord>>;
    /// The summary of conversation `id`'s older items, if one was written.
    fn summary<'a>(&'a self, owner: &'a Owner, id: &'a str) -> Kept<'a, Option<SummaryRecord>>;
    /// Replaces the summary of conversation `id`.
    fn set_summary<'a>(
        &'a self,
        owner: &'a Owner,
        id: &'a str,
        summary: &'a SummaryRecord,
    ) -> Kept<'a, ()>;
    /// `owner`'s facts, newest first.
    fn facts<'a>(&'a self, owner: &'a Owner) -> Kept<'a, Vec<FactRecord>>;
    /// Adds fact `content` of `owner`, from `source`.
    fn add_fact<'a>(
        &'a self,
        owner: &'a Owner,
        content: &'a str,
        source: &'a str,
    ) -> Kept<'a, FactRecord>;
    /// `owner`'s unexpired scratchpad `name`.
    fn working<'a>(&'a self, owner: &'a Owner, name: &'a str) -> Kept<'a, WorkingRecord>;
    /// Version `version` of prompt `name`.
    fn prompt_version<'a>(&'a self, name: &'a str, version: i64) -> Kept<'a, PromptVersion>;
    /// Every version of prompt `name`, oldest first.
    fn prompt_versions<'a>(&'a self, name: &'a str) -> Kept<'a, Vec<PromptVersion>>;
    /// What label `label` of prompt `name` points at.
    fn label<'a>(&'a self, name: &'a str, label: &'a str) -> Kept<'a, Split>;
}

impl ContextStore for Store {
    fn items<'a>(
        &'a self,
        owner: &'a Owner,
        id: &'a str,
        page: ItemPage<'a>,
    ) -> Kept<'a, Vec<ItemRecord>> {
        Box::pin(Store::items(self, owner, id, page))
    }
    fn append_items<'a>(
        &'a self,
        owner: &'a Owner,
        id: &'a str,
        items: &'a [NewItem],
    ) -> Kept<'a, Vec<ItemRecord>> {
        Box::pin(Store::append_items(self, owner, id, items))
    }
    fn summary<'a>(&'a self, owner: &'a Owner, id: &'a str) -> Kept<'a, Option<SummaryRecord>> {
        Box::pin(Store::summary(self, owner, id))
    }
    fn set_summary<'a>(
        &'a self,
        owner: &'a Owner,
        id: &'a str,
        summary: &'a SummaryRecord,
    ) -> Kept<'a, ()> {
        Box::pin(Store::set_summary(self, owner, id, summary))
    }
    fn facts<'a>(&'a self, owner: &'a Owner) -> Kept<'a, Vec<FactRecord>> {
        Box::pin(Store::facts(self, owner))
    }
    fn add_fact<'a>(
        &'a self,
        owner: &'a Owner,
        content: &'a str,
        source: &'a str,
    ) -> Kept<'a, FactRecord> {
        Box::pin(Store::add_fact(self, owner, content, source))
    }
    fn working<'a>(&'a self, owner: &'a Owner, name: &'a str) -> Kept<'a, WorkingRecord> {
        Box::pin(Store::working(self, owner, name))
    }
    fn prompt_version<'a>(&'a self, name: &'a str, version: i64) -> Kept<'a, PromptVersion> {
        Box::pin(Store::prompt_version(self, name, version))
    }
    fn prompt_versions<'a>(&'a self, name: &'a str) -> Kept<'a, Vec<PromptVersion>> {
        Box::pin(Store::prompt_versions(self, name))
    }
    fn label<'a>(&'a self, name: &'a str, label: &'a str) -> Kept<'a, Split> {
        Box::pin(Store::label(self, name, label))
    }
}
