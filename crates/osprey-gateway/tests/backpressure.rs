//! Overload and disconnects against the real model, on an engine of its own (in a process of its
//! own, [`common::run_alone`], so the engine gauges in /metrics are this engine's): a full queue
//! answers 503 with `retry-after` instead of hanging, and clients that hang up give back every
//! KV block.

use std::time::Duration;

use osprey_engine::{Engine, EngineConfig, SchedulerConfig};
use osprey_gateway::Services;
use serde_json::{Value, json};

use crate::common;

const MODEL: &str = "smollm2-135m-instruct";

async fn server(engine: Engine) -> String {
    let state = Services::serving(MODEL);
    state.set_engine(engine);
    common::serve(state).await
}

/// Runs [`overload_alone`] in a child process: every engine of a process sets the same gauges,
/// and the other tests' shared engine is busy meanwhile.
#[test]
fn overload_is_refused_and_disconnects_free_their_blocks() {
    common::run_alone("backpressure::overload_alone", &[]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by overload_is_refused_and_disconnects_free_their_blocks, in a process of its own"]
async fn overload_alone() {
    if !common::alone("backpressure::overload_alone") {
        return;
    }
    let engine = osprey_testkit::engine(EngineConfig {
        scheduler: SchedulerConfig {
            max_num_seqs: 2,
            ..SchedulerConfig::default()
        },
        max_waiting: 2,
        ..osprey_testkit::test_config()
    });
    let base = server(engine.clone()).await;
    let client = reqwest::Client::new();

    // 12 requests at once into 2 seats and 2 waiting places: some must be refused, at once.
    let body =
        json!({"model": MODEL, "prompt": "Count slowly:", "max_tokens": 32, "ignore_eos": true});
    let calls = (0..12).map(|_| {
        let request = client.post(format!("{base}/v1/completions")).json(&body);
        tokio::spawn(async move {
            let resp = tokio::time::timeout(Duration::from_secs(120), request.send())
                .await
                .expect("a request hung")
                .unwrap();
            let status = resp.status().as_u16();
            let retry = resp
                .headers()
                .get("retry-after")
                .map(|v| v.to_str().unwrap().to_owned());
            let body: Value = resp.json().await.unwrap();
            (status, retry, body)
        })
    });
    let mut served = 0;
    let mut refused = 0;
    for call in calls.collect::<Vec<_>>() {
        let (status, retry, body) = call.await.unwrap();
        match status {
            200 => {
                assert_eq!(body["usage"]["completion_tokens"], 32, "{body}");
                served += 1;
            }
            503 => {
                assert_eq!(retry.as_deref(), Some("1"));
                assert_eq!(body["error"]["code"], "server_overloaded", "{body}");
                assert!(body["error"]["message"].is_string(), "{body}");
                refused += 1;
            }
            other => panic!("unexpected {other}: {body}"),
        }
    }
    assert!(
        served >= 2 && refused >= 1,
        "served {served}, refused {refused}"
    );

    // Clients that hang up, streaming and not, mid-generation.
    for stream in [true, false, true] {
        let body = json!({"model": MODEL, "prompt": "Once upon a time", "max_tokens": 4000,
                          "ignore_eos": true, "stream": stream});
        let request = client.post(format!("{base}/v1/completions")).json(&body);
        if stream {
            let mut resp = request.send().await.unwrap();
            let mut seen = 0;
            while seen < 3 {
                let chunk = resp.chunk().await.unwrap().expect("stream ended early");
                seen += String::from_utf8_lossy(&chunk).matches("data: ").count();
            }
        } else {
            let gone = request.timeout(Duration::from_millis(500)).send().await;
            assert!(gone.is_err(), "4000 tokens cannot be done in 0.5 s");
        }
    }
    // Every block comes back, and /metrics says so, once the engine has seen the hang-ups.
    osprey_testkit::eventually(
        || async {
            let s = engine.stats();
            let freed = s.running() == 0 && s.waiting() == 0 && s.free_blocks() == s.total_blocks();
            let used = common::metric(&base, "osprey_kv_blocks_used").await;
            let running = common::metric(&base, "osprey_running_sequences").await;
            (freed && used == Some(0.0) && running == Some(0.0)).then_some(())
        },
        Duration::from_secs(60),
    )
    .await;
}
