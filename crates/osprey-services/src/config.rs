//! What the edge is configured with: tenants and their limits, default limits, admission
//! control, upstream models, the admin key. The binary reads these from the TOML config file
//! and flags; every table here rejects unknown fields, so a typo is an error naming it.

use std::collections::BTreeMap;

use osprey_core::Priority;
pub use osprey_limits::admission::AdmissionConfig;
use osprey_policy::pipeline::PolicyConfig;
use serde::Deserialize;

/// `[models.NAME]`: a model served by an OpenAI-compatible upstream.
pub use osprey_router::upstream::UpstreamConfig;

/// The config file as TOML gives it: its tables, and its top-level keys (the flags of
/// `osprey serve`, by their long names) left as values for the binary to turn into arguments.
#[derive(Debug, Default, Deserialize)]
pub struct ConfigTables {
    /// `[tenants.NAME]`.
    #[serde(default)]
    pub tenants: BTreeMap<String, TenantConfig>,
    /// `[models.NAME]`: upstream models (with a `url`), and settings of models served here.
    #[serde(default)]
    pub models: BTreeMap<String, ModelTable>,
    /// `[[tiers]]`.
    #[serde(default)]
    pub tiers: Vec<TierConfig>,
    /// `[policies.NAME]`.
    #[serde(default)]
    pub policies: BTreeMap<String, PolicyConfig>,
    /// `[agent]`.
    #[serde(default)]
    pub agent: osprey_agent::AgentConfig,
    /// Everything else: the flags.
    #[serde(flatten)]
    pub flags: BTreeMap<String, toml::Value>,
}

impl ConfigTables {
    /// Parses the text of a config file; errors name the line.
    pub fn parse(text: &str) -> Result<Self, toml::de::Error> {
        toml::from_str(text)
    }
}

/// A `[models.NAME]` table: an upstream model if it has a `url`, else the settings of a model
/// this server's engines serve.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(try_from = "toml::Table")]
pub enum ModelTable {
    /// An OpenAI-compatible server elsewhere.
    Upstream(UpstreamConfig),
    /// A model of `--model`.
    Local(LocalModelConfig),
}

impl TryFrom<toml::Table> for ModelTable {
    type Error = String;

    fn try_from(table: toml::Table) -> Result<Self, String> {
        let upstream = table.contains_key("url");
        let value = toml::Value::Table(table);
        match upstream {
            true => value.try_into().map(Self::Upstream),
            false => value.try_into().map(Self::Local),
        }
        .map_err(|e: toml::de::Error| e.message().to_owned())
    }
}

/// Settings of one model served by this server's engines (`[models.NAME]` without a `url`).
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LocalModelConfig {
    /// Its KV pool, e.g. `"1GiB"` or bytes; the models without one share the rest of
    /// `--kv-cache-memory`.
    pub kv_cache_memory: Option<Size>,
}

/// A size in the config file: bytes, or a text like `"512MiB"` the binary parses.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum Size {
    /// A byte count.
    Bytes(u64),
    /// `"1GiB"`, `"512MiB"`, ...
    Text(String),
}

/// A tenant: who a key acts for, with its limits and policy.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    /// Requests per minute, for the tenant as a whole and for each of its keys that sets none.
    pub rpm: Option<u64>,
    /// Tokens per minute (prompt + completion), likewise.
    pub tpm: Option<u64>,
    /// Requests in flight at once (per replica).
    pub max_concurrent: Option<u64>,
    /// Models the tenant may use (default: all).
    pub models: Option<Vec<String>>,
    /// The model of its requests that name none, e.g. `auto` to let the router choose.
    pub default_model: Option<String>,
    /// Largest `max_tokens` a request may ask for; larger ones are clamped to it.
    pub max_tokens: Option<u64>,
    /// Scheduling class of requests that don't ask for one.
    pub priority: Option<Priority>,
    /// Safety policy profile (used by the policy layer).
    pub policy: Option<String>,
    /// Tenants with the same cache group share prefix-cache entries; by default a tenant
    /// shares its cache with no one.
    pub cache_group: Option<String>,
    /// Degraded last under load: two levels less than others.
    pub premium: Option<bool>,
    /// ACL groups all of the tenant's requests belong to (its keys may add more).
    pub groups: Option<Vec<String>>,
    /// Scopes its agent runs' tools may use (`read`, `write`, `network`, `destructive`);
    /// default: `[agent] default_scopes`. Its keys may narrow them.
    pub tool_scopes: Option<Vec<String>>,
    /// The share (0 to 1) of its requests whose prompt and answer text the request log keeps,
    /// PII redacted; default 0: none, so a tenant that forbids it needs to say nothing.
    pub log_text_sample_rate: Option<f64>,
}

