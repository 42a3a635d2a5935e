//! Tenant isolation and secrets, surface by surface: with one gateway and two tenants (`acme`
//! and `globex`, the same user name in each), globex can neither read, change, use nor infer
//! acme's data (a refusal for acme's id reads exactly as one for an id that never existed);
//! tenant keys never open the admin API; key secrets are never stored. (Secrets in logs and the
//! bounds on bodies and headers: `secrets.rs`.)
//!
//! Where each surface is proven (tests elsewhere are not repeated here):
//!
//! | surface | test |
//! |---|---|
//! | conversation read, list, append, delete | `conversations.rs` `a_conversation_is_its_users_alone` |
//! | conversation update, one item, item cursor, chat in it | here: `conversations_and_memory_are_out_of_another_tenants_reach` |
//! | another user's conversation in a chat (same tenant) | `conversations.rs` `a_chat_in_a_conversation_sees_its_history_and_keeps_its_turn` |
//! | facts (list, delete), scratchpad (read) | `memory.rs` `facts_and_scratchpads_are_their_users_alone_and_go_in_as_built` |
//! | scratchpad list and overwrite, memory in another tenant's chat | here: `conversations_and_memory_are_out_of_another_tenants_reach` |
//! | a user's cached answers forgotten with them | `memory.rs` `deleting_a_user_forgets_everything_of_theirs_and_their_cached_answers` |
//! | collection search (ACL groups, other tenant 404) | `rag.rs` `documents_are_ingested_searched_and_hidden_by_acl` |
//! | `file_search` tool across tenants | `agents.rs` `file_search_reads_only_what_the_caller_may_see` |
//! | collection list, chunk counts, documents, jobs, deletes, RAG chat citations | here: `collections_files_and_batches_are_out_of_another_tenants_reach` |
//! | files, file content, batches (read, list, cancel, create from another's file) | here: `collections_files_and_batches_are_out_of_another_tenants_reach` |
//! | stored responses: read, list | `agents.rs` `agents_run_real_tools_under_budgets_scopes_and_approvals`, `client_functions_continue_with_previous_response_id_and_runs_replay` |
//! | stored responses: steps, replay, cancel, approve, reject, `previous_response_id` | here: `stored_responses_are_out_of_another_tenants_reach` |
//! | exact and semantic cache, idempotent replays | here: `cached_answers_are_never_served_to_another_tenant` (the flag's own gating: `semantic_cache.rs`) |
//! | KV prefix blocks in the engine's hot cache | here: `another_tenant_never_reuses_a_kv_prefix` |
//! | KV prefix blocks from the warm and cold tiers | `osprey-engine/tests/tiers.rs` `tenants_never_reuse_each_others_blocks_from_a_tier` |
//! | prefix hashes salted per tenant | `osprey-engine/src/kv/prefix_cache.rs` `hashes_chain_and_salt` |
//! | prompts, request log, flags, audit, runs, users, keys (admin-only) | here: `tenant_keys_never_open_the_admin_api`; a wrong admin key: `edge.rs` `the_admin_api_needs_the_admin_key` |
//! | keys stored as SHA-256 (SQLite file bytes) | `osprey-store/src/keys.rs` `keys_are_stored_as_hashes_and_found_by_secret` |
//! | keys made through the admin API and used, on each backend | here: `the_store_never_holds_a_key_secret` |
//! | secrets in logs and traces | `secrets.rs` `secrets_never_reach_the_logs` |
//! | body and header bounds | `secrets.rs` `bodies_and_headers_are_bounded`; generation routes' 413: `api.rs` `bad_input_gets_a_clear_error_and_the_server_keeps_serving`, `edge.rs` |

use std::time::Duration;

use osprey_gateway::{Services, Wiring};
use osprey_limits::RateLimiter;
use osprey_services::auth::Authenticator;
use osprey_services::cache::ResponseCache;
use osprey_services::config::EdgeConfig;
use osprey_services::edge::Edge;
use osprey_store::Store;
use reqwest::Method;
use serde_json::{Value, json};

use crate::common::{self, As};

const MODEL: &str = "smollm2-135m-instruct";
const ADMIN: &str = "admin-secret-of-the-operator";
const ACME: &str = "acme";
const GLOBEX: &str = "globex";
/// What acme says: it must never show up in anything globex gets.
const SECRET: &str = "Project Kestrel: acme buys the Lyon foundry for 40 million euros.";

