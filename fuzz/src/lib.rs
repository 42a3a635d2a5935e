//! The entry points of Osprey's fuzz targets: every parser an attacker (or a bad file) reaches,
//! each taking raw bytes. None may panic, hang or allocate without bound, whatever the bytes.
//!
//! cargo-fuzz drives them (`fuzz_targets/`, one line each; `reliability/fuzz.sh` runs them all
//! for a fixed time and keeps the corpus). `crates/osprey/tests/fuzz_corpus.rs` includes this
//! file and replays the kept corpus and every input that ever crashed (`fuzz/regressions/`)
//! through the same functions on stable, so CI holds every fix.
//!
//! The tokenizer, chat template and grammar compiler are the default model's (fetched on first
//! use, like the tests do): the targets exercise what a request really meets.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use axum::body::{Body, Bytes};
use axum::response::Response;
use futures_util::StreamExt;
use osprey_core::Grammar;
use osprey_core::api::{ChatCompletionRequest, CompletionRequest, JsonBody, ToolMode};
use osprey_engine::{GrammarCompiler, Prompter, TemplateMessage};
use osprey_models::WeightSource;

/// A fuzz target's entry point.
pub type Target = fn(&[u8]);

/// Every target, by name, as cargo-fuzz and the corpus directories know them.
pub const TARGETS: &[(&str, Target)] = &[
    ("request_json", request_json),
    ("upstream_sse", upstream_sse),
    ("chat_template", chat_template),
    ("tokenizer", tokenizer),
    ("gguf_header", gguf_header),
    ("checkpoint_header", checkpoint_header),
    ("ingest", ingest),
    ("config", config),
];

/// A chat or completions request body, as the gateway takes it: parsed, validated, its prompt
/// rendered and tokenized, and any grammar it asks for (`response_format`, `osprey.grammar`,
/// tools) compiled against the model's vocabulary.
pub fn request_json(data: &[u8]) {
    let Ok(body) = JsonBody::parse(Bytes::copy_from_slice(data)) else {
        return;
    };
    if let Ok(req) = body.typed::<ChatCompletionRequest>() {
        let _ = osprey_engine::backend::chat::prompt_tokens(&req, prompter());
        let grammar = req.tool_mode().and_then(|mode| {
            let text = req.output_grammar()?;
            let tools = req.tools.as_deref().unwrap_or(&[]);
            match !tools.is_empty() && mode != ToolMode::None {
                true => osprey_engine::tools::answer_grammar(
                    tools,
                    &mode,
                    req.parallel_tool_calls(),
                    text.as_ref(),
                ),
                false => Ok(text),
            }
        });
        if let Ok(Some(g)) = grammar {
            compile(&g);
        }
    }
    if let Ok(req) = body.typed::<CompletionRequest>() {
        let _ = osprey_engine::backend::completions::prompt_tokens(&req, prompter());
        if let Ok(Some(g)) = req.output_grammar() {
            compile(&g);
        }
    }
}

