//! Tools a chat may call and the structure an answer must have: `tools`, `tool_choice`,
//! `parallel_tool_calls`, `response_format`, the calls in an answer (whole or streamed), and
//! Osprey's `grammar` option.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{Error, Result};
use crate::grammar::Grammar;

/// One entry of `tools`.
#[derive(Clone, Debug, Deserialize, Serialize, utoipa::ToSchema)]
pub struct Tool {
    /// Always `function`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The function.
    pub function: FunctionDef,
}

/// A function the model may call.
#[derive(Clone, Debug, Deserialize, Serialize, utoipa::ToSchema)]
pub struct FunctionDef {
    /// Its name: letters, digits, `_` and `-`, at most 64.
    pub name: String,
    /// What it does, for the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The JSON Schema of its arguments (an object); none means no arguments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Value>,
    /// Refuse schema keywords that cannot be enforced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
}

impl FunctionDef {
    /// The schema of the arguments (an empty object when none was given).
    pub fn parameters(&self) -> Value {
        self.parameters
            .clone()
            .unwrap_or_else(|| serde_json::json!({"type": "object", "properties": {}}))
    }
}

/// `tool_choice`: `"none"`, `"auto"`, `"required"`, or one named function.
#[derive(Clone, Debug, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum ToolChoice {
    /// `none`, `auto` or `required`.
    Mode(String),
    /// `{"type": "function", "function": {"name": ...}}`.
    Named(NamedToolChoice),
}

/// A tool choice naming one function.
#[derive(Clone, Debug, Deserialize, Serialize, utoipa::ToSchema)]
pub struct NamedToolChoice {
    /// Always `function`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Which function.
    pub function: FunctionName,
}

/// A function, by name.
#[derive(Clone, Debug, Deserialize, Serialize, utoipa::ToSchema)]
pub struct FunctionName {
    /// The function's name.
    pub name: String,
}

/// What the model may do with its tools, once checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolMode {
    /// Answer in text; the tools are not offered.
    None,
    /// Answer in text or call tools, as the model chooses.
    Auto,
    /// Call at least one tool.
    Required,
    /// Call this function.
    Named(String),
}

/// A call in an answer.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize, utoipa::ToSchema)]
pub struct ToolCall {
    /// `call_…`, quoted back by the `tool` message that answers it.
    pub id: String,
    /// Always `function`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The function and its arguments.
    pub function: FunctionCall,
}

/// A function called.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize, utoipa::ToSchema)]
pub struct FunctionCall {
    /// Its name.
    pub name: String,
    /// Its arguments, JSON text.
    pub arguments: String,
}

/// A streamed increment of a call.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize, utoipa::ToSchema)]
pub struct ToolCallDelta {
    /// Which call of the answer.
    #[serde(default)]
    pub index: usize,
    /// The call's id, on its first increment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// `function`, on its first increment.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Name (first increment) and a piece of the arguments.
    pub function: FunctionCallDelta,
}

/// A function call's increment.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize, utoipa::ToSchema)]
pub struct FunctionCallDelta {
    /// The function's name, on the call's first increment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// More of the arguments' JSON text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<String>,
}

/// `response_format`.
#[derive(Clone, Debug, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ResponseFormat {
    /// Any text (the default).
    Text,
    /// A JSON object.
    JsonObject,
    /// JSON valid under a schema.
    JsonSchema {
        /// The schema and its name.
        json_schema: JsonSchemaFormat,
    },
}

/// `response_format.json_schema`.
#[derive(Clone, Debug, Deserialize, Serialize, utoipa::ToSchema)]
pub struct JsonSchemaFormat {
    /// The schema's name.
    pub name: String,
    /// What it is for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The JSON Schema (any JSON when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<Value>,
    /// Refuse schema keywords that cannot be enforced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
}

/// Osprey's `grammar` option: `{"regex": "..."}` or `{"lark": "..."}`.
#[derive(Clone, Debug, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum GrammarOption {
    /// The whole output matches this regular expression.
    Regex(String),
    /// The output derives from this Lark grammar (llguidance's dialect).
    Lark(String),
}

/// The grammar a request's text must follow, from `response_format` and `osprey.grammar`
/// (asking for both is an error).
pub fn output_grammar(
    format: Option<&ResponseFormat>,
    option: Option<&GrammarOption>,
) -> Result<Option<Grammar>> {
    let from_format = match format {
        None | Some(ResponseFormat::Text) => None,
        Some(ResponseFormat::JsonObject) => Some(Grammar::JsonObject),
        Some(ResponseFormat::JsonSchema { json_schema }) => {
            let schema = json_schema.schema.clone().unwrap_or(Value::Bool(true));
            if !(schema.is_object() || schema.is_boolean()) {
                return Err(Error::invalid(
                    "response_format.json_schema.schema",
                    "the schema must be a JSON object",
                ));
            }
            Some(Grammar::JsonSchema {
                schema,
                strict: json_schema.strict.unwrap_or(false),
            })
        }
    };
    let from_option = option.map(|o| match o {
        GrammarOption::Regex(r) => Grammar::Regex(r.clone()),
        GrammarOption::Lark(l) => Grammar::Lark(l.clone()),
    });
    match (from_format, from_option) {
        (Some(_), Some(_)) => Err(Error::invalid(
            "osprey.grammar",
            "`osprey.grammar` and a structured `response_format` cannot both be given",
        )),
        (a, b) => Ok(a.or(b)),
    }
}