/// A gateway on the shared engine with the admin API, a library, a response cache, and a key of
/// each tenant.
struct World {
    base: String,
    /// acme's key.
    a: String,
    /// globex's key.
    b: String,
    _library: tempfile::TempDir,
}

async fn world(store: &Store) -> World {
    let a = common::new_key(store, ACME).await;
    let b = common::new_key(store, GLOBEX).await;
    let auth = Authenticator::new(store.clone()).await.unwrap();
    auth.spawn_refresh_task(); // writes keys' last use
    let config = EdgeConfig {
        admin_key: Some(ADMIN.into()),
        ..EdgeConfig::default()
    };
    let library = tempfile::tempdir().unwrap();
    let edge = Edge::new(config, auth, RateLimiter::local());
    let state = Services::new(Wiring {
        store: Some(store.clone()),
        library: osprey_rag::Library::new(library.path().to_owned()),
        response_cache: Some(ResponseCache::memory()),
        ..Wiring::new(Some(MODEL.into()), vec![], edge)
    });
    state.set_engine(osprey_testkit::shared_engine());
    World {
        base: common::serve(state).await,
        a,
        b,
        _library: library,
    }
}

/// `id` with its last character changed: an id of the same shape that never existed.
fn never_existed(id: &str) -> String {
    let last = if id.ends_with('0') { '1' } else { '0' };
    format!("{}{last}", &id[..id.len() - 1])
}

/// Asserts that what `who` gets for `path` (naming someone else's `id`) is a 404 (or `status`)
/// that reads exactly as the answer for an id that never existed, so nothing can be inferred.
async fn refused_as_if_missing(
    who: &As<'_>,
    method: Method,
    path: &str,
    id: &str,
    body: Option<Value>,
    status: u16,
) {
    let fake = never_existed(id);
    let faked =
        (body.as_ref()).map(|b| serde_json::from_str(&b.to_string().replace(id, &fake)).unwrap());
    let (got, theirs) = who.send(method.clone(), path, body).await;
    let (got_missing, missing) = who.send(method, &path.replace(id, &fake), faked).await;
    assert_eq!((got, got_missing), (status, status), "{path}: {theirs}");
    assert_eq!(
        theirs.to_string().replace(id, &fake),
        missing.to_string(),
        "{path}: the refusal says the id exists"
    );
    assert!(!theirs.to_string().contains("Kestrel"), "{path}: {theirs}");
}

/// A chat as `who`: its status, `x-osprey-memory` and `x-osprey-rag` headers, and body.
async fn chat(who: &As<'_>, body: Value) -> (u16, String, String, Value) {
    let r = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", who.base))
        .bearer_auth(who.key)
        .header("x-osprey-user", who.user)
        .json(&body)
        .send()
        .await
        .unwrap();
    let header = |name: &str| {
        (r.headers().get(name))
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default()
    };
    let (memory, rag) = (header("x-osprey-memory"), header("x-osprey-rag"));
    (r.status().as_u16(), memory, rag, r.json().await.unwrap())
}

fn question(text: &str, osprey: Value) -> Value {
    json!({"model": MODEL, "max_tokens": 4, "temperature": 0, "osprey": osprey,
           "messages": [{"role": "user", "content": text}]})
}

/// Writes `who`'s scratchpad `deal`.
async fn put_pad(who: &As<'_>, content: &str) -> (u16, Value) {
    let body = json!({"content": content, "ttl_seconds": 600});
    (who.send(Method::PUT, "/v1/memory/working/deal", Some(body))).await
}

