//! A chat request that names a registered prompt (`"osprey": {"prompt": {"name", "label" |
//! "version", "variables"}}`) is sent with that prompt's messages, rendered with its variables,
//! before its own, and with the prompt's settings where the request sets none.
//!
//! A label that splits traffic gives each caller one version for good: the choice hashes the
//! tenant and the user (`x-osprey-user`, else the body's `user`, else the key). Neither label
//! nor version: the label the tenant's `prompt.NAME.label` flag names, else the newest version. The response says which version answered in
//! `x-osprey-prompt: NAME@VERSION`, and the choice is logged (`prompt applied`) with the tenant
//! and the user.

use axum::http::HeaderValue;
use axum::response::Response;
use osprey_context::prompt::{PromptDef, pick};
use osprey_core::api::JsonBody;
use osprey_core::{Error, ErrorKind};
use osprey_store::{Store, StoreError};
use serde_json::{Map, Value, json};

use crate::edge::Caller;
use crate::error::store_error;
use crate::state::AppState;

/// The response header naming the prompt version used.
pub const PROMPT_HEADER: &str = "x-osprey-prompt";

/// The prompt version a request was given.
pub struct Applied {
    name: String,
    version: i64,
}

impl Applied {
    /// The prompt's name and version.
    pub fn version(&self) -> (String, i64) {
        (self.name.clone(), self.version)
    }

    /// Marks `response` with the version.
    pub fn mark(&self, response: &mut Response) {
        if let Ok(v) = HeaderValue::from_str(&format!("{}@{}", self.name, self.version)) {
            response.headers_mut().insert(PROMPT_HEADER, v);
        }
    }
}

/// Whether a chat body names a prompt.
pub fn named(body: &JsonBody) -> bool {
    !body.osprey("prompt").is_null()
}

/// Applies the prompt the body names to it; which version that was.
pub async fn apply(
    state: &AppState,
    caller: &Caller,
    flags: &Map<String, Value>,
    body: &mut JsonBody,
) -> Result<Applied, Error> {
    let store = state.audit_store().ok_or_else(|| {
        Error::new(
            ErrorKind::Unavailable,
            "This server has no store for prompts.",
        )
    })?;
    let v = body.edit();
    let mut asked = v["osprey"]["prompt"].take();
    // Neither label nor version: the tenant's flag may name the label.
    if asked["label"].is_null()
        && asked["version"].is_null()
        && let Some(label) = asked["name"]
            .as_str()
            .and_then(|n| crate::flags::prompt_label(flags, n))
    {
        asked["label"] = label.into();
    }
    let param = "osprey.prompt";
    let Some(name) = asked["name"].as_str() else {
        return Err(Error::invalid(
            format!("{param}.name"),
            "a prompt is named by `name`",
        ));
    };
    let variables = match &asked["variables"] {
        Value::Null => Map::new(),
        Value::Object(m) => m.clone(),
        _ => {
            return Err(Error::invalid(
                format!("{param}.variables"),
                "variables must be an object",
            ));
        }
    };
    let user = caller.owner(v["user"].as_str()).user;
    let who = match user.is_empty() {
        true => caller.key_id.clone().unwrap_or_default(),
        false => user,
    };
    let sticky = format!("{}\u{0}{who}\u{0}{name}", caller.tenant.name);
    let version = resolve(&store, name, &asked, &sticky).await?;
    let record = (store.prompt_version(name, version).await).map_err(|e| not_found(e, param))?;
    let def = PromptDef::parse(&record.body).map_err(|e| {
        Error::new(
            ErrorKind::Internal,
            format!("stored prompt {name}@{version}: {e}"),
        )
    })?;
    let rendered = def
        .render(&variables)
        .map_err(|e| Error::invalid(format!("{param}.variables"), e.to_string()))?;
    let mut messages: Vec<Value> = (rendered.into_iter())
        .map(|m| json!({"role": m.role, "content": m.content}))
        .collect();
    if let Some(own) = v["messages"].as_array() {
        messages.extend(own.iter().cloned());
    }
    v["messages"] = Value::Array(messages);
    if let Some(body) = v.as_object_mut() {
        for (key, value) in &def.settings {
            body.entry(key.clone()).or_insert_with(|| value.clone());
        }
        if body["osprey"].as_object().is_some_and(Map::is_empty) {
            body.remove("osprey");
        }
    }
    tracing::info!(
        tenant = %caller.tenant.name,
        user = caller.owner(None).user,
        prompt = name,
        version,
        "prompt applied"
    );
    let applied = Applied {
        name: name.to_owned(),
        version,
    };
    Ok(applied)
}

/// The version `asked` names: its `version`, the pick of its `label`, or the newest.
async fn resolve(store: &Store, name: &str, asked: &Value, sticky: &str) -> Result<i64, Error> {
    let param = "osprey.prompt";
    match (&asked["version"], &asked["label"]) {
        (Value::Null, Value::Null) => {
            let versions = (store.prompt_versions(name).await).map_err(store_error)?;
            (versions.last().map(|v| v.version)).ok_or_else(|| {
                Error::new(ErrorKind::NotFound, format!("No prompt {name} exists."))
                    .with_param(format!("{param}.name"))
                    .with_code("not_found")
            })
        }
        (Value::Null, Value::String(label)) => {
            let split = (store.label(name, label).await).map_err(|e| not_found(e, param))?;
            pick(&split, sticky).ok_or_else(|| Error::internal("an empty label split"))
        }
        (version, Value::Null) => (version.as_i64()).ok_or_else(|| {
            Error::invalid(format!("{param}.version"), "version must be an integer")
        }),
        _ => Err(Error::invalid(
            param,
            "give a prompt's `label` or its `version`, not both",
        )),
    }
}

fn not_found(e: StoreError, param: &str) -> Error {
    match e {
        StoreError::NotFound(_) => store_error(e).with_param(format!("{param}.name")),
        e => store_error(e),
    }
}
