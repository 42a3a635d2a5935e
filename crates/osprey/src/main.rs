//! `osprey`: serve a model through an OpenAI-compatible API, fetch models, benchmark.

mod bench;
mod cli;
mod models;
mod serve;

use clap::Parser;

fn main() -> anyhow::Result<()> {
    let cli = cli::Cli::parse();
    cli::init_logging(&cli.log_format);
    match cli.command {
        cli::Command::Serve(args) => serve::run(args),
        cli::Command::Models(cmd) => models::run(cmd),
        cli::Command::Bench(cmd) => bench::run(cmd),
    }
}
