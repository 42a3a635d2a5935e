//! Targets: the route a suite runs against. Any OpenAI-compatible server, so a target can be an
//! Osprey model, a tier (`model = "auto"`), a prompt version or RAG setting (through `osprey`),
//! or an upstream Osprey fronts.
//!
//! ```toml
//! name = "support-v2"
//! url = "http://127.0.0.1:8080"           # the server's base, without /v1
//! model = "smollm2-135m-instruct"
//! api_key_env = "OSPREY_KEY"              # the key is read from this variable, never the file
//! params = { temperature = 0, max_tokens = 64 }
//! osprey = { prompt = { name = "support", version = 2 } }
//! cost = { input_per_mtok = 0.15, output_per_mtok = 0.60 }   # for the cost estimate
//! [judge]                                 # for `judge` checkers (default: this target)
//! url = "http://127.0.0.1:8080"
//! model = "smollm2-135m-instruct"
//! ```

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::EvalError;

/// A route to evaluate.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Target {
    /// How reports name it (default: the file's stem, or the model).
    #[serde(default)]
    pub name: String,
    /// The server's base URL, without `/v1`.
    pub url: String,
    /// The `model` of every request.
    pub model: String,
    /// The environment variable holding the API key, if the server wants one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
    /// Request fields every case gets unless it sets them (default: `temperature = 0`).
    #[serde(default)]
    pub params: Map<String, Value>,
    /// The `osprey` object every request gets, under the case's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub osprey: Option<Value>,
    /// The `model` of `/v1/embeddings` requests for `similar` checkers (default: none given,
    /// which Osprey answers with its retrieval embedder).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub embedding_model: Option<String>,
    /// Ask Osprey for fresh answers (`"osprey": {"cache": false}`), so a rerun measures the
    /// model and not the response cache; `false` for servers that refuse unknown fields.
    #[serde(default = "yes")]
    pub bypass_cache: bool,
    /// Prices, for the cost estimate.
    #[serde(default)]
    pub cost: Prices,
    /// Where `judge` checkers ask (default: this target's server and model).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub judge: Option<Judge>,
}

fn yes() -> bool {
    true
}

/// Dollars per million tokens.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Prices {
    /// Per million prompt tokens.
    #[serde(default)]
    pub input_per_mtok: f64,
    /// Per million completion tokens.
    #[serde(default)]
    pub output_per_mtok: f64,
}

impl Prices {
    /// The cost of one request.
    pub fn of(&self, prompt_tokens: u64, completion_tokens: u64) -> f64 {
        (prompt_tokens as f64 * self.input_per_mtok
            + completion_tokens as f64 * self.output_per_mtok)
            / 1e6
    }
}

/// The judge model's server.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Judge {
    /// Its base URL, without `/v1`.
    pub url: String,
    /// Its model.
    pub model: String,
    /// The variable holding its API key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
}

impl Target {
    /// A target from a TOML file.
    pub fn load(path: &Path) -> Result<Target, EvalError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| EvalError::Io(format!("reading {}: {e}", path.display())))?;
        let mut t: Target = toml::from_str(&text)
            .map_err(|e| EvalError::Target(format!("{}: {e}", path.display())))?;
        if t.name.is_empty() {
            t.name = (path.file_stem()).map_or(t.model.clone(), |s| s.to_string_lossy().into());
        }
        t.validate()?;
        Ok(t)
    }

    /// A target that is just a server and a model.
    pub fn new(url: &str, model: &str) -> Target {
        Target {
            name: model.into(),
            url: url.trim_end_matches('/').into(),
            model: model.into(),
            api_key_env: None,
            params: Map::new(),
            osprey: None,
            embedding_model: None,
            bypass_cache: true,
            cost: Prices::default(),
            judge: None,
        }
    }

    fn validate(&self) -> Result<(), EvalError> {
        let bad = |why: String| Err(EvalError::Target(format!("target {}: {why}", self.name)));
        if !(self.url.starts_with("http://") || self.url.starts_with("https://")) {
            return bad(format!("`url` {:?} is not http(s)", self.url));
        }
        if let Some(var) = &self.api_key_env
            && std::env::var(var).is_err()
        {
            return bad(format!("`api_key_env` names {var}, which is not set"));
        }
        if self.osprey.as_ref().is_some_and(|o| !o.is_object()) {
            return bad("`osprey` must be a table".into());
        }
        Ok(())
    }

    /// The API key, from the environment.
    pub fn api_key(&self) -> Option<String> {
        self.api_key_env
            .as_ref()
            .and_then(|v| std::env::var(v).ok())
    }

    /// The judge's server: the `[judge]` table, else this target.
    pub fn judge_target(&self) -> Target {
        match &self.judge {
            Some(j) => Target {
                api_key_env: j.api_key_env.clone(),
                ..Target::new(&j.url, &j.model)
            },
            None => Target {
                osprey: None,
                ..self.clone()
            },
        }
    }
}
