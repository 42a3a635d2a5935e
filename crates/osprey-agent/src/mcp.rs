//! MCP client (the `rmcp` crate): servers the operator configures, over stdio (a command this
//! process starts) or streamable HTTP (a URL), whose tools become Osprey [`Tool`]s under
//! Osprey's permissions.
//!
//! A server's tools need the scopes its config declares, plus what the server's own
//! annotations admit to (`destructiveHint` → `destructive`, `readOnlyHint: false` → `write`):
//! annotations can only add scopes, never lift the operator's. Tools are named
//! `LABEL__TOOL` so two servers' tools never collide. The connection is made on first use and
//! shared by every run; a server that went away is reconnected on the next call.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use rmcp::model::{CallToolRequestParams, ContentBlock};
use rmcp::service::RunningService;
use rmcp::transport::{ConfigureCommandExt, StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{RoleClient, ServiceExt};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::Mutex;

use crate::scope::{Scope, Scopes};
use crate::tool::{Tool, ToolError, ToolSpec};

/// One MCP server (`[[agent.mcp]]`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpServerConfig {
    /// Its name, the prefix of its tools (`LABEL__TOOL`), letters, digits, `_` and `-`.
    pub label: String,
    /// The program to start (stdio transport).
    #[serde(default)]
    pub command: Option<String>,
    /// Its arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// Its working directory.
    #[serde(default)]
    pub cwd: Option<std::path::PathBuf>,
    /// The server's URL (streamable HTTP transport), instead of a command.
    #[serde(default)]
    pub url: Option<String>,
    /// Scopes every tool of the server needs.
    #[serde(default)]
    pub scopes: Scopes,
    /// Tools offered (all when empty).
    #[serde(default)]
    pub allowed_tools: Vec<String>,
    /// `never` (default: only destructive calls wait), `always` (every call waits).
    #[serde(default)]
    pub require_approval: Approval,
    /// Longest a call may take, seconds.
    #[serde(default = "default_timeout")]
    pub timeout_seconds: f64,
}

fn default_timeout() -> f64 {
    30.0
}

/// When a server's calls wait for approval.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Approval {
    /// Only destructive calls.
    #[default]
    Never,
    /// Every call.
    Always,
}

impl McpServerConfig {
    /// Checks the config; the message names the server and the field.
    pub fn validate(&self) -> Result<(), String> {
        let label_ok = !self.label.is_empty()
            && (self.label.bytes()).all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !label_ok {
            return Err(format!(
                "agent.mcp: label `{}` must be letters, digits, `_` or `-`",
                self.label
            ));
        }
        match (&self.command, &self.url) {
            (Some(_), None) | (None, Some(_)) => Ok(()),
            _ => Err(format!(
                "agent.mcp.{}: give exactly one of `command` and `url`",
                self.label
            )),
        }
    }
}

type Client = RunningService<RoleClient, ()>;

/// A connection to one MCP server.
pub struct McpServer {
    config: McpServerConfig,
    client: Mutex<Option<Arc<Client>>>,
}

impl McpServer {
    /// A server, not yet connected.
    pub fn new(config: McpServerConfig) -> Arc<Self> {
        Arc::new(Self {
            config,
            client: Mutex::new(None),
        })
    }

    /// Its config.
    pub fn config(&self) -> &McpServerConfig {
        &self.config
    }

    async fn connect(&self) -> Result<Arc<Client>, String> {
        let mut slot = self.client.lock().await;
        if let Some(c) = slot.as_ref()
            && !c.is_closed()
        {
            return Ok(c.clone());
        }
        let label = &self.config.label;
        let client = match (&self.config.command, &self.config.url) {
            (Some(command), _) => {
                let cmd = tokio::process::Command::new(command).configure(|cmd| {
                    cmd.args(&self.config.args).kill_on_drop(true);
                    if let Some(dir) = &self.config.cwd {
                        cmd.current_dir(dir);
                    }
                });
                let transport = TokioChildProcess::builder(cmd)
                    .stderr(std::process::Stdio::null())
                    .spawn()
                    .map(|(t, _)| t)
                    .map_err(|e| format!("MCP server `{label}`: cannot start `{command}`: {e}"))?;
                ().serve(transport).await
            }
            (None, Some(url)) => {
                ().serve(StreamableHttpClientTransport::from_uri(url.as_str()))
                    .await
            }
            (None, None) => return Err(format!("MCP server `{label}` has no command or url")),
        }
        .map_err(|e| format!("MCP server `{label}`: {e}"))?;
        let client = Arc::new(client);
        *slot = Some(client.clone());
        Ok(client)
    }

