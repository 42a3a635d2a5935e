//! `osprey eval` on the real model, as docs/eval.md shows it: a suite run against two prompt
//! versions, the gate passing an equal candidate and failing the deliberately worse version,
//! and replay of the request log (kept with its text for this tenant) against the server.

use std::path::Path;
use std::process::{Command, Stdio};

use osprey_testkit::Process;

use crate::support::{self, ServerSlot};

const ADMIN: &str = "eval-test-admin";

struct Cli {
    store: String,
    key: String,
}

impl Cli {
    fn run(&self, args: &[&str]) -> (bool, String, String) {
        let out = Command::new(env!("CARGO_BIN_EXE_osprey"))
            .args(args)
            .args(["--store", &self.store])
            .env("OSPREY_EVAL_KEY", &self.key)
            .env("OSPREY_ADMIN_KEY", ADMIN)
            .output()
            .expect("running osprey");
        let text = |b: Vec<u8>| String::from_utf8(b).unwrap();
        (out.status.success(), text(out.stdout), text(out.stderr))
    }

    /// Runs `osprey eval run` and returns the stored run's id.
    fn eval_run(&self, suite: &Path, target: &Path, extra: &[&str]) -> String {
        let mut args = vec![
            "eval",
            "run",
            suite.to_str().unwrap(),
            "--target",
            target.to_str().unwrap(),
        ];
        args.extend(extra);
        let (ok, out, err) = self.run(&args);
        assert!(ok, "{out}\n{err}");
        eprintln!("{out}");
        out.lines()
            .find_map(|l| l.strip_prefix("stored as "))
            .expect("a run id")
            .trim()
            .to_owned()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn suites_compare_gate_and_replay_on_the_real_model() {
    let _slot = ServerSlot::take_async().await;
    let dir = std::env::temp_dir().join(format!("osprey-eval-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let store = format!("sqlite://{}", dir.join("osprey.db").display());
    let mut cli = Cli {
        store,
        key: String::new(),
    };

    // A tenant whose requests keep their text, and two versions of its prompt: the second
    // deliberately worse (its answers are cut to two tokens).
    let (ok, out, err) = cli.run(&["keys", "create", "--tenant", "acme"]);
    assert!(ok, "{err}");
    cli.key = out.trim().to_owned();
    let prompt = dir.join("answer.toml");
    let push = |toml: &str| {
        std::fs::write(&prompt, toml).unwrap();
        let (ok, _, err) = cli.run(&[
            "prompts",
            "push",
            "answer",
            "--file",
            prompt.to_str().unwrap(),
        ]);
        assert!(ok, "{err}");
    };
    push(
        "[settings]\nmax_tokens = 24\n\n[[messages]]\nrole = \"system\"\ncontent = \"Answer the question in a short sentence.\"\n",
    );
    push(
        "[settings]\nmax_tokens = 2\n\n[[messages]]\nrole = \"system\"\ncontent = \"Be brief.\"\n",
    );
    let config = dir.join("osprey.toml");
    std::fs::write(&config, "[tenants.acme]\nlog_text_sample_rate = 1.0\n").unwrap();

    let port = osprey_testkit::free_port().to_string();
    let model = osprey_testkit::default_model();
    let _server = Process::spawn(
        Command::new(env!("CARGO_BIN_EXE_osprey"))
            .args([
                "serve",
                "--port",
                &port,
                "--model",
                model.to_str().unwrap(),
                "--threads",
                "2",
                "--served-model-name",
                "smollm2-135m-instruct",
            ])
            .args([
                "--store",
                &cli.store,
                "--admin-key",
                ADMIN,
                "--config",
                config.to_str().unwrap(),
            ])
            .stdout(Stdio::null()),
    );
    let url = format!("http://127.0.0.1:{port}");
    support::ready(&reqwest::Client::new(), &url).await;

    // Questions whose answer is one word the small model knows, checked by rule.
    let suite = dir.join("capitals.jsonl");
    let cases: Vec<String> = [
        ("France", "Paris"),
        ("Japan", "Tokyo"),
        ("Italy", "Rome"),
        ("Germany", "Berlin"),
        ("Spain", "Madrid"),
        ("Egypt", "Cairo"),
        ("England", "London"),
        ("Russia", "Moscow"),
        ("China", "Beijing"),
        ("Greece", "Athens"),
        ("Portugal", "Lisbon"),
        ("Austria", "Vienna"),
    ]
    .iter()
    .map(|(country, city)| {
        serde_json::json!({"id": country.to_lowercase(),
            "messages": [{"role": "user", "content": format!("What is the capital of {country}?")}],
            "checks": [{"type": "contains", "value": city, "ignore_case": true}]})
        .to_string()
    })
    .collect();
    std::fs::write(&suite, cases.join("\n")).unwrap();
    let target = |name: &str, version: u32| {
        let path = dir.join(format!("{name}.toml"));
        std::fs::write(&path, format!(
            "url = \"{url}\"\nmodel = \"smollm2-135m-instruct\"\napi_key_env = \"OSPREY_EVAL_KEY\"\n\
             params = {{ temperature = 0 }}\nosprey = {{ prompt = {{ name = \"answer\", version = {version} }} }}\n\
             cost = {{ input_per_mtok = 0.05, output_per_mtok = 0.2 }}\n"
        )).unwrap();
        path
    };
    let v1 = target("v1", 1);
    let v2 = target("v2", 2);
    // A model the server does not have: every request fails, and the run still reports.
    let (ok, out, _) = cli.run(&[
        "eval",
        "run",
        suite.to_str().unwrap(),
        "--target",
        v1.to_str().unwrap(),
        "--model",
        "no-such-model",
    ]);
    assert!(ok, "a run whose requests fail still completes and reports");
    assert!(
        out.contains("passed 0/12") && out.contains("request errors 12"),
        "{out}"
    );

    let html = dir.join("v1.html");
    let base = cli.eval_run(&suite, &v1, &["-c", "1", "--html", html.to_str().unwrap()]);
    assert!(std::fs::read_to_string(&html).unwrap().contains("<svg"));
    let again = cli.eval_run(&suite, &v1, &["-c", "1"]);
    let worse = cli.eval_run(&suite, &v2, &["-c", "1"]);

    let (ok, listed, _) = cli.run(&["eval", "list"]);
    assert!(
        ok && [&base, &again, &worse]
            .iter()
            .all(|id| listed.contains(id.as_str())),
        "{listed}"
    );
    let (ok, cmp, err) = cli.run(&["eval", "compare", &base, &worse]);
    assert!(ok, "{err}");
    assert!(
        cmp.contains("pass → fail") && cmp.contains("WORSE"),
        "{cmp}"
    );

    let (ok, said, _) = cli.run(&["eval", "gate", &base, &again, "--max-regression", "0.05"]);
    assert!(ok, "an equal candidate passes: {said}");
    let (ok, _, said) = cli.run(&["eval", "gate", &base, &worse, "--max-regression", "0.05"]);
    assert!(
        !ok && said.contains("regression"),
        "the worse prompt is blocked: {said}"
    );

    // Every eval request was logged with its text: replay five against the same route.
    let (ok, out, err) = cli.run(&[
        "eval",
        "replay",
        "--source",
        &url,
        "--sample",
        "5",
        "--since",
        "1h",
        "--target",
        v1.to_str().unwrap(),
    ]);
    assert!(ok, "{out}\n{err}");
    eprintln!("{out}");
    assert!(
        out.contains("checker") && out.contains("similar") && out.contains("latency_ms"),
        "{out}"
    );
    let stored = out
        .lines()
        .find_map(|l| l.strip_prefix("stored as "))
        .expect("stored");
    assert!(stored.starts_with("replay-"), "{stored}");
    let _ = std::fs::remove_dir_all(&dir);
}
