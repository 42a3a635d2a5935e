//! The deployment recipe in `deploy/` follows the code:
//! - it uses only flags and `OSPREY_*` variables the CLI has: a renamed flag breaks this test,
//!   not a cluster;
//! - the gateways list every worker, share the store and Redis, and keep their probes;
//! - `.dockerignore` keeps `target/` out of the image's build context, and nothing the build
//!   reads;
//! - run as local processes (the manifests' commands and environment, with the local Postgres,
//!   Redis and worker in place of the cluster's Services), two gateways and a worker serve as
//!   the cluster would: a key created through one gateway works on the other, and the two
//!   share one rate limit.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use osprey_testkit::{Process, free_port};
use serde_json::{Value, json};

use crate::support::ServerSlot;

fn help(subcommand: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_osprey"))
        .args(subcommand.split(' '))
        .arg("--help")
        .output()
        .expect("running osprey --help");
    assert!(out.status.success());
    String::from_utf8(out.stdout).expect("UTF-8 help")
}

/// `OSPREY_*` names in `text`.
fn variables(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for (i, _) in text.match_indices("OSPREY_") {
        let name: String = text[i..]
            .chars()
            .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
            .collect();
        found.insert(name);
    }
    found
}

/// The subcommand (with its own subcommand: `eval replay`) and flags of each `args: [...]` line.
fn invocations(text: &str) -> Vec<(String, Vec<String>)> {
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("args: ["))
        .map(|list| {
            let items: Vec<String> = (list.trim_end_matches(']').split(','))
                .map(|s| s.trim().trim_matches('"').to_owned())
                .collect();
            let flags = items
                .iter()
                .filter(|i| i.starts_with("--"))
                .cloned()
                .collect();
            let words = items.iter().take_while(|i| !i.starts_with("--"));
            (words.take(2).cloned().collect::<Vec<_>>().join(" "), flags)
        })
        .collect()
}

#[test]
fn every_flag_and_variable_in_deploy_exists_in_the_cli() {
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy");
    let mut checked = 0;
    for entry in std::fs::read_dir(deploy.join("k8s")).expect("deploy/k8s") {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        for (subcommand, flags) in invocations(&text) {
            if !matches!(subcommand.as_str(), "serve" | "worker" | "eval replay") {
                continue;
            }
            let help = help(&subcommand);
            for flag in flags {
                assert!(
                    help.contains(&format!("{flag} ")) || help.contains(&format!("{flag}\n")),
                    "{}: `osprey {subcommand}` has no flag {flag}",
                    path.display()
                );
                checked += 1;
            }
            for var in variables(&text) {
                assert!(
                    help.contains(&format!("env: {var}="))
                        || help.contains(&format!("env: {var}]")),
                    "{}: `osprey {subcommand}` reads no variable {var}",
                    path.display()
                );
                checked += 1;
            }
        }
    }
    let dockerfile = std::fs::read_to_string(deploy.join("Dockerfile")).unwrap();
    let serve = help("serve");
    for var in variables(&dockerfile) {
        // OSPREY_HOME is where models and the store live, read by every command.
        let known = var == "OSPREY_HOME" || serve.contains(&format!("env: {var}="));
        assert!(known, "Dockerfile: no command reads {var}");
        checked += 1;
    }
    assert!(
        checked > 10,
        "the manifests were read ({checked} names checked)"
    );
}

/// `osprey_*` metric names in `text`, without a histogram's `_bucket`, `_sum` or `_count`.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for (i, _) in text.match_indices("osprey_") {
        if i > 0 && text.as_bytes()[i - 1].is_ascii_alphanumeric() {
            continue;
        }
        let name: String = text[i..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
            .collect();
        let base = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .unwrap_or(&name);
        found.insert(base.to_owned());
    }
    found
}

