//! `/v1/embeddings` and the embedding model's card in `/v1/models`.

use serde_json::{Value, json};

use crate::api::{MODEL, send, server};
use crate::common::get_json;

/// The embedding model is listed under its id, `all-MiniLM-L6-v2`, and answers to that and to
/// the lower-case spelling it had first; another name is a 404 `model_not_found`.
#[tokio::test]
async fn the_embedding_model_is_listed_and_answers_to_both_spellings() {
    let base = server().await;
    let client = reqwest::Client::new();
    let models = get_json(&format!("{base}/v1/models")).await;
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["id"].as_str())
        .collect();
    assert_eq!(ids, [MODEL, "all-MiniLM-L6-v2"], "{models}");
    for id in ["all-MiniLM-L6-v2", "all-minilm-l6-v2"] {
        let card = get_json(&format!("{base}/v1/models/{id}")).await;
        assert_eq!(card["id"], "all-MiniLM-L6-v2", "{card}");
        let r = send(
            &base,
            "/v1/embeddings",
            &json!({"model": id, "input": "Ospreys eat fish."}),
        )
        .await;
        assert_eq!(r.status(), 200);
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["model"], "all-MiniLM-L6-v2");
        assert_eq!(body["data"][0]["embedding"].as_array().unwrap().len(), 384);
    }
    let r = send(
        &base,
        "/v1/embeddings",
        &json!({"model": "text-embedding-3-small", "input": "x"}),
    )
    .await;
    assert_eq!(r.status(), 404);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "model_not_found", "{body}");
    let r = client
        .get(format!("{base}/v1/models/all-mpnet-base-v2"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
}
