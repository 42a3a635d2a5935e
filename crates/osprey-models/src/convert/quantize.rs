//! `osprey quantize`: a model in GGUF or checkpoint form → a sharded checkpoint in MXFP4 (or
//! F16/BF16/F32), recording every tensor kept in higher precision and why.

use std::path::Path;

use candle_core::quantized::GgmlDType;

use super::{Input, values_for};
use crate::checkpoint::layout::CheckpointConfig;
use crate::checkpoint::layout::Index;
use crate::checkpoint::{PlannedTensor, WriteOptions, write};
use crate::error::{ModelError, Result};
use crate::kernels::blocks::QK;
use crate::kernels::matmul::WeightFormat;

/// What `osprey quantize` writes.
pub struct QuantizeOptions {
    /// The format of the matrices.
    pub format: WeightFormat,
    /// Number of shards.
    pub shards: usize,
    /// Keep the token embedding (and a tied output head) in F16 instead of `format`.
    pub keep_embeddings: bool,
}

/// Parses a `--format` value: `mxfp4`, `f16`, `bf16` or `f32`.
pub fn parse_format(s: &str) -> Result<WeightFormat> {
    Ok(match s.to_ascii_lowercase().as_str() {
        "mxfp4" => WeightFormat::Mxfp4,
        "f16" => WeightFormat::Ggml(GgmlDType::F16),
        "bf16" => WeightFormat::Ggml(GgmlDType::BF16),
        "f32" => WeightFormat::Ggml(GgmlDType::F32),
        other => {
            return Err(ModelError::Input(format!(
                "unknown format `{other}` (expected mxfp4, f16, bf16 or f32)"
            )));
        }
    })
}

/// The format tensor `name` of shape `dims` is written in, and why when it is not `target`.
pub fn choose_format(
    name: &str,
    dims: &[usize],
    target: WeightFormat,
    keep_embeddings: bool,
) -> (WeightFormat, Option<String>) {
    let f16 = WeightFormat::Ggml(GgmlDType::F16);
    let f32 = WeightFormat::Ggml(GgmlDType::F32);
    if dims.len() == 1 {
        return (f32, Some("1-D (norm or bias): kept in F32".into()));
    }
    if name == "token_embd.weight" && keep_embeddings && target != f32 {
        return (
            f16,
            Some("embedding kept in F16 (--keep-embeddings)".into()),
        );
    }
    let cols = dims[dims.len() - 1];
    if target == WeightFormat::Mxfp4 && !cols.is_multiple_of(QK) {
        return (
            f16,
            Some(format!("width {cols} is not a multiple of 32: kept in F16")),
        );
    }
    (target, None)
}

/// Converts `input` into a checkpoint in `out`; `on_tensor` is called once per tensor written
/// (after `on_plan` said how many there are).
pub fn quantize(
    input: &Input,
    out: &Path,
    options: &QuantizeOptions,
    on_plan: &dyn Fn(usize),
    on_tensor: &(dyn Fn(&str) + Sync),
) -> Result<Index> {
    let plan: Vec<PlannedTensor> = input
        .tensors()?
        .into_iter()
        .map(|(name, dims, _)| {
            let (format, kept) =
                choose_format(&name, &dims, options.format, options.keep_embeddings);
            PlannedTensor {
                name,
                format,
                dims,
                kept,
            }
        })
        .collect();
    on_plan(plan.len());
    let config = CheckpointConfig {
        model_type: if input.k3().is_some() { "k3" } else { "llama" }.into(),
        model: input.config()?,
        k3: input.k3().cloned(),
    };
    let src = input.source();
    write(
        out,
        &config,
        input.tokenizer(),
        &plan,
        &|t| values_for(src, &t.name, t.format),
        &WriteOptions {
            shards: options.shards,
            format_label: options.format.to_string().to_ascii_lowercase(),
            on_tensor,
        },
    )
}
