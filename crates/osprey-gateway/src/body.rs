//! The edits the gateway makes to a JSON request body before passing it on: the model it
//! names (an upstream's own name, a tier's model, a tenant's default) and a cap on its
//! `max_tokens` (a tenant's limit, the degradation ladder).

use axum::body::Bytes;
use osprey_core::Error;

/// `body` with its `model` set to `model`; an error for a body that is not a JSON object.
pub fn set_model(body: &Bytes, model: &str) -> Result<Bytes, Error> {
    let mut v: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| Error::invalid("body", format!("The request body is not valid JSON: {e}")))?;
    let Some(object) = v.as_object_mut() else {
        return Err(Error::invalid(
            "body",
            "The request body must be a JSON object.",
        ));
    };
    object.insert("model".to_owned(), model.into());
    Ok(serde_json::to_vec(&v)
        .expect("a JSON value serialises")
        .into())
}

/// `body` with `max_tokens` (or `max_completion_tokens`, whichever it uses) at most `cap`;
/// `None` if it already is (or the body is not a JSON object).
pub fn cap_max_tokens(body: &Bytes, cap: u64) -> Option<Bytes> {
    let mut v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let object = v.as_object_mut()?;
    let field = match object.contains_key("max_completion_tokens") {
        true => "max_completion_tokens",
        false => "max_tokens",
    };
    if object
        .get(field)
        .and_then(|m| m.as_u64())
        .is_some_and(|m| m <= cap)
    {
        return None;
    }
    object.insert(field.to_owned(), cap.into());
    Some(serde_json::to_vec(&v).ok()?.into())
}

/// Whether a streamed request asks for the usage chunk (`stream_options.include_usage`).
pub fn include_usage(body: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(body)
        .is_ok_and(|v| v["stream_options"]["include_usage"] == true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_tokens_is_capped_only_when_larger() {
        let capped = cap_max_tokens(&Bytes::from_static(br#"{"max_tokens": 900}"#), 256).unwrap();
        assert_eq!(capped, Bytes::from_static(br#"{"max_tokens":256}"#));
        assert!(cap_max_tokens(&Bytes::from_static(br#"{"max_tokens": 16}"#), 256).is_none());
        let unset = cap_max_tokens(&Bytes::from_static(br#"{"model": "m"}"#), 256).unwrap();
        assert!(String::from_utf8_lossy(&unset).contains(r#""max_tokens":256"#));
        let newer = br#"{"max_completion_tokens": 1000}"#;
        let capped = cap_max_tokens(&Bytes::from_static(newer), 256).unwrap();
        assert!(String::from_utf8_lossy(&capped).contains(r#""max_completion_tokens":256"#));
    }

    #[test]
    fn capping_rewrites_the_field_in_use() {
        let b = Bytes::from_static(br#"{"model":"m","max_completion_tokens":900}"#);
        let v: serde_json::Value =
            serde_json::from_slice(&cap_max_tokens(&b, 64).unwrap()).unwrap();
        assert_eq!(v["max_completion_tokens"], 64);
        assert!(v.get("max_tokens").is_none());
        let b = Bytes::from_static(br#"{"model":"m"}"#);
        let v: serde_json::Value =
            serde_json::from_slice(&cap_max_tokens(&b, 64).unwrap()).unwrap();
        assert_eq!(v["max_tokens"], 64);
    }

    #[test]
    fn only_an_object_names_a_model() {
        let named = set_model(&Bytes::from_static(br#"{"model":"a"}"#), "b").unwrap();
        assert_eq!(named, Bytes::from_static(br#"{"model":"b"}"#));
        assert!(set_model(&Bytes::from_static(b"[1]"), "b").is_err());
        assert!(set_model(&Bytes::from_static(b"{"), "b").is_err());
    }
}
