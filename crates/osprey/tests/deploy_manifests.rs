//! The deployment recipe in `deploy/` uses only flags and `OSPREY_*` variables the CLI has: a
//! renamed flag breaks this test, not a cluster.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

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
