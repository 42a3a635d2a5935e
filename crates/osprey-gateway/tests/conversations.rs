//! Conversations through the API, on each store backend: a tenant's user reads and writes
//! only their own; a chat naming a conversation is answered with its history (on the real
//! model) and its turn is kept, streamed or not; and while Postgres is unreachable, requests
//! that need the store fail fast with a 503 and recover when it returns, with nothing lost.

use osprey_gateway::{Services, Wiring};
use osprey_limits::RateLimiter;
use osprey_services::auth::Authenticator;
use osprey_services::config::EdgeConfig;
use osprey_services::edge::Edge;
use osprey_store::Store;
use serde_json::{Value, json};

use crate::common::{self, As};

const MODEL: &str = "smollm2-135m-instruct";

/// A gateway on `store` with the shared engine; its base URL.
async fn gateway(store: Store) -> String {
    let auth = Authenticator::new(store.clone()).await.unwrap();
    let edge = Edge::new(EdgeConfig::default(), auth, RateLimiter::local());
    let state = Services::new(Wiring {
        store: Some(store),
        ..Wiring::new(Some(MODEL.into()), vec![], edge)
    });
    state.set_engine(osprey_testkit::shared_engine());
    common::serve(state).await
}

#[tokio::test]
async fn a_conversation_is_its_users_alone() {
    for store in osprey_store::testing::stores().await {
        let acme = common::new_key(&store, "acme").await;
        let globex = common::new_key(&store, "globex").await;
        let base = gateway(store.store.clone()).await;
        let alice = As {
            base: &base,
            key: &acme,
            user: "alice",
        };
        let (status, c) = alice
            .post(
                "/v1/conversations",
                json!({"metadata": {"topic": "birds"}, "items": [
                    {"type": "message", "role": "user", "content": "hi"},
                    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "hello"}]},
                ]}),
            )
            .await;
        assert_eq!(status, 200, "{c}");
        assert_eq!(
            (c["object"].as_str(), &c["metadata"]),
            (Some("conversation"), &json!({"topic": "birds"}))
        );
        let id = c["id"].as_str().unwrap().to_owned();
        let path = format!("/v1/conversations/{id}");
        assert_eq!(alice.get(&path).await.0, 200);
        assert_eq!(alice.texts(&id).await, ["hi", "hello"]);

        // Another user of the tenant, and the same user name in another tenant: not found,
        // whatever they try.
        let bob = As {
            user: "bob",
            ..alice
        };
        let other = As {
            key: &globex,
            ..alice
        };
        for stranger in [&bob, &other] {
            let (status, e) = stranger.get(&path).await;
            assert_eq!(
                (status, e["error"]["code"].as_str()),
                (404, Some("not_found")),
                "{e}"
            );
            assert_eq!(stranger.get(&format!("{path}/items")).await.0, 404);
            let add = json!({"items": [{"role": "user", "content": "let me in"}]});
            assert_eq!(stranger.post(&format!("{path}/items"), add).await.0, 404);
            assert_eq!(stranger.delete(&path).await.0, 404);
        }

        // Items: add, page, read one, delete one.
        let (status, added) = alice
            .post(&format!("{path}/items"), json!({"items": [{"role": "user", "content": "more"}, {"role": "user", "content": "again"}]}))
            .await;
        assert_eq!(
            (status, added["data"].as_array().map(Vec::len)),
            (200, Some(2)),
            "{added}"
        );
        let (_, newest) = alice.get(&format!("{path}/items?limit=2")).await;
        assert_eq!(newest["data"][0]["content"][0]["text"], "again");
        assert_eq!(newest["has_more"], true);
        let after = newest["last_id"].as_str().unwrap();
        let (_, rest) = alice
            .get(&format!("{path}/items?limit=10&after={after}"))
            .await;
        assert_eq!(rest["data"].as_array().unwrap().len(), 2);
        assert_eq!(rest["has_more"], false);
        let first = added["data"][0]["id"].as_str().unwrap();
        let (status, item) = alice.get(&format!("{path}/items/{first}")).await;
        assert_eq!((status, item["role"].as_str()), (200, Some("user")));
        let (status, back) = alice.delete(&format!("{path}/items/{first}")).await;
        assert_eq!((status, back["id"].as_str()), (200, Some(id.as_str())));
        assert_eq!(alice.texts(&id).await, ["hi", "hello", "again"]);

        // Bad input is refused in OpenAI's envelope, naming the field.
        let bad = json!({"items": [{"role": "wizard", "content": "x"}]});
        let (status, e) = alice.post(&format!("{path}/items"), bad).await;
        assert_eq!(
            (status, e["error"]["param"].as_str()),
            (400, Some("items[0].role")),
            "{e}"
        );
        let (status, e) = alice.get(&format!("{path}/items?limit=0")).await;
        assert_eq!((status, e["error"]["param"].as_str()), (400, Some("limit")));
        let (status, e) = alice
            .post("/v1/conversations", json!({"metadata": {"n": 1}}))
            .await;
        assert_eq!(
            (status, e["error"]["param"].as_str()),
            (400, Some("metadata"))
        );

        let (status, gone) = alice.delete(&path).await;
        assert_eq!((status, gone["deleted"].as_bool()), (200, Some(true)));
        assert_eq!(alice.get(&path).await.0, 404);
    }
}

