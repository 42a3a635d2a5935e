//! Writing a sharded checkpoint: tensors are planned first (name, format, shape), assigned
//! to shards by size, then produced, encoded and written shard by shard in parallel, each
//! shard hashed as it is finished.

use std::collections::BTreeMap;
use std::path::Path;

use candle_core::quantized::GgmlDType;
use candle_core::quantized::gguf_file;
use half::{bf16, f16};
use rayon::prelude::*;
use safetensors::tensor::{Dtype, TensorView};
use sha2::{Digest, Sha256};

use super::layout::{
    BLOCKS_SUFFIX, CONFIG_FILE, CheckpointConfig, INDEX_FILE, Index, IndexMetadata, SCALES_SUFFIX,
    ShardRecord, TOKENIZER_FILE, shard_file,
};
use super::{err, hex};
use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;
use crate::kernels::blocks::QK;
use crate::kernels::matmul::WeightFormat;
use crate::kernels::mxfp4::BlockMxfp4;

/// A tensor to write.
#[derive(Clone, Debug)]
pub struct PlannedTensor {
    /// Logical name (`blk.0.attn_q.weight`).
    pub name: String,
    /// Format to store it in.
    pub format: WeightFormat,
    /// Shape, outermost first.
    pub dims: Vec<usize>,
    /// Why it is not in the checkpoint's main format, if it is not (recorded in the index).
    pub kept: Option<String>,
}

impl PlannedTensor {
    fn stored_bytes(&self) -> usize {
        let cols = *self.dims.last().unwrap_or(&1);
        let rows = self.dims.iter().product::<usize>() / cols.max(1);
        self.format.bytes(rows, cols)
    }
}

/// What a producer returns for a planned tensor.
pub enum TensorValues {
    /// Values as floats, encoded by the writer into the planned format.
    F32(Vec<f32>),
    /// Bytes already in the planned format's ggml block layout (a GGML type kept as it came).
    Raw(Vec<u8>),
}

/// Options of [`write`].
pub struct WriteOptions<'a> {
    /// Number of shards.
    pub shards: usize,
    /// The main format's name for the index (`mxfp4`).
    pub format_label: String,
    /// Called after each tensor is encoded, with its name.
    pub on_tensor: &'a (dyn Fn(&str) + Sync),
}

/// Writes `plan` as a checkpoint in `dir` (created if needed), asking `produce` for each
/// tensor's values, with `config` and the tokenizer and chat template of `tokenizer`.
pub fn write(
    dir: &Path,
    config: &CheckpointConfig,
    tokenizer: &GgufFile,
    plan: &[PlannedTensor],
    produce: &(dyn Fn(&PlannedTensor) -> Result<TensorValues> + Sync),
    options: &WriteOptions,
) -> Result<Index> {
    let n = options.shards;
    if n == 0 || n > plan.len() {
        return Err(ModelError::Input(format!(
            "{n} shards for {} tensors: use 1..={} shards",
            plan.len(),
            plan.len()
        )));
    }
    std::fs::create_dir_all(dir).map_err(|e| err(dir, e.to_string()))?;
    let assignment = assign_shards(plan, n);
    let records = (0..n)
        .into_par_iter()
        .map(|s| {
            let tensors: Vec<&PlannedTensor> = plan
                .iter()
                .zip(&assignment)
                .filter(|(_, a)| **a == s)
                .map(|(t, _)| t)
                .collect();
            write_shard(dir, &shard_file(s, n), &tensors, produce, options.on_tensor)
        })
        .collect::<Result<Vec<_>>>()?;

    let mut index = Index {
        metadata: IndexMetadata {
            total_size: plan.iter().map(|t| t.stored_bytes() as u64).sum(),
            format: options.format_label.clone(),
            shards: records,
            ..Default::default()
        },
        weight_map: BTreeMap::new(),
    };
    for (t, &s) in plan.iter().zip(&assignment) {
        let file = shard_file(s, n);
        for stored in stored_names(t) {
            index.weight_map.insert(stored, file.clone());
        }
        if let WeightFormat::Ggml(d) = t.format
            && !is_float(d)
        {
            index
                .metadata
                .formats
                .insert(t.name.clone(), format!("{d:?}"));
        }
        if let Some(why) = &t.kept {
            index.metadata.kept.insert(t.name.clone(), why.clone());
        }
    }
    write_json(&dir.join(INDEX_FILE), &index)?;
    write_json(&dir.join(CONFIG_FILE), config)?;
    write_tokenizer(&dir.join(TOKENIZER_FILE), tokenizer)?;
    Ok(index)
}

