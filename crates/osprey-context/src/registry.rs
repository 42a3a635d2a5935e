//! A chat request that names a registered prompt (`"osprey": {"prompt": {"name", "label" |
//! "version", "variables"}}`) is sent with that prompt's messages, rendered with its variables,
//! before its own, and with the prompt's settings where the request sets none.
//!
//! A label that splits traffic gives each caller one version for good: the choice hashes the
//! tenant and the user (else the key). Neither label nor version: the label the tenant's
//! `prompt.NAME.label` flag names, else the newest version.

use osprey_core::api::JsonBody;
use osprey_core::{Error, ErrorKind};
use osprey_store::{Owner, StoreError};

use crate::store::ContextStore;
use serde_json::{Map, Value, json};

use crate::prompt::{PromptDef, pick};

/// The option's name, as errors point at it.
const PARAM: &str = "osprey.prompt";

/// The prompt version a request was given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Applied {
    /// The prompt's name.
    pub name: String,
    /// Its version.
    pub version: i64,
}

/// Who asks: whose split a label sticks to.
pub struct Asker<'a> {
    /// The tenant's name.
    pub tenant: &'a str,
    /// The caller's key, for callers that name no user.
    pub key_id: Option<&'a str>,
}

/// Whether a chat body names a prompt.
pub fn named(body: &JsonBody) -> bool {
    !body.osprey("prompt").is_null()
}

/// The default label of prompt `name` in a tenant's `flags`, if set.
fn flagged_label<'a>(flags: &'a Map<String, Value>, name: &str) -> Option<&'a str> {
    flags
        .get(&format!("prompt.{name}.label"))
        .and_then(Value::as_str)
}

/// Applies the prompt the body names to it, for `asker` whose user `owner` names (given the
/// body's `user`) under the tenant's `flags`: which version that was.
pub async fn apply(
    store: &dyn ContextStore,
    asker: &Asker<'_>,
    owner: impl FnOnce(Option<&str>) -> Owner,
    flags: &Map<String, Value>,
    body: &mut JsonBody,
) -> Result<Applied, Error> {
    let v = body.edit();
    let mut asked = v["osprey"]["prompt"].take();
    // Neither label nor version: the tenant's flag may name the label.
    if asked["label"].is_null()
        && asked["version"].is_null()
        && let Some(label) = asked["name"].as_str().and_then(|n| flagged_label(flags, n))
    {
        asked["label"] = label.into();
    }
    let Some(name) = asked["name"].as_str() else {
        return Err(Error::invalid(
            format!("{PARAM}.name"),
            "a prompt is named by `name`",
        ));
    };
    let variables = match &asked["variables"] {
        Value::Null => Map::new(),
        Value::Object(m) => m.clone(),
        _ => {
            return Err(Error::invalid(
                format!("{PARAM}.variables"),
                "variables must be an object",
            ));
        }
    };
    let user = owner(v["user"].as_str()).user;
    let who = match user.is_empty() {
        true => asker.key_id.unwrap_or_default(),
        false => &user,
    };
    let sticky = format!("{}\u{0}{who}\u{0}{name}", asker.tenant);
    let version = resolve(store, name, &asked, &sticky).await?;
    let record = (store.prompt_version(name, version).await).map_err(not_found)?;
    let def = PromptDef::parse(&record.body).map_err(|e| {
        Error::new(
            ErrorKind::Internal,
            format!("stored prompt {name}@{version}: {e}"),
        )
    })?;
    let rendered = def
        .render(&variables)
        .map_err(|e| Error::invalid(format!("{PARAM}.variables"), e.to_string()))?;
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
        tenant = asker.tenant,
        user,
        prompt = name,
        version,
        "prompt applied"
    );
    Ok(Applied {
        name: name.to_owned(),
        version,
    })
}

/// The version `asked` names: its `version`, the pick of its `label`, or the newest.
async fn resolve(
    store: &dyn ContextStore,
    name: &str,
    asked: &Value,
    sticky: &str,
) -> Result<i64, Error> {
    match (&asked["version"], &asked["label"]) {
        (Value::Null, Value::Null) => {
            let versions = store.prompt_versions(name).await?;
            (versions.last().map(|v| v.version)).ok_or_else(|| {
                Error::new(ErrorKind::NotFound, format!("No prompt {name} exists."))
                    .with_param(format!("{PARAM}.name"))
                    .with_code("not_found")
            })
        }
        (Value::Null, Value::String(label)) => {
            let split = (store.label(name, label).await).map_err(not_found)?;
            pick(&split, sticky).ok_or_else(|| Error::internal("an empty label split"))
        }
        (version, Value::Null) => (version.as_i64()).ok_or_else(|| {
            Error::invalid(format!("{PARAM}.version"), "version must be an integer")
        }),
        _ => Err(Error::invalid(
            PARAM,
            "give a prompt's `label` or its `version`, not both",
        )),
    }
}

fn not_found(e: StoreError) -> Error {
    let missing = matches!(e, StoreError::NotFound(_));
    let e = Error::from(e);
    match missing {
        true => e.with_param(format!("{PARAM}.name")),
        false => e,
    }
}