#[test]
fn alert_rules_and_the_dashboard_name_only_metrics_osprey_exports() {
    let source = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../osprey-core/src/metrics.rs"),
    )
    .unwrap();
    let known: BTreeSet<String> = (source.lines())
        .filter_map(|l| l.split_once(": &str = \"")?.1.strip_suffix("\";"))
        .map(str::to_owned)
        .collect();
    assert!(known.len() > 50, "the metric names were read");
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy");
    for file in ["prometheus/alerts.yml", "grafana/osprey-dashboard.json"] {
        let text = std::fs::read_to_string(deploy.join(file)).unwrap();
        let used = metric_names(&text);
        assert!(used.len() > 5, "{file} names metrics");
        let unknown: Vec<_> = used.difference(&known).collect();
        assert!(
            unknown.is_empty(),
            "{file} names metrics Osprey does not export: {unknown:?}"
        );
    }
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(deploy.join("grafana/osprey-dashboard.json")).unwrap(),
    )
    .unwrap();
    assert!(
        dashboard["panels"]
            .as_array()
            .is_some_and(|p| p.len() >= 10)
    );
}

/// A file of `deploy/`.
fn deploy_file(path: &str) -> String {
    let full = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy")
        .join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{}: {e}", full.display()))
}

/// A container's variable, as its manifest gives it.
#[derive(Debug, Clone, PartialEq)]
enum EnvValue {
    /// `value: ...`
    Literal(String),
    /// `valueFrom: {secretKeyRef: {name, key}}`
    Secret { name: String, key: String },
}

/// The one container of a manifest file: its `args` and `env`, in order.
#[derive(Debug)]
struct Container {
    args: Vec<String>,
    env: Vec<(String, EnvValue)>,
}

impl Container {
    fn var(&self, name: &str) -> &EnvValue {
        (self.env.iter().find(|(n, _)| n == name))
            .map(|(_, v)| v)
            .unwrap_or_else(|| panic!("the container sets no {name}"))
    }

    /// The value given to `flag` in `args`.
    fn arg(&self, flag: &str) -> &str {
        let at = (self.args.iter().position(|a| a == flag))
            .unwrap_or_else(|| panic!("no {flag} in {:?}", self.args));
        &self.args[at + 1]
    }
}

/// `line` without its `# comment`, if any (a `#` outside quotes, at the start or after a space).
fn without_comment(line: &str) -> &str {
    let mut quoted = false;
    for (i, c) in line.char_indices() {
        match c {
            '"' => quoted = !quoted,
            '#' if !quoted && (i == 0 || line[..i].ends_with(' ')) => return line[..i].trim_end(),
            _ => {}
        }
    }
    line.trim_end()
}

/// A plain or double-quoted scalar.
fn scalar(s: &str) -> String {
    let s = s.trim();
    (s.strip_prefix('"').and_then(|s| s.strip_suffix('"')))
        .unwrap_or(s)
        .to_owned()
}

