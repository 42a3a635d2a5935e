//! Command-line interface: every option is a flag and an `OSPREY_*` environment variable.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use osprey_engine::speculative::{Drafter, SpeculationConfig};

/// Osprey: a production LLM serving stack.
#[derive(Parser, Debug)]
#[command(name = "osprey", version, about)]
pub struct Cli {
    /// Log format: `text` or `json`.
    #[arg(long, global = true, env = "OSPREY_LOG_FORMAT", default_value = "text")]
    pub log_format: String,
    /// Export traces over OTLP/HTTP to this collector, e.g. `http://127.0.0.1:4318` (spans go
    /// to `/v1/traces` beneath it). Without it nothing is exported.
    #[arg(long, global = true, env = "OSPREY_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
    /// The share of traces exported, from 0 to 1, decided where a trace starts: a request that
    /// continues a caller's trace (`traceparent`) follows the caller's decision.
    #[arg(long, global = true, env = "OSPREY_OTLP_SAMPLE", default_value_t = 1.0,
          value_parser = sample_ratio)]
    pub otlp_sample: f64,
    #[command(subcommand)]
    pub command: Command,
}

/// A ratio from 0 to 1.
fn sample_ratio(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
        _ => Err(format!("`{s}` is not a ratio from 0 to 1")),
    }
}

/// Subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Serve a model through the OpenAI-compatible API.
    Serve(Box<ServeArgs>),
    /// Run only an engine, for a gateway's worker pool (`osprey serve --worker URL`).
    Worker(Box<WorkerArgs>),
    /// Fetch or list models.
    #[command(subcommand)]
    Models(ModelsCommand),
    /// Benchmarks (see docs/benchmarks.md).
    #[command(subcommand)]
    Bench(crate::bench::BenchCommand),
    /// Create, list and revoke API keys.
    Keys(crate::keys::KeysArgs),
    /// The prompt registry: push versions, label them (with A/B splits), diff, roll back.
    Prompts(crate::prompts::PromptsArgs),
    /// Per-tenant feature flags, read by servers at request time.
    Flags(crate::flags::FlagsArgs),
    /// Forget a tenant's user: conversations, memory, request log, cached answers.
    Users(crate::users::UsersArgs),
    /// Agent runs on a server: list, show, approve or reject a waiting call, the tool audit.
    Runs(crate::runs::RunsArgs),
    /// Offline evaluation: run suites against a route, compare runs with confidence
    /// intervals, gate a rollout on regressions, replay the request log (docs/eval.md).
    Eval(crate::eval::EvalArgs),
    /// Ingest files or folders into a document collection (PDF, HTML, Markdown, text, JSONL).
    Ingest(crate::rag::IngestArgs),
    /// Search a document collection.
    Search(crate::rag::SearchArgs),
    /// Check a config file.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Write a model as a sharded safetensors checkpoint in MXFP4 (or F16/BF16/F32).
    Quantize(crate::convert::QuantizeArgs),
    /// Turn a dense model into a k3 (LatentMoE + AttnRes) checkpoint.
    Upcycle(crate::convert::UpcycleArgs),
}

/// `osprey config ...`
#[derive(Subcommand, Debug)]
pub enum ConfigCommand {
    /// Validate a config file: syntax, every option, tenants and models; names the bad line.
    Check {
        /// The TOML file.
        file: PathBuf,
    },
}

/// `osprey models ...`
#[derive(Subcommand, Debug)]
pub enum ModelsCommand {
    /// Download a model of the catalog into $OSPREY_HOME/models (verified by SHA-256).
    Fetch {
        /// The model's name (`osprey models list` shows them; default: the default model).
        name: Option<String>,
    },
    /// List the models Osprey can fetch, and the files in $OSPREY_HOME/models.
    List,
}

