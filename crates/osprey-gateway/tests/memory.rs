//! Layered memory through the API, on each store backend, with the real model: facts and
//! scratchpads are their user's alone and go into the prompt exactly as the prompt builder
//! says; a conversation's older turns are summarised by the model and the prompt stays within
//! its budgets; facts are extracted when the tenant enables it; the request log records the
//! prompt version and what was injected; deleting a user forgets all of theirs, cached answers
//! included (in memory and in Redis).

use osprey_gateway::{Services, Wiring};
use osprey_limits::RateLimiter;
use osprey_services::auth::Authenticator;
use osprey_services::cache::ResponseCache;
use osprey_services::config::EdgeConfig;
use osprey_services::edge::Edge;
use osprey_store::SharedRedis;
use osprey_store::{Owner, Store};
use serde_json::{Value, json};

use crate::common::{self, As};

const MODEL: &str = "smollm2-135m-instruct";
const ADMIN: &str = "admin-secret";

/// A gateway on `store` with the shared engine, the admin API and `cache`; its base URL.
async fn gateway(store: Store, cache: ResponseCache) -> String {
    let auth = Authenticator::new(store.clone()).await.unwrap();
    let config = EdgeConfig {
        admin_key: Some(ADMIN.into()),
        ..EdgeConfig::default()
    };
    let edge = Edge::new(config, auth, RateLimiter::local());
    let state = Services::new(Wiring {
        store: Some(store),
        response_cache: Some(cache),
        ..Wiring::new(Some(MODEL.into()), vec![], edge)
    });
    state.set_engine(osprey_testkit::shared_engine());
    common::serve(state).await
}

