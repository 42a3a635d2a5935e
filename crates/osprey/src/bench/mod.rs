//! `osprey bench`: measurements that belong in benchmarks, not tests.
//!
//! - `osprey bench model`: llama-bench's `pp` and `tg` tests on Osprey's forward pass
//!   (prompt processing of N tokens in one pass; decoding M tokens one at a time), so the two
//!   can be compared side by side on the same GGUF and thread count; `-d` runs both at a
//!   context depth, as llama-bench's `-d` does.
//! - `osprey bench serve`: load against OpenAI-compatible servers (workloads A, B, F of
//!   `../shared/BENCHMARKS.md`), several of them interleaved, with ratios.
//! - `osprey bench guards`: the cost of the safety layer (input pipeline latency, the output
//!   filter's time per token and hold-back).
//! - `osprey bench rag`: retrieval quality (MRR@10, Recall@10 per method) and speed (ingest
//!   chunks/s, query latency at several concurrencies) on a known-item corpus.
//! - `osprey bench structured`: constrained decoding's cost per token (same run, free vs under
//!   a schema), each mask's cost, and the schema validity rate over varied schemas.
//! - `osprey bench sandbox`: the wasm sandbox's set-up, compile and call latency.
//! - `osprey bench k3`: MXFP4 and MoEfication quality and speed, KDA against FCFS.
//! - `osprey bench kv`: the KV tiers: codec quality, TTFT per tier (D), the memory wall (E).

mod guards;
mod k3;
mod kv;
mod model;
mod rag;
mod sandbox;
mod serve;
mod structured;

use clap::Subcommand;

/// `osprey bench ...`
#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// Prompt processing and decode speed of the forward pass (like llama-bench pp/tg).
    Model(model::ModelBenchArgs),
    /// Load on OpenAI-compatible servers: tokens/s, TTFT, TPOT (optionally two, compared).
    Serve(Box<serve::ServeBenchArgs>),
    /// The safety layer's cost: input pipeline latency, output filter per token and hold-back.
    Guards(guards::GuardsBenchArgs),
    /// Retrieval: MRR@10 and Recall@10 per method, ingest chunks/s, query latency.
    Rag(rag::RagBenchArgs),
    /// Structured output: constrained-decoding overhead, mask cost, schema validity rate.
    Structured(structured::StructuredBenchArgs),
    /// The wasm sandbox: set-up, compile and call latency.
    Sandbox(sandbox::SandboxBenchArgs),
    /// K3 features: MXFP4 vs Q4_1 vs F16, MoEfication sweeps, KDA vs FCFS scheduling.
    K3(Box<k3::K3BenchArgs>),
    /// KV tiers: codec quality, workload D (TTFT per tier), workload E (the memory wall).
    Kv(Box<kv::KvBenchArgs>),
}

pub fn run(cmd: BenchCommand) -> anyhow::Result<()> {
    match cmd {
        BenchCommand::Model(args) => model::run(args),
        BenchCommand::Serve(args) => serve::run(*args),
        BenchCommand::Guards(args) => guards::run(args),
        BenchCommand::Rag(args) => rag::run(args),
        BenchCommand::Structured(args) => structured::run(args),
        BenchCommand::Sandbox(args) => sandbox::run(args),
        BenchCommand::K3(args) => k3::run(*args),
        BenchCommand::Kv(args) => kv::run(*args),
    }
}
