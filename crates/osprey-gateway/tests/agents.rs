//! Agent runs through `/v1/responses` on the real model, with real tools: the calculator, real
//! third-party MCP servers from the npm registry (server-everything over stdio and streamable
//! HTTP, server-filesystem over stdio), a client's own function, approvals through the admin
//! API, scopes refused and audited, runs stored, listed, streamed and replayed, and bad input in
//! the error envelope.

use std::collections::BTreeMap;
use std::path::PathBuf;

use osprey_agent::builtin::calculator;
use osprey_agent::mcp::McpServerConfig;
use osprey_agent::{AgentConfig, Budget, Scopes};
use osprey_gateway::{Services, Wiring};
use osprey_limits::RateLimiter;
use osprey_services::auth::Authenticator;
use osprey_services::config::{EdgeConfig, TenantConfig};
use osprey_services::edge::Edge;
use osprey_store::{NewKey, Store};
use serde_json::{Value, json};

use crate::common;

const MODEL: &str = "smollm2-135m-instruct";
const ADMIN: &str = "admin-secret";

struct Server {
    base: String,
    /// A key of tenant `acme`, granted read, write and destructive.
    acme: String,
    /// A key of tenant `globex`, granted the default (read).
    globex: String,
    /// The folder server-filesystem may touch.
    files: PathBuf,
    /// The streamable-HTTP MCP server, killed with the test.
    _http_mcp: tokio::process::Child,
    _library: tempfile::TempDir,
}

fn mcp(label: &str, command: PathBuf, args: Vec<String>) -> McpServerConfig {
    McpServerConfig {
        label: label.into(),
        command: Some(command.display().to_string()),
        args,
        cwd: None,
        url: None,
        scopes: Scopes::NONE,
        allowed_tools: Vec::new(),
        require_approval: Default::default(),
        timeout_seconds: 30.0,
    }
}

async fn server() -> Server {
    let bin = osprey_testkit::mcp_servers();
    let files =
        std::env::temp_dir().join(format!("osprey-mcp-files-{:08x}", rand::random::<u32>()));
    std::fs::create_dir_all(&files).unwrap();
    std::fs::write(files.join("notes.txt"), "The meeting is on Tuesday.").unwrap();
    let port = osprey_testkit::free_port();
    let http_mcp = tokio::process::Command::new(bin.join("mcp-server-everything"))
        .arg("streamableHttp")
        .env("PORT", port.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut http = mcp("everything_http", PathBuf::new(), Vec::new());
    (http.command, http.url) = (None, Some(format!("http://127.0.0.1:{port}/mcp")));
    let mut filesystem = mcp(
        "files",
        bin.join("mcp-server-filesystem"),
        vec![files.display().to_string()],
    );
    filesystem.scopes = Scopes::parse(["read"]).unwrap();
    let agent = AgentConfig {
        budget: Budget {
            steps: 3,
            ..Budget::default()
        },
        mcp: vec![
            mcp(
                "everything",
                bin.join("mcp-server-everything"),
                vec!["stdio".into()],
            ),
            http,
            filesystem,
        ],
        ..AgentConfig::default()
    };
    let (store, _) = store().await;
    let auth = Authenticator::new(store.clone()).await.unwrap();
    let mut tenants = BTreeMap::new();
    tenants.insert(
        "acme".to_owned(),
        TenantConfig {
            tool_scopes: Some(vec!["read".into(), "write".into(), "destructive".into()]),
            ..TenantConfig::default()
        },
    );
    let config = EdgeConfig {
        tenants,
        admin_key: Some(ADMIN.into()),
        ..EdgeConfig::default()
    };
    let edge = Edge::new(config, auth, RateLimiter::local());
    let acme = store
        .create_key(NewKey::for_tenant("acme"))
        .await
        .unwrap()
        .secret;
    let globex = store
        .create_key(NewKey::for_tenant("globex"))
        .await
        .unwrap()
        .secret;
    let library = tempfile::tempdir().unwrap();
    let state = Services::new(Wiring {
        store: Some(store),
        library: osprey_rag::Library::new(library.path().to_owned()),
        agents: agent,
        ..Wiring::new(Some(MODEL.into()), Vec::new(), edge)
    });
    state.set_engine(osprey_testkit::shared_engine());
    let base = common::serve(state).await;
    // The HTTP MCP server needs a moment to listen.
    osprey_testkit::eventually(
        || async {
            let listening = tokio::net::TcpStream::connect(("127.0.0.1", port)).await;
            listening.is_ok().then_some(())
        },
        std::time::Duration::from_secs(60),
    )
    .await;
    Server {
        base,
        acme,
        globex,
        files,
        _http_mcp: http_mcp,
        _library: library,
    }
}

async fn store() -> (Store, String) {
    let dir = std::env::temp_dir().join(format!("osprey-agents-{:016x}", rand::random::<u64>()));
    std::fs::create_dir_all(&dir).unwrap();
    let url = Store::default_url(&dir);
    (Store::open(&url).await.unwrap(), url)
}

async fn call(
    base: &str,
    key: &str,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut req = reqwest::Client::new()
        .request(method, format!("{base}{path}"))
        .bearer_auth(key);
    if let Some(b) = body {
        req = req.json(&b);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON: {text}")),
    )
}

async fn respond(s: &Server, key: &str, body: Value) -> (u16, Value) {
    call(
        &s.base,
        key,
        reqwest::Method::POST,
        "/v1/responses",
        Some(body),
    )
    .await
}

fn items<'a>(response: &'a Value, kind: &str) -> Vec<&'a Value> {
    (response["output"].as_array().into_iter().flatten())
        .filter(|i| i["type"] == kind)
        .collect()
}