/// An upstream's answer, cut into chunks at the sizes the first byte picks, served as
/// server-sent events or (when the first byte's bit 6 is set) as one JSON answer: read as typed
/// events by [`osprey_router::upstream::Upstream::answer`] (as a chat answer) and by
/// [`osprey_router::events::read`] (as a completion).
pub fn upstream_sse(data: &[u8]) {
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let size = usize::from(first % 64) + 1;
    let chunks: Vec<Bytes> = rest.chunks(size).map(Bytes::copy_from_slice).collect();
    let (url, served) = upstream_server();
    *served.lock().unwrap() = (first & 0x40 != 0, chunks.clone());
    runtime().block_on(async {
        let config: osprey_services::config::UpstreamConfig =
            serde_json::from_value(serde_json::json!({"url": url, "max_retries": 0}))
                .expect("an upstream config");
        let client = osprey_router::upstream::http_client();
        let upstream = osprey_router::upstream::Upstream::new("fuzz", &config, client)
            .expect("a valid upstream");
        let source = |chat| osprey_router::events::Source {
            model: "fuzz".into(),
            chat,
            prompt_tokens: 1,
            choices: 2,
        };
        let request = Bytes::from_static(br#"{"model": "fuzz", "messages": [], "stream": true}"#);
        let request = JsonBody::parse(request).expect("a JSON object");
        let headers = axum::http::HeaderMap::new();
        let answer = upstream.answer("chat/completions", &request, headers, source(true));
        if let Ok(events) = answer.await {
            let _: Vec<_> = events.collect().await;
        }
        let stream = futures_util::stream::iter(chunks.into_iter().map(Ok::<_, std::io::Error>));
        let events = osprey_router::events::read(stream, source(false));
        let _: Vec<_> = events.collect().await;
    });
}

/// A conversation rendered with the model's chat template: messages separated by NUL, each
/// `role` SOH `content` (a message without SOH is a user's).
pub fn chat_template(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let messages: Vec<TemplateMessage> = (text.split('\0'))
        .map(|m| match m.split_once('\u{1}') {
            Some((role, content)) => TemplateMessage {
                role: role.to_owned(),
                content: content.to_owned(),
            },
            None => TemplateMessage {
                role: "user".to_owned(),
                content: m.to_owned(),
            },
        })
        .collect();
    let _ = prompter().chat_tokens(&messages);
}

/// Text through the model's tokenizer and back, and token ids (4 bytes each, any value) decoded.
pub fn tokenizer(data: &[u8]) {
    let tokenizer = prompter().tokenizer();
    let text = String::from_utf8_lossy(data);
    for special in [false, true] {
        let ids = tokenizer.encode(&text, special);
        let _ = tokenizer.decode(&ids);
    }
    let ids: Vec<u32> = (data.chunks(4))
        .map(|c| {
            let mut word = [0; 4];
            word[..c.len()].copy_from_slice(c);
            u32::from_le_bytes(word) % (tokenizer.vocab_size() as u32 + 8)
        })
        .collect();
    let _ = tokenizer.decode(&ids);
}

/// A GGUF file: its header parsed and bounds-checked, then read as a model's config,
/// tokenizer and chat template, and each tensor's view taken.
pub fn gguf_header(data: &[u8]) {
    let path = scratch_dir().join("model.gguf");
    std::fs::write(&path, data).expect("writing the scratch file");
    let Ok(gguf) = osprey_models::GgufFile::open(&path) else {
        return;
    };
    let _ = osprey_models::ModelConfig::from_gguf(&gguf);
    let _ = Prompter::from_gguf(&gguf);
    let names: Vec<String> = gguf.tensor_names().map(str::to_owned).collect();
    for name in names {
        let _ = gguf.tensor(&name);
    }
}

/// An Osprey (MXFP4) checkpoint: `config.json` (the first part), the index's `formats` (the
/// second, a JSON object) and one safetensors shard (the rest), parts prefixed by their
/// 16-bit little-endian length. The index is written to match the shard (size, SHA-256, its
/// tensors), so the shard's header and the tensors behind it are reached; then every tensor is
/// read as the model loader would.
pub fn checkpoint_header(data: &[u8]) {
    use osprey_models::checkpoint::layout::{CONFIG_FILE, INDEX_FILE, shard_file};
    use sha2::Digest;
    let Some((config, rest)) = length_prefixed(data) else {
        return;
    };
    let Some((formats, shard)) = length_prefixed(rest) else {
        return;
    };
    let dir = scratch_dir();
    let file = shard_file(0, 1);
    let names: Vec<String> = safetensors::SafeTensors::read_metadata(shard)
        .map(|(_, meta)| meta.tensors().into_keys().collect())
        .unwrap_or_default();
    let index = serde_json::json!({
        "metadata": {
            "total_size": shard.len(),
            "format": "mxfp4",
            "shards": [{
                "file": file,
                "bytes": shard.len(),
                "sha256": format!("{:x}", sha2::Sha256::digest(shard)),
            }],
            "formats": serde_json::from_slice::<serde_json::Value>(formats)
                .ok()
                .filter(|f| f.is_object())
                .unwrap_or_default(),
        },
        "weight_map": names.iter().map(|n| (n.clone(), file.clone().into())).collect::<serde_json::Map<_, _>>(),
    });
    let write = |name: &str, bytes: &[u8]| std::fs::write(dir.join(name), bytes).expect("scratch");
    write(CONFIG_FILE, config);
    write(INDEX_FILE, &serde_json::to_vec(&index).expect("JSON"));
    write(&file, shard);
    let Ok(checkpoint) = osprey_models::Checkpoint::open(&dir) else {
        return;
    };
    for name in &names {
        let logical = name.strip_suffix(".blocks").unwrap_or(name);
        let _ = checkpoint.tensor(logical);
    }
}

/// A document for ingestion in the format the first byte picks (PDF, HTML, Markdown, text,
/// JSONL, gzip), parsed and chunked.
pub fn ingest(data: &[u8]) {
    const NAMES: [&str; 8] = [
        "doc.pdf",
        "doc.html",
        "doc.md",
        "doc.txt",
        "doc.jsonl",
        "doc.md.gz",
        "doc.pdf.gz",
        "doc",
    ];
    let Some((&first, bytes)) = data.split_first() else {
        return;
    };
    let name = NAMES[usize::from(first) % NAMES.len()];
    let Ok(documents) = osprey_rag::document::parse(name, "fuzz", bytes) else {
        return;
    };
    for document in &documents {
        let _ = osprey_rag::chunk::chunks(document, &osprey_rag::testing::WordEmbedder);
    }
}

/// The config file of `osprey serve`: its tables parsed and each policy built.
pub fn config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(tables) = osprey_services::config::ConfigTables::parse(text) else {
        return;
    };
    for policy in tables.policies.into_values() {
        let _ = osprey_policy::pipeline::Pipeline::new(policy);
    }
}