/// The items of a flow collection's inside (`a, "b,c", d`): split at commas outside quotes.
fn flow_items(inside: &str) -> Vec<&str> {
    let (mut items, mut start, mut quoted) = (Vec::new(), 0, false);
    for (i, c) in inside.char_indices() {
        match c {
            '"' => quoted = !quoted,
            ',' if !quoted => {
                items.push(inside[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(inside[start..].trim());
    items.retain(|i| !i.is_empty());
    items
}

/// A flow mapping: `{name: osprey, key: admin-key}`.
fn flow_map(text: &str) -> BTreeMap<String, String> {
    let inside = (text
        .trim()
        .strip_prefix('{')
        .and_then(|t| t.strip_suffix('}')))
    .unwrap_or_else(|| panic!("not a flow mapping: {text}"));
    (flow_items(inside).into_iter())
        .map(|item| {
            let (k, v) =
                (item.split_once(':')).unwrap_or_else(|| panic!("not `key: value`: {item}"));
            (k.trim().to_owned(), scalar(v))
        })
        .collect()
}

fn indent(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

/// The container of a manifest file that has one (its only `args:` line and `env:` list), read
/// in the plain forms the manifests use: `args: ["a", "b"]`, and `env` items as
/// `{name: N, value: "V"}`, or `name:` with `value:` or `valueFrom: secretKeyRef: {...}` below.
fn container(text: &str) -> Container {
    let lines: Vec<&str> = (text.lines().map(without_comment))
        .filter(|l| !l.trim().is_empty())
        .collect();
    let args: Vec<&str> = (lines.iter())
        .filter_map(|l| l.trim().strip_prefix("args: "))
        .collect();
    assert_eq!(args.len(), 1, "one container with args: {args:?}");
    let inside = (args[0].strip_prefix('[').and_then(|a| a.strip_suffix(']')))
        .expect("args: [...] on one line");
    let args = flow_items(inside).into_iter().map(scalar).collect();

    let start = (lines.iter().position(|l| l.trim() == "env:")).expect("an env: list");
    let mut items: Vec<Vec<&str>> = Vec::new();
    for line in lines[start + 1..]
        .iter()
        .take_while(|l| indent(l) > indent(lines[start]))
    {
        match line.trim().strip_prefix("- ") {
            Some(first) => items.push(vec![first]),
            None => items.last_mut().expect("an env item").push(line.trim()),
        }
    }
    let env = (items.into_iter())
        .map(|item| {
            let mut fields = BTreeMap::new();
            for line in item {
                if line.starts_with('{') {
                    fields.extend(flow_map(line));
                    continue;
                }
                let (k, v) = (line.split_once(':')).unwrap_or_else(|| panic!("env: {line}?"));
                if v.trim().starts_with('{') {
                    for (field, value) in flow_map(v) {
                        fields.insert(format!("{}.{field}", k.trim()), value);
                    }
                } else {
                    fields.insert(k.trim().to_owned(), scalar(v));
                }
            }
            let name = fields.remove("name").expect("an env item's name");
            let value = match (
                fields.get("value"),
                fields.get("secretKeyRef.name"),
                fields.get("secretKeyRef.key"),
            ) {
                (Some(v), None, None) => EnvValue::Literal(v.clone()),
                (None, Some(secret), Some(key)) => EnvValue::Secret {
                    name: secret.clone(),
                    key: key.clone(),
                },
                _ => panic!("{name}: neither a value nor a Secret's key: {fields:?}"),
            };
            (name, value)
        })
        .collect();
    Container { args, env }
}

/// The `name` of the first object of `kind` in a manifest file.
fn name_of(text: &str, kind: &str) -> String {
    let mut lines = text.lines().map(str::trim);
    lines
        .find(|l| *l == format!("kind: {kind}"))
        .unwrap_or_else(|| panic!("no {kind}"));
    let name = lines
        .find_map(|l| l.strip_prefix("name: "))
        .expect("a name");
    scalar(name)
}

/// The value of the only `key:` line of a manifest file.
fn only(text: &str, key: &str) -> String {
    let prefix = format!("{key}: ");
    let values: Vec<&str> = (text.lines())
        .filter_map(|l| without_comment(l).trim().strip_prefix(&prefix))
        .collect();
    assert_eq!(values.len(), 1, "one `{key}:` line: {values:?}");
    scalar(values[0])
}

/// The HTTP path of a container's probe (`readinessProbe` or `livenessProbe`).
fn probe_path(text: &str, probe: &str) -> String {
    let mut lines = (text.lines().map(without_comment))
        .map(str::trim)
        .filter(|l| !l.is_empty());
    lines
        .find(|l| *l == format!("{probe}:"))
        .unwrap_or_else(|| panic!("no {probe}"));
    let http = (lines.next().and_then(|l| l.strip_prefix("httpGet: ")))
        .unwrap_or_else(|| panic!("{probe} is not an httpGet"));
    flow_map(http)["path"].clone()
}

#[test]
fn the_gateways_list_every_worker_share_the_store_and_redis_and_keep_their_probes() {
    let (gateway_yaml, workers_yaml) = (
        deploy_file("k8s/gateway.yaml"),
        deploy_file("k8s/workers.yaml"),
    );
    let (gateway, worker) = (container(&gateway_yaml), container(&workers_yaml));

    // Each worker by its stable name: pod N of the StatefulSet, under its headless Service.
    let set = name_of(&workers_yaml, "StatefulSet");
    let service = only(&workers_yaml, "serviceName");
    assert_eq!(name_of(&workers_yaml, "Service"), service);
    assert_eq!(
        only(&workers_yaml, "clusterIP"),
        "None",
        "a headless Service"
    );
    let replicas: usize = only(&workers_yaml, "replicas").parse().unwrap();
    let port = worker.arg("--port");
    let every_worker: Vec<String> = (0..replicas)
        .map(|n| format!("http://{set}-{n}.{service}:{port}"))
        .collect();
    assert_eq!(
        gateway.var("OSPREY_WORKER"),
        &EnvValue::Literal(every_worker.join(",")),
        "the gateways list every worker of the StatefulSet"
    );

    // One store for every replica (and for the nightly replay's runs), from the Secret.
    let store = EnvValue::Secret {
        name: "osprey".into(),
        key: "store-url".into(),
    };
    assert_eq!(gateway.var("OSPREY_STORE"), &store);
    let replay = deploy_file("k8s/eval-replay.yaml");
    assert!(replay.contains("secretKeyRef: {name: osprey, key: store-url}"));
    let postgres = deploy_file("k8s/postgres.yaml");
    assert_eq!(name_of(&postgres, "Service"), "osprey-postgres");
    // One Redis, the Service of redis.yaml.
    let redis = deploy_file("k8s/redis.yaml");
    let redis_port = (redis.lines().map(str::trim))
        .find_map(|l| l.strip_prefix("- ").filter(|m| m.starts_with("{port:")))
        .map(|m| flow_map(m)["port"].clone())
        .expect("the Redis Service's port");
    assert_eq!(
        gateway.var("OSPREY_REDIS"),
        &EnvValue::Literal(format!(
            "redis://{}:{redis_port}",
            name_of(&redis, "Service")
        ))
    );
    assert_eq!(
        gateway.var("OSPREY_ADMIN_KEY"),
        &EnvValue::Secret {
            name: "osprey".into(),
            key: "admin-key".into()
        }
    );

    // Probes: ready once it can serve, alive while it answers at all.
    for text in [&gateway_yaml, &workers_yaml] {
        assert_eq!(probe_path(text, "readinessProbe"), "/ready");
        assert_eq!(probe_path(text, "livenessProbe"), "/health");
    }
}

/// Whether a `.dockerignore` pattern (`*` and `?` within a name, `**` for any folders) matches
/// `path`'s components.
fn pattern_matches(pattern: &[&str], path: &[&str]) -> bool {
    fn glob(p: &[u8], s: &[u8]) -> bool {
        match (p.split_first(), s.split_first()) {
            (None, _) => s.is_empty(),
            (Some((b'*', rest)), _) => (0..=s.len()).any(|i| glob(rest, &s[i..])),
            (Some((b'?', rest)), Some((_, tail))) => glob(rest, tail),
            (Some((c, rest)), Some((d, tail))) => c == d && glob(rest, tail),
            (Some(_), None) => false,
        }
    }
    match pattern.split_first() {
        None => path.is_empty(),
        Some((&"**", rest)) => (0..=path.len()).any(|i| pattern_matches(rest, &path[i..])),
        Some((p, rest)) => path.split_first().is_some_and(|(s, tail)| {
            glob(p.as_bytes(), s.as_bytes()) && pattern_matches(rest, tail)
        }),
    }
}

/// Every file under `dir`, as paths relative to `root`; Python caches are not sources.
fn files_under(root: &Path, dir: &Path, out: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n != "__pycache__") {
                files_under(root, &path, out);
            }
        } else {
            let relative = path.strip_prefix(root).unwrap();
            out.push(relative.to_str().expect("a UTF-8 path").to_owned());
        }
    }
}

#[test]
fn the_docker_build_context_leaves_target_out_and_keeps_what_the_build_reads() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let ignore = std::fs::read_to_string(root.join(".dockerignore")).expect(".dockerignore");
    let patterns: Vec<Vec<&str>> = (ignore.lines().map(str::trim))
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|p| {
            assert!(!p.starts_with('!'), "exceptions are not read here: {p}");
            let p = p.trim_start_matches('/').trim_end_matches('/');
            p.split('/').collect()
        })
        .collect();
    // Docker leaves out a path that a pattern matches, or that lies in a folder one matches.
    let ignored = |path: &str| {
        let parts: Vec<&str> = path.split('/').collect();
        (1..=parts.len()).any(|n| patterns.iter().any(|p| pattern_matches(p, &parts[..n])))
    };
    for out in [
        "target/release/osprey",
        "fuzz/target/debug/x",
        ".git/HEAD",
        ".osprey/models/m.gguf",
    ] {
        assert!(ignored(out), "{out} is sent to the Docker daemon");
    }

    // The image is built from `COPY . .` alone: the workspace's manifests, lock file, cargo
    // settings and every crate's files (sources, migrations, data read with include_str!).
    let dockerfile = deploy_file("Dockerfile");
    for copy in dockerfile.lines().filter(|l| l.starts_with("COPY ")) {
        assert!(
            copy == "COPY . ." || copy.starts_with("COPY --from="),
            "a COPY this test does not know: {copy}"
        );
    }
    let mut needed = vec!["Cargo.toml".to_owned(), "Cargo.lock".to_owned()];
    files_under(&root, &root.join(".cargo"), &mut needed);
    files_under(&root, &root.join("crates"), &mut needed);
    assert!(
        needed.len() > 100,
        "the sources were listed: {}",
        needed.len()
    );
    let left_out: Vec<&String> = needed.iter().filter(|p| ignored(p)).collect();
    assert!(
        left_out.is_empty(),
        ".dockerignore leaves out what the build reads: {left_out:?}"
    );
}

/// A process started from a manifest's container, as its pod would run it: a folder of its own
/// for `OSPREY_HOME` (holding the default model, as the image does), and the container's
/// environment only. Its output goes to a log, shown if the test fails.
struct Pod {
    name: &'static str,
    log: PathBuf,
    _process: Process,
}

impl Drop for Pod {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            eprintln!("--- {} (last lines) ---\n{}", self.name, tail.join("\n"));
        }
    }
}

