//! Checkpoint conversions: `osprey quantize` ([`quantize`]) and `osprey upcycle`
//! ([`upcycle`]). Both read a GGUF file or a checkpoint directory through [`Input`] and write
//! a sharded checkpoint with [`crate::checkpoint::write`].

mod calibrate;
mod moefy;
pub mod quantize;
pub mod upcycle;

/// Varied text (prose, a recipe, code, figures, a letter, a question) that MoEfication runs
/// the dense model over to centre its routers: tokenize it with the model's tokenizer for
/// [`upcycle::UpcycleOptions::calibration`]. Written for this purpose; in no evaluation set.
pub const CALIBRATION_TEXT: &str = include_str!("calibration.txt");

use std::path::Path;

use candle_core::quantized::GgmlDType;

use crate::checkpoint::Checkpoint;
use crate::checkpoint::TensorValues;
use crate::checkpoint::layout::{BLOCKS_SUFFIX, SCALES_SUFFIX};
use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;
use crate::k3::K3Config;
use crate::kernels::matmul::WeightFormat;
use crate::source::{WeightSource, matrix};

/// A model to convert: a GGUF file or a checkpoint directory.
pub enum Input {
    /// A GGUF file.
    Gguf(GgufFile),
    /// A checkpoint directory and its tokenizer file.
    Checkpoint(Box<Checkpoint>, GgufFile),
}

impl Input {
    /// Opens `path` (a directory is a checkpoint, anything else a GGUF file).
    pub fn open(path: &Path) -> Result<Self> {
        if path.is_dir() {
            let c = Checkpoint::open(path)?;
            let tok = GgufFile::open(&c.tokenizer_path())?;
            Ok(Self::Checkpoint(Box::new(c), tok))
        } else {
            Ok(Self::Gguf(GgufFile::open(path)?))
        }
    }

    /// The tensors.
    pub fn source(&self) -> &dyn WeightSource {
        match self {
            Self::Gguf(g) => g,
            Self::Checkpoint(c, _) => c.as_ref(),
        }
    }

    /// The GGUF holding the tokenizer and chat template.
    pub fn tokenizer(&self) -> &GgufFile {
        match self {
            Self::Gguf(g) | Self::Checkpoint(_, g) => g,
        }
    }

    /// The model's shape (with Llama 3's rope frequency factors folded in).
    pub fn config(&self) -> Result<ModelConfig> {
        match self {
            Self::Gguf(g) => {
                let mut c = ModelConfig::from_gguf(g)?;
                if g.tensor("rope_freqs.weight").is_some() {
                    c.rope.freq_factors = Some(WeightSource::vector(
                        g,
                        "rope_freqs.weight",
                        c.rope.dims / 2,
                    )?);
                }
                Ok(c)
            }
            Self::Checkpoint(c, _) => Ok(c.config().model.clone()),
        }
    }

    /// The k3 plan, when the input is a k3 checkpoint.
    pub fn k3(&self) -> Option<&K3Config> {
        match self {
            Self::Gguf(_) => None,
            Self::Checkpoint(c, _) => c.config().k3.as_ref(),
        }
    }

    /// Logical tensor names with their shapes and formats, sorted (rope factors excluded:
    /// they live in the config).
    pub fn tensors(&self) -> Result<Vec<(String, Vec<usize>, WeightFormat)>> {
        let names: Vec<String> = match self {
            Self::Gguf(g) => g.tensor_names().map(str::to_owned).collect(),
            Self::Checkpoint(c, _) => {
                let mut v: Vec<String> = c
                    .index()
                    .weight_map
                    .keys()
                    .filter(|n| !n.ends_with(SCALES_SUFFIX))
                    .map(|n| n.strip_suffix(BLOCKS_SUFFIX).unwrap_or(n).to_owned())
                    .collect();
                v.dedup();
                v
            }
        };
        let mut out = names
            .into_iter()
            .filter(|n| n != "rope_freqs.weight")
            .map(|n| {
                let t = self.source().require(&n)?;
                Ok((n, t.dims, t.format))
            })
            .collect::<Result<Vec<_>>>()?;
        out.sort_by_key(|t| natural_key(&t.0));
        Ok(out)
    }
}

/// Sort key putting `blk.2.` before `blk.10.`.
fn natural_key(name: &str) -> (usize, String) {
    let layer = name
        .strip_prefix("blk.")
        .and_then(|r| r.split('.').next())
        .and_then(|n| n.parse().ok())
        .map_or(0, |l: usize| l + 1);
    (layer, name.to_owned())
}

/// A tensor's values as floats, row-major.
pub fn dequantize(src: &dyn WeightSource, name: &str) -> Result<Vec<f32>> {
    let t = src.require(name)?;
    let cols = *t.dims.last().unwrap_or(&1);
    let rows = t.dims.iter().product::<usize>() / cols.max(1);
    let m = matrix(name, t.format, rows, cols, &t.bytes)?;
    let mut out = vec![0.0; rows * cols];
    for (r, row) in out.chunks_exact_mut(cols).enumerate() {
        m.row_to_f32(r, row);
    }
    Ok(out)
}

/// A tensor's values for writing it again in `format`: its bytes when it stays the GGML
/// block type it is, else its floats.
pub fn values_for(
    src: &dyn WeightSource,
    name: &str,
    format: WeightFormat,
) -> Result<TensorValues> {
    let t = src.require(name)?;
    let is_block_type = |f: WeightFormat| matches!(f, WeightFormat::Ggml(d) if !matches!(d, GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16));
    if t.format == format && is_block_type(format) {
        return Ok(TensorValues::Raw(t.bytes.into_owned()));
    }
    if is_block_type(format) {
        return Err(ModelError::Input(format!(
            "tensor `{name}`: cannot convert {} to {format}",
            t.format
        )));
    }
    dequantize(src, name).map(TensorValues::F32)
}
