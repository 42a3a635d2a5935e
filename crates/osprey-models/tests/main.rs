//! osprey-models' integration tests, as one test binary (`cargo test -p osprey-models --test
//! models`): the forward pass on the real default model against llama.cpp's outputs, the same
//! network in other GGUF layouts and tensor types, sharded checkpoints, and upcycling to
//! mixtures of experts.
//!
//! Each file is a module; all their tests run as threads of this one process.

mod checkpoint;
mod families;
mod formats;
mod golden;
mod k3;
