//! `osprey prompts` on a real store: push two versions, label, list, show, diff, split and
//! roll back, as an operator would.

use std::process::Command;

fn osprey(store: &str, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_osprey"))
        .arg("prompts")
        .args(args)
        .args(["--store", store])
        .output()
        .expect("running osprey");
    let text = |b: Vec<u8>| String::from_utf8(b).unwrap();
    (out.status.success(), text(out.stdout), text(out.stderr))
}

#[test]
fn prompts_are_pushed_labelled_diffed_and_rolled_back() {
    let dir = std::env::temp_dir().join(format!("osprey-prompts-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let store = format!("sqlite://{}", dir.join("osprey.db").display());
    let file = dir.join("support.toml");
    let write = |system: &str| {
        let toml = format!(
            "[settings]\ntemperature = 0.2\n\n[[messages]]\nrole = \"system\"\ncontent = \"{system}\"\n"
        );
        std::fs::write(&file, toml).unwrap();
    };
    let path = file.to_str().unwrap();

    write("Help {{ customer }} with billing.");
    let (ok, out, err) = osprey(&store, &["push", "support", "--file", path]);
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "support@1 (variables: customer)");
    write("Help {{ customer }} with billing, politely.");
    assert_eq!(
        osprey(&store, &["push", "support", "--file", path])
            .1
            .trim(),
        "support@2 (variables: customer)"
    );

    std::fs::write(&file, "[[messages]]\nrole = \"wizard\"\ncontent = \"x\"\n").unwrap();
    let (ok, _, err) = osprey(&store, &["push", "support", "--file", path]);
    assert!(!ok && err.contains("role"), "a bad file is refused: {err}");

    assert!(osprey(&store, &["label", "support", "1", "production"]).0);
    let (_, listed, _) = osprey(&store, &["list"]);
    assert!(
        listed.contains("support") && listed.contains("production=1"),
        "{listed}"
    );
    let (_, shown, _) = osprey(&store, &["show", "support", "--label", "production"]);
    assert!(
        shown.contains("support@1") && shown.contains("with billing.\""),
        "{shown}"
    );
    let (_, diff, _) = osprey(&store, &["diff", "support", "1", "2"]);
    assert!(
        diff.contains("-content = \"Help {{ customer }} with billing.\""),
        "{diff}"
    );
    assert!(
        diff.contains("+content = \"Help {{ customer }} with billing, politely.\""),
        "{diff}"
    );

    let (ok, out, _) = osprey(&store, &["label", "support", "1:90,2:10", "production"]);
    assert!(ok && out.contains("1:90,2:10"), "{out}");
    assert!(
        !osprey(&store, &["label", "support", "7", "production"]).0,
        "an unknown version"
    );
    let (ok, out, _) = osprey(&store, &["rollback", "support", "production"]);
    assert!(ok && out.contains("production -> 1"), "{out}");
    let (ok, _, err) = osprey(&store, &["rollback", "support", "production"]);
    assert!(!ok, "nothing left to roll back: {err}");
    let _ = std::fs::remove_dir_all(&dir);
}