/// `osprey serve`.
#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    /// A TOML config file: top-level keys are these options' long names, plus `[tenants.NAME]`,
    /// `[models.NAME]` and `[[tiers]]` tables (see docs/gateway.md, docs/routing.md). Flags and variables beat the file.
    #[arg(long, env = "OSPREY_CONFIG")]
    pub config: Option<PathBuf>,
    /// Serve model NAME from an OpenAI-compatible server at URL (its base, with `/v1`);
    /// repeatable.
    #[arg(
        long = "upstream",
        env = "OSPREY_UPSTREAM",
        value_delimiter = ',',
        value_name = "NAME=URL"
    )]
    pub upstream: Vec<String>,
    /// Run no local engine: serve only upstream models.
    #[arg(long, env = "OSPREY_NO_ENGINE")]
    pub no_engine: bool,
    /// Turn the exact response cache off (benchmarks: a hit is not a measurement of serving).
    #[arg(long, env = "OSPREY_NO_RESPONSE_CACHE")]
    pub no_response_cache: bool,
    /// Serve the model from these `osprey worker`s (base URLs, without `/v1`) instead of an
    /// engine in this process; repeatable.
    #[arg(
        long = "worker",
        env = "OSPREY_WORKER",
        value_delimiter = ',',
        value_name = "URL"
    )]
    pub worker: Vec<String>,
    /// How a request picks among workers: `cache_aware` (where most of its prompt is cached,
    /// weighed against load), `least_loaded` or `round_robin`.
    #[arg(long, env = "OSPREY_ROUTING_POLICY", default_value = "cache_aware", value_parser = ["cache_aware", "least_loaded", "round_robin"])]
    pub routing_policy: String,
    /// `"model": "auto"` (with `[[tiers]]` in the config file): a request the task classifier
    /// is less sure of than this goes one tier up.
    #[arg(long, env = "OSPREY_AUTO_CONFIDENCE", default_value_t = 0.6)]
    pub auto_confidence: f64,
    /// `"model": "auto"`: check each non-streamed answer below the top tier, and ask the tier
    /// above again when its mean token logprob is below this (e.g. -1.0; default: answers are
    /// not checked).
    #[arg(long, env = "OSPREY_AUTO_MIN_LOGPROB", allow_negative_numbers = true)]
    pub auto_min_logprob: Option<f64>,
    /// Time to first token (seconds) the degradation ladder holds to: as the recent TTFT of the
    /// local engine nears it, output is capped, `auto` steps down and batch work is deferred, as
    /// when requests in flight near --max-in-flight (default: TTFT is not watched).
    #[arg(long, env = "OSPREY_TTFT_SLO")]
    pub ttft_slo: Option<f64>,
    /// Where keys and state live: sqlite://PATH (default: $OSPREY_HOME/osprey.db) or
    /// postgres://USER@HOST/DB.
    #[arg(long, env = "OSPREY_STORE", hide_env_values = true)]
    pub store: Option<String>,
    /// Share rate limits, key revocations and the response cache with other replicas through
    /// this Redis.
    #[arg(long, env = "OSPREY_REDIS", hide_env_values = true)]
    pub redis: Option<String>,
    /// Gateway replicas sharing the limits: while Redis is down each enforces this share.
    #[arg(long, env = "OSPREY_REPLICAS", default_value_t = 1)]
    pub replicas: u64,
    /// The key of the admin API (`/admin/keys`); without it the admin API is closed.
    #[arg(long, env = "OSPREY_ADMIN_KEY", hide_env_values = true)]
    pub admin_key: Option<String>,
    /// Keep no request log (rows of who asked what, how it went): for measuring its cost.
    #[arg(long, env = "OSPREY_NO_REQUEST_LOG")]
    pub no_request_log: bool,
    /// Record no metrics (`/metrics` answers 404): for measuring their cost.
    #[arg(long, env = "OSPREY_NO_METRICS")]
    pub no_metrics: bool,
    /// Serve `POST /admin/faults/panic` (behind the admin key), whose handler panics: for the
    /// reliability suites (reliability/chaos.sh). Never in production.
    #[arg(long, env = "OSPREY_FAULT_INJECTION")]
    pub fault_injection: bool,
    /// Requests per minute of tenants that set none.
    #[arg(long, env = "OSPREY_DEFAULT_RPM", default_value_t = 6_000)]
    pub default_rpm: u64,
    /// Tokens per minute of tenants that set none.
    #[arg(long, env = "OSPREY_DEFAULT_TPM", default_value_t = 2_000_000)]
    pub default_tpm: u64,
    /// Requests in flight per tenant, for tenants that set none.
    #[arg(long, env = "OSPREY_DEFAULT_MAX_CONCURRENT", default_value_t = 256)]
    pub default_max_concurrent: u64,
    /// Requests in flight through the gateway; more are shed with 503.
    #[arg(long, env = "OSPREY_MAX_IN_FLIGHT", default_value_t = 1024)]
    pub max_in_flight: u64,
    /// Tokens (prompt + max_tokens) of the requests in flight; more are shed with 503.
    #[arg(long, env = "OSPREY_MAX_QUEUED_TOKENS", default_value_t = 4_000_000)]
    pub max_queued_tokens: u64,
    /// Share of those limits open to batch-priority requests (the rest is kept for
    /// interactive ones).
    #[arg(long, env = "OSPREY_BATCH_SHARE", default_value_t = 0.75)]
    pub batch_share: f64,
    /// Address to listen on.
    #[arg(long, env = "OSPREY_HOST", default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on.
    #[arg(long, env = "OSPREY_PORT", default_value_t = 8080)]
    pub port: u16,
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Largest request body accepted, e.g. `4MiB`.
    #[arg(long, env = "OSPREY_MAX_BODY_BYTES", default_value = "4MiB", value_parser = parse_bytes)]
    pub max_body_bytes: usize,
    #[command(flatten)]
    pub tls: TlsArgs,
}

