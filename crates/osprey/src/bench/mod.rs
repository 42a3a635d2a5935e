//! `osprey bench`: measurements that belong in benchmarks, not tests.
//!
//! - `osprey bench model`: llama-bench's `pp` and `tg` tests on Osprey's forward pass
//!   (prompt processing of N tokens in one pass; decoding M tokens one at a time), so the two
//!   can be compared side by side on the same GGUF and thread count.

mod model;

use clap::Subcommand;

/// `osprey bench ...`
#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// Prompt processing and decode speed of the forward pass (like llama-bench pp/tg).
    Model(model::ModelBenchArgs),
}

pub fn run(cmd: BenchCommand) -> anyhow::Result<()> {
    match cmd {
        BenchCommand::Model(args) => model::run(args),
    }
}