/// A chat request for `messages` (system, then user), greedy, with `osprey` options.
fn chat(system: &str, user: &str, osprey: Value) -> Value {
    json!({"model": MODEL, "max_tokens": 10, "temperature": 0, "osprey": osprey,
           "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]})
}

/// Sends a chat; its status, `x-osprey-memory` header and body.
async fn ask(who: &As<'_>, body: Value) -> (u16, String, Value) {
    let r = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", who.base))
        .bearer_auth(who.key)
        .header("x-osprey-user", who.user)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let memory = (r.headers().get("x-osprey-memory"))
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    (status, memory, r.json().await.unwrap())
}

fn prompt_tokens(answer: &Value) -> u64 {
    answer["usage"]["prompt_tokens"].as_u64().unwrap()
}

fn text(answer: &Value) -> &str {
    answer["choices"][0]["message"]["content"].as_str().unwrap()
}

async fn admin(base: &str, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
    let mut req = reqwest::Client::new()
        .request(method, format!("{base}{path}"))
        .bearer_auth(ADMIN);
    if let Some(body) = body {
        req = req.json(&body);
    }
    let r = req.send().await.unwrap();
    assert!(r.status().is_success(), "{path}: {}", r.status());
    r.json().await.unwrap()
}

#[tokio::test]
async fn facts_and_scratchpads_are_their_users_alone_and_go_in_as_built() {
    for store in osprey_store::testing::stores().await {
        let acme = common::new_key(&store, "acme").await;
        let globex = common::new_key(&store, "globex").await;
        let base = gateway(store.store.clone(), ResponseCache::memory()).await;
        let alice = As {
            base: &base,
            key: &acme,
            user: "alice",
        };
        let bob = As {
            user: "bob",
            ..alice
        };
        let elsewhere = As {
            key: &globex,
            ..alice
        };
        let (status, bees) = alice
            .post("/v1/memory/facts", json!({"content": "keeps bees"}))
            .await;
        assert_eq!(status, 200, "{bees}");
        alice
            .post("/v1/memory/facts", json!({"content": "lives in Lisbon"}))
            .await;
        let (_, list) = alice.get("/v1/memory/facts").await;
        let contents: Vec<&str> = (list["data"].as_array().unwrap().iter())
            .map(|f| f["content"].as_str().unwrap())
            .collect();
        assert_eq!(contents, ["lives in Lisbon", "keeps bees"], "newest first");
        let pad = "Step 1 done: flights compared. Step 2: choose a hotel.";
        let (status, _) = alice
            .send(
                reqwest::Method::PUT,
                "/v1/memory/working/trip",
                Some(json!({"content": pad, "ttl_seconds": 600})),
            )
            .await;
        assert_eq!(status, 200);
        let bees_path = format!("/v1/memory/facts/{}", bees["id"].as_str().unwrap());
        for stranger in [&bob, &elsewhere] {
            let (_, theirs) = stranger.get("/v1/memory/facts").await;
            assert_eq!(theirs["data"], json!([]));
            assert_eq!(stranger.delete(&bees_path).await.0, 404);
            assert_eq!(stranger.get("/v1/memory/working/trip").await.0, 404);
        }

        // The facts (newest first) and the scratchpad go in one system message after the
        // request's own: the same prompt, token for token, as those messages written by hand.
        let (status, memory, with) = ask(
            &alice,
            chat(
                "Be brief.",
                "Where do I live?",
                json!({"memory": true, "working_memory": "trip"}),
            ),
        )
        .await;
        assert_eq!(status, 200, "{with}");
        assert_eq!(memory, "facts=2; working=trip");
        let by_hand = json!({"model": MODEL, "max_tokens": 10, "temperature": 0, "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "system", "content": format!(
                "Known about the user:\n- lives in Lisbon\n- keeps bees\n\n\
                 Notes for the current task (trip):\n{pad}")},
            {"role": "user", "content": "Where do I live?"}]});
        let (_, _, expected) = ask(&alice, by_hand).await;
        assert_eq!(prompt_tokens(&with), prompt_tokens(&expected));
        assert_eq!(text(&with), text(&expected));

        // Budgets: none for facts leaves them out; someone else's memory never goes in.
        let no_facts = json!({"memory": true, "memory_tokens": 0, "working_memory": "trip"});
        let (_, memory, _) = ask(&alice, chat("Be brief.", "Where do I live?", no_facts)).await;
        assert_eq!(memory, "working=trip");
        let (_, memory, theirs) = ask(
            &bob,
            chat(
                "Be brief.",
                "Where do I live?",
                json!({"memory": true, "working_memory": "trip"}),
            ),
        )
        .await;
        let (_, _, bare) = ask(&bob, chat("Be brief.", "Where do I live?", json!({}))).await;
        assert_eq!(
            (memory.as_str(), prompt_tokens(&theirs)),
            ("", prompt_tokens(&bare))
        );

        // An expired scratchpad is an empty one.
        let owner = Owner {
            tenant: "acme".into(),
            user: "alice".into(),
        };
        store.set_working(&owner, "old", "stale", -1).await.unwrap();
        let (status, memory, _) = ask(
            &alice,
            chat("Be brief.", "Hi", json!({"working_memory": "old"})),
        )
        .await;
        assert_eq!((status, memory.as_str()), (200, ""));
        assert_eq!(alice.get("/v1/memory/working/old").await.0, 404);

        // Bad input is refused, naming the field.
        for (osprey, param) in [
            (json!({"memory": "yes"}), "osprey.memory"),
            (json!({"working_memory": 5}), "osprey.working_memory"),
            (json!({"memory_tokens": -1}), "osprey.memory_tokens"),
        ] {
            let (status, _, e) = ask(&alice, chat("Be brief.", "Hi", osprey)).await;
            assert_eq!(
                (status, e["error"]["param"].as_str()),
                (400, Some(param)),
                "{e}"
            );
        }
        let (status, e) = alice
            .post("/v1/memory/facts", json!({"content": " "}))
            .await;
        assert_eq!(
            (status, e["error"]["param"].as_str()),
            (400, Some("content"))
        );
        let put =
            |path: &'static str, body: Value| alice.send(reqwest::Method::PUT, path, Some(body));
        let (status, e) = put("/v1/memory/working/a%20b", json!({"content": "x"})).await;
        assert_eq!((status, e["error"]["param"].as_str()), (400, Some("name")));
        let (status, e) = put(
            "/v1/memory/working/ok",
            json!({"content": "x", "ttl_seconds": 0}),
        )
        .await;
        assert_eq!(
            (status, e["error"]["param"].as_str()),
            (400, Some("ttl_seconds"))
        );

        assert_eq!(alice.delete(&bees_path).await.0, 200);
        let (_, memory, _) = ask(&alice, chat("Be brief.", "Hi", json!({"memory": true}))).await;
        assert_eq!(memory, "facts=1");
    }
}

