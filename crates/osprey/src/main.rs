//! `osprey`: serve a model through an OpenAI-compatible API (alone, or as a gateway in front of
//! `osprey worker`s), fetch models, benchmark.

mod bench;
mod cli;
mod config;
mod convert;
mod eval;
mod flags;
mod keys;
mod models;
mod prompts;
mod rag;
mod runs;
mod serve;
mod telemetry;
mod users;
mod worker;

use clap::{CommandFactory, FromArgMatches};

/// mimalloc instead of glibc's malloc: a request through the gateway allocates and frees many
/// small values on two runtime threads. glibc's malloc and free were 10–15% of the gateway's
/// profile under workload G; mimalloc cut the CPU per streamed request by about 12%, for about
/// 20 MiB more resident memory (docs/benchmarks.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    // Errors are for people: the message and its causes, never a backtrace dump.
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> anyhow::Result<()> {
    let argv: Vec<String> = std::env::args().collect();
    let matches = cli::Cli::command().get_matches_from(&argv);
    let cli = cli::Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    // Flushes the spans still buffered when it is dropped, as the command ends.
    let _telemetry = telemetry::init(
        &cli.log_format,
        cli.otlp_endpoint.as_deref(),
        cli.otlp_sample,
    )?;
    match cli.command {
        cli::Command::Serve(args) => {
            let file = match &args.config {
                Some(path) => config::ConfigFile::load(path)?,
                None => config::ConfigFile::default(),
            };
            let serve_matches = matches.subcommand_matches("serve").expect("serve");
            let args = match &args.config {
                Some(_) => file.serve_args(&argv, serve_matches)?,
                None => *args,
            };
            serve::run(args, file)
        }
        cli::Command::Worker(args) => worker::run(*args),
        cli::Command::Models(cmd) => models::run(cmd),
        cli::Command::Bench(cmd) => bench::run(cmd),
        cli::Command::Keys(args) => keys::run(args),
        cli::Command::Prompts(args) => prompts::run(args),
        cli::Command::Flags(args) => flags::run(args),
        cli::Command::Users(args) => users::run(args),
        cli::Command::Runs(args) => runs::run(args),
        cli::Command::Eval(args) => eval::run(args),
        cli::Command::Ingest(args) => rag::ingest(args),
        cli::Command::Search(args) => rag::search(args),
        cli::Command::Config(cli::ConfigCommand::Check { file }) => config::check(&file),
        cli::Command::Quantize(args) => convert::run_quantize(args),
        cli::Command::Upcycle(args) => convert::run_upcycle(args),
    }
}
