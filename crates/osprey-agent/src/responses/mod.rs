//! The Responses API over the orchestrator: what a server needs to run agents for its callers.
//!
//! - [`chat`]: a run's transcript as a chat request, and a chat answer as a decision;
//! - [`wire`]: the request and response shapes (`input`, `tools`, `previous_response_id`,
//!   Osprey's `budget`; a run shown as a response object with OpenAI's output item types);
//! - [`sink`]: every step and audit written to the store as it happens, and, for a streamed
//!   run, the Responses API's events ([`RunEvent`]);
//! - [`Agents`]: the built-in tools and MCP servers, a caller's grant and a run's budget, and
//!   how a request's `tools` become a run's [`ToolSet`]; [`RunCaller`]: who a run acts for;
//! - [`runner`]: starting, resuming (after approval) and showing runs, each driven on a task
//!   of its own.
//!
//! The server supplies the rest through [`runner::Host`]: the [`Model`](crate::Model) that
//! decides (a served model asked with [`chat::chat_request`]), the `file_search` tool (its
//! collections), the safety policy and the store; and HTTP.

pub mod chat;
pub mod runner;
pub mod sink;
pub mod wire;

use std::sync::Arc;

use osprey_core::{Error, ErrorKind};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{AgentConfig, Budget, Builtins, Scopes, Tool, ToolSet, ToolSpec};
pub use sink::{RunEvent, StoreSink};
pub use wire::{ResponsesRequest, Shown, response_object};

/// What a run remembers of who started it, so that it resumes with the same rights
/// whoever approves it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunCaller {
    /// The tenant.
    pub tenant: String,
    /// The key.
    pub key_id: Option<String>,
    /// The user (`x-osprey-user`).
    pub user: String,
    /// ACL groups (retrieval).
    pub groups: Vec<String>,
    /// Tool scopes granted.
    pub grant: Scopes,
}

/// The built-in tools, the MCP servers and the limits of every run.
pub struct Agents {
    config: AgentConfig,
    builtins: Builtins,
}

impl Agents {
    /// Sets up `config` (nothing connects yet); an error names the bad field.
    pub fn new(config: AgentConfig) -> Result<Self, String> {
        Ok(Self {
            builtins: Builtins::new(&config)?,
            config,
        })
    }

    /// The config.
    pub fn config(&self) -> &AgentConfig {
        &self.config
    }

    /// The scopes a caller holds: its tenant's grant (`tenant`, or the default), narrowed by
    /// its key's (`key`).
    pub fn grant(
        &self,
        tenant: Option<&[String]>,
        key: Option<&[String]>,
    ) -> Result<Scopes, Error> {
        let parse = |names: &[String], what: &str| {
            Scopes::parse(names.iter().map(String::as_str))
                .map_err(|e| Error::new(ErrorKind::Internal, format!("{what}: {e}")))
        };
        let tenant = match tenant {
            Some(names) => parse(names, "the tenant's tool_scopes")?,
            None => self.config.default_scopes,
        };
        Ok(match key {
            Some(names) => tenant.intersect(parse(names, "the key's tool scopes")?),
            None => tenant,
        })
    }

    /// The run's budget: what the request asks for (else the operator's), capped by the
    /// operator's, with `max_tool_calls` if given.
    pub fn budget(
        &self,
        asked: Option<&Budget>,
        max_tool_calls: Option<u32>,
    ) -> Result<Budget, Error> {
        let ceiling = &self.config.budget;
        let mut budget = asked.unwrap_or(ceiling).capped_by(ceiling);
        if let Some(n) = max_tool_calls {
            budget.tool_calls = budget.tool_calls.min(n);
        }
        budget
            .validate()
            .map_err(|e| Error::invalid("osprey.budget", e))?;
        Ok(budget)
    }

    /// The tools of a request, by entry: functions the client runs, MCP servers configured
    /// here (by `server_label`), `file_search` over collections (the tool `file_search`
    /// makes of the collections and the number of results), and the built-ins by type.
    pub async fn toolset(
        &self,
        tools: &[Value],
        file_search: &(dyn Fn(Vec<String>, usize) -> Arc<dyn Tool> + Sync),
    ) -> Result<ToolSet, Error> {
        let mut set = ToolSet::default();
        for (i, tool) in tools.iter().enumerate() {
            let at = |f: &str| format!("tools[{i}]{f}");
            let kind = tool["type"].as_str().unwrap_or_default();
            match kind {
                "function" => {
                    let f = if tool["function"].is_object() {
                        &tool["function"]
                    } else {
                        tool
                    };
                    let name = f["name"].as_str().ok_or_else(|| {
                        Error::invalid(at(".name"), "a function tool needs a name")
                    })?;
                    let parameters = match &f["parameters"] {
                        Value::Null => serde_json::json!({"type": "object", "properties": {}}),
                        p => p.clone(),
                    };
                    let description = f["description"].as_str().unwrap_or_default();
                    set.add_client(ToolSpec::new(name, description, parameters));
                }
                "mcp" => {
                    let label = tool["server_label"].as_str().ok_or_else(|| {
                        Error::invalid(at(".server_label"), "an mcp tool names its server_label")
                    })?;
                    let server = self.builtins.mcp(label).ok_or_else(|| {
                        Error::invalid(
                            at(".server_label"),
                            format!("no MCP server `{label}` is configured on this server ([[agent.mcp]])"),
                        )
                    })?;
                    let allowed: Option<Vec<String>> = tool["allowed_tools"].as_array().map(|a| {
                        a.iter()
                            .filter_map(|t| t.as_str().map(str::to_owned))
                            .collect()
                    });
                    let listed = server.tools(allowed.as_deref()).await.map_err(|e| {
                        Error::new(ErrorKind::BadGateway, e).with_code("mcp_unavailable")
                    })?;
                    for t in listed {
                        set.add(t);
                    }
                }
                "file_search" => {
                    let collections: Vec<String> = tool["vector_store_ids"]
                        .as_array()
                        .map(|a| {
                            a.iter()
                                .filter_map(|c| c.as_str().map(str::to_owned))
                                .collect()
                        })
                        .unwrap_or_default();
                    if collections.is_empty() {
                        return Err(Error::invalid(
                            at(".vector_store_ids"),
                            "file_search needs the collections to search (vector_store_ids)",
                        ));
                    }
                    let top_k = tool["max_num_results"].as_u64().unwrap_or(4).clamp(1, 20) as usize;
                    set.add(file_search(collections, top_k));
                }
                other => match self.builtins.tool(other) {
                    Some(t) => set.add(t),
                    None => {
                        return Err(Error::invalid(
                            at(".type"),
                            format!(
                                "no tool of type `{other}` here (function, mcp, file_search, or one of {:?})",
                                self.builtins.available()
                            ),
                        ));
                    }
                },
            }
        }
        Ok(set)
    }

    /// The MCP server label of tool `name` (`LABEL__TOOL`), if it is one.
    pub fn server_of(&self, name: &str) -> Option<String> {
        let (label, _) = name.split_once("__")?;
        self.builtins.mcp(label).map(|_| label.to_owned())
    }
}