#[tokio::test]
async fn older_turns_are_summarised_by_the_model_and_the_prompt_keeps_its_budgets() {
    for store in osprey_store::testing::stores().await {
        let key = common::new_key(&store, "acme").await;
        let base = gateway(store.store.clone(), ResponseCache::memory()).await;
        let alice = As {
            base: &base,
            key: &key,
            user: "alice",
        };
        let turns = [
            (
                "user",
                "My beekeeping club meets every Thursday evening in the old library hall.",
            ),
            (
                "assistant",
                "That sounds lovely. Thursday evenings in a library hall must be quiet.",
            ),
            (
                "user",
                "We have eleven hives this year, and the strongest colony is called Marigold.",
            ),
            (
                "assistant",
                "Eleven hives is a lot of work. Marigold must be a productive colony.",
            ),
            (
                "user",
                "Next spring we want to sell honey at the farmers market near the river.",
            ),
            (
                "assistant",
                "Selling at the farmers market is a good way to meet local customers.",
            ),
        ];
        let items: Vec<Value> = (turns.iter())
            .map(|(r, c)| json!({"role": r, "content": c}))
            .collect();
        let (_, c) = alice
            .post("/v1/conversations", json!({"items": items}))
            .await;
        let id = c["id"].as_str().unwrap().to_owned();
        let owner = Owner {
            tenant: "acme".into(),
            user: "alice".into(),
        };
        let (history, summary) = (100, 48);
        let session =
            json!({"conversation": id, "history_tokens": history, "summary_tokens": summary});
        let (_, _, bare) = ask(
            &alice,
            chat("Be brief.", "What is my colony called?", json!({})),
        )
        .await;
        let (status, memory, first) = ask(
            &alice,
            chat("Be brief.", "What is my colony called?", session.clone()),
        )
        .await;
        assert_eq!(status, 200, "{first}");
        // About 20 tokens a turn: 6 turns are over 100, so the older ones were folded into a
        // summary written by the model, and the newest that fit half the budget stayed.
        let made = store
            .summary(&owner, &id)
            .await
            .unwrap()
            .expect("a summary");
        assert!(!made.content.trim().is_empty());
        assert!(memory.starts_with("summary="), "{memory}");
        let kept: usize = memory.rsplit("history=").next().unwrap().parse().unwrap();
        assert!((1..6).contains(&kept), "{memory}");
        let added = prompt_tokens(&first) - prompt_tokens(&bare);
        assert!(
            added <= (history + summary + 8) as u64,
            "the history and its summary stay within their budgets: {added} tokens added"
        );

        // The next turn fits beside the kept ones: no new summary.
        ask(&alice, chat("Be brief.", "Thanks.", session.clone())).await;
        let again = store.summary(&owner, &id).await.unwrap().unwrap();
        assert_eq!(again.through_seq, made.through_seq);

        // No summary budget: nothing is folded, the newest turns that fit go in.
        let plain = json!({"conversation": id, "history_tokens": history, "summary_tokens": 0});
        let (_, memory, _) = ask(&alice, chat("Be brief.", "Hi", plain)).await;
        assert!(memory.starts_with("history="), "{memory}");

        // Deleting an item drops the summary, which may tell of it.
        let (_, page) = alice
            .get(&format!("/v1/conversations/{id}/items?order=asc&limit=1"))
            .await;
        let first_item = page["data"][0]["id"].as_str().unwrap();
        alice
            .delete(&format!("/v1/conversations/{id}/items/{first_item}"))
            .await;
        assert_eq!(store.summary(&owner, &id).await.unwrap(), None);
    }
}