/// A folder, removed when dropped.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What stands in, on this machine, for what only the cluster has.
struct Local {
    /// The Secret `osprey`'s keys.
    secrets: BTreeMap<&'static str, String>,
    /// The Redis Service.
    redis: String,
    /// The workers' stable names.
    workers: String,
}

impl Local {
    /// `name`'s value in the local process: the manifest's, or its local stand-in.
    fn value(&self, name: &str, value: &EnvValue) -> String {
        match (name, value) {
            (_, EnvValue::Secret { name: secret, key }) => {
                assert_eq!(secret, "osprey", "{name}: an unknown Secret");
                (self.secrets.get(key.as_str()))
                    .unwrap_or_else(|| panic!("{name}: no local value for the Secret's {key}"))
                    .clone()
            }
            // A pod listens on its own address; here, on loopback.
            ("OSPREY_HOST", _) => "127.0.0.1".into(),
            ("OSPREY_REDIS", _) => self.redis.clone(),
            ("OSPREY_WORKER", _) => self.workers.clone(),
            // Sized for a pod of 4 CPUs: here, one thread (the machine runs other tests).
            ("OSPREY_THREADS", _) => "1".into(),
            (_, EnvValue::Literal(v)) => {
                assert!(
                    !v.contains("osprey-"),
                    "{name}={v} names a cluster Service this test has no stand-in for"
                );
                v.clone()
            }
        }
    }