#[tokio::test]
async fn conversations_and_memory_are_out_of_another_tenants_reach() {
    for store in osprey_store::testing::stores().await {
        let w = world(&store).await;
        let alice = As {
            base: &w.base,
            key: &w.a,
            user: "alice",
        };
        // The same user name, in the other tenant.
        let mallory = As { key: &w.b, ..alice };
        let (status, c) = alice
            .post(
                "/v1/conversations",
                json!({"metadata": {"topic": "merger"}, "items": [{"role": "user", "content": SECRET}]}),
            )
            .await;
        assert_eq!(status, 200, "{c}");
        let id = c["id"].as_str().unwrap().to_owned();
        let path = format!("/v1/conversations/{id}");
        let (_, items) = alice.get(&format!("{path}/items")).await;
        let item = items["data"][0]["id"].as_str().unwrap().to_owned();

        let update = json!({"metadata": {"topic": "mine now"}});
        refused_as_if_missing(&mallory, Method::POST, &path, &id, Some(update), 404).await;
        let one = format!("{path}/items/{item}");
        for method in [Method::GET, Method::DELETE] {
            refused_as_if_missing(&mallory, method, &one, &id, None, 404).await;
        }
        let (status, _, _, e) = chat(
            &mallory,
            question("What did I say?", json!({"conversation": id})),
        )
        .await;
        assert_eq!(
            (status, e["error"]["code"].as_str()),
            (404, Some("not_found")),
            "{e}"
        );
        // Alice's item id within mallory's own conversation, as the item or as a cursor.
        let (_, own) = mallory
            .post(
                "/v1/conversations",
                json!({"items": [{"role": "user", "content": "hi"}]}),
            )
            .await;
        let own = format!("/v1/conversations/{}", own["id"].as_str().unwrap());
        assert_eq!(mallory.get(&format!("{own}/items/{item}")).await.0, 404);
        let (_, page) = mallory.get(&format!("{own}/items?after={item}")).await;
        assert!(!page.to_string().contains("Kestrel"), "{page}");
        let (_, c) = alice.get(&path).await;
        assert_eq!(c["metadata"], json!({"topic": "merger"}), "unchanged");
        assert_eq!(
            alice.texts(&id).await,
            [SECRET],
            "nothing appended or deleted"
        );

        // Memory: mallory lists no scratchpad of alice's, and a chat asking for memory gets none.
        let (status, _) = alice
            .post("/v1/memory/facts", json!({"content": SECRET}))
            .await;
        assert_eq!(status, 200);
        assert_eq!(put_pad(&alice, SECRET).await.0, 200);
        let (_, pads) = mallory.get("/v1/memory/working").await;
        assert_eq!(pads["data"], json!([]), "{pads}");
        let wants = json!({"memory": true, "working_memory": "deal"});
        let (status, memory, _, with) = chat(&mallory, question("Who buys what?", wants)).await;
        let (_, _, _, bare) = chat(&mallory, question("Who buys what?", json!({}))).await;
        assert_eq!(status, 200, "{with}");
        assert_eq!(memory, "", "nothing of alice's went in");
        assert_eq!(
            with["usage"]["prompt_tokens"],
            bare["usage"]["prompt_tokens"]
        );
        // A scratchpad of the same name is mallory's own: writing or deleting it leaves alice's.
        assert_eq!(put_pad(&mallory, "picnic plans").await.0, 200);
        assert_eq!(mallory.delete("/v1/memory/working/deal").await.0, 200);
        let (status, pad) = alice.get("/v1/memory/working/deal").await;
        assert_eq!(
            (status, pad["content"].as_str()),
            (200, Some(SECRET)),
            "{pad}"
        );
        let (_, facts) = alice.get("/v1/memory/facts").await;
        let fact = facts["data"][0]["id"].as_str().unwrap().to_owned();
        let fact_path = format!("/v1/memory/facts/{fact}");
        refused_as_if_missing(&mallory, Method::DELETE, &fact_path, &fact, None, 404).await;
    }
}

/// Posts documents to `collection` as `who` and waits for the job; the job's id.
async fn ingest(who: &As<'_>, collection: &str, documents: Value) -> String {
    let path = format!("/v1/collections/{collection}/documents");
    let (status, job) = who.post(&path, json!({"documents": documents})).await;
    assert_eq!(status, 202, "{job}");
    let id = job["id"].as_str().unwrap().to_owned();
    let path = format!("/v1/collections/{collection}/jobs/{id}");
    osprey_testkit::eventually(
        || async {
            let (_, job) = who.get(&path).await;
            match job["status"].as_str().unwrap() {
                "succeeded" => Some(()),
                "failed" => panic!("ingest failed: {job}"),
                _ => None,
            }
        },
        Duration::from_secs(60),
    )
    .await;
    id
}

