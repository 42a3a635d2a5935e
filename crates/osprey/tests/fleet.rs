//! A gateway in front of two real `osprey worker` processes (`osprey serve --worker ...`):
//! requests go where their prompt is cached, and a worker killed with SIGKILL under load loses
//! no request that had not started answering. And in front of two plain OpenAI-compatible
//! servers (two `osprey serve`, which have no worker protocol): requests go where their prompt
//! was sent before.

use std::process::{Command, Stdio};
use std::time::Duration;

use futures_util::StreamExt;
use osprey_testkit::{Process, eventually};
use serde_json::{Value, json};

use crate::support::{STARTUP, ServerSlot};

const NAME: &str = "smollm2-135m-instruct";

/// `osprey ARGS`, killed when dropped.
fn start(args: &[&str]) -> Process {
    Process::spawn(
        Command::new(env!("CARGO_BIN_EXE_osprey"))
            .args(args)
            .stdout(Stdio::null()),
    )
}

struct Fleet {
    gateway: String,
    workers: Vec<String>,
    // Dropped last: the gateway first.
    _gateway: Process,
    worker_processes: Vec<Process>,
    _stores: Vec<Store>,
}

/// A SQLite store file, removed when dropped.
struct Store(std::path::PathBuf);

impl Store {
    fn new(port: &str) -> Self {
        Self(std::env::temp_dir().join(format!("osprey-fleet-{port}.db")))
    }