    /// The server's tools, as Osprey tools: those its config allows, and of those the ones
    /// in `only` when given (by their names on the server).
    pub async fn tools(
        self: &Arc<Self>,
        only: Option<&[String]>,
    ) -> Result<Vec<Arc<dyn Tool>>, String> {
        let client = self.connect().await?;
        let listed = client
            .list_all_tools()
            .await
            .map_err(|e| format!("MCP server `{}`: listing tools: {e}", self.config.label))?;
        let c = &self.config;
        let mut out: Vec<Arc<dyn Tool>> = Vec::new();
        for tool in listed {
            let offered = |list: &[String]| list.iter().any(|a| a == tool.name.as_ref());
            if (!c.allowed_tools.is_empty() && !offered(&c.allowed_tools))
                || only.is_some_and(|o| !offered(o))
            {
                continue;
            }
            let mut scopes = c.scopes;
            if let Some(a) = &tool.annotations {
                if a.destructive_hint == Some(true) {
                    scopes = scopes.with(Scope::Destructive);
                }
                if a.read_only_hint == Some(false) {
                    scopes = scopes.with(Scope::Write);
                }
            }
            let name = tool_name(&c.label, &tool.name);
            let description = tool.description.as_deref().unwrap_or_default();
            let mut spec = ToolSpec::new(
                &name,
                &format!("[{} server] {description}", c.label),
                Value::Object((*tool.input_schema).clone()),
            )
            .with_scopes(scopes);
            spec.require_approval = c.require_approval == Approval::Always;
            spec.timeout = Duration::from_secs_f64(c.timeout_seconds.max(0.1));
            out.push(Arc::new(McpTool {
                spec,
                remote: tool.name.to_string(),
                server: self.clone(),
            }));
        }
        Ok(out)
    }

    async fn call(&self, tool: &str, arguments: Value) -> Result<String, ToolError> {
        let client = self.connect().await.map_err(ToolError::transient)?;
        let mut params = CallToolRequestParams::new(Cow::Owned(tool.to_owned()));
        params.arguments = match arguments {
            Value::Object(map) => Some(map),
            _ => None,
        };
        let result = client.call_tool(params).await.map_err(|e| {
            ToolError::transient(format!("MCP server `{}`: {e}", self.config.label))
        })?;
        let mut text = String::new();
        for block in &result.content {
            let piece = match block {
                ContentBlock::Text(t) => t.text.clone(),
                ContentBlock::Image(i) => format!("[image {}]", i.mime_type),
                ContentBlock::Audio(a) => format!("[audio {}]", a.mime_type),
                ContentBlock::Resource(r) => serde_json::to_string(&r.resource).unwrap_or_default(),
                ContentBlock::ResourceLink(r) => format!("[resource {}]", r.uri),
                _ => "[content of another kind]".to_owned(),
            };
            if !text.is_empty() {
                text.push('\n');
            }
            text.push_str(&piece);
        }
        if text.is_empty()
            && let Some(s) = &result.structured_content
        {
            text = s.to_string();
        }
        match result.is_error {
            Some(true) => Err(ToolError::fatal(text)),
            _ => Ok(text),
        }
    }
}

/// `LABEL__TOOL`, with what a function name may not hold replaced by `_`, at most 64 bytes.
fn tool_name(label: &str, tool: &str) -> String {
    let name: String = format!("{label}__{tool}")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    name.chars().take(64).collect()
}

/// One tool of an MCP server.
pub struct McpTool {
    spec: ToolSpec,
    /// Its name on the server.
    remote: String,
    server: Arc<McpServer>,
}

impl Tool for McpTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn call(&self, arguments: Value) -> BoxFuture<'_, Result<String, ToolError>> {
        Box::pin(self.server.call(&self.remote, arguments))
    }
}