    /// Starts `container` as pod `name` listening on `port`, in a folder of its own under `dir`.
    fn start(&self, name: &'static str, container: &Container, port: u16, dir: &Path) -> Pod {
        let home = dir.join(name);
        let models = home.join("models");
        std::fs::create_dir_all(&models).unwrap();
        let model = osprey_testkit::default_model();
        let file = model.file_name().unwrap().to_str().unwrap();
        std::os::unix::fs::symlink(&model, models.join(file)).unwrap();
        // The fetch's stamp: the file is known verified, not hashed again.
        let stamp = format!("{file}.sha256");
        let _ = std::fs::copy(model.with_file_name(&stamp), models.join(&stamp));

        let mut args = container.args.clone();
        let at = (args.iter().position(|a| a == "--port")).expect("a --port in args");
        args[at + 1] = port.to_string();
        let mut command = Command::new(env!("CARGO_BIN_EXE_osprey"));
        command.args(&args);
        for (var, _) in std::env::vars_os() {
            if var.to_string_lossy().starts_with("OSPREY_") {
                command.env_remove(var);
            }
        }
        command.env("OSPREY_HOME", &home);
        for (var, value) in &container.env {
            command.env(var, self.value(var, value));
        }
        let log = home.join("osprey.log");
        let out = std::fs::File::create(&log).unwrap();
        command
            .stdout(Stdio::from(out.try_clone().unwrap()))
            .stderr(Stdio::from(out));
        Pod {
            name,
            log,
            _process: Process::spawn(&mut command),
        }
    }
}