#[tokio::test]
async fn a_chat_in_a_conversation_sees_its_history_and_keeps_its_turn() {
    for store in osprey_store::testing::stores().await {
        let key = common::new_key(&store, "acme").await;
        let base = gateway(store.store.clone()).await;
        let alice = As {
            base: &base,
            key: &key,
            user: "alice",
        };
        let history = [
            ("user", "My name is Zorblax and I keep bees."),
            ("assistant", "Nice to meet you, Zorblax."),
        ];
        let items: Vec<Value> = history
            .iter()
            .map(|(r, c)| json!({"role": r, "content": c}))
            .collect();
        let (_, c) = alice
            .post("/v1/conversations", json!({"items": items}))
            .await;
        let id = c["id"].as_str().unwrap().to_owned();
        let ask = |extra: Value| {
            let mut body = json!({"model": MODEL, "max_tokens": 8, "temperature": 0,
                "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is my name?"}]});
            body.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            body
        };

        let (status, bare) = alice.post("/v1/chat/completions", ask(json!({}))).await;
        assert_eq!(status, 200, "{bare}");
        let (status, within) = alice
            .post(
                "/v1/chat/completions",
                ask(json!({"osprey": {"conversation": id}})),
            )
            .await;
        assert_eq!(status, 200, "{within}");
        let tokens = |r: &Value| r["usage"]["prompt_tokens"].as_u64().unwrap();
        assert!(
            tokens(&within) > tokens(&bare) + 10,
            "the history is in the prompt: {} vs {}",
            tokens(&within),
            tokens(&bare)
        );
        let answer = within["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_owned();
        let texts = alice.texts(&id).await;
        assert_eq!(texts.len(), 4);
        assert_eq!(
            (texts[2].as_str(), texts[3].as_str()),
            ("What is my name?", answer.as_str())
        );

        // Streamed: the turn is kept before `[DONE]`, with the text the client saw.
        let r = reqwest::Client::new()
            .post(format!("{base}/v1/chat/completions"))
            .bearer_auth(&key)
            .header("x-osprey-user", "alice")
            .json(&ask(
                json!({"stream": true, "osprey": {"conversation": id}}),
            ))
            .send()
            .await
            .unwrap();
        let sse = r.text().await.unwrap();
        assert!(sse.trim_end().ends_with("data: [DONE]"), "{sse}");
        let streamed: String = (sse.lines())
            .filter_map(|l| l.strip_prefix("data: "))
            .filter_map(|d| serde_json::from_str::<Value>(d).ok())
            .filter_map(|v| {
                v["choices"][0]["delta"]["content"]
                    .as_str()
                    .map(str::to_owned)
            })
            .collect();
        let texts = alice.texts(&id).await;
        assert_eq!(texts.len(), 6);
        assert_eq!(texts[5], streamed);

        // A budget of no history tokens: the prompt is the request's alone.
        let (_, none) = alice
            .post(
                "/v1/chat/completions",
                ask(json!({"osprey": {"conversation": id, "history_tokens": 0}})),
            )
            .await;
        assert_eq!(tokens(&none), tokens(&bare));

        // Someone else's conversation: refused before generating, and nothing is appended.
        let bob = As {
            user: "bob",
            ..alice
        };
        let (status, e) = bob
            .post(
                "/v1/chat/completions",
                ask(json!({"osprey": {"conversation": id}})),
            )
            .await;
        assert_eq!(
            (status, e["error"]["code"].as_str()),
            (404, Some("not_found")),
            "{e}"
        );
        assert_eq!(alice.texts(&id).await.len(), 8);
    }
}

#[tokio::test]
async fn while_postgres_is_unreachable_requests_get_a_503_and_recover() {
    let Some(url) = osprey_store::testing::postgres_url().await else {
        eprintln!("SKIPPED: OSPREY_TEST_POSTGRES_URL is not set (.ci/run sets it)");
        return;
    };
    // The store reaches Postgres through a proxy the test can cut.
    let (scheme_user, rest) = url.split_once('@').unwrap();
    let (host, path) = rest.split_once('/').unwrap();
    let proxy = common::Proxy::tcp(host).await;
    let store = Store::open(&format!("{scheme_user}@{}/{path}", proxy.addr))
        .await
        .unwrap();
    let key = common::new_key(&store, "acme").await;
    let base = gateway(store).await;
    let alice = As {
        base: &base,
        key: &key,
        user: "alice",
    };
    let (_, c) = alice
        .post(
            "/v1/conversations",
            json!({"items": [{"role": "user", "content": "kept"}]}),
        )
        .await;
    let id = c["id"].as_str().unwrap().to_owned();

    proxy.down();
    let started = std::time::Instant::now();
    let (status, e) = alice.get(&format!("/v1/conversations/{id}")).await;
    assert_eq!(
        (status, e["error"]["code"].as_str()),
        (503, Some("store_unavailable")),
        "{e}"
    );
    let (status, _) = alice
        .post(
            "/v1/conversations",
            json!({"items": [{"role": "user", "content": "lost?"}]}),
        )
        .await;
    assert_eq!(status, 503, "an unacknowledged write");
    eprintln!("503s took {:?}", started.elapsed());

    proxy.up();
    // The store comes back.
    osprey_testkit::eventually(
        || async { (alice.get(&format!("/v1/conversations/{id}")).await.0 == 200).then_some(()) },
        std::time::Duration::from_secs(30),
    )
    .await;
    assert_eq!(alice.texts(&id).await, ["kept"]);
}
