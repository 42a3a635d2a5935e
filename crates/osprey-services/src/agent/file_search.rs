//! `file_search`: the caller's collections searched as a tool (hybrid, reranked, one passage
//! per document, under the caller's ACL groups), the passages numbered with their document
//! ids. Needs the `read` scope; the orchestrator screens the passages as untrusted text.

use futures_util::future::BoxFuture;
use osprey_agent::{Scope, Scopes, Tool, ToolError, ToolSpec};
use osprey_core::ErrorKind;
use osprey_rag::SearchQuery;
use serde_json::{Value, json};

use crate::edge::Caller;
use crate::state::Services;

/// Retrieval over some of the caller's collections.
pub struct FileSearch {
    spec: ToolSpec,
    state: Services,
    caller: Caller,
    collections: Vec<String>,
    top_k: usize,
}

impl FileSearch {
    /// Searches `collections` as `caller`, `top_k` passages at most.
    pub fn new(state: Services, caller: Caller, collections: Vec<String>, top_k: usize) -> Self {
        let parameters = json!({
            "type": "object",
            "properties": {"query": {"type": "string", "maxLength": 500,
                "description": "What to look for in the documents"}},
            "required": ["query"],
            "additionalProperties": false
        });
        let description = format!(
            "Searches the documents of {} and returns the most relevant passages.",
            collections.join(", ")
        );
        let spec = ToolSpec::new("file_search", &description, parameters)
            .with_scopes(Scopes::of(&[Scope::Read]));
        Self {
            spec,
            state,
            caller,
            collections,
            top_k,
        }
    }

    async fn search(&self, query: &str) -> Result<String, ToolError> {
        let mut hits = Vec::new();
        for name in &self.collections {
            let q = SearchQuery::new(query, self.top_k, self.caller.groups.clone());
            let found = crate::rag::search(&self.state, &self.caller, name, q)
                .await
                .map_err(|e| match e.kind {
                    ErrorKind::Unavailable => ToolError::transient(e.message),
                    _ => ToolError::fatal(e.message),
                })?;
            hits.extend(found.into_iter().map(|h| (name.clone(), h)));
        }
        hits.sort_by(|a, b| b.1.score.total_cmp(&a.1.score));
        hits.truncate(self.top_k);
        if hits.is_empty() {
            return Ok("No passage matches.".to_owned());
        }
        let mut out = String::new();
        for (i, (collection, h)) in hits.iter().enumerate() {
            out.push_str(&format!(
                "[{}] {} ({collection}/{}):\n{}\n\n",
                i + 1,
                h.title,
                h.document_id,
                h.text.trim()
            ));
        }
        Ok(out.trim_end().to_owned())
    }
}

impl Tool for FileSearch {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn call(&self, arguments: Value) -> BoxFuture<'_, Result<String, ToolError>> {
        let query = arguments["query"].as_str().unwrap_or_default().to_owned();
        Box::pin(async move { self.search(&query).await })
    }
}