/// Contiguous runs of tensors of about equal bytes, none empty.
fn assign_shards(plan: &[PlannedTensor], n: usize) -> Vec<usize> {
    let total: usize = plan.iter().map(PlannedTensor::stored_bytes).sum();
    let mut out = Vec::with_capacity(plan.len());
    let (mut shard, mut cum) = (0, 0);
    for (i, t) in plan.iter().enumerate() {
        out.push(shard);
        cum += t.stored_bytes();
        let (tensors_left, shards_left) = (plan.len() - i - 1, n - shard - 1);
        if shards_left > 0 && (cum * n >= (shard + 1) * total || tensors_left <= shards_left) {
            shard += 1;
        }
    }
    out
}

fn is_float(d: GgmlDType) -> bool {
    matches!(d, GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16)
}

fn stored_names(t: &PlannedTensor) -> Vec<String> {
    match t.format {
        WeightFormat::Mxfp4 => vec![
            format!("{}{BLOCKS_SUFFIX}", t.name),
            format!("{}{SCALES_SUFFIX}", t.name),
        ],
        WeightFormat::Ggml(_) => vec![t.name.clone()],
    }
}

/// One stored safetensors tensor.
struct Stored {
    name: String,
    dtype: Dtype,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

fn write_shard(
    dir: &Path,
    file: &str,
    tensors: &[&PlannedTensor],
    produce: &(dyn Fn(&PlannedTensor) -> Result<TensorValues> + Sync),
    on_tensor: &(dyn Fn(&str) + Sync),
) -> Result<ShardRecord> {
    let mut stored = Vec::new();
    for t in tensors {
        stored.extend(encode(t, produce(t)?)?);
        on_tensor(&t.name);
    }
    let path = dir.join(file);
    let views = stored
        .iter()
        .map(|s| {
            TensorView::new(s.dtype, s.shape.clone(), &s.bytes)
                .map(|v| (s.name.clone(), v))
                .map_err(|e| ModelError::Input(format!("tensor `{}`: {e}", s.name)))
        })
        .collect::<Result<Vec<_>>>()?;
    safetensors::tensor::serialize_to_file(views, None, &path)
        .map_err(|e| err(&path, e.to_string()))?;
    let bytes = std::fs::read(&path).map_err(|e| err(&path, e.to_string()))?;
    Ok(ShardRecord {
        file: file.to_owned(),
        bytes: bytes.len() as u64,
        sha256: hex(&Sha256::digest(&bytes)),
    })
}

/// The stored tensors of `t` from its values.
fn encode(t: &PlannedTensor, values: TensorValues) -> Result<Vec<Stored>> {
    let elements: usize = t.dims.iter().product();
    let wrong = |what: &str| ModelError::Input(format!("tensor `{}`: {what}", t.name));
    let one = |dtype, bytes| {
        Ok(vec![Stored {
            name: t.name.clone(),
            dtype,
            shape: t.dims.clone(),
            bytes,
        }])
    };
    match (t.format, values) {
        (WeightFormat::Ggml(d), TensorValues::Raw(bytes)) if !is_float(d) => {
            let cols = *t.dims.last().unwrap_or(&1);
            let row_bytes = cols / d.block_size() * d.type_size();
            if bytes.len() != elements / cols * row_bytes {
                return Err(wrong("raw bytes do not match the shape"));
            }
            let mut shape = t.dims.clone();
            *shape.last_mut().expect("non-empty") = row_bytes;
            Ok(vec![Stored {
                name: t.name.clone(),
                dtype: Dtype::U8,
                shape,
                bytes,
            }])
        }
        (_, TensorValues::Raw(_)) => Err(wrong("raw bytes are only for GGML block types")),
        (_, TensorValues::F32(v)) if v.len() != elements => Err(wrong("wrong number of values")),
        (WeightFormat::Ggml(GgmlDType::F32), TensorValues::F32(v)) => {
            one(Dtype::F32, v.iter().flat_map(|x| x.to_le_bytes()).collect())
        }
        (WeightFormat::Ggml(GgmlDType::F16), TensorValues::F32(v)) => one(
            Dtype::F16,
            v.iter()
                .flat_map(|&x| f16::from_f32(x).to_le_bytes())
                .collect(),
        ),
        (WeightFormat::Ggml(GgmlDType::BF16), TensorValues::F32(v)) => one(
            Dtype::BF16,
            v.iter()
                .flat_map(|&x| bf16::from_f32(x).to_le_bytes())
                .collect(),
        ),
        (WeightFormat::Mxfp4, TensorValues::F32(v)) => {
            let cols = *t.dims.last().unwrap_or(&1);
            if t.dims.len() != 2 || !cols.is_multiple_of(QK) {
                return Err(wrong(
                    "MXFP4 needs a matrix whose width is a multiple of 32",
                ));
            }
            let (mut codes, mut scales) = (Vec::new(), Vec::new());
            for block in v.chunks_exact(QK) {
                let q = BlockMxfp4::quantize(block);
                codes.extend_from_slice(&q.to_ocp());
                scales.push(q.e);
            }
            Ok(vec![
                Stored {
                    name: format!("{}{BLOCKS_SUFFIX}", t.name),
                    dtype: Dtype::F4,
                    shape: t.dims.clone(),
                    bytes: codes,
                },
                Stored {
                    name: format!("{}{SCALES_SUFFIX}", t.name),
                    dtype: Dtype::F8_E8M0,
                    shape: vec![t.dims[0], cols / QK],
                    bytes: scales,
                },
            ])
        }
        (WeightFormat::Ggml(d), TensorValues::F32(_)) => Err(wrong(&format!(
            "writing {d:?} from floats is not supported"
        ))),
    }
}

fn write_json(path: &Path, value: &impl serde::Serialize) -> Result<()> {
    let text = serde_json::to_string_pretty(value).map_err(|e| err(path, e.to_string()))?;
    std::fs::write(path, text + "\n").map_err(|e| err(path, e.to_string()))
}

/// A GGUF with `source`'s metadata and no tensors: the tokenizer and chat template travel in
/// the format Osprey reads them from.
fn write_tokenizer(path: &Path, source: &GgufFile) -> Result<()> {
    let mut keys: Vec<(&str, &gguf_file::Value)> = source
        .metadata()
        .iter()
        .filter(|(k, _)| k.starts_with("tokenizer.") || k.starts_with("general."))
        .map(|(k, v)| (k.as_str(), v))
        .collect();
    keys.sort_by_key(|(k, _)| *k);
    let mut file =
        std::io::BufWriter::new(std::fs::File::create(path).map_err(|e| err(path, e.to_string()))?);
    gguf_file::write(&mut file, &keys, &[]).map_err(|e| err(path, e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn planned(bytes: usize) -> PlannedTensor {
        PlannedTensor {
            name: String::new(),
            format: WeightFormat::Ggml(GgmlDType::F32),
            dims: vec![bytes / 4],
            kept: None,
        }
    }

    #[test]
    fn shards_are_contiguous_balanced_and_never_empty() {
        let plan: Vec<_> = [4000, 40, 40, 40, 40, 40, 40, 4000].map(planned).into();
        let a = assign_shards(&plan, 4);
        assert_eq!(a.first(), Some(&0));
        assert_eq!(a.last(), Some(&3));
        assert!(a.windows(2).all(|w| w[1] == w[0] || w[1] == w[0] + 1));
        // The big first tensor gets a shard to itself.
        assert_eq!(a[1], 1);
        let plan: Vec<_> = [4; 5].map(planned).into();
        assert_eq!(assign_shards(&plan, 5), vec![0, 1, 2, 3, 4]);
    }
}
