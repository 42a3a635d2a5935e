//! osprey-agent's integration tests, as one test binary (`cargo test -p osprey-agent --test
//! agent`): the orchestrator's logic with a scripted model, and the built-in tools against real
//! parts (the WASI sandbox, SQLite and Postgres, a local HTTP server).
//!
//! Each file is a module; all their tests run as threads of this one process.

mod builtins;
mod orchestrator;