/// The output of the call `call_id`.
fn output_of<'a>(response: &'a Value, call_id: &Value) -> Option<&'a str> {
    items(response, "function_call_output")
        .into_iter()
        .find(|o| &o["call_id"] == call_id)
        .and_then(|o| o["output"].as_str())
}

#[tokio::test]
async fn agents_run_real_tools_under_budgets_scopes_and_approvals() {
    let s = server().await;

    // The calculator: the model's expression, computed exactly; the run stored with its steps.
    let (status, r) = respond(
        &s,
        &s.acme,
        json!({"model": MODEL, "input": "What is 1234 times 5678?",
        "tools": [{"type": "calculator"}], "tool_choice": "required"}),
    )
    .await;
    assert_eq!(status, 200, "{r}");
    assert!(
        ["completed", "incomplete"].contains(&r["status"].as_str().unwrap()),
        "{r}"
    );
    let first = items(&r, "function_call")[0];
    assert_eq!(first["name"], "calculator");
    let args: Value = serde_json::from_str(first["arguments"].as_str().unwrap()).unwrap();
    let expected = calculator::evaluate(args["expression"].as_str().unwrap())
        .map(|v| calculator::show(&v))
        .unwrap_or_else(|e| format!("error: {e}"));
    assert_eq!(
        output_of(&r, &first["call_id"]),
        Some(expected.as_str()),
        "{r}"
    );
    let id = r["id"].as_str().unwrap().to_owned();
    let (_, stored) = call(
        &s.base,
        &s.acme,
        reqwest::Method::GET,
        &format!("/v1/responses/{id}"),
        None,
    )
    .await;
    assert_eq!(stored["output"], r["output"], "stored as answered");
    let (_, steps) = call(
        &s.base,
        &s.acme,
        reqwest::Method::GET,
        &format!("/v1/responses/{id}/steps"),
        None,
    )
    .await;
    let kinds: Vec<&str> = steps["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["kind"].as_str().unwrap())
        .collect();
    assert_eq!(&kinds[..3], ["decide", "act", "observe"], "{kinds:?}");
    assert_eq!(kinds.last(), Some(&"finish"));
    assert!(r["usage"]["total_tokens"].as_u64().unwrap() > 0);
    let (status, _) = call(
        &s.base,
        &s.globex,
        reqwest::Method::GET,
        &format!("/v1/responses/{id}"),
        None,
    )
    .await;
    assert_eq!(status, 404, "another tenant cannot read the run");

    // MCP over stdio: server-everything's `echo`.
    let (status, r) = respond(
        &s,
        &s.acme,
        json!({"model": MODEL, "input": "Say hello through the echo tool.",
        "tools": [{"type": "mcp", "server_label": "everything", "allowed_tools": ["echo"]}],
        "tool_choice": "required"}),
    )
    .await;
    assert_eq!(status, 200, "{r}");
    let echo = items(&r, "function_call")[0];
    assert_eq!(echo["name"], "everything__echo");
    let said: Value = serde_json::from_str(echo["arguments"].as_str().unwrap()).unwrap();
    let out = output_of(&r, &echo["call_id"]).unwrap();
    assert_eq!(
        out,
        format!("Echo: {}", said["message"].as_str().unwrap()),
        "{r}"
    );

    // MCP over streamable HTTP: server-everything's `get-sum`, streamed.
    let body = json!({"model": MODEL, "input": "Add 2 and 3 with the tool.", "stream": true,
        "tools": [{"type": "mcp", "server_label": "everything_http", "allowed_tools": ["get-sum"]}],
        "tool_choice": "required"});
    let text = reqwest::Client::new()
        .post(format!("{}/v1/responses", s.base))
        .bearer_auth(&s.acme)
        .json(&body)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let events: Vec<Value> = (text.lines().filter_map(|l| l.strip_prefix("data: ")))
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(kinds.first(), Some(&"response.created"), "{kinds:?}");
    assert!(kinds.contains(&"response.output_item.added"));
    let end = events.last().unwrap();
    assert!(
        ["response.completed", "response.incomplete"].contains(&end["type"].as_str().unwrap()),
        "{kinds:?}"
    );
    let r = &end["response"];
    let sum = items(r, "function_call")[0];
    let args: Value = serde_json::from_str(sum["arguments"].as_str().unwrap()).unwrap();
    let want = args["a"].as_f64().unwrap() + args["b"].as_f64().unwrap();
    let out = output_of(r, &sum["call_id"]).unwrap();
    assert!(
        out.contains(&format!("{want}")) || out.contains(&format!("{}", want as i64)),
        "{out}"
    );
    let seq: Vec<u64> = events
        .iter()
        .map(|e| e["sequence_number"].as_u64().unwrap())
        .collect();
    assert!(
        seq.windows(2).all(|w| w[1] == w[0] + 1),
        "events numbered in order"
    );

    // A destructive MCP call waits for approval; the admin approves, the file is written.
    let write = json!({"model": MODEL, "input": "Write the word hello to a file.",
        "tools": [{"type": "mcp", "server_label": "files", "allowed_tools": ["write_file"]}],
        "tool_choice": "required"});
    let (status, r) = respond(&s, &s.acme, write.clone()).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["status"], "requires_approval", "{r}");
    let request = items(&r, "mcp_approval_request")[0];
    assert_eq!(request["server_label"], "files");
    assert!(request["reason"].as_str().unwrap().contains("destructive"));
    let args: Value = serde_json::from_str(request["arguments"].as_str().unwrap()).unwrap();
    let path = PathBuf::from(args["path"].as_str().unwrap());
    let id = r["id"].as_str().unwrap().to_owned();
    let (_, waiting) = call(
        &s.base,
        ADMIN,
        reqwest::Method::GET,
        "/admin/runs?status=requires_approval",
        None,
    )
    .await;
    assert!(
        waiting["data"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w["id"] == id)
    );
    let (status, approved) = call(
        &s.base,
        ADMIN,
        reqwest::Method::POST,
        &format!("/admin/runs/{id}/approve"),
        Some(json!({"approval_request_id": request["id"], "reason": "fine"})),
    )
    .await;
    assert_eq!(status, 200, "{approved}");
    let written = if path.is_absolute() {
        path.clone()
    } else {
        s.files.join(&path)
    };
    let allowed_place = written.starts_with(&s.files);
    // The model may have asked for several calls at once: the one approved has run.
    let out = output_of(&approved, &request["call_id"]).unwrap();
    if allowed_place {
        assert_eq!(
            std::fs::read_to_string(&written).unwrap(),
            args["content"].as_str().unwrap(),
            "{out}"
        );
    } else {
        assert!(
            out.starts_with("error:"),
            "outside its folder the server refuses: {out}"
        );
    }
    let (status, again) = call(
        &s.base,
        ADMIN,
        reqwest::Method::POST,
        &format!("/admin/runs/{id}/approve"),
        Some(json!({"approval_request_id": request["id"]})),
    )
    .await;
    assert_eq!(status, 400, "answered once: {again}");

    // Rejected: nothing is written and the model is told.
    let (_, r) = respond(&s, &s.acme, write.clone()).await;
    let id = r["id"].as_str().unwrap();
    let request = items(&r, "mcp_approval_request")[0];
    let args: Value = serde_json::from_str(request["arguments"].as_str().unwrap()).unwrap();
    let _ = std::fs::remove_file(s.files.join(args["path"].as_str().unwrap()));
    let (status, rejected) = call(
        &s.base,
        &s.acme,
        reqwest::Method::POST,
        &format!("/v1/responses/{id}/reject"),
        Some(json!({"approval_request_id": request["id"], "reason": "not now"})),
    )
    .await;
    assert_eq!(status, 200, "{rejected}");
    assert_eq!(
        output_of(&rejected, &request["call_id"]),
        Some("error: the call was rejected by its approver: not now")
    );
    assert!(!s.files.join(args["path"].as_str().unwrap()).exists() || args["path"] == "notes.txt");

    // OpenAI's way: a new response continues the paused one with an approval response.
    let (_, paused) = respond(&s, &s.acme, write.clone()).await;
    let request = items(&paused, "mcp_approval_request")[0];
    let (status, r) = respond(
        &s,
        &s.acme,
        json!({"model": MODEL, "previous_response_id": paused["id"],
        "tools": write["tools"], "input": [{"type": "mcp_approval_response",
        "approval_request_id": request["id"], "approve": false, "reason": "use another file"}]}),
    )
    .await;
    assert_eq!(status, 200, "{r}");
    let rejected_out = items(&r, "function_call_output");
    assert!(
        rejected_out.iter().any(
            |o| o["output"] == "error: the call was rejected by its approver: use another file"
        ),
        "{r}"
    );

    // A paused run can be cancelled; then nothing answers it.
    let (_, paused) = respond(&s, &s.acme, write.clone()).await;
    let id = paused["id"].as_str().unwrap();
    let (status, cancelled) = call(
        &s.base,
        &s.acme,
        reqwest::Method::POST,
        &format!("/v1/responses/{id}/cancel"),
        None,
    )
    .await;
    assert_eq!(
        (status, cancelled["status"].as_str()),
        (200, Some("cancelled")),
        "{cancelled}"
    );
    let (status, _) = call(
        &s.base,
        &s.acme,
        reqwest::Method::POST,
        &format!("/v1/responses/{id}/approve"),
        None,
    )
    .await;
    assert_eq!(status, 400, "a cancelled run is not resumed");

    // Globex holds only `read`: the write is refused outright and audited.
    let (_, r) = respond(&s, &s.globex, write).await;
    let call_id = items(&r, "function_call")[0]["call_id"].clone();
    let out = output_of(&r, &call_id).unwrap();
    assert!(out.contains("not granted"), "{out}");
    let (_, audit) = call(
        &s.base,
        ADMIN,
        reqwest::Method::GET,
        "/admin/tool-audit?tenant=globex",
        None,
    )
    .await;
    let verdicts: Vec<&str> = audit["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["verdict"].as_str().unwrap())
        .collect();
    assert!(verdicts.contains(&"denied"), "{verdicts:?}");
    let (_, audit) = call(
        &s.base,
        ADMIN,
        reqwest::Method::GET,
        "/admin/tool-audit?tenant=acme",
        None,
    )
    .await;
    let verdicts: Vec<&str> = audit["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["verdict"].as_str().unwrap())
        .collect();
    for v in ["allowed", "approval_requested", "approved", "rejected"] {
        assert!(verdicts.contains(&v), "{v} in {verdicts:?}");
    }
}

#[tokio::test]
async fn client_functions_continue_with_previous_response_id_and_runs_replay() {
    let s = server().await;
    let tools = json!([{"type": "function", "name": "get_weather", "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
        "required": ["city"], "additionalProperties": false}}]);
    let (status, r) = respond(
        &s,
        &s.acme,
        json!({"model": MODEL, "input": "What is the weather in Oslo?",
        "tools": tools, "tool_choice": "required", "metadata": {"case": "weather"}}),
    )
    .await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["status"], "requires_action", "{r}");
    assert_eq!(r["metadata"]["case"], "weather");
    let fc = items(&r, "function_call")[0].clone();
    let args: Value = serde_json::from_str(fc["arguments"].as_str().unwrap()).unwrap();
    assert!(args["city"].is_string());
    let first = r["id"].as_str().unwrap().to_owned();
    let first_prompt = r["usage"]["input_tokens"].as_u64().unwrap();
    // Every call of the answer gets its output.
    let outputs: Vec<Value> = items(&r, "function_call")
        .iter()
        .map(|c| json!({"type": "function_call_output", "call_id": c["call_id"], "output": "-3C and snowing"}))
        .collect();
    let (status, r) = respond(
        &s,
        &s.acme,
        json!({"model": MODEL, "previous_response_id": first, "tools": tools, "input": outputs}),
    )
    .await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["previous_response_id"], first.as_str());
    assert!(
        !r["output"].as_array().unwrap().is_empty(),
        "the model went on: {r}"
    );
    // It read the earlier turn and the outputs: its prompt is longer than the first one's.
    assert!(
        r["usage"]["input_tokens"].as_u64().unwrap() > first_prompt + 10,
        "{r}"
    );
    let (status, bad) = respond(
        &s,
        &s.acme,
        json!({"model": MODEL, "previous_response_id": first, "tools": tools,
        "input": [{"type": "function_call_output", "call_id": "call_nope", "output": "x"}]}),
    )
    .await;
    assert_eq!(
        (status, bad["error"]["param"].as_str()),
        (400, Some("input")),
        "{bad}"
    );

    // Replay: the same request again, as a new run that says what it replays.
    let (status, replayed) = call_post(&s, &format!("/v1/responses/{first}/replay")).await;
    assert_eq!(status, 200, "{replayed}");
    assert_ne!(replayed["id"], first.as_str());
    let (_, listed) = call(
        &s.base,
        &s.acme,
        reqwest::Method::GET,
        "/v1/responses?limit=10",
        None,
    )
    .await;
    let ids: Vec<&str> = listed["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    assert!(ids.contains(&first.as_str()) && ids.contains(&replayed["id"].as_str().unwrap()));
    let replay = listed["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == replayed["id"])
        .unwrap();
    assert_eq!(replay["replay_of"], first.as_str());
    let (_, theirs) = call(
        &s.base,
        &s.globex,
        reqwest::Method::GET,
        "/v1/responses",
        None,
    )
    .await;
    assert!(
        theirs["data"].as_array().unwrap().is_empty(),
        "another tenant lists none of them"
    );
}

#[tokio::test]
async fn file_search_reads_only_what_the_caller_may_see() {
    let s = server().await;
    let docs = json!({"documents": [
        {"id": "holidays", "title": "Holiday policy", "text": "Every employee has 25 days of paid holiday a year. Holidays are booked in the HR portal."},
        {"id": "salaries", "title": "Salary bands", "text": "Salary bands for every grade, and the holiday bonus paid in June."}
    ]});
    let path = "/v1/collections/handbook/documents";
    let (status, job) = call(&s.base, &s.acme, reqwest::Method::POST, path, Some(docs)).await;
    assert_eq!(status, 202, "{job}");
    let secret = json!({"documents": [{"id": "reviews", "title": "Holiday reviews", "text": "Confidential holiday reviews of staff."}], "acl": ["hr"]});
    let (status, job2) = call(&s.base, &s.acme, reqwest::Method::POST, path, Some(secret)).await;
    assert_eq!(status, 202, "{job2}");
    for job in [job, job2] {
        let at = format!(
            "/v1/collections/handbook/jobs/{}",
            job["id"].as_str().unwrap()
        );
        osprey_testkit::eventually(
            || async {
                let (_, j) = call(&s.base, &s.acme, reqwest::Method::GET, &at, None).await;
                assert_ne!(j["status"], "failed", "{j}");
                (j["status"] == "succeeded").then_some(())
            },
            std::time::Duration::from_secs(60),
        )
        .await;
    }
    let ask = json!({"model": MODEL, "input": "How many days of holiday do I get?",
        "tools": [{"type": "file_search", "vector_store_ids": ["handbook"]}], "tool_choice": "required"});
    let (status, r) = respond(&s, &s.acme, ask.clone()).await;
    assert_eq!(status, 200, "{r}");
    let search = items(&r, "function_call")[0];
    assert_eq!(search["name"], "file_search");
    let out = output_of(&r, &search["call_id"]).unwrap();
    assert!(out.contains("[1]") && out.contains("handbook/"), "{out}");
    assert!(
        !out.contains("reviews"),
        "a document of a group the caller is not in: {out}"
    );
    // Globex has no collection of that name: the search fails, and the model is told.
    let (_, r) = respond(&s, &s.globex, ask).await;
    let search = items(&r, "function_call")[0];
    let out = output_of(&r, &search["call_id"]).unwrap();
    assert!(
        out.starts_with("error:") && out.contains("No collection"),
        "{out}"
    );
}

async fn call_post(s: &Server, path: &str) -> (u16, Value) {
    call(&s.base, &s.acme, reqwest::Method::POST, path, None).await
}

#[tokio::test]
async fn bad_agent_requests_are_refused_in_the_envelope() {
    let s = server().await;
    let cases = [
        (
            json!({"model": MODEL, "input": "hi", "tools": [{"type": "teleport"}]}),
            400,
            "tools[0].type",
        ),
        (
            json!({"model": MODEL, "input": "hi", "tools": [{"type": "mcp", "server_label": "nope"}]}),
            400,
            "tools[0].server_label",
        ),
        (json!({"model": MODEL, "input": []}), 400, "input"),
        (
            json!({"model": MODEL, "input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]}),
            400,
            "previous_response_id",
        ),
        (
            json!({"model": MODEL, "input": "hi", "previous_response_id": "resp_missing"}),
            404,
            "",
        ),
        (
            json!({"model": MODEL, "input": "hi", "osprey": {"budget": {"steps": 0}}}),
            400,
            "osprey.budget",
        ),
        (
            json!({"model": MODEL, "input": "hi", "osprey": {"budget": {"stepz": 1}}}),
            400,
            "osprey.budget",
        ),
        (json!({"model": "no-such-model", "input": "hi"}), 404, ""),
        (
            json!({"model": MODEL, "input": [{"role": "robot", "content": "x"}]}),
            400,
            "input[0].role",
        ),
    ];
    for (body, want, param) in cases {
        let (status, r) = respond(&s, &s.acme, body.clone()).await;
        assert_eq!(status, want, "{body}: {r}");
        assert!(r["error"]["message"].is_string(), "{r}");
        if !param.is_empty() {
            assert!(
                r["error"]["param"]
                    .as_str()
                    .unwrap_or_default()
                    .starts_with(param),
                "{body}: {r}"
            );
        }
    }
    let (status, r) = call(
        &s.base,
        &s.acme,
        reqwest::Method::POST,
        "/v1/responses/resp_missing/approve",
        None,
    )
    .await;
    assert_eq!(status, 404, "{r}");
    let (status, _) = call(&s.base, "wrong", reqwest::Method::GET, "/admin/runs", None).await;
    assert_eq!(status, 401);
}