#[tokio::test]
async fn facts_are_extracted_from_what_users_say_when_the_tenant_enables_it() {
    let store = osprey_store::testing::sqlite().await;
    let key = common::new_key(&store, "acme").await;
    let base = gateway(store.store.clone(), ResponseCache::memory()).await;
    let alice = As {
        base: &base,
        key: &key,
        user: "alice",
    };
    let anonymous = As { user: "", ..alice };
    let said = "Hello! I am a beekeeper and I live in Oslo. What should I plant?";
    ask(&alice, chat("Be brief.", said, json!({}))).await;
    let (_, none) = alice.get("/v1/memory/facts").await;
    assert_eq!(none["data"], json!([]), "off unless the tenant enables it");

    for flag in ["memory.extract", "memory"] {
        let path = format!("/admin/flags/acme/{flag}");
        admin(
            &base,
            reqwest::Method::PUT,
            &path,
            Some(json!({"value": true})),
        )
        .await;
    }
    // Flags are read again at most once a second: until then, what is said is not looked at.
    let mut facts: Vec<(String, String)> = osprey_testkit::eventually(
        || async {
            ask(&alice, chat("Be brief.", said, json!({"memory": false}))).await;
            let (_, list) = alice.get("/v1/memory/facts").await;
            let facts: Vec<_> = (list["data"].as_array().unwrap().iter())
                .map(|f| {
                    (
                        f["content"].as_str().unwrap().to_owned(),
                        f["source"].as_str().unwrap().to_owned(),
                    )
                })
                .collect();
            (!facts.is_empty()).then_some(facts)
        },
        std::time::Duration::from_secs(30),
    )
    .await;
    facts.sort();
    assert_eq!(
        facts,
        [
            ("is a beekeeper".to_owned(), "extracted".to_owned()),
            ("lives in Oslo".to_owned(), "extracted".to_owned())
        ]
    );
    // With the `memory` flag the facts go into every chat of the tenant's users.
    let (_, memory, _) = ask(&alice, chat("Be brief.", "What should I plant?", json!({}))).await;
    assert_eq!(memory, "facts=2");
    // The anonymous user is many people: nothing is kept for it.
    ask(&anonymous, chat("Be brief.", "I live in Rome.", json!({}))).await;
    assert_eq!(anonymous.get("/v1/memory/facts").await.1["data"], json!([]));
}

#[tokio::test]
async fn the_request_log_names_the_prompt_version_and_what_went_in() {
    for store in osprey_store::testing::stores().await {
        let key = common::new_key(&store, "acme").await;
        let base = gateway(store.store.clone(), ResponseCache::memory()).await;
        let alice = As {
            base: &base,
            key: &key,
            user: "alice",
        };
        let toml = "[[messages]]\nrole = \"system\"\ncontent = \"You help with {{ topic }}.\"\n";
        store.push_prompt("helper", toml).await.unwrap();
        let (_, fact) = alice
            .post("/v1/memory/facts", json!({"content": "keeps bees"}))
            .await;
        let (_, c) = alice.post("/v1/conversations", json!({})).await;
        let body = json!({"model": MODEL, "max_tokens": 4, "temperature": 0,
            "messages": [{"role": "user", "content": "Hi"}],
            "osprey": {"prompt": {"name": "helper", "variables": {"topic": "bees"}},
                       "memory": true, "conversation": c["id"]}});
        let (status, _, _) = ask(&alice, body).await;
        assert_eq!(status, 200);
        // Rows are written off the request's path: wait for ours.
        let rows = osprey_testkit::eventually(
            || async {
                let rows = admin(
                    &base,
                    reqwest::Method::GET,
                    "/admin/requests?user=alice",
                    None,
                )
                .await;
                (!rows["data"].as_array().unwrap().is_empty()).then_some(rows)
            },
            std::time::Duration::from_secs(30),
        )
        .await;
        let row = &rows["data"][0];
        assert_eq!(
            row["prompt"],
            json!({"name": "helper", "version": 1}),
            "{rows}"
        );
        assert_eq!(
            (&row["tenant"], &row["status"], &row["conversation"]),
            (&json!("acme"), &json!(200), &c["id"])
        );
        assert_eq!(row["injected"]["facts"], json!([fact["id"]]));
        assert!(row["id"].as_str().unwrap().starts_with("req_"));
        let by_prompt = admin(
            &base,
            reqwest::Method::GET,
            "/admin/requests?prompt=nothing",
            None,
        )
        .await;
        assert_eq!(by_prompt["data"], json!([]));
    }
}