/// Checks `tools` and `tool_choice` together: every tool a uniquely named function with an
/// object schema, and a choice that names one of them.
pub fn tool_mode(tools: &[Tool], choice: Option<&ToolChoice>) -> Result<ToolMode> {
    for (i, tool) in tools.iter().enumerate() {
        if tool.kind != "function" {
            return Err(Error::invalid(
                format!("tools[{i}].type"),
                format!("tools[{i}].type must be `function`, got `{}`", tool.kind),
            ));
        }
        let name = &tool.function.name;
        let valid = (1..=64).contains(&name.len())
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !valid {
            return Err(Error::invalid(
                format!("tools[{i}].function.name"),
                format!(
                    "tools[{i}].function.name must be 1 to 64 letters, digits, `_` or `-`, got `{name}`"
                ),
            ));
        }
        if tools[..i].iter().any(|t| &t.function.name == name) {
            return Err(Error::invalid(
                format!("tools[{i}].function.name"),
                format!("two tools are named `{name}`"),
            ));
        }
        if let Some(p) = &tool.function.parameters
            && !(p.is_object() && p.get("type").is_none_or(|t| t == "object"))
        {
            return Err(Error::invalid(
                format!("tools[{i}].function.parameters"),
                format!("tools[{i}].function.parameters must be a JSON Schema of an object"),
            ));
        }
    }
    let mode = match choice {
        None if tools.is_empty() => ToolMode::None,
        None => ToolMode::Auto,
        Some(ToolChoice::Mode(m)) => match m.as_str() {
            "none" => ToolMode::None,
            "auto" => ToolMode::Auto,
            "required" => ToolMode::Required,
            other => {
                return Err(Error::invalid(
                    "tool_choice",
                    format!(
                        "tool_choice must be `none`, `auto`, `required` or a named function, got `{other}`"
                    ),
                ));
            }
        },
        Some(ToolChoice::Named(n)) => {
            if n.kind != "function" {
                return Err(Error::invalid(
                    "tool_choice.type",
                    "tool_choice.type must be `function`",
                ));
            }
            if !tools.iter().any(|t| t.function.name == n.function.name) {
                return Err(Error::invalid(
                    "tool_choice.function.name",
                    format!(
                        "tool_choice names `{}`, which is not in `tools`",
                        n.function.name
                    ),
                ));
            }
            ToolMode::Named(n.function.name.clone())
        }
    };
    if tools.is_empty() && matches!(mode, ToolMode::Required | ToolMode::Auto) {
        return Err(Error::invalid(
            "tool_choice",
            "tool_choice asks for a tool call, but `tools` is empty",
        ));
    }
    Ok(mode)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str) -> Tool {
        serde_json::from_value(serde_json::json!({
            "type": "function",
            "function": {"name": name, "parameters": {"type": "object", "properties": {}}}
        }))
        .unwrap()
    }

    #[test]
    fn tool_choice_is_checked_against_the_tools() {
        let tools = [tool("get_weather"), tool("add")];
        assert_eq!(tool_mode(&tools, None).unwrap(), ToolMode::Auto);
        assert_eq!(tool_mode(&[], None).unwrap(), ToolMode::None);
        let named: ToolChoice = serde_json::from_value(
            serde_json::json!({"type": "function", "function": {"name": "add"}}),
        )
        .unwrap();
        assert_eq!(
            tool_mode(&tools, Some(&named)).unwrap(),
            ToolMode::Named("add".into())
        );
        let err = tool_mode(&tools[..1], Some(&named)).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("tool_choice.function.name"));
        let err = tool_mode(&[tool("a b")], None).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("tools[0].function.name"));
        let err = tool_mode(&[tool("x"), tool("x")], None).unwrap_err();
        assert!(err.message.contains("two tools"), "{}", err.message);
        let required = ToolChoice::Mode("required".into());
        assert!(tool_mode(&[], Some(&required)).is_err());
    }

    #[test]
    fn response_format_and_grammar_option_become_one_grammar() {
        let format: ResponseFormat = serde_json::from_value(serde_json::json!({
            "type": "json_schema",
            "json_schema": {"name": "x", "schema": {"type": "object"}, "strict": true}
        }))
        .unwrap();
        let g = output_grammar(Some(&format), None).unwrap().unwrap();
        assert!(matches!(g, Grammar::JsonSchema { strict: true, .. }));
        let option: GrammarOption =
            serde_json::from_value(serde_json::json!({"regex": "[0-9]+"})).unwrap();
        assert_eq!(
            output_grammar(None, Some(&option)).unwrap(),
            Some(Grammar::Regex("[0-9]+".into()))
        );
        assert!(output_grammar(Some(&format), Some(&option)).is_err());
        assert_eq!(
            output_grammar(Some(&ResponseFormat::Text), None).unwrap(),
            None
        );
    }
}
