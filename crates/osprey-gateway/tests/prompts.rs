//! The prompt registry through the admin API and chat requests, on the real model and each
//! store backend: versions pushed and labelled, a request naming a prompt gets its rendered
//! messages and settings and says which version answered, a split label gives each user one
//! version for good, and a rollback takes effect at once.

use osprey_gateway::{Services, Wiring};
use osprey_limits::RateLimiter;
use osprey_services::auth::Authenticator;
use osprey_services::config::EdgeConfig;
use osprey_services::edge::Edge;
use osprey_store::Store;
use serde_json::{Value, json};

use crate::common;

const MODEL: &str = "smollm2-135m-instruct";
const ADMIN: &str = "admin-secret";

async fn gateway(store: Store) -> String {
    let auth = Authenticator::new(store.clone()).await.unwrap();
    let config = EdgeConfig {
        admin_key: Some(ADMIN.into()),
        ..EdgeConfig::default()
    };
    let edge = Edge::new(config, auth, RateLimiter::local());
    let state = Services::new(Wiring {
        store: Some(store),
        ..Wiring::new(Some(MODEL.into()), vec![], edge)
    });
    state.set_engine(osprey_testkit::shared_engine());
    common::serve(state).await
}

async fn send(
    base: &str,
    method: reqwest::Method,
    path: &str,
    key: &str,
    user: &str,
    body: Option<Value>,
) -> (u16, Option<String>, Value) {
    let mut req = reqwest::Client::new()
        .request(method, format!("{base}{path}"))
        .bearer_auth(key)
        .header("x-osprey-user", user);
    if let Some(body) = body {
        req = req.json(&body);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    let prompt = (r.headers().get("x-osprey-prompt")).map(|v| v.to_str().unwrap().to_owned());
    (status, prompt, r.json().await.unwrap_or(Value::Null))
}

fn definition(system: &str, max_tokens: u32) -> Value {
    json!({"messages": [{"role": "system", "content": system}],
           "settings": {"max_tokens": max_tokens, "temperature": 0}})
}

#[tokio::test]
async fn requests_get_the_labelled_version_and_say_which() {
    for store in osprey_store::testing::stores().await {
        let key = common::new_key(&store, "acme").await;
        let base = gateway(store.store.clone()).await;
        let admin = |method, path: &str, body| {
            let base = base.clone();
            let path = path.to_owned();
            async move { send(&base, method, &path, ADMIN, "", body).await }
        };
        use reqwest::Method;
        let system = "You answer questions about {{ product }} in one short sentence.";
        let (status, _, v1) = admin(
            Method::POST,
            "/admin/prompts/support",
            Some(definition(system, 6)),
        )
        .await;
        assert_eq!((status, v1["version"].as_i64()), (201, Some(1)), "{v1}");
        let (_, _, v2) = admin(
            Method::POST,
            "/admin/prompts/support",
            Some(definition("Reply with one word about {{ product }}.", 6)),
        )
        .await;
        assert_eq!(v2["version"], 2);
        let bad = json!({"messages": [{"role": "wizard", "content": "x"}]});
        assert_eq!(
            admin(Method::POST, "/admin/prompts/support", Some(bad))
                .await
                .0,
            400
        );
        let (status, _, _) = send(
            &base,
            Method::POST,
            "/admin/prompts/x",
            &key,
            "",
            Some(definition("x", 1)),
        )
        .await;
        assert_eq!(status, 401, "the admin API needs the admin key");
        let label = |split: &str| json!({"split": split});
        assert_eq!(
            admin(
                Method::PUT,
                "/admin/prompts/support/labels/production",
                Some(label("1"))
            )
            .await
            .0,
            200
        );

        let chat = |user: &str, prompt: Value, extra: Value| {
            let mut body = json!({"model": MODEL, "messages": [{"role": "user", "content": "What is it?"}],
                                  "osprey": {"prompt": prompt}});
            body.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            let (base, key, user) = (base.clone(), key.clone(), user.to_owned());
            async move {
                send(
                    &base,
                    Method::POST,
                    "/v1/chat/completions",
                    &key,
                    &user,
                    Some(body),
                )
                .await
            }
        };
        let vars = json!({"product": "Osprey"});
        let (status, which, answer) = chat(
            "alice",
            json!({"name": "support", "label": "production", "variables": vars}),
            json!({}),
        )
        .await;
        assert_eq!(
            (status, which.as_deref()),
            (200, Some("support@1")),
            "{answer}"
        );
        // The same messages written out by hand make the same prompt.
        let by_hand = json!({"model": MODEL, "max_tokens": 6, "temperature": 0, "messages": [
            {"role": "system", "content": "You answer questions about Osprey in one short sentence."},
            {"role": "user", "content": "What is it?"}]});
        let (_, _, bare) = send(
            &base,
            Method::POST,
            "/v1/chat/completions",
            &key,
            "alice",
            Some(by_hand),
        )
        .await;
        let tokens = |r: &Value, k: &str| r["usage"][k].as_u64().unwrap();
        assert_eq!(
            tokens(&answer, "prompt_tokens"),
            tokens(&bare, "prompt_tokens"),
            "the rendered prompt is sent"
        );
        assert_eq!(
            answer["choices"][0]["message"], bare["choices"][0]["message"],
            "temperature 0 from the prompt's settings"
        );
        assert!(
            tokens(&answer, "completion_tokens") <= 6,
            "the prompt's max_tokens applies"
        );
        let (_, _, own) = chat(
            "alice",
            json!({"name": "support", "version": 2, "variables": vars}),
            json!({"max_tokens": 2}),
        )
        .await;
        assert!(
            tokens(&own, "completion_tokens") <= 2,
            "the request's own setting wins"
        );
        let (_, which, _) = chat(
            "alice",
            json!({"name": "support", "variables": vars}),
            json!({}),
        )
        .await;
        assert_eq!(
            which.as_deref(),
            Some("support@2"),
            "no label nor version: the newest"
        );

        // Bad references are refused in OpenAI's envelope, naming the field.
        let (status, _, e) = chat(
            "alice",
            json!({"name": "support", "label": "production"}),
            json!({}),
        )
        .await;
        assert_eq!(
            (status, e["error"]["param"].as_str()),
            (400, Some("osprey.prompt.variables")),
            "{e}"
        );
        let (status, _, e) = chat(
            "alice",
            json!({"name": "nope", "label": "production", "variables": vars}),
            json!({}),
        )
        .await;
        assert_eq!(
            (status, e["error"]["param"].as_str()),
            (404, Some("osprey.prompt.name")),
            "{e}"
        );
        let (status, _, _) = chat(
            "alice",
            json!({"name": "support", "label": "canary", "variables": vars}),
            json!({}),
        )
        .await;
        assert_eq!(status, 404);
        let (status, _, _) = chat(
            "alice",
            json!({"name": "support", "label": "production", "version": 1, "variables": vars}),
            json!({}),
        )
        .await;
        assert_eq!(status, 400);

        // A 50/50 split: each user keeps their version, and both are served.
        admin(
            Method::PUT,
            "/admin/prompts/support/labels/production",
            Some(label("1:50,2:50")),
        )
        .await;
        let mut seen = std::collections::BTreeMap::new();
        for i in 0..16 {
            let user = format!("user-{i}");
            let prompt = json!({"name": "support", "label": "production", "variables": vars});
            let (_, first, _) = chat(&user, prompt.clone(), json!({"max_tokens": 1})).await;
            let (_, again, _) = chat(&user, prompt, json!({"max_tokens": 1})).await;
            assert_eq!(first, again, "{user} keeps their version");
            *seen.entry(first.unwrap()).or_insert(0) += 1;
        }
        assert_eq!(seen.len(), 2, "both versions are served: {seen:?}");

        // Rolled back: everyone is on version 1 again.
        let (status, _, back) = admin(
            Method::POST,
            "/admin/prompts/support/labels/production/rollback",
            None,
        )
        .await;
        assert_eq!(
            (status, back["split"][0]["version"].as_i64()),
            (200, Some(1)),
            "{back}"
        );
        for i in 0..4 {
            let prompt = json!({"name": "support", "label": "production", "variables": vars});
            let (_, which, _) = chat(&format!("user-{i}"), prompt, json!({"max_tokens": 1})).await;
            assert_eq!(which.as_deref(), Some("support@1"));
        }

        let (_, _, d) = admin(Method::GET, "/admin/prompts/support/diff?from=1&to=2", None).await;
        let text = d["diff"].as_str().unwrap();
        assert!(
            text.contains("-content = \"You answer")
                && text.contains("+content = \"Reply with one word"),
            "{text}"
        );
        let (_, _, listed) = admin(Method::GET, "/admin/prompts", None).await;
        assert_eq!(listed["data"][0]["latest_version"], 2);
        let (_, _, shown) = admin(Method::GET, "/admin/prompts/support/versions/1", None).await;
        assert_eq!(shown["definition"]["settings"]["max_tokens"], 6);
    }
}