/// A request the engine speculated on says what it drafted: in its usage (OpenAI's
/// `completion_tokens_details`), in its request-log row and in the engine's counters.
#[tokio::test]
async fn a_speculated_answer_reports_its_drafts_in_usage_the_request_log_and_metrics() {
    let store = osprey_store::testing::stores().await.remove(0);
    let key = common::new_key(&store, "acme").await;
    let base = gateway(store.store.clone(), ResponseCache::memory()).await;
    let bob = As {
        base: &base,
        key: &key,
        user: "bob",
    };
    let passage = "Every morning the ferry left the north quay at seven, carried forty \
        passengers across the bay, and came back at noon with the post and the bread.";
    let body = json!({"model": MODEL, "max_tokens": 60, "temperature": 0,
        "messages": [{"role": "user", "content": format!("Repeat exactly: {passage}")}]});
    let (status, _, answer) = ask(&bob, body).await;
    assert_eq!(status, 200, "{answer}");
    let details = &answer["usage"]["completion_tokens_details"];
    let accepted = details["accepted_prediction_tokens"].as_u64().unwrap();
    let rejected = details["rejected_prediction_tokens"].as_u64().unwrap();
    assert!(accepted > 10, "{answer}");
    let rows = osprey_testkit::eventually(
        || async {
            let rows = admin(
                &base,
                reqwest::Method::GET,
                "/admin/requests?user=bob",
                None,
            )
            .await;
            (!rows["data"].as_array().unwrap().is_empty()).then_some(rows)
        },
        std::time::Duration::from_secs(30),
    )
    .await;
    assert_eq!(
        rows["data"][0]["detail"]["speculation"],
        json!({"drafted": accepted + rejected, "accepted": accepted}),
        "{rows}"
    );
    let metrics = reqwest::get(format!("{base}/metrics")).await.unwrap();
    let metrics = metrics.text().await.unwrap();
    for name in [
        "osprey_spec_draft_tokens_total",
        "osprey_spec_accepted_tokens_total",
        "osprey_spec_accepted_length_bucket",
    ] {
        assert!(metrics.contains(name), "{name} missing from /metrics");
    }
}

#[tokio::test]
async fn deleting_a_user_forgets_everything_of_theirs_and_their_cached_answers() {
    let mut caches = vec![("memory", ResponseCache::memory())];
    if let Some(url) = common::redis_url("deleting a user (Redis cache)") {
        caches.push((
            "redis",
            ResponseCache::redis(SharedRedis::open(&url).unwrap()),
        ));
    }
    for (name, cache) in caches {
        let store = osprey_store::testing::sqlite().await;
        // A tenant of its own per run, so runs sharing one Redis never share answers.
        let tenant = common::unique("acme");
        let key = common::new_key(&store, &tenant).await;
        let base = gateway(store.store.clone(), cache).await;
        let alice = As {
            base: &base,
            key: &key,
            user: "alice",
        };
        let bob = As {
            user: "bob",
            ..alice
        };
        for who in [&alice, &bob] {
            who.post("/v1/memory/facts", json!({"content": "keeps bees"}))
                .await;
            who.post(
                "/v1/conversations",
                json!({"items": [{"role": "user", "content": "hi"}]}),
            )
            .await;
        }
        let personal = || chat("Be brief.", "What do I keep?", json!({"memory": true}));
        let cached = async |who: &As<'_>| {
            let r = reqwest::Client::new()
                .post(format!("{base}/v1/chat/completions"))
                .bearer_auth(&key)
                .header("x-osprey-user", who.user)
                .json(&personal())
                .send()
                .await
                .unwrap();
            r.headers()["x-osprey-cache"].to_str().unwrap().to_owned()
        };
        assert_eq!(cached(&alice).await, "miss", "{name}");
        assert_eq!(cached(&alice).await, "hit", "{name}");
        assert_eq!(
            cached(&bob).await,
            "miss",
            "{name}: a user's answers are theirs"
        );

        let path = format!("/admin/tenants/{tenant}/users/alice");
        let gone = admin(&base, reqwest::Method::DELETE, &path, None).await;
        let deleted = &gone["deleted"];
        assert_eq!(
            (
                &deleted["conversations"],
                &deleted["facts"],
                &deleted["cached_answers"]
            ),
            (&json!(1), &json!(1), &json!(1)),
            "{name}: {gone}"
        );
        assert_eq!(alice.get("/v1/memory/facts").await.1["data"], json!([]));
        // The same fact again makes the same prompt: the answer kept before is gone.
        alice
            .post("/v1/memory/facts", json!({"content": "keeps bees"}))
            .await;
        assert_eq!(cached(&alice).await, "miss", "{name}");
        assert_eq!(cached(&bob).await, "hit", "{name}: bob's answer stays");
        assert_eq!(
            bob.get("/v1/memory/facts").await.1["data"]
                .as_array()
                .unwrap()
                .len(),
            1
        );
    }
}