/// TLS terminated by the server itself, for deployments without a proxy in front.
#[derive(Args, Debug, Clone)]
pub struct TlsArgs {
    /// A PEM certificate chain (leaf first): serve HTTPS instead of HTTP (with --tls-key).
    #[arg(long, env = "OSPREY_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long, env = "OSPREY_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
}

impl TlsArgs {
    /// The server's TLS settings, if a certificate was given.
    pub fn server_config(
        &self,
    ) -> anyhow::Result<Option<std::sync::Arc<osprey_gateway::tls::ServerConfig>>> {
        match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Ok(Some(osprey_gateway::tls::server_config(cert, key)?)),
            _ => Ok(None),
        }
    }
}

/// The engine's options, shared by `osprey serve` and `osprey worker`.
#[derive(Args, Debug, Clone)]
pub struct EngineArgs {
    /// The model to serve: a GGUF file, or a name from `osprey models list`, fetched on first use
    /// (default: smollm2-135m-instruct). Repeat it to serve several, each on its own engine and
    /// KV pool; the first is the default.
    #[arg(long, env = "OSPREY_MODEL")]
    pub model: Vec<PathBuf>,
    /// Name clients put in `model` (default: the catalog name, or the file's name without
    /// `.gguf`). Repeated, the i-th names the i-th `--model`.
    #[arg(long, env = "OSPREY_SERVED_MODEL_NAME")]
    pub served_model_name: Vec<String>,
    /// KV cache size, e.g. `1GiB`, `512MiB` or bytes (default: a tenth of RAM, 256 MiB–4 GiB;
    /// memory becomes resident only as it is used). With several models, those without
    /// `kv_cache_memory` in their `[models.NAME]` share what the others leave, evenly.
    #[arg(long, env = "OSPREY_KV_CACHE_MEMORY", value_parser = parse_bytes)]
    pub kv_cache_memory: Option<usize>,
    /// Turn off reuse of cached prompt prefixes across requests.
    #[arg(long, env = "OSPREY_NO_PREFIX_CACHING")]
    pub no_prefix_caching: bool,
    /// `priority` (interactive before batch), `fcfs` (arrival order) or `kda` (priority with
    /// deadlines; on an MoE model, batches composed by expert load). Switchable while running
    /// with `PUT /admin/scheduler`.
    #[arg(long, env = "OSPREY_SCHEDULING_POLICY", default_value = "priority", value_parser = ["priority", "fcfs", "kda"])]
    pub scheduling_policy: String,
    /// `kda`: the most tokens one expert may take in a step, as a multiple of its fair share
    /// (top_k × tokens / experts); batch sequences that would exceed it wait a step.
    #[arg(long, env = "OSPREY_EXPERT_CAPACITY", default_value_t = 2.0, value_parser = parse_capacity)]
    pub expert_capacity: f32,
    /// `kda`: steps a sequence may be held back in a row for expert capacity.
    #[arg(long, env = "OSPREY_MAX_DEFERRALS", default_value_t = 4)]
    pub max_deferrals: u32,
    /// `kda`: steps between samples of attention heat per KV block (0: never).
    #[arg(long, env = "OSPREY_HEAT_INTERVAL", default_value_t = 16)]
    pub heat_interval: usize,
    /// Sequences that may wait for admission; more requests get 503 with `retry-after`.
    #[arg(long, env = "OSPREY_MAX_WAITING", default_value_t = 256)]
    pub max_waiting: usize,
    /// Most prompt tokens a batch request prefills per step while interactive work runs.
    #[arg(long, env = "OSPREY_BATCH_PREFILL_CHUNK", default_value_t = 64)]
    pub batch_prefill_chunk: usize,
    /// Seconds after which a waiting batch request is treated as interactive.
    #[arg(long, env = "OSPREY_STARVATION_TIMEOUT", default_value_t = 300.0)]
    pub starvation_timeout: f64,
    /// Speculative decoding: `ngram` drafts a decoding sequence's next tokens from matches of
    /// its latest tokens in its own prompt and output; `layers:N` drafts them with the model's
    /// own first N layers and its output head; either way the step's forward pass verifies
    /// them. `off` does not speculate. The output is the same either way.
    #[arg(long, env = "OSPREY_SPECULATIVE", default_value = "ngram")]
    pub speculative: Speculative,
    /// Most tokens a sequence drafts per step.
    #[arg(long, env = "OSPREY_SPECULATIVE_MAX_DRAFT", default_value_t = SpeculationConfig::default().max_draft)]
    pub speculative_max_draft: usize,
    /// Drafts are verified only in steps of fewer rows than this (past it a step is bound by
    /// compute, and speculation backs off).
    #[arg(long, env = "OSPREY_SPECULATIVE_STEP_ROWS", default_value_t = SpeculationConfig::default().max_step_rows)]
    pub speculative_step_rows: usize,
    /// Most sequences in one forward pass.
    #[arg(long, env = "OSPREY_MAX_NUM_SEQS", default_value_t = 32)]
    pub max_num_seqs: usize,
    /// Most tokens (prefill and decode) in one forward pass.
    #[arg(long, env = "OSPREY_MAX_NUM_BATCHED_TOKENS", default_value_t = 512)]
    pub max_num_batched_tokens: usize,
    /// Context window (default: the model's).
    #[arg(long, env = "OSPREY_MAX_MODEL_LEN")]
    pub max_model_len: Option<usize>,
    /// Host RAM for the warm KV tier, e.g. `4GiB`: blocks evicted from the pool are kept there,
    /// compressed, and brought back for requests sharing their prefix (default 0: off).
    #[arg(long, env = "OSPREY_KV_WARM_MEMORY", value_parser = parse_bytes, default_value = "0")]
    pub kv_warm_memory: usize,
    /// Disk for the cold KV tier, e.g. `20GiB`: what the warm tier evicts (or, without one,
    /// what the pool evicts) is written there (default 0: off).
    #[arg(long, env = "OSPREY_KV_COLD_DISK", value_parser = parse_bytes, default_value = "0")]
    pub kv_cold_disk: usize,
    /// The cold tier's directory (default: $OSPREY_HOME/kv-cold).
    #[arg(long, env = "OSPREY_KV_COLD_DIR")]
    pub kv_cold_dir: Option<PathBuf>,
    /// Redis for the shared KV tier, so workers and replicas reuse each other's prefixes.
    #[arg(long, env = "OSPREY_KV_REDIS", hide_env_values = true)]
    pub kv_redis: Option<String>,
    /// Seconds a block lives in the shared tier.
    #[arg(long, env = "OSPREY_KV_REDIS_TTL", default_value_t = 3600)]
    pub kv_redis_ttl: u64,
    /// Most bytes of blocks this model keeps in the shared tier.
    #[arg(long, env = "OSPREY_KV_REDIS_MEMORY", value_parser = parse_bytes, default_value = "1GiB")]
    pub kv_redis_memory: usize,
    /// How blocks are stored below the pool: `int8` (a scale per layer, side and head; about
    /// half the bytes) or `f16` (lossless).
    #[arg(long, env = "OSPREY_KV_CODEC", default_value = "int8", value_parser = ["int8", "f16"])]
    pub kv_codec: String,
    /// Compute threads (default: one per core).
    #[arg(long, env = "OSPREY_THREADS", default_value_t = 0)]
    pub threads: usize,
}

