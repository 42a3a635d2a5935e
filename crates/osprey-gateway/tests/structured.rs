//! Structured output and tool calls through the API, on the real model: JSON that validates
//! against the request's schema, calls whose arguments match their function's schema, OpenAI's
//! shapes whole and streamed, `role: tool` messages taken back in, and bad input refused in the
//! error envelope.

use osprey_gateway::Services;
use serde_json::{Value, json};

use crate::common;

const MODEL: &str = "smollm2-135m-instruct";

async fn server() -> String {
    let state = Services::serving(MODEL);
    state.set_engine(osprey_testkit::shared_engine());
    common::serve(state).await
}

async fn post(base: &str, path: &str, body: &Value) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .post(format!("{base}{path}"))
        .json(body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    let value = serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON: {text}"));
    (status, value)
}

/// The `data:` payloads of a streamed request, `[DONE]` last.
async fn stream(base: &str, body: &Value) -> Vec<Value> {
    let mut body = body.clone();
    body["stream"] = true.into();
    let text = reqwest::Client::new()
        .post(format!("{base}/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let data: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    assert_eq!(data.last(), Some(&"[DONE]"), "{text}");
    data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

fn weather_tools() -> Value {
    json!([
        {"type": "function", "function": {
            "name": "get_weather", "description": "The current weather in a city",
            "parameters": {"type": "object", "properties": {
                "city": {"type": "string", "maxLength": 30},
                "unit": {"enum": ["celsius", "fahrenheit"]}
            }, "required": ["city", "unit"], "additionalProperties": false}}},
        {"type": "function", "function": {
            "name": "add", "description": "Adds two integers",
            "parameters": {"type": "object", "properties": {
                "a": {"type": "integer"}, "b": {"type": "integer"}
            }, "required": ["a", "b"], "additionalProperties": false}}}
    ])
}

fn schema_of(tools: &Value, name: &str) -> jsonschema::Validator {
    let tool = (tools.as_array().unwrap().iter())
        .find(|t| t["function"]["name"] == name)
        .unwrap_or_else(|| panic!("no tool {name}"));
    jsonschema::validator_for(&tool["function"]["parameters"]).unwrap()
}

/// Checks a call as OpenAI shapes it and that its arguments are valid for its function.
fn assert_valid_call(call: &Value, tools: &Value) {
    assert!(call["id"].as_str().unwrap().starts_with("call_"), "{call}");
    assert_eq!(call["type"], "function");
    let name = call["function"]["name"].as_str().unwrap();
    let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap())
        .unwrap_or_else(|e| panic!("{e}: {call}"));
    assert!(schema_of(tools, name).is_valid(&args), "{call}");
}

#[tokio::test]
async fn json_schema_answers_validate_whole_and_streamed() {
    let base = server().await;
    let schema = json!({"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 40},
        "country": {"type": "string", "maxLength": 40},
        "population_millions": {"type": "number", "minimum": 0}
    }, "required": ["city", "country", "population_millions"], "additionalProperties": false});
    let validator = jsonschema::validator_for(&schema).unwrap();
    let body = json!({
        "model": MODEL, "temperature": 0, "max_tokens": 120,
        "messages": [{"role": "user", "content": "Tell me about the capital of Japan."}],
        "response_format": {"type": "json_schema",
            "json_schema": {"name": "city", "schema": schema, "strict": true}}
    });
    let (status, answer) = post(&base, "/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{answer}");
    let text = answer["choices"][0]["message"]["content"].as_str().unwrap();
    let value: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert!(validator.is_valid(&value), "{text}");
    assert_eq!(answer["choices"][0]["finish_reason"], "stop");

    let chunks = stream(&base, &body).await;
    let streamed: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(streamed, text, "streamed and whole answers agree");

    // `json_object`: any object, even when the question does not ask for JSON (bounded, so
    // that it ends).
    let body = json!({"model": MODEL, "temperature": 0, "max_tokens": 1500,
        "messages": [{"role": "user", "content": "Write a poem about rain."}],
        "response_format": {"type": "json_object"}});
    let (_, answer) = post(&base, "/v1/chat/completions", &body).await;
    let text = answer["choices"][0]["message"]["content"].as_str().unwrap();
    let value: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert!(value.is_object(), "{text}");
}

#[tokio::test]
async fn osprey_grammars_constrain_completions_and_chats() {
    let base = server().await;
    let (status, answer) = post(
        &base,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": "The date today is", "max_tokens": 20,
                "temperature": 0, "osprey": {"grammar": {"regex": " [0-9]{4}-[0-9]{2}-[0-9]{2}"}}}),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    let text = answer["choices"][0]["text"].as_str().unwrap();
    let b = text.as_bytes();
    assert!(
        b.len() == 11
            && b[5] == b'-'
            && b[8] == b'-'
            && text[1..5].bytes().all(|c| c.is_ascii_digit()),
        "{text:?}"
    );
    let (_, answer) = post(
        &base,
        "/v1/chat/completions",
        &json!({"model": MODEL, "max_tokens": 10, "temperature": 0,
                "messages": [{"role": "user", "content": "Is water wet?"}],
                "osprey": {"grammar": {"lark": "start: \"yes\" | \"no\" | \"maybe\""}}}),
    )
    .await;
    let text = answer["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(["yes", "no", "maybe"].contains(&text), "{text:?}");
}

#[tokio::test]
async fn required_and_named_tool_calls_match_their_schemas() {
    let base = server().await;
    let tools = weather_tools();
    for (choice, parallel) in [
        (json!("required"), true),
        (json!("required"), false),
        (
            json!({"type": "function", "function": {"name": "add"}}),
            true,
        ),
    ] {
        let body = json!({
            "model": MODEL, "temperature": 0, "max_tokens": 150,
            "messages": [{"role": "user", "content": "What is the weather in Paris, and what is 2 plus 3?"}],
            "tools": tools, "tool_choice": choice, "parallel_tool_calls": parallel
        });
        let (status, answer) = post(&base, "/v1/chat/completions", &body).await;
        assert_eq!(status, 200, "{answer}");
        let choice0 = &answer["choices"][0];
        assert_eq!(choice0["finish_reason"], "tool_calls", "{answer}");
        assert!(choice0["message"]["content"].is_null(), "{answer}");
        let calls = choice0["message"]["tool_calls"].as_array().unwrap();
        assert!(!calls.is_empty());
        if !parallel {
            assert_eq!(calls.len(), 1);
        }
        for call in calls {
            assert_valid_call(call, &tools);
        }
        if body["tool_choice"].is_object() {
            assert!(
                calls.iter().all(|c| c["function"]["name"] == "add"),
                "{answer}"
            );
        }

        // Streamed: the first delta of a call carries id, type and name; the arguments
        // arrive in pieces that join to the same JSON.
        let chunks = stream(&base, &body).await;
        let mut streamed: Vec<Value> = Vec::new();
        for chunk in &chunks {
            for delta in chunk["choices"][0]["delta"]["tool_calls"]
                .as_array()
                .into_iter()
                .flatten()
            {
                let i = delta["index"].as_u64().unwrap() as usize;
                if i == streamed.len() {
                    assert!(
                        delta["id"].is_string() && delta["function"]["name"].is_string(),
                        "{delta}"
                    );
                    streamed.push(json!({"id": delta["id"], "type": delta["type"],
                        "function": {"name": delta["function"]["name"], "arguments": ""}}));
                } else {
                    assert!(delta.get("id").is_none(), "{delta}");
                }
                let piece = delta["function"]["arguments"].as_str().unwrap_or_default();
                let args = streamed[i]["function"]["arguments"]
                    .as_str()
                    .unwrap()
                    .to_owned()
                    + piece;
                streamed[i]["function"]["arguments"] = args.into();
            }
        }
        let finish = chunks
            .iter()
            .find_map(|c| c["choices"][0]["finish_reason"].as_str());
        assert_eq!(finish, Some("tool_calls"));
        assert_eq!(streamed.len(), calls.len());
        for (s, whole) in streamed.iter().zip(calls) {
            assert_valid_call(s, &tools);
            assert_eq!(
                s["function"], whole["function"],
                "streamed and whole calls agree"
            );
        }
    }
}

#[tokio::test]
async fn a_tool_result_goes_back_to_the_model() {
    let base = server().await;
    let tools = weather_tools();
    let mut messages = vec![json!({"role": "user", "content": "What is the weather in Paris?"})];
    let body = json!({"model": MODEL, "temperature": 0, "max_tokens": 80, "messages": messages,
        "tools": tools, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}});
    let (_, answer) = post(&base, "/v1/chat/completions", &body).await;
    let message = answer["choices"][0]["message"].clone();
    let call = message["tool_calls"][0].clone();
    messages.push(message);
    messages.push(json!({"role": "tool", "tool_call_id": call["id"],
        "content": "{\"temperature\": 21, \"sky\": \"sunny\"}"}));
    let body = json!({"model": MODEL, "temperature": 0, "max_tokens": 40, "messages": messages,
        "tools": tools, "tool_choice": "none"});
    let (status, answer) = post(&base, "/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{answer}");
    let text = answer["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(!text.is_empty() && answer["choices"][0]["message"]["tool_calls"].is_null());
    assert!(
        answer["usage"]["prompt_tokens"].as_u64().unwrap() > 40,
        "the call and its result are in the prompt"
    );

    // `auto`: text or calls, and calls, when made, valid.
    let body = json!({"model": MODEL, "temperature": 0, "max_tokens": 80,
        "messages": [{"role": "user", "content": "Hello! How are you today?"}], "tools": tools});
    let (status, answer) = post(&base, "/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{answer}");
    let message = &answer["choices"][0]["message"];
    match message["tool_calls"].as_array() {
        Some(calls) => calls.iter().for_each(|c| assert_valid_call(c, &tools)),
        None => assert!(!message["content"].as_str().unwrap().contains("<tool_call>")),
    }
}

#[tokio::test]
async fn bad_schemas_and_tool_choices_are_refused_in_the_envelope() {
    let base = server().await;
    let cases = [
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x",
                "schema": {"type": "object", "properties": {"a": {"type": "nope"}}}, "strict": true}}}),
            "response_format",
        ),
        (
            json!({"response_format": {"type": "xml"}}),
            "response_format.type",
        ),
        (
            json!({"osprey": {"grammar": {"regex": "(["}}}),
            "osprey.grammar",
        ),
        (
            json!({"tools": weather_tools(), "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
            "tool_choice.function.name",
        ),
        (json!({"tool_choice": "required"}), "tool_choice"),
        (
            json!({"tools": [{"type": "function", "function": {"name": "bad name"}}]}),
            "tools[0].function.name",
        ),
        (
            json!({"messages": [{"role": "tool", "content": "18C"}]}),
            "messages[0].tool_call_id",
        ),
    ];
    for (extra, param) in cases {
        let mut body = json!({"model": MODEL, "max_tokens": 5,
            "messages": [{"role": "user", "content": "hi"}]});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let (status, answer) = post(&base, "/v1/chat/completions", &body).await;
        assert_eq!(status, 400, "{body}: {answer}");
        assert_eq!(answer["error"]["type"], "invalid_request_error");
        assert_eq!(answer["error"]["param"], param, "{answer}");
    }
    let (status, _) = post(
        &base,
        "/v1/chat/completions",
        &json!({"model": MODEL, "max_tokens": 3,
        "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(status, 200, "the server keeps serving");
}