/// The key's requests a minute: two on each gateway spend them.
const RPM: u64 = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_as_deployed_share_keys_and_one_rate_limit() {
    let Ok(redis) = std::env::var("OSPREY_TEST_REDIS_URL") else {
        eprintln!("SKIPPED: OSPREY_TEST_REDIS_URL is not set (.ci/run sets it)");
        return;
    };
    let Some(store) = osprey_store::testing::postgres_url().await else {
        eprintln!("SKIPPED: OSPREY_TEST_POSTGRES_URL is not set (.ci/run sets it)");
        return;
    };
    let _slot = ServerSlot::take_async().await;
    tokio::task::spawn_blocking(osprey_testkit::default_model)
        .await
        .expect("the default model");
    let gateway_yaml = deploy_file("k8s/gateway.yaml");
    let workers_yaml = deploy_file("k8s/workers.yaml");
    let (gateway, worker) = (container(&gateway_yaml), container(&workers_yaml));

    let dir =
        TempDir(std::env::temp_dir().join(format!("osprey-deploy-{:016x}", rand::random::<u64>())));
    let admin_key = format!("admin-{:016x}", rand::random::<u64>());
    let worker_port = free_port();
    let worker_url = format!("http://127.0.0.1:{worker_port}");
    let local = Local {
        secrets: BTreeMap::from([("admin-key", admin_key.clone()), ("store-url", store)]),
        redis,
        workers: worker_url.clone(),
    };
    // Dropped before `dir`: the processes stop before their folders go.
    let _worker = local.start("worker", &worker, worker_port, &dir.0);
    let ports = [free_port(), free_port()];
    let _a = local.start("gateway-a", &gateway, ports[0], &dir.0);
    let _b = local.start("gateway-b", &gateway, ports[1], &dir.0);
    let [a, b] = ports.map(|p| format!("http://127.0.0.1:{p}"));

    // Ready as Kubernetes sees it: the readiness probe answers 200 (a gateway's once its worker
    // is live); and alive.
    let client = reqwest::Client::new();
    for (text, url) in [
        (&workers_yaml, &worker_url),
        (&gateway_yaml, &a),
        (&gateway_yaml, &b),
    ] {
        crate::support::up(&client, url, &probe_path(text, "readinessProbe")).await;
        let live = client
            .get(format!("{url}{}", probe_path(text, "livenessProbe")))
            .send()
            .await
            .unwrap();
        assert_eq!(live.status(), 200, "{url} is alive");
    }

    // A key created through gateway A, with a low limit, in a tenant of this run alone.
    let tenant = format!("deploy-{:08x}", rand::random::<u32>());
    let r = client
        .post(format!("{a}/admin/keys"))
        .bearer_auth(&admin_key)
        .json(&json!({"tenant": tenant, "name": "deploy", "rpm": RPM}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
    let created: Value = r.json().await.unwrap();
    let key = created["key"].as_str().expect("the new key").to_owned();

    // It works on gateway B at once: B reads it from the same store (with a store of its own,
    // B would answer 401 to a key it does not hold). Listing models charges nothing.
    let r = client
        .get(format!("{b}/v1/models"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "the key created through A works on B");
    let models: Value = r.json().await.unwrap();
    let model = models["data"][0]["id"]
        .as_str()
        .expect("a model")
        .to_owned();

    // The limit is one for both gateways: RPM requests, alternately through A and B, spend it,
    // and the next is refused on either, where each gateway alone has counted only half of it.
    let chat = |gateway: &str, n: u64| {
        client
            .post(format!("{gateway}/v1/chat/completions"))
            .bearer_auth(&key)
            .json(&json!({
                "model": model,
                "messages": [{"role": "user", "content": format!("Count to {n}.")}],
                "max_tokens": 1,
            }))
            .send()
    };
    for n in 0..RPM {
        let (name, gateway) = if n % 2 == 0 { ("A", &a) } else { ("B", &b) };
        let r = chat(gateway, n).await.unwrap();
        assert_eq!(
            r.status(),
            200,
            "request {n} through {name}, within the key's {RPM} a minute: {}",
            r.text().await.unwrap()
        );
    }
    for (name, gateway) in [("A", &a), ("B", &b)] {
        let r = chat(gateway, RPM).await.unwrap();
        assert_eq!(
            r.status(),
            429,
            "{name} has served {} of the key's {RPM} requests a minute, A and B together {RPM}: \
             one limit for both",
            RPM / 2
        );
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["error"]["code"], "rate_limit_exceeded", "{body}");
    }
}