/// `osprey worker`: only an engine, serving the OpenAI routes and the worker protocol
/// (`/worker/load`, `/worker/events`) to a gateway started with `--worker`.
#[derive(Args, Debug, Clone)]
pub struct WorkerArgs {
    /// Address to listen on.
    #[arg(long, env = "OSPREY_HOST", default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on.
    #[arg(long, env = "OSPREY_PORT", default_value_t = 8081)]
    pub port: u16,
    /// Largest request body accepted, e.g. `4MiB`.
    #[arg(long, env = "OSPREY_MAX_BODY_BYTES", default_value = "4MiB", value_parser = parse_bytes)]
    pub max_body_bytes: usize,
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// Parses an expert capacity: a finite multiple of the fair share, at least 1.
fn parse_capacity(s: &str) -> Result<f32, String> {
    match s.trim().parse::<f32>() {
        Ok(v) if v.is_finite() && v >= 1.0 => Ok(v),
        _ => Err(format!(
            "`{s}` is not a capacity: give a number of at least 1 (e.g. 2.0)"
        )),
    }
}

/// Parses `1GiB`, `512MiB`, `64KiB`, `1.5GB` or a plain byte count.
pub fn parse_bytes(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a size like 1GiB or 512MiB"))?;
    let scale = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "kib" => 1024.0,
        "m" | "mb" => 1e6,
        "mib" => 1024.0 * 1024.0,
        "g" | "gb" => 1e9,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        other => {
            return Err(format!(
                "unknown size unit `{other}` (use B, KiB, MiB, GiB)"
            ));
        }
    };
    Ok((value * scale) as usize)
}

#[cfg(test)]
mod tests {
    use super::parse_bytes;

    #[test]
    fn sizes_parse_with_units() {
        assert_eq!(parse_bytes("1GiB"), Ok(1 << 30));
        assert_eq!(parse_bytes("512MiB"), Ok(512 << 20));
        assert_eq!(parse_bytes("1000"), Ok(1000));
        assert_eq!(parse_bytes("1.5 kb"), Ok(1500));
        assert!(parse_bytes("lots").is_err());
        assert!(parse_bytes("3 parsecs").is_err());
    }
}

/// `--speculative`: where drafts come from, or `off`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Speculative(pub Option<Drafter>);

impl std::str::FromStr for Speculative {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "off" => Ok(Self(None)),
            _ => s
                .parse()
                .map(|d| Self(Some(d)))
                .map_err(|e| format!("{e}, or off")),
        }
    }
}
