//! The deployment recipe in `deploy/` uses only flags and `OSPREY_*` variables the CLI has: a
//! renamed flag breaks this test, not a cluster.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

fn help(subcommand: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_osprey"))
        .args([subcommand, "--help"])
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

/// The subcommand and flags of each `args: [...]` line.
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
            (items[0].clone(), flags)
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
            if !matches!(subcommand.as_str(), "serve" | "worker") {
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
