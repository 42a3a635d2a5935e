//! Test fixtures shared by Osprey's crates (a dev-dependency only).
//!
//! - [`default_model`]: the real default model, fetched once per machine through the same code
//!   as `osprey models fetch` (so a fresh clone's `cargo test` needs no manual step);
//! - [`golden`]: llama.cpp's reference outputs for that model (`data/golden/`), or another file
//!   of the same shape named by `OSPREY_GOLDEN` (held-out checks run the same tests on it);
//! - [`shared_engine`]: one engine per test process over the default model; [`engine`] and
//!   [`test_config`] for tests that need their own;
//! - [`backend`]: a scripted [`osprey_core::backend::Backend`], for what is done with an
//!   answer's events without a real model;
//! - [`scripted`]: a scripted agent model, for the orchestrator's logic without a real model;
//!   [`mcp_servers`]: real third-party MCP servers from the npm registry;
//! - [`eventually`]: waits for a condition instead of a fixed sleep before an assertion.
#![deny(missing_docs)]

pub mod backend;
pub mod scripted;
mod wait;

pub use wait::{eventually, eventually_blocking};

use std::path::PathBuf;
use std::sync::OnceLock;

use osprey_engine::{Engine, EngineConfig};
use serde::Deserialize;

/// Path of the default model, fetching it on first use.
pub fn default_model() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| fetched(&osprey_models::DEFAULT_MODEL))
        .clone()
}

/// Path of Gemma 3 270M (`gemma-3-270m`), fetching it on first use.
pub fn gemma_model() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| fetched(&osprey_models::fetch::GEMMA_3_270M))
        .clone()
}

fn fetched(source: &osprey_models::ModelSource) -> PathBuf {
    let home = osprey_models::osprey_home();
    osprey_models::fetch(source, &home, &mut |_| {})
        .unwrap_or_else(|e| panic!("fetching {} for tests: {e}", source.served_name))
}

/// An engine over the default model, shared by the tests of one process.
pub fn shared_engine() -> Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    let config = EngineConfig {
        name: Some(osprey_models::DEFAULT_MODEL.served_name.into()),
        ..test_config()
    };
    ENGINE.get_or_init(|| engine(config)).clone()
}

/// An engine over Gemma 3 270M (served as `gemma-3-270m`), shared by the tests of one process.
pub fn gemma_engine() -> Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    let load = || {
        let config = EngineConfig {
            name: Some(osprey_models::fetch::GEMMA_3_270M.served_name.into()),
            ..test_config()
        };
        Engine::load(&gemma_model(), config).expect("loading Gemma 3 270M")
    };
    ENGINE.get_or_init(load).clone()
}

/// The engine configuration tests start from: the defaults with a 256 MiB KV pool.
pub fn test_config() -> EngineConfig {
    EngineConfig {
        kv_cache_bytes: 256 << 20,
        ..EngineConfig::default()
    }
}

/// A new engine of its own over the default model.
pub fn engine(config: EngineConfig) -> Engine {
    Engine::load(&default_model(), config).expect("loading the default model")
}

/// llama.cpp's outputs on the default model (see `data/golden/README.md`).
#[derive(Debug, Deserialize)]
pub struct Golden {
    /// Text → ids.
    pub tokenizer: Vec<TokenizerCase>,
    /// Chat template renders (none for a base model).
    #[serde(default)]
    pub chat_template_renders: Vec<TemplateCase>,
    /// Teacher-forced next-token predictions.
    pub teacher_forced: Vec<TeacherForcedCase>,
    /// Greedy continuations.
    pub greedy: Vec<GreedyCase>,
    /// Perplexity of one long text.
    pub perplexity: PerplexityCase,
}

/// A tokenization.
#[derive(Debug, Deserialize)]
pub struct TokenizerCase {
    /// Input.
    pub text: String,
    /// Expected ids (no BOS).
    pub ids: Vec<u32>,
}

/// A chat template render.
#[derive(Debug, Deserialize)]
pub struct TemplateCase {
    /// Conversation.
    pub messages: Vec<osprey_core::api::ChatMessage>,
    /// Expected text, with the generation prompt.
    pub rendered: String,
}

/// Teacher-forced logits summary for one text.
#[derive(Debug, Deserialize)]
pub struct TeacherForcedCase {
    /// The text's ids.
    pub ids: Vec<u32>,
    /// Argmax after `ids[..=i]`.
    pub top1: Vec<u32>,
    /// `log p(ids[i+1] | ids[..=i])`.
    pub next_logprob: Vec<f64>,
    /// Five best `(id, logprob)` after `ids[..=i]`.
    pub top5: Vec<Vec<(u32, f64)>>,
}

/// A greedy continuation.
#[derive(Debug, Deserialize)]
pub struct GreedyCase {
    /// `raw` or `chat`.
    pub kind: String,
    /// Prompt ids (rendered and tokenized for chat).
    pub prompt_ids: Vec<u32>,
    /// llama.cpp's greedy continuation.
    pub greedy_ids: Vec<u32>,
    /// The raw prompt text (raw cases).
    #[serde(default)]
    pub prompt: Option<String>,
    /// The conversation (chat cases).
    #[serde(default)]
    pub messages: Option<Vec<osprey_core::api::ChatMessage>>,
}

