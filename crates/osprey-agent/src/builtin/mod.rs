//! The tools Osprey ships, and the `[agent]` config that sets them up.
//!
//! | tool | scopes | what |
//! |---|---|---|
//! | `calculator` | none | exact arithmetic ([`calculator`]) |
//! | `http_fetch` | network | GET on allow-listed hosts ([`http_fetch`]) |
//! | `sql_query` | read | read-only parameterised SQL ([`sql`]) |
//! | `wasm_exec`, operator modules | none | WASI code in a WebAssembly sandbox ([`wasm`]) |
//! | `file_search` | read | retrieval over collections (the gateway's, which owns them) |
//! | `LABEL__TOOL` | configured | an MCP server's tools ([`crate::mcp`]) |

pub mod calculator;
pub mod http_fetch;
pub mod sql;
pub mod wasm;

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::budget::Budget;
use crate::mcp::{McpServer, McpServerConfig};
use crate::scope::{Scope, Scopes};
use crate::tool::Tool;

/// The `[agent]` section of the config.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AgentConfig {
    /// The most a run may spend, and what it gets when the request asks for nothing.
    pub budget: Budget,
    /// Cost of 1,000 model tokens, for the cost budget.
    pub price_per_1k_tokens: f64,
    /// Scopes of tenants whose config grants none.
    pub default_scopes: Scopes,
    /// `http_fetch`.
    pub http_fetch: http_fetch::HttpFetchConfig,
    /// `sql_query`.
    pub sql: sql::SqlConfig,
    /// The wasm sandbox.
    pub wasm: wasm::WasmConfig,
    /// MCP servers.
    pub mcp: Vec<McpServerConfig>,
}

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            budget: Budget::default(),
            price_per_1k_tokens: 0.0,
            default_scopes: Scopes::of(&[Scope::Read]),
            http_fetch: Default::default(),
            sql: Default::default(),
            wasm: Default::default(),
            mcp: Vec::new(),
        }
    }
}

impl AgentConfig {
    /// Checks the section; the message names the bad field.
    pub fn validate(&self) -> Result<(), String> {
        self.budget.validate().map_err(|e| format!("agent.{e}"))?;
        for server in &self.mcp {
            server.validate()?;
        }
        let mut labels: Vec<&str> = self.mcp.iter().map(|s| s.label.as_str()).collect();
        labels.sort();
        if let Some(w) = labels.windows(2).find(|w| w[0] == w[1]) {
            return Err(format!("agent.mcp: two servers are labelled `{}`", w[0]));
        }
        Ok(())
    }
}

/// The built-in tools and MCP servers, set up once from an [`AgentConfig`].
#[derive(Clone)]
pub struct Builtins {
    calculator: Arc<dyn Tool>,
    http_fetch: Option<Arc<dyn Tool>>,
    sql: Option<Arc<dyn Tool>>,
    wasm_exec: Option<Arc<dyn Tool>>,
    modules: Vec<Arc<dyn Tool>>,
    mcp: Vec<Arc<McpServer>>,
}

impl Builtins {
    /// Sets up what `config` configures (nothing connects yet); an error names the field.
    pub fn new(config: &AgentConfig) -> Result<Self, String> {
        config.validate()?;
        let http_fetch = (!config.http_fetch.allow.is_empty()).then(|| {
            Arc::new(http_fetch::HttpFetch::new(config.http_fetch.clone())) as Arc<dyn Tool>
        });
        let sql = match config.sql.url.is_empty() {
            true => None,
            false => Some(Arc::new(sql::SqlQuery::new(config.sql.clone())?) as Arc<dyn Tool>),
        };
        let wants_wasm = config.wasm.exec || !config.wasm.modules.is_empty();
        let sandbox = match wants_wasm {
            true => Some(wasm::Sandbox::new(config.wasm.clone())?),
            false => None,
        };
        let wasm_exec = (sandbox.as_ref())
            .filter(|_| config.wasm.exec)
            .map(|s| Arc::new(wasm::WasmExec::new(s.clone())) as Arc<dyn Tool>);
        let mut modules: Vec<Arc<dyn Tool>> = Vec::new();
        if let Some(s) = &sandbox {
            for (name, module) in &config.wasm.modules {
                modules.push(Arc::new(wasm::WasmModuleTool::new(
                    s.clone(),
                    name,
                    module,
                )?));
            }
        }
        Ok(Self {
            calculator: Arc::new(calculator::Calculator::default()),
            http_fetch,
            sql,
            wasm_exec,
            modules,
            mcp: config.mcp.iter().cloned().map(McpServer::new).collect(),
        })
    }

    /// The built-in tool of `kind` (a Responses API tool type: `calculator`, `http_fetch`,
    /// `sql_query`, `wasm_exec`, or an operator module's name), if configured.
    pub fn tool(&self, kind: &str) -> Option<Arc<dyn Tool>> {
        match kind {
            "calculator" => Some(self.calculator.clone()),
            "http_fetch" => self.http_fetch.clone(),
            "sql_query" => self.sql.clone(),
            "wasm_exec" => self.wasm_exec.clone(),
            name => self.modules.iter().find(|m| m.spec().name == name).cloned(),
        }
    }

    /// The MCP server labelled `label`.
    pub fn mcp(&self, label: &str) -> Option<&Arc<McpServer>> {
        self.mcp.iter().find(|s| s.config().label == label)
    }

    /// The names of what is configured, for listings and errors.
    pub fn available(&self) -> Vec<String> {
        let mut out = vec!["calculator".to_owned()];
        for (name, t) in [
            ("http_fetch", &self.http_fetch),
            ("sql_query", &self.sql),
            ("wasm_exec", &self.wasm_exec),
        ] {
            if t.is_some() {
                out.push(name.to_owned());
            }
        }
        out.extend(self.modules.iter().map(|m| m.spec().name.clone()));
        out
    }
}