/// Limits for tenants that set none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DefaultLimits {
    /// Requests per minute.
    pub rpm: u64,
    /// Tokens per minute.
    pub tpm: u64,
    /// Requests in flight at once.
    pub max_concurrent: u64,
}

impl Default for DefaultLimits {
    fn default() -> Self {
        Self {
            rpm: 6_000,
            tpm: 2_000_000,
            max_concurrent: 256,
        }
    }
}

/// One tier of `"model": "auto"` (`[[tiers]]` in the config file, smallest first).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TierConfig {
    /// Its name, in `x-osprey-tier`.
    pub name: String,
    /// The served model (local, workers' or upstream) its requests go to.
    pub model: String,
}

/// Everything the edge needs besides its backends.
#[derive(Clone, Debug, Default)]
pub struct EdgeConfig {
    /// Tenants by name.
    pub tenants: BTreeMap<String, TenantConfig>,
    /// Limits of tenants that set none.
    pub limits: DefaultLimits,
    /// Global admission control.
    pub admission: AdmissionConfig,
    /// The key that opens the admin API (`/admin/...`); without it the admin API is closed.
    pub admin_key: Option<String>,
    /// Keep no request log (for measuring what it costs).
    pub no_request_log: bool,
}

/// The tenant of requests made without a key, on a server with no keys.
pub const OPEN_TENANT: &str = "default";

/// A tenant's settings resolved against the defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct Tenant {
    /// Its name.
    pub name: String,
    /// Requests per minute.
    pub rpm: u64,
    /// Tokens per minute.
    pub tpm: u64,
    /// Requests in flight at once.
    pub max_concurrent: u64,
    /// Allowed models (`None`: all).
    pub models: Option<Vec<String>>,
    /// The model of requests that name none.
    pub default_model: Option<String>,
    /// `max_tokens` cap.
    pub max_tokens: Option<u64>,
    /// Default priority.
    pub priority: Priority,
    /// Safety policy profile.
    pub policy: Option<String>,
    /// What separates this tenant's prefix-cache entries from others'.
    pub cache_salt: String,
    /// Degraded last under load.
    pub premium: bool,
    /// ACL groups all its requests belong to.
    pub groups: Vec<String>,
    /// Tool scopes granted (`None`: the agent runtime's default).
    pub tool_scopes: Option<Vec<String>>,
    /// The share of its requests whose text the request log keeps (redacted).
    pub log_text_sample_rate: f64,
}

impl EdgeConfig {
    /// The settings of tenant `name` (configured or not: unknown tenants get the defaults).
    pub fn tenant(&self, name: &str) -> Tenant {
        let t = self.tenants.get(name).cloned().unwrap_or_default();
        Tenant {
            name: name.to_owned(),
            rpm: t.rpm.unwrap_or(self.limits.rpm),
            tpm: t.tpm.unwrap_or(self.limits.tpm),
            max_concurrent: t.max_concurrent.unwrap_or(self.limits.max_concurrent),
            models: t.models,
            default_model: t.default_model,
            max_tokens: t.max_tokens,
            priority: t.priority.unwrap_or_default(),
            policy: t.policy,
            cache_salt: format!("tenant:{}", t.cache_group.as_deref().unwrap_or(name)),
            premium: t.premium.unwrap_or(false),
            groups: t.groups.unwrap_or_default(),
            tool_scopes: t.tool_scopes,
            log_text_sample_rate: t.log_text_sample_rate.unwrap_or(0.0).clamp(0.0, 1.0),
        }
    }
}