fn compile(grammar: &Grammar) {
    if let Ok(mut constraint) = compiler().compile(grammar) {
        let _ = constraint.allowed();
    }
}

fn length_prefixed(data: &[u8]) -> Option<(&[u8], &[u8])> {
    let (len, rest) = data.split_first_chunk::<2>()?;
    let len = usize::from(u16::from_le_bytes(*len)).min(rest.len());
    Some(rest.split_at(len))
}

/// The default model's tokenizer and chat template (`OSPREY_FUZZ_MODEL` names another).
fn prompter() -> &'static Prompter {
    static PROMPTER: OnceLock<Prompter> = OnceLock::new();
    PROMPTER.get_or_init(|| {
        let path = std::env::var_os("OSPREY_FUZZ_MODEL")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                let home = osprey_models::osprey_home();
                osprey_models::fetch(&osprey_models::DEFAULT_MODEL, &home, &mut |_| {})
                    .expect("fetching the default model")
            });
        Prompter::load(&path).expect("loading the model's tokenizer")
    })
}

fn compiler() -> &'static GrammarCompiler {
    static COMPILER: OnceLock<GrammarCompiler> = OnceLock::new();
    COMPILER.get_or_init(|| GrammarCompiler::new(prompter().tokenizer()).expect("a compiler"))
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        (tokio::runtime::Builder::new_multi_thread())
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime")
    })
}

/// A local upstream answering every chat request with what its slot holds; its base URL and
/// the slot.
fn upstream_server() -> &'static (String, Served) {
    static SERVER: OnceLock<(String, Served)> = OnceLock::new();
    SERVER.get_or_init(|| {
        let slot: Served = Arc::default();
        let served = slot.clone();
        let answer = move || {
            let (json, chunks) = served.lock().unwrap().clone();
            let body = futures_util::stream::iter(chunks.into_iter().map(Ok::<_, std::io::Error>));
            let kind = if json {
                "application/json"
            } else {
                "text/event-stream"
            };
            async move {
                Response::builder()
                    .header("content-type", kind)
                    .body(Body::from_stream(body))
                    .unwrap()
            }
        };
        let app = axum::Router::new().route("/v1/chat/completions", axum::routing::post(answer));
        let listener = runtime()
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("a port");
        let url = format!("http://{}/v1", listener.local_addr().unwrap());
        runtime().spawn(async move { axum::serve(listener, app).await });
        (url, slot)
    })
}

/// What the test upstream answers: whether as one JSON answer (else as server-sent events), and
/// its body's chunks.
type Served = Arc<Mutex<(bool, Vec<Bytes>)>>;

/// A directory of this process's own for the files a target writes.
fn scratch_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("osprey-fuzz-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("creating the scratch directory");
    dir
}
