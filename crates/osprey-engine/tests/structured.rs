//! Structured output on the real model: whatever the model would have said, the text follows
//! its grammar (JSON schema, regex, Lark), alone or batched with unconstrained sequences,
//! whose own output the grammar next to them does not change.

use osprey_core::{Grammar, SamplingParams};
use osprey_engine::{Engine, GenerateRequest, TemplateMessage};
use osprey_testkit::shared_engine;
use serde_json::json;

fn chat(engine: &Engine, user: &str) -> Vec<u32> {
    let messages = [TemplateMessage {
        role: "user".into(),
        content: user.into(),
    }];
    engine.prompter().chat_tokens(&messages).unwrap()
}

/// The text of one request, run to completion, and why it ended.
async fn run(
    engine: &Engine,
    prompt: Vec<u32>,
    grammar: Option<Grammar>,
    max_tokens: usize,
) -> (String, osprey_core::FinishReason) {
    let params = SamplingParams {
        temperature: 0.0,
        max_tokens,
        ..SamplingParams::default()
    };
    let request = GenerateRequest {
        grammar,
        ..GenerateRequest::new(prompt, params)
    };
    let mut generation = engine.generate(engine.validate(request).unwrap()).unwrap();
    let mut text = String::new();
    let mut finish = None;
    while let Some(delta) = generation.next().await {
        let delta = delta.unwrap();
        text.push_str(&delta.text);
        finish = delta.finish.or(finish);
    }
    (text, finish.expect("a last delta"))
}

fn person_schema() -> serde_json::Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 40},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "languages": {"type": "array", "items": {"enum": ["English", "French", "German"]}, "maxItems": 3},
            "employed": {"type": "boolean"}
        },
        "required": ["name", "age", "languages", "employed"],
        "additionalProperties": false
    })
}

#[tokio::test]
async fn json_schema_output_parses_and_validates() {
    let engine = shared_engine();
    let schema = person_schema();
    let validator = jsonschema::validator_for(&schema).unwrap();
    for user in [
        "Describe a French teacher called Marie as JSON.",
        "Who are you? Answer in JSON.",
        "Write a haiku about the sea.",
    ] {
        let grammar = Grammar::JsonSchema {
            schema: schema.clone(),
            strict: true,
        };
        let (text, finish) = run(&engine, chat(&engine, user), Some(grammar), 200).await;
        assert_eq!(finish, osprey_core::FinishReason::Stop, "{text}");
        let value: serde_json::Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert!(validator.is_valid(&value), "{text}");
    }
}

#[tokio::test]
async fn regex_and_lark_outputs_match() {
    let engine = shared_engine();
    let (text, _) = run(
        &engine,
        chat(&engine, "What is the phone number of the museum?"),
        Some(Grammar::Regex(r"\+44 [0-9]{4} [0-9]{6}".into())),
        40,
    )
    .await;
    let re = regex_lite(&text);
    assert!(re, "{text:?}");
    let lark = r#"start: "The answer is " ANSWER "."
ANSWER: "yes" | "no""#;
    let (text, _) = run(
        &engine,
        chat(&engine, "Is Paris in France?"),
        Some(Grammar::Lark(lark.into())),
        20,
    )
    .await;
    assert!(
        text == "The answer is yes." || text == "The answer is no.",
        "{text:?}"
    );
}

/// `+44 dddd dddddd`, checked by hand.
fn regex_lite(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 15
        && s.starts_with("+44 ")
        && b[4..8].iter().all(u8::is_ascii_digit)
        && b[8] == b' '
        && b[9..].iter().all(u8::is_ascii_digit)
}

#[tokio::test]
async fn constrained_and_free_sequences_batch_together() {
    let engine = shared_engine();
    let free_prompt = chat(&engine, "Tell me about owls.");
    let (alone, _) = run(&engine, free_prompt.clone(), None, 48).await;
    let schema = person_schema();
    let validator = jsonschema::validator_for(&schema).unwrap();
    let mut runs = Vec::new();
    for i in 0..6 {
        let engine = engine.clone();
        let (prompt, grammar) = match i % 2 {
            0 => (free_prompt.clone(), None),
            _ => (
                chat(&engine, &format!("Describe person number {i} as JSON.")),
                Some(Grammar::JsonSchema {
                    schema: schema.clone(),
                    strict: false,
                }),
            ),
        };
        runs.push(tokio::spawn(async move {
            {
                let max = if grammar.is_some() { 200 } else { 48 };
                (grammar.is_some(), run(&engine, prompt, grammar, max).await)
            }
        }));
    }
    for r in runs {
        let (constrained, (text, _)) = r.await.unwrap();
        if constrained {
            let v: serde_json::Value =
                serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
            assert!(validator.is_valid(&v), "{text}");
        } else {
            assert_eq!(text, alone, "a free neighbour's output is unchanged");
        }
    }
}

#[tokio::test]
async fn json_objects_are_bounded_so_they_always_end() {
    let engine = shared_engine();
    for user in [
        "Write a poem about rain.",
        "Describe a cat as JSON.",
        "List three colours.",
    ] {
        let (text, finish) = run(
            &engine,
            chat(&engine, user),
            Some(Grammar::JsonObject),
            1500,
        )
        .await;
        assert_eq!(finish, osprey_core::FinishReason::Stop, "{text}");
        let value: serde_json::Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        let object = value.as_object().expect("an object");
        assert!(
            object.len() <= 32 && object.keys().all(|k| k.chars().count() <= 64),
            "{text}"
        );
    }
}

#[test]
fn a_bad_grammar_is_an_error_about_the_grammar() {
    let engine = shared_engine();
    for grammar in [
        Grammar::Regex("(unclosed".into()),
        Grammar::Lark("start: undefined_rule".into()),
        Grammar::JsonSchema {
            schema: json!({"type": "object", "properties": {"x": {"type": "no-such-type"}}}),
            strict: true,
        },
    ] {
        let request = GenerateRequest {
            grammar: Some(grammar.clone()),
            ..GenerateRequest::new(vec![1, 2, 3], SamplingParams::default())
        };
        let err = engine
            .validate(request)
            .err()
            .unwrap_or_else(|| panic!("{grammar:?} compiled"));
        assert_eq!(err.param.as_deref(), Some("grammar"), "{}", err.message);
    }
}
