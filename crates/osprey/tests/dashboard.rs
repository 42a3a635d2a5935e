//! Osprey's page in a real browser (Debian's Chromium driven by playwright-core, both
//! installed by `scripts/browser-kit.sh`): it loads without a key, a chart updates from
//! `/metrics`, a playground message streams its answer, and that request opens in the request
//! log. A screenshot is saved (`OSPREY_DASHBOARD_SCREENSHOT`, default in the temp dir).

use std::path::Path;
use std::process::{Command, Stdio};

use osprey_testkit::Process;
use serde_json::Value;

use crate::support::{self, ServerSlot};

const ADMIN: &str = "dashboard-test-admin";

fn repo() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_charts_streams_a_playground_answer_and_shows_its_request() {
    let _slot = ServerSlot::take_async().await;
    let kit = Command::new("bash")
        .arg(repo().join("scripts/browser-kit.sh"))
        .stderr(Stdio::inherit())
        .output()
        .expect("running scripts/browser-kit.sh");
    assert!(kit.status.success(), "scripts/browser-kit.sh failed");
    let playwright = String::from_utf8(kit.stdout).unwrap().trim().to_owned();

    let model = osprey_testkit::default_model();
    let port = osprey_testkit::free_port().to_string();
    let dir = std::env::temp_dir().join(format!("osprey-dashboard-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let store = format!("sqlite://{}", dir.join("store.db").display());
    let _server = Process::spawn(
        Command::new(env!("CARGO_BIN_EXE_osprey"))
            .args(["serve", "--port", &port, "--model", model.to_str().unwrap()])
            .args(["--store", &store, "--admin-key", ADMIN, "--threads", "2"])
            .stdout(Stdio::null()),
    );
    let url = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    support::ready(&client, &url).await;
    // The page itself needs no key; the admin routes behind it do.
    let page = client.get(&url).send().await.unwrap();
    assert!(page.status().is_success());
    assert!(page.text().await.unwrap().contains("<title>Osprey</title>"));
    let closed = client
        .get(format!("{url}/admin/requests"))
        .send()
        .await
        .unwrap();
    assert_eq!(closed.status(), 401);

    let shot = std::env::var("OSPREY_DASHBOARD_SCREENSHOT")
        .unwrap_or_else(|_| dir.join("dashboard.png").display().to_string());
    let out = Command::new("node")
        .arg(repo().join("scripts/dashboard-check.cjs"))
        .args([&url, ADMIN, &shot])
        .env("OSPREY_PLAYWRIGHT", &playwright)
        .stderr(Stdio::inherit())
        .output()
        .expect("running node");
    assert!(out.status.success(), "the browser check failed");
    let summary: Value = serde_json::from_slice(&out.stdout).expect("a JSON summary");
    assert!(
        summary["errors"].as_array().unwrap().is_empty(),
        "page errors: {summary}"
    );
    assert!(
        !summary["answer"].as_str().unwrap().trim().is_empty(),
        "{summary}"
    );
    let detail = summary["detail"].as_str().unwrap();
    assert!(
        detail.to_lowercase().contains("smollm2") && detail.contains("tokens"),
        "{detail}"
    );
    assert!(summary["chart_updates"].as_u64().unwrap() > summary["before"].as_u64().unwrap());
    assert!(
        std::fs::metadata(&shot).unwrap().len() > 10_000,
        "a screenshot was saved"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
