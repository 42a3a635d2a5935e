//! Streaming through a real llama-server as an upstream, where one is built
//! (`../shared/peers/llama-cpp.sh`, found in `$LLAMA_SERVER` or the peers cache): every token
//! llama-server generates reaches the client through the gateway, in order.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::common::*;

fn llama_server() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("LLAMA_SERVER").map(PathBuf::from) {
        return p.is_file().then_some(p);
    }
    let peers = std::env::var_os("OSPREY_PEERS")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/osprey-peers"))
        })?;
    std::fs::read_dir(peers)
        .ok()?
        .filter_map(|e| Some(e.ok()?.path().join("bin/llama-server")))
        .find(|p| p.is_file())
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_llama_server_stream_arrives_whole() {
    let Some(binary) = llama_server() else {
        eprintln!(
            "SKIPPED a_llama_server_stream_arrives_whole: no llama-server built (../shared/peers/llama-cpp.sh)"
        );
        return;
    };
    let port = free_port();
    let model = osprey_testkit::default_model();
    let _server = Killed(
        Command::new(&binary)
            .args([
                "-m",
                model.to_str().unwrap(),
                "-t",
                "2",
                "-c",
                "2048",
                "--parallel",
                "1",
            ])
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("llama-server starts"),
    );
    let direct = format!("http://127.0.0.1:{port}/v1");
    // llama-server answers /health once it has loaded the model.
    osprey_testkit::eventually(
        || async {
            let health = reqwest::get(format!("http://127.0.0.1:{port}/health")).await;
            health.is_ok_and(|r| r.status() == 200).then_some(())
        },
        Duration::from_secs(60),
    )
    .await;

    let (_, store_url) = store().await;
    let base = gateway(Setup {
        store_url,
        upstreams: vec![("llama".into(), direct.clone())],
        ..Setup::default()
    })
    .await;
    let body = json!({"model": "llama", "temperature": 0, "max_tokens": 24, "seed": 1,
        "messages": [{"role": "user", "content": "Name three rivers in Europe."}]});
    let expected: Value = reqwest::Client::new()
        .post(format!("{direct}/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let expected = expected["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(!expected.is_empty());

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let r = chat(&base, None, streamed).await;
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    let content = streamed_content(&text);
    assert_eq!(
        content, expected,
        "the stream through the gateway carries every token"
    );
    assert!(text.trim_end().ends_with("data: [DONE]"));
}
