//! The text of a message and of an answer's choice, read from their JSON: one home for what
//! every stage that reads answers (guard-out, the request log, citations, conversations, the
//! caches, evaluation) needs.

use serde_json::Value;

/// The text of a message's content: a string, or its text parts joined (`text`,
/// `input_text`, `output_text`); `None` for any other part.
pub fn content_text(content: &Value) -> Option<String> {
    match content {
        Value::String(s) => Some(s.clone()),
        Value::Array(parts) => parts
            .iter()
            .map(|p| match p["type"].as_str() {
                Some("input_text" | "output_text" | "text") => p["text"].as_str(),
                _ => None,
            })
            .collect::<Option<Vec<&str>>>()
            .map(|texts| texts.concat()),
        _ => None,
    }
}

/// Where the text of a choice is: a chat answer's `message` or a chunk's `delta` content, or
/// a completion's `text`.
fn text_field(choice: &Value) -> (Option<&'static str>, &'static str) {
    match ["message", "delta"]
        .into_iter()
        .find(|k| choice.get(k).is_some())
    {
        Some(key) => (Some(key), "content"),
        None => (None, "text"),
    }
}

/// The text of a choice of a chat or text completion (or of one of their chunks).
pub fn choice_text(choice: &Value) -> Option<&str> {
    match text_field(choice) {
        (Some(key), field) => choice[key][field].as_str(),
        (None, field) => choice[field].as_str(),
    }
}

/// [`choice_text`], to change in place.
pub fn choice_text_mut(choice: &mut Value) -> Option<&mut String> {
    let field = match text_field(choice) {
        (Some(key), field) => choice.get_mut(key)?.get_mut(field)?,
        (None, field) => choice.get_mut(field)?,
    };
    match field {
        Value::String(s) => Some(s),
        _ => None,
    }
}

/// Sets the text of a choice (see [`choice_text`]), creating the field if need be.
pub fn set_choice_text(choice: &mut Value, text: String) {
    if !choice.is_object() {
        return;
    }
    match text_field(choice) {
        (Some(key), field) => choice[key][field] = text.into(),
        (None, field) => choice[field] = text.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_choice_has_its_text_in_its_message_its_delta_or_its_text() {
        let mut chat = json!({"message": {"role": "assistant", "content": "a"}});
        let mut chunk = json!({"delta": {"content": "b"}});
        let mut text = json!({"text": "c"});
        assert_eq!(choice_text(&chat), Some("a"));
        assert_eq!(choice_text(&chunk), Some("b"));
        assert_eq!(choice_text(&text), Some("c"));
        choice_text_mut(&mut chat).unwrap().push('!');
        assert_eq!(chat["message"]["content"], "a!");
        let mut role_only = json!({"delta": {"role": "assistant"}});
        assert_eq!(choice_text_mut(&mut role_only), None);
        set_choice_text(&mut role_only, "d".into());
        assert_eq!(role_only["delta"]["content"], "d");
        set_choice_text(&mut chunk, "e".into());
        set_choice_text(&mut text, "f".into());
        assert_eq!(
            (choice_text(&chunk), choice_text(&text)),
            (Some("e"), Some("f"))
        );
    }

    #[test]
    fn content_is_a_string_or_text_parts() {
        assert_eq!(content_text(&json!("hi")).as_deref(), Some("hi"));
        let parts = json!([{"type": "text", "text": "a"}, {"type": "input_text", "text": "b"}]);
        assert_eq!(content_text(&parts).as_deref(), Some("ab"));
        assert_eq!(content_text(&json!([{"type": "image_url"}])), None);
        assert_eq!(content_text(&Value::Null), None);
    }
}
