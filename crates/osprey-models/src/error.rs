//! Errors raised while loading or running a model.

use crate::kernels::matmul::WeightFormat;

/// What can go wrong when opening a model file or running it.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The file is not a valid GGUF file.
    #[error("{path} is not a valid GGUF file: {reason}")]
    InvalidGguf {
        /// The file.
        path: String,
        /// Why it was rejected.
        reason: String,
    },
    /// A metadata key the architecture needs is missing or has the wrong type.
    #[error("GGUF metadata key `{key}` is missing or malformed")]
    Metadata {
        /// The key.
        key: String,
    },
    /// The model's architecture is not one Osprey implements.
    #[error("unsupported model architecture `{0}` (supported: {families})", families = crate::config::Arch::names())]
    UnsupportedArchitecture(String),
    /// A tensor has a storage type Osprey has no kernel for.
    #[error(
        "tensor `{tensor}` has unsupported type {format} (supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K, MXFP4)"
    )]
    UnsupportedTensorType {
        /// The tensor's name.
        tensor: String,
        /// Its storage format.
        format: WeightFormat,
    },
    /// A sharded checkpoint is incomplete or inconsistent: a shard missing, truncated or
    /// corrupt, an index entry pointing nowhere, a shape that disagrees with the config.
    #[error("checkpoint {path}: {reason}")]
    Checkpoint {
        /// The file at fault (a shard, the index or the config).
        path: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A tensor the architecture needs is absent.
    #[error("tensor `{0}` is missing from the model file")]
    MissingTensor(String),
    /// A tensor's shape disagrees with the model's configuration.
    #[error("tensor `{tensor}` has shape {actual:?}, expected {expected:?}")]
    Shape {
        /// The tensor's name.
        tensor: String,
        /// The shape found, outermost dimension first.
        actual: Vec<usize>,
        /// The shape the configuration implies.
        expected: Vec<usize>,
    },
    /// A tensor operation failed.
    #[error("tensor operation: {0}")]
    Tensor(#[from] candle_core::Error),
    /// An input the model cannot take.
    #[error("{0}")]
    Input(String),
    /// The tokenizer metadata cannot be turned into a tokenizer.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
}

/// Result alias for this crate.
pub type Result<T, E = ModelError> = std::result::Result<T, E>;