/// The collections `who` lists: (name, chunks).
async fn collections(who: &As<'_>) -> Vec<(String, u64)> {
    let (status, list) = who.get("/v1/collections").await;
    assert_eq!(status, 200, "{list}");
    (list["data"].as_array().unwrap().iter())
        .map(|c| {
            (
                c["id"].as_str().unwrap().to_owned(),
                c["chunks"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// The document ids a search of `collection` finds for `who`.
async fn found(who: &As<'_>, collection: &str, query: &str) -> Vec<String> {
    let path = format!("/v1/collections/{collection}/search");
    let (status, hits) = who.post(&path, json!({"query": query, "top_k": 10})).await;
    assert_eq!(status, 200, "{hits}");
    (hits["data"].as_array().unwrap().iter())
        .map(|h| h["document_id"].as_str().unwrap().to_owned())
        .collect()
}

/// Uploads a batch input file as `who`; its id.
async fn upload(who: &As<'_>, content: &str) -> String {
    let boundary = "osprey-boundary";
    let body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n\
         --{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\n\
         Content-Type: application/jsonl\r\n\r\n{content}\r\n--{boundary}--\r\n"
    );
    let r = reqwest::Client::new()
        .post(format!("{}/v1/files", who.base))
        .bearer_auth(who.key)
        .header(
            "content-type",
            format!("multipart/form-data; boundary={boundary}"),
        )
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let file: Value = r.json().await.unwrap();
    file["id"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn collections_files_and_batches_are_out_of_another_tenants_reach() {
    let store = osprey_store::testing::sqlite().await;
    let w = world(&store).await;
    let acme = As {
        base: &w.base,
        key: &w.a,
        user: "",
    };
    let globex = As { key: &w.b, ..acme };
    let job = ingest(&acme, "handbook", json!([
        {"id": "merger", "title": "Merger", "text": SECRET},
        {"id": "refunds", "title": "Refunds", "text": "Refunds are paid within 14 days of the returned item arriving."},
    ]))
    .await;
    let acme_collections = collections(&acme).await;
    assert_eq!(acme_collections.len(), 1);
    assert_eq!(collections(&globex).await, [], "not even its name");
    let c = "/v1/collections/handbook";
    for (method, path, body) in [
        (Method::GET, format!("{c}/documents"), None),
        (Method::GET, format!("{c}/jobs/{job}"), None),
        (
            Method::POST,
            format!("{c}/search"),
            Some(json!({"query": "foundry"})),
        ),
        (Method::DELETE, format!("{c}/documents/merger"), None),
        (Method::DELETE, c.to_owned(), None),
    ] {
        refused_as_if_missing(&globex, method, &path, "handbook", body, 404).await;
    }
    let rag = |q: &str| question(q, json!({"rag": {"collection": "handbook", "top_k": 5}}));
    let (status, _, _, e) = chat(&globex, rag("Who buys the Lyon foundry?")).await;
    assert_eq!(status, 404, "{e}");

    // Globex's own collection of the same name: its counts, results and citations are its own.
    ingest(&globex, "handbook", json!([
        {"id": "picnic", "title": "Picnic", "text": "The globex picnic is on the first Friday of June, by the Lyon river."},
    ]))
    .await;
    let one_chunk = vec![("handbook".to_owned(), 1)];
    assert_eq!(
        collections(&globex).await,
        one_chunk,
        "its own chunks alone"
    );
    assert_eq!(
        collections(&acme).await,
        acme_collections,
        "acme's count unchanged"
    );
    assert_eq!(
        found(&globex, "handbook", "Lyon foundry merger").await,
        ["picnic"]
    );
    assert!(
        !found(&acme, "handbook", "Lyon picnic")
            .await
            .contains(&"picnic".to_owned())
    );
    let (status, _, said, answer) = chat(&globex, rag("Who buys the Lyon foundry?")).await;
    assert_eq!(
        (status, said.as_str()),
        (200, "passages=1; dropped=0"),
        "{answer}"
    );
    let cited: Vec<&str> = (answer["osprey"]["citations"].as_array().unwrap().iter())
        .map(|c| c["document_id"].as_str().unwrap())
        .collect();
    assert_eq!(cited, ["picnic"], "{answer}");
    assert!(!answer.to_string().contains("Kestrel"));

    // Files and batches.
    let line = json!({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
        "body": {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": SECRET}]}});
    let file = upload(&acme, &line.to_string()).await;
    for path in [
        format!("/v1/files/{file}"),
        format!("/v1/files/{file}/content"),
    ] {
        refused_as_if_missing(&globex, Method::GET, &path, &file, None, 404).await;
    }
    let create = |file: &str| json!({"input_file_id": file, "endpoint": "/v1/chat/completions", "completion_window": "24h"});
    let from_theirs = Some(create(&file));
    refused_as_if_missing(
        &globex,
        Method::POST,
        "/v1/batches",
        &file,
        from_theirs,
        400,
    )
    .await;
    let (status, batch) = acme.post("/v1/batches", create(&file)).await;
    assert_eq!(status, 200, "{batch}");
    let id = batch["id"].as_str().unwrap().to_owned();
    let done = osprey_testkit::eventually(
        || async {
            let batch = acme.get(&format!("/v1/batches/{id}")).await.1;
            assert_ne!(batch["status"], "failed", "{batch}");
            (batch["status"] == "completed").then_some(batch)
        },
        Duration::from_secs(60),
    )
    .await;
    let output = done["output_file_id"].as_str().unwrap();
    let at = format!("/v1/files/{output}/content");
    refused_as_if_missing(&globex, Method::GET, &at, output, None, 404).await;
    refused_as_if_missing(
        &globex,
        Method::GET,
        &format!("/v1/batches/{id}"),
        &id,
        None,
        404,
    )
    .await;
    let cancel = format!("/v1/batches/{id}/cancel");
    refused_as_if_missing(&globex, Method::POST, &cancel, &id, None, 404).await;
    let (_, listed) = globex.get("/v1/batches").await;
    assert_eq!(listed["data"], json!([]), "{listed}");
}

#[tokio::test]
async fn stored_responses_are_out_of_another_tenants_reach() {
    let store = osprey_store::testing::sqlite().await;
    let w = world(&store).await;
    let alice = As {
        base: &w.base,
        key: &w.a,
        user: "alice",
    };
    let mallory = As { key: &w.b, ..alice };
    let ask = json!({"model": MODEL, "input": SECRET, "max_output_tokens": 4});
    let (status, r) = alice.post("/v1/responses", ask).await;
    assert_eq!(status, 200, "{r}");
    let id = r["id"].as_str().unwrap().to_owned();
    let p = format!("/v1/responses/{id}");
    for (method, path) in [
        (Method::GET, format!("{p}/steps")),
        (Method::POST, format!("{p}/replay")),
        (Method::POST, format!("{p}/cancel")),
        (Method::POST, format!("{p}/approve")),
        (Method::POST, format!("{p}/reject")),
    ] {
        refused_as_if_missing(&mallory, method, &path, &id, None, 404).await;
    }
    let go_on = json!({"model": MODEL, "input": "Repeat what I said.", "previous_response_id": id});
    refused_as_if_missing(
        &mallory,
        Method::POST,
        "/v1/responses",
        &id,
        Some(go_on),
        404,
    )
    .await;
    let (_, listed) = mallory.get("/v1/responses").await;
    assert_eq!(listed["data"], json!([]), "{listed}");
    let (status, kept) = alice.get(&p).await;
    assert_eq!((status, &kept["status"]), (200, &r["status"]), "untouched");
    let (_, listed) = alice.get("/v1/responses").await;
    assert_eq!(
        listed["data"].as_array().unwrap().len(),
        1,
        "no replay was made"
    );
}

/// A chat as `key`: its `x-osprey-cache` and `x-osprey-cache-similarity` headers and body.
async fn ask_cached(
    base: &str,
    key: &str,
    body: &Value,
    idempotency: Option<&str>,
) -> (Option<String>, Option<String>, Value) {
    let mut req = reqwest::Client::new()
        .post(format!("{base}/v1/chat/completions"))
        .bearer_auth(key)
        .json(body);
    if let Some(k) = idempotency {
        req = req.header("idempotency-key", k);
    }
    let r = req.send().await.unwrap();
    assert_eq!(r.status(), 200);
    let header = |name: &str| (r.headers().get(name)).map(|v| v.to_str().unwrap().to_owned());
    let (cache, similarity) = (
        header("x-osprey-cache"),
        header("x-osprey-cache-similarity"),
    );
    (cache, similarity, r.json().await.unwrap())
}

#[tokio::test]
async fn cached_answers_are_never_served_to_another_tenant() {
    let store = osprey_store::testing::sqlite().await;
    // Both tenants have the semantic cache on: only its scope keeps them apart.
    for tenant in [ACME, GLOBEX] {
        store
            .set_flag(tenant, "cache.semantic", "true")
            .await
            .unwrap();
    }
    let w = world(&store).await;
    let q = json!({"model": MODEL, "max_tokens": 6, "temperature": 0,
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]});
    let (cache, _, first) = ask_cached(&w.base, &w.a, &q, None).await;
    assert_eq!(cache.as_deref(), Some("miss"));
    let (cache, _, again) = ask_cached(&w.base, &w.a, &q, None).await;
    assert_eq!(cache.as_deref(), Some("hit"), "acme's own answer is kept");
    assert_eq!(again["id"], first["id"]);
    // The same request, word for word (a similarity of 1 to the semantic cache): a miss.
    let (cache, similarity, theirs) = ask_cached(&w.base, &w.b, &q, None).await;
    assert_eq!((cache.as_deref(), similarity), (Some("miss"), None));
    assert_ne!(theirs["id"], first["id"]);
    let (cache, _, again) = ask_cached(&w.base, &w.b, &q, None).await;
    assert_eq!(cache.as_deref(), Some("hit"), "globex's own answer is kept");
    assert_eq!(again["id"], theirs["id"]);

    // An idempotent request (sampled, so never cached) named the same by both tenants.
    let mut sampled = q.clone();
    sampled["temperature"] = json!(0.9);
    let (_, _, first) = ask_cached(&w.base, &w.a, &sampled, Some("order-1")).await;
    let (_, _, again) = ask_cached(&w.base, &w.a, &sampled, Some("order-1")).await;
    assert_eq!(again["id"], first["id"], "acme's retry gets its answer");
    let (_, _, theirs) = ask_cached(&w.base, &w.b, &sampled, Some("order-1")).await;
    assert_ne!(theirs["id"], first["id"], "globex's does not");
}

#[tokio::test]
async fn another_tenant_never_reuses_a_kv_prefix() {
    let store = osprey_store::testing::sqlite().await;
    let a = common::new_key(&store, ACME).await;
    let b = common::new_key(&store, GLOBEX).await;
    let auth = Authenticator::new(store.store.clone()).await.unwrap();
    let edge = Edge::new(EdgeConfig::default(), auth, RateLimiter::local());
    // An engine of its own, so its prefix-cache counters count these requests alone.
    let engine = osprey_testkit::engine(osprey_engine::EngineConfig {
        kv_cache_bytes: 64 << 20,
        ..osprey_testkit::test_config()
    });
    let state = Services::new(Wiring::new(Some(MODEL.into()), vec![], edge));
    state.set_engine(engine.clone());
    let base = common::serve(state).await;
    // A prompt of several KV blocks; never served from the response cache.
    let prompt = format!(
        "{SECRET} {}",
        "The foundry casts bells and anchors. ".repeat(20)
    );
    let body = json!({"model": MODEL, "max_tokens": 1, "temperature": 0, "osprey": {"cache": false},
        "messages": [{"role": "user", "content": prompt}]});
    let stats = engine.stats();
    let hits_after = async |key: &str| {
        let queried = stats.prefix_queried_tokens();
        let r = common::chat(&base, Some(key), body.clone()).await;
        assert_eq!(r.status(), 200);
        // The engine's counters are published after its step.
        osprey_testkit::eventually(
            || async { (stats.prefix_queried_tokens() > queried).then_some(()) },
            Duration::from_secs(30),
        )
        .await;
        stats.prefix_hit_tokens()
    };
    let cold = hits_after(&a).await;
    assert_eq!(hits_after(&b).await, cold, "globex reused acme's blocks");
    assert!(hits_after(&a).await > cold, "acme reuses its own");
    let warm = stats.prefix_hit_tokens();
    assert!(hits_after(&b).await > warm, "globex reuses its own");
}

#[tokio::test]
async fn tenant_keys_never_open_the_admin_api() {
    let store = osprey_store::testing::sqlite().await;
    let w = world(&store).await;
    // Something for the request log to hold (of a user the routes below do not delete).
    let bob = As {
        base: &w.base,
        key: &w.a,
        user: "bob",
    };
    let (status, _, _, _) = chat(&bob, question(SECRET, json!({}))).await;
    assert_eq!(status, 200);
    let routes = [
        (Method::GET, "/admin/keys"),
        (Method::POST, "/admin/keys"),
        (Method::DELETE, "/admin/keys/key_0"),
        (Method::GET, "/admin/audit"),
        (Method::GET, "/admin/flags"),
        (Method::PUT, "/admin/flags/acme/memory"),
        (Method::DELETE, "/admin/flags/acme/memory"),
        (Method::GET, "/admin/prompts"),
        (Method::GET, "/admin/prompts/support"),
        (Method::POST, "/admin/prompts/support"),
        (Method::GET, "/admin/prompts/support/versions/1"),
        (Method::GET, "/admin/prompts/support/diff"),
        (Method::PUT, "/admin/prompts/support/labels/prod"),
        (Method::POST, "/admin/prompts/support/labels/prod/rollback"),
        (Method::DELETE, "/admin/tenants/acme/users/alice"),
        (Method::GET, "/admin/requests"),
        (Method::GET, "/admin/requests/req_0"),
        (Method::GET, "/admin/runs"),
        (Method::GET, "/admin/runs/resp_0"),
        (Method::POST, "/admin/runs/resp_0/approve"),
        (Method::POST, "/admin/runs/resp_0/reject"),
        (Method::GET, "/admin/tool-audit"),
        (Method::GET, "/admin/scheduler"),
        (Method::PUT, "/admin/scheduler"),
        (Method::GET, "/admin/models"),
        (Method::POST, "/admin/playground"),
    ];
    let client = reqwest::Client::new();
    for (method, path) in routes {
        for (who, key) in [("acme", w.a.as_str()), ("globex", w.b.as_str())] {
            let r = (client.request(method.clone(), format!("{}{path}", w.base)))
                .bearer_auth(key)
                .header("api-key", key)
                .json(&json!({}))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 401, "{method} {path} with {who}'s key");
            let e: Value = r.json().await.unwrap();
            assert_eq!(e["error"]["code"], "invalid_api_key", "{e}");
        }
        // The route is there: the admin key reaches its handler.
        let r = (client.request(method.clone(), format!("{}{path}", w.base)))
            .bearer_auth(ADMIN)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let body = r.text().await.unwrap();
        assert!(
            status != 401 && status != 405 && !body.contains("There is no route"),
            "{method} {path}: {status} {body}"
        );
    }
    // The request log holds acme's request, for the operator alone.
    let log: Value = osprey_testkit::eventually(
        || async {
            let r = common::admin(
                &w.base,
                ADMIN,
                Method::GET,
                "/admin/requests?tenant=acme",
                None,
            );
            let log: Value = r.await.json().await.unwrap();
            log["data"]
                .as_array()
                .is_some_and(|d| !d.is_empty())
                .then_some(log)
        },
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(log["data"][0]["tenant"], ACME, "{log}");
}

#[tokio::test]
async fn the_store_never_holds_a_key_secret() {
    for store in osprey_store::testing::stores().await {
        let w = world(&store).await;
        let created = common::admin(
            &w.base,
            ADMIN,
            Method::POST,
            "/admin/keys",
            Some(json!({"tenant": ACME})),
        )
        .await;
        assert_eq!(created.status(), 201);
        let created: Value = created.json().await.unwrap();
        let secret = created["key"].as_str().unwrap().to_owned();
        let r = common::chat(&w.base, Some(&secret), question("Hi", json!({}))).await;
        assert_eq!(r.status(), 200, "the key works");
        // Its last use is written within a second or two.
        let id = created["id"].as_str().unwrap();
        let record = osprey_testkit::eventually(
            || async {
                let keys = store.list_keys().await.unwrap();
                keys.into_iter()
                    .find(|k| k.id == id && k.last_used_at.is_some())
            },
            Duration::from_secs(30),
        )
        .await;
        assert_eq!(record.hash, osprey_store::keys::hash_secret(&secret));
        assert!(!format!("{record:?}").contains(&secret[4..]), "{record:?}");
        let listed = common::admin(&w.base, ADMIN, Method::GET, "/admin/keys", None).await;
        assert!(!listed.text().await.unwrap().contains(&secret[4..]));
        // SQLite: not in any byte of the database, its WAL or its shared memory; the hash is.
        if let Some(dir) = &store.dir {
            let bytes: Vec<u8> = ["osprey.db", "osprey.db-wal", "osprey.db-shm"]
                .iter()
                .flat_map(|f| std::fs::read(dir.join(f)).unwrap_or_default())
                .collect();
            let holds = |needle: &[u8]| bytes.windows(needle.len()).any(|w| w == needle);
            assert!(holds(record.hash.as_bytes()), "the right files were read");
            assert!(!holds(&secret.as_bytes()[4..]), "the secret is on disk");
        }
    }
}