/// The perplexity text.
#[derive(Debug, Deserialize)]
pub struct PerplexityCase {
    /// The text.
    pub text: String,
    /// Its ids.
    pub ids: Vec<u32>,
    /// llama.cpp's perplexity over positions 1..n.
    pub perplexity: f64,
}

/// The golden file: `$OSPREY_GOLDEN` if set, else the bundled one.
pub fn golden() -> &'static Golden {
    static GOLDEN: OnceLock<Golden> = OnceLock::new();
    GOLDEN.get_or_init(|| {
        let path = std::env::var_os("OSPREY_GOLDEN").map_or_else(
            || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("data/golden/smollm2-135m-q4_1.json"),
            PathBuf::from,
        );
        read_golden(&path)
    })
}

/// llama.cpp's outputs on Gemma 3 270M (`data/golden/gemma-3-270m-q4_k_m.json`, made by
/// `scripts/gemma3-golden.py`).
pub fn gemma_golden() -> &'static Golden {
    static GOLDEN: OnceLock<Golden> = OnceLock::new();
    GOLDEN.get_or_init(|| {
        read_golden(
            &PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("data/golden/gemma-3-270m-q4_k_m.json"),
        )
    })
}

fn read_golden(path: &std::path::Path) -> Golden {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()))
}

/// A Python interpreter with the official `openai` package: `$OSPREY_TEST_PYTHON`, or a
/// virtual environment under `$OSPREY_HOME/test-venv`, created (once per machine) if missing.
pub fn openai_python() -> PathBuf {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON
        .get_or_init(|| {
            if let Some(p) = std::env::var_os("OSPREY_TEST_PYTHON") {
                return PathBuf::from(p);
            }
            let home = osprey_models::osprey_home();
            let venv = home.join("test-venv");
            let python = venv.join("bin").join("python");
            std::fs::create_dir_all(&home).expect("creating OSPREY_HOME");
            let lock = std::fs::File::create(home.join(".test-venv.lock"))
                .expect("creating the venv lock");
            lock.lock().expect("locking the venv");
            let ready = venv.join(".openai-installed");
            if !ready.exists() {
                eprintln!(
                    "creating {} with the openai package (first run only)",
                    venv.display()
                );
                run(std::process::Command::new("python3")
                    .args(["-m", "venv"])
                    .arg(&venv));
                run(std::process::Command::new(&python).args([
                    "-m",
                    "pip",
                    "install",
                    "-q",
                    "--disable-pip-version-check",
                    "openai",
                ]));
                std::fs::write(&ready, "").expect("marking the venv ready");
            }
            python
        })
        .clone()
}

/// The MCP servers the agent tests run against, from the npm registry: the reference
/// `@modelcontextprotocol/server-everything` and `server-filesystem`, pinned, installed once
/// per machine under `$OSPREY_HOME/mcp-servers`. Returns the folder of their commands
/// (`mcp-server-everything`, `mcp-server-filesystem`).
pub fn mcp_servers() -> PathBuf {
    const PACKAGES: [&str; 2] = [
        "@modelcontextprotocol/server-everything@2026.8.31",
        "@modelcontextprotocol/server-filesystem@2026.8.31",
    ];
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let dir = osprey_models::osprey_home().join("mcp-servers");
        std::fs::create_dir_all(&dir).expect("creating the MCP servers' folder");
        let lock = std::fs::File::create(dir.join(".lock")).expect("creating the npm lock");
        lock.lock().expect("locking the MCP servers' folder");
        let ready = dir.join(format!(
            ".installed-{}",
            PACKAGES.join("+").replace('/', "_")
        ));
        if !ready.exists() {
            eprintln!(
                "installing {PACKAGES:?} into {} (first run only)",
                dir.display()
            );
            run(std::process::Command::new("npm")
                .args(["install", "--no-audit", "--no-fund", "--prefix"])
                .arg(&dir)
                .args(PACKAGES));
            std::fs::write(&ready, "").expect("marking the MCP servers installed");
        }
        dir.join("node_modules").join(".bin")
    })
    .clone()
}

fn run(cmd: &mut std::process::Command) {
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    assert!(status.success(), "{cmd:?} failed with {status}");
}

/// A TCP port that was free a moment ago on 127.0.0.1.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("binding an ephemeral port")
}

/// A child process (a server under test), killed and reaped when dropped.
pub struct Process(pub std::process::Child);

impl Process {
    /// Starts `cmd` with its stdin closed.
    pub fn spawn(cmd: &mut std::process::Command) -> Self {
        let child = (cmd.stdin(std::process::Stdio::null()).spawn())
            .unwrap_or_else(|e| panic!("starting {cmd:?}: {e}"));
        Self(child)
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