    fn url(&self) -> String {
        format!("sqlite://{}", self.0.display())
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Two workers and a gateway with `policy`, all ready.
async fn fleet(policy: &str) -> Fleet {
    fleet_of("worker", policy).await
}

/// Two workers started as `osprey <kind>` (`worker`, or `serve`: a plain OpenAI-compatible
/// server) and a gateway with `policy`, all ready.
async fn fleet_of(kind: &str, policy: &str) -> Fleet {
    let model = osprey_testkit::default_model();
    let model = model.to_str().expect("a UTF-8 path");
    let mut worker_processes = Vec::new();
    let mut workers = Vec::new();
    let mut stores = Vec::new();
    for _ in 0..2 {
        let port = osprey_testkit::free_port().to_string();
        let mut args = vec![kind, "--port", &port, "--model", model, "--threads", "1"];
        args.extend(["--kv-cache-memory", "128MiB", "--served-model-name", NAME]);
        let store = Store::new(&port);
        let store_url = store.url();
        if kind == "serve" {
            args.extend(["--store", &store_url]);
        }
        worker_processes.push(start(&args));
        workers.push(format!("http://127.0.0.1:{port}"));
        stores.push(store);
    }
    let port = osprey_testkit::free_port().to_string();
    let store = Store::new(&port);
    let store_url = store.url();
    stores.push(store);
    let mut args = vec![
        "serve", "--port", &port, "--model", model, "--store", &store_url,
    ];
    args.extend(["--routing-policy", policy, "--served-model-name", NAME]);
    for w in &workers {
        args.extend(["--worker", w]);
    }
    let gateway = start(&args);
    let fleet = Fleet {
        gateway: format!("http://127.0.0.1:{port}"),
        workers,
        _gateway: gateway,
        worker_processes,
        _stores: stores,
    };
    let (client, url) = (&reqwest::Client::new(), &format!("{}/ready", fleet.gateway));
    eventually(
        || async move {
            let ready: Value = client.get(url).send().await.ok()?.json().await.ok()?;
            let workers = ready["workers"].as_array()?;
            (workers.iter().filter(|w| w["live"] == true).count() == 2).then_some(())
        },
        STARTUP,
    )
    .await;
    fleet
}

fn chat(system: &str, question: &str, max_tokens: u32, stream: bool) -> Value {
    json!({
        "model": NAME,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": true,
        "stream": stream,
    })
}

/// A system prompt of a few hundred tokens, distinct per `topic`.
fn system_prompt(topic: &str) -> String {
    format!("You are the assistant of the {topic} desk. ").repeat(30)
}

/// Sends `body`; the answering worker and the response.
async fn send(
    client: &reqwest::Client,
    fleet: &Fleet,
    body: &Value,
) -> (String, reqwest::Response) {
    let r = client
        .post(format!("{}/v1/chat/completions", fleet.gateway))
        .json(body)
        .send()
        .await
        .expect("the gateway answers");
    let worker = r
        .headers()
        .get("x-osprey-worker")
        .map(|v| v.to_str().unwrap().to_owned());
    (worker.unwrap_or_default(), r)
}

async fn prefix_hits(client: &reqwest::Client, worker: &str) -> f64 {
    let url = format!("{worker}/metrics");
    (metric(client, &url, "osprey_prefix_cache_hit_tokens_total").await)
        .expect("the worker's metrics")
}

/// The sum of metric `name`'s series (all label values) in the Prometheus text at `url`;
/// `None` if it cannot be read.
async fn metric(client: &reqwest::Client, url: &str, name: &str) -> Option<f64> {
    let text = client.get(url).send().await.ok()?.text().await.ok()?;
    let values = text.lines().filter_map(|l| {
        let (series, value) = l.rsplit_once(' ')?;
        let metric = series.split('{').next()?;
        (metric == name)
            .then(|| value.parse::<f64>().ok())
            .flatten()
    });
    Some(values.sum())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_go_to_the_worker_holding_their_prompt() {
    let _slot = ServerSlot::take_async().await;
    let fleet = fleet("cache_aware").await;
    placement_follows_the_cache(&fleet).await;
    answers_are_the_workers_own(&fleet).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_upstreams_get_requests_where_they_were_sent_before() {
    let _slot = ServerSlot::take_async().await;
    let fleet = fleet_of("serve", "cache_aware").await;
    placement_follows_the_cache(&fleet).await;
    answers_are_the_workers_own(&fleet).await;
    // What the gateway sent is all it knows: counted as prompt blocks found cached.
    let text = reqwest::get(format!("{}/metrics", fleet.gateway))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let cached = text
        .lines()
        .find_map(|l| l.strip_prefix(r#"osprey_worker_prompt_blocks_total{cached="true"} "#))
        .map_or(0.0, |v| v.parse::<f64>().unwrap());
    assert!(cached > 0.0, "{text}");
}

/// What the gateway answers through a worker (read as typed events, written again) says what
/// the worker says when asked directly: every choice's text, log-probabilities and finish,
/// the usage, whole and streamed, and the worker's own errors.
async fn answers_are_the_workers_own(fleet: &Fleet) {
    let client = &reqwest::Client::new();
    let ask = |url: String, path: &'static str, body: Value| async move {
        let r = (client.post(format!("{url}/v1/{path}")).json(&body).send())
            .await
            .expect("an answer");
        let status = r.status().as_u16();
        (status, r.text().await.unwrap())
    };
    let chat = json!({"model": NAME, "messages": [{"role": "user", "content": "Name a colour."}],
        "max_tokens": 6, "temperature": 0, "n": 2, "logprobs": true, "top_logprobs": 2});
    let completion = json!({"model": NAME, "prompt": "The sky is", "max_tokens": 5,
        "temperature": 0, "logprobs": 2, "stream": true, "stream_options": {"include_usage": true}});
    let invalid = json!({"model": NAME, "messages": [{"role": "user", "content": "hi"}], "n": 0});
    for (path, body) in [
        ("chat/completions", chat),
        ("completions", completion),
        ("chat/completions", invalid),
    ] {
        let (status, via_gateway) = ask(fleet.gateway.clone(), path, body.clone()).await;
        let (worker_status, direct) = ask(fleet.workers[0].clone(), path, body).await;
        assert_eq!(status, worker_status, "{via_gateway}");
        let (got, want) = (said(&via_gateway), said(&direct));
        assert_eq!(
            got, want,
            "through the gateway: {via_gateway}\ndirect: {direct}"
        );
    }
}

/// What an answer says, without what differs between two answers (ids, times): each choice's
/// text (and log-probabilities, finish) by index, the usage, or the error; streamed chunks
/// joined first.
fn said(answer: &str) -> Value {
    let parsed: Vec<Value> = match answer.starts_with("data:") {
        false => vec![serde_json::from_str(answer).expect("JSON")],
        true => (answer.lines())
            .filter_map(|l| l.strip_prefix("data: "))
            .filter(|d| *d != "[DONE]")
            .map(|d| serde_json::from_str(d).expect("a JSON chunk"))
            .collect(),
    };
    let mut choices = std::collections::BTreeMap::<u64, Value>::new();
    let mut usage = Value::Null;
    for part in &parsed {
        if part.get("error").is_some() {
            return json!({"error": part["error"]["param"], "type": part["error"]["type"]});
        }
        for c in part["choices"].as_array().into_iter().flatten() {
            let seen = choices
                .entry(c["index"].as_u64().unwrap())
                .or_insert(json!({
                    "text": "", "logprobs": [], "finish": null
                }));
            let text = (c["message"]["content"].as_str())
                .or(c["delta"]["content"].as_str())
                .or(c["text"].as_str())
                .unwrap_or_default();
            seen["text"] = format!("{}{text}", seen["text"].as_str().unwrap()).into();
            let logprobs = match c["logprobs"]["content"].as_array() {
                Some(chat) => chat.iter().map(|t| t["token"].clone()).collect(),
                None => (c["logprobs"]["tokens"].as_array().cloned()).unwrap_or_default(),
            };
            (seen["logprobs"].as_array_mut().unwrap()).extend(logprobs);
            if !c["finish_reason"].is_null() {
                seen["finish"] = c["finish_reason"].clone();
            }
        }
        if !part["usage"].is_null() {
            usage = part["usage"].clone();
        }
    }
    json!({"choices": choices.into_values().collect::<Vec<_>>(), "usage": usage})
}

/// Each of two system prompts is served by one worker, where its blocks are reused.
async fn placement_follows_the_cache(fleet: &Fleet) {
    let client = reqwest::Client::new();
    let (a, b) = (system_prompt("billing"), system_prompt("shipping"));
    let (first_a, r) = send(&client, fleet, &chat(&a, "Hello.", 2, false)).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-osprey-model"], NAME);
    let usage: Value = r.json().await.unwrap();
    let prompt_tokens = usage["usage"]["prompt_tokens"].as_f64().unwrap();
    let (first_b, _) = send(&client, fleet, &chat(&b, "Hello.", 2, false)).await;
    assert_ne!(
        first_a, first_b,
        "with nothing cached, idle workers take turns"
    );
    let hits_before = prefix_hits(&client, &first_a).await;
    for q in [
        "Where is my invoice?",
        "Can I pay by card?",
        "Refund, please.",
    ] {
        let (worker, r) = send(&client, fleet, &chat(&a, q, 2, false)).await;
        assert_eq!(r.status(), 200);
        assert_eq!(worker, first_a, "a prompt goes where it is cached");
        let (worker, _) = send(&client, fleet, &chat(&b, q, 2, true)).await;
        assert_eq!(worker, first_b, "streams too");
    }
    let hits = prefix_hits(&client, &first_a).await - hits_before;
    // The system prompt is all but the last few tokens (the question, in whole blocks).
    assert!(
        hits >= 3.0 * (prompt_tokens - 40.0),
        "the worker reused the cached prompt: {hits} tokens"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_under_load_loses_no_unstarted_request() {
    let _slot = ServerSlot::take_async().await;
    let mut fleet = fleet("least_loaded").await;
    let client = reqwest::Client::new();
    let system = system_prompt("support");
    // Two long streams, one per worker (least-loaded alternates), already answering.
    let mut streams = Vec::new();
    for _ in 0..2 {
        let (worker, r) = send(
            &client,
            &fleet,
            &chat(&system, "Tell me a story.", 400, true),
        )
        .await;
        assert_eq!(r.status(), 200);
        let mut body = r.bytes_stream();
        let first = body.next().await.expect("a first chunk").expect("bytes");
        assert!(String::from_utf8_lossy(&first).contains("data:"));
        streams.push((worker, body));
    }
    assert_ne!(streams[0].0, streams[1].0, "one stream on each worker");
    // Non-streamed requests on both workers, then one worker dies mid-way.
    let pending: Vec<_> = (0..8)
        .map(|i| {
            let (client, body) = (
                client.clone(),
                chat(&system, &format!("Question {i}?"), 48, false),
            );
            let url = format!("{}/v1/chat/completions", fleet.gateway);
            tokio::spawn(async move {
                let r = client
                    .post(url)
                    .json(&body)
                    .send()
                    .await
                    .expect("an answer");
                let status = r.status();
                let worker = r
                    .headers()
                    .get("x-osprey-worker")
                    .map(|v| v.to_str().unwrap().to_owned());
                (status, worker, r.json::<Value>().await.ok())
            })
        })
        .collect();
    let victim = fleet
        .workers
        .iter()
        .position(|w| *w == streams[0].0)
        .unwrap();
    let survivor = fleet.workers[1 - victim].clone();
    // Mid-way: the gateway has sent all eight on, and the victim holds some of them (queued or
    // answering) beside its stream.
    let (gateway, victim_url) = (
        &format!("{}/metrics", fleet.gateway),
        &format!("{}/metrics", fleet.workers[victim]),
    );
    let client_ref = &client;
    eventually(
        || async move {
            let sent = metric(client_ref, gateway, "osprey_worker_requests_total").await?;
            let running = metric(client_ref, victim_url, "osprey_running_sequences").await?;
            let waiting = metric(client_ref, victim_url, "osprey_waiting_sequences").await?;
            (sent >= 10.0 && running + waiting >= 2.0).then_some(())
        },
        Duration::from_secs(60),
    )
    .await;
    fleet.worker_processes[victim].0.kill().expect("SIGKILL"); // Child::kill is SIGKILL
    let _ = fleet.worker_processes[victim].0.wait();

    for p in pending {
        let (status, worker, body) = p.await.unwrap();
        assert_eq!(status, 200, "{body:?}");
        assert_eq!(
            worker.as_deref(),
            Some(survivor.as_str()),
            "finished on the survivor"
        );
        let body = body.expect("a JSON answer");
        assert_eq!(body["usage"]["completion_tokens"], 48);
    }
    // The stream on the killed worker ends with an error event, not a broken connection.
    let (_, mut cut) = streams.remove(0);
    let mut text = String::new();
    while let Some(chunk) = cut.next().await {
        text.push_str(&String::from_utf8_lossy(
            &chunk.expect("the stream ends cleanly"),
        ));
    }
    let last = text
        .lines()
        .rfind(|l| l.starts_with("data:"))
        .unwrap_or_default();
    assert!(
        last.contains("\"upstream_disconnected\""),
        "last event: {last}"
    );
    // New requests go to the survivor.
    for q in ["After?", "Still there?"] {
        let (worker, r) = send(&client, &fleet, &chat(&system, q, 4, false)).await;
        assert_eq!(r.status(), 200);
        assert_eq!(worker, survivor);
    }
    let ready: Value = client
        .get(format!("{}/ready", fleet.gateway))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let live: Vec<bool> = ready["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["live"] == true)
        .collect();
    assert_eq!(live.iter().filter(|l| **l).count(), 1, "{ready}");
}
