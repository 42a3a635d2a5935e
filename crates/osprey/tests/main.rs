//! The `osprey` binary's integration tests, as one test binary (`cargo test -p osprey --test
//! cli`): the CLI and `osprey serve` run as child processes (`CARGO_BIN_EXE_osprey`) against
//! the real default model, real stores and real clients (the official `openai` Python package,
//! a browser), and the deployment recipe and the fuzz corpus are checked against the code.
//!
//! Each file is a module; all their tests run as threads of this one process. What they share
//! is in [`support`]: waiting for a server to come up, and the slots that bound how many tests
//! run model-serving processes at once.

mod support;

mod dashboard;
mod deploy_manifests;
mod durability;
mod eval;
mod fleet;
mod fuzz_corpus;
mod models_cli;
mod openai_client;
mod prompts_cli;
mod traces;
