//! A [`Tool`]: a name, a JSON schema for its arguments, the [`Scopes`] it needs, and a call.
//! A [`ToolSet`] is the tools one run may use.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::scope::Scopes;

/// What the model and the policy know of a tool.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// Its name, as the model calls it (letters, digits, `_`, `-`).
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// JSON Schema of its arguments (an object).
    pub parameters: Value,
    /// The scopes a call needs.
    pub scopes: Scopes,
    /// Every call waits for a person's approval (besides destructive tools, which always do).
    #[serde(default)]
    pub require_approval: bool,
    /// Cost of one call, in the budget's currency.
    #[serde(default)]
    pub cost: f64,
    /// Longest a call may take.
    #[serde(default = "default_timeout", with = "secs")]
    pub timeout: Duration,
}

fn default_timeout() -> Duration {
    Duration::from_secs(30)
}

mod secs {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        Duration::try_from_secs_f64(f64::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

impl ToolSpec {
    /// A spec with no scopes, no cost and the default timeout.
    pub fn new(name: &str, description: &str, parameters: Value) -> Self {
        Self {
            name: name.to_owned(),
            description: description.to_owned(),
            parameters,
            scopes: Scopes::NONE,
            require_approval: false,
            cost: 0.0,
            timeout: default_timeout(),
        }
    }

    /// The same spec needing `scopes`.
    pub fn with_scopes(mut self, scopes: Scopes) -> Self {
        self.scopes = scopes;
        self
    }
}

/// A failed call.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct ToolError {
    /// What went wrong, for the model (and the audit log).
    pub message: String,
    /// Whether trying again may succeed (a timeout, a server that was down).
    pub retryable: bool,
}

impl ToolError {
    /// A failure that trying again will not mend (bad arguments, a refused query).
    pub fn fatal(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            retryable: false,
        }
    }

    /// A failure worth retrying.
    pub fn transient(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            retryable: true,
        }
    }
}

/// Something the agent can call.
pub trait Tool: Send + Sync {
    /// What it is.
    fn spec(&self) -> &ToolSpec;
    /// Runs it with `arguments` (already checked against the schema): its result, as text for
    /// the model.
    fn call(&self, arguments: Value) -> BoxFuture<'_, Result<String, ToolError>>;
}

/// The tools a run may use, by name.
#[derive(Clone, Default)]
pub struct ToolSet {
    tools: BTreeMap<String, Arc<dyn Tool>>,
    /// Functions the client runs itself (the Responses API's `function` tools): the run
    /// pauses and hands their calls back.
    client: BTreeMap<String, ToolSpec>,
}

impl ToolSet {
    /// Adds `tool` (replacing one of the same name).
    pub fn add(&mut self, tool: Arc<dyn Tool>) {
        self.tools.insert(tool.spec().name.clone(), tool);
    }

    /// Adds a function the client runs.
    pub fn add_client(&mut self, spec: ToolSpec) {
        self.client.insert(spec.name.clone(), spec);
    }

    /// The tool called `name`, run here.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.tools.get(name)
    }

    /// Whether `name` is a function the client runs.
    pub fn is_client(&self, name: &str) -> bool {
        self.client.contains_key(name)
    }

    /// Every tool's spec, as offered to the model.
    pub fn specs(&self) -> Vec<ToolSpec> {
        let mut specs: Vec<ToolSpec> = self.tools.values().map(|t| t.spec().clone()).collect();
        specs.extend(self.client.values().cloned());
        specs
    }

    /// Whether there are no tools.
    pub fn is_empty(&self) -> bool {
        self.tools.is_empty() && self.client.is_empty()
    }
}
