//! Sharded safetensors checkpoints: MXFP4 (or F16, or GGML blocks kept as they came) in N
//! shards with a Hugging Face-style index ([`layout`] has the files and encodings).
//!
//! [`Checkpoint::open`] checks everything before a byte is used: the index parses and names
//! only listed shards; every shard is there, has the recorded size and SHA-256 (hashed in
//! parallel, one task per shard) and a valid safetensors header; every tensor the index maps
//! is in its shard. A problem is an error naming the file at fault. [`write`] produces one.

pub mod layout;
mod write;

use std::borrow::Cow;
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use candle_core::quantized::GgmlDType;
use memmap2::Mmap;
use rayon::prelude::*;
use safetensors::tensor::{Dtype, SafeTensors, TensorInfo};
use sha2::{Digest, Sha256};

use crate::error::{ModelError, Result};
use crate::kernels::blocks::QK;
use crate::kernels::matmul::WeightFormat;
use crate::kernels::mxfp4::BlockMxfp4;
use crate::source::{TensorData, WeightSource};
use layout::{
    BLOCKS_SUFFIX, CONFIG_FILE, CheckpointConfig, INDEX_FILE, Index, SCALES_SUFFIX, ShardRecord,
    TOKENIZER_FILE,
};
pub use write::{PlannedTensor, TensorValues, WriteOptions, write};

/// An open, validated checkpoint directory.
pub struct Checkpoint {
    dir: PathBuf,
    config: CheckpointConfig,
    index: Index,
    shards: Vec<Shard>,
    /// Stored tensor name → shard index.
    location: HashMap<String, usize>,
}

struct Shard {
    map: Mmap,
    /// Offset of the data section in the file.
    data_start: usize,
    tensors: HashMap<String, TensorInfo>,
}

fn err(path: &Path, reason: impl Into<String>) -> ModelError {
    ModelError::Checkpoint {
        path: path.display().to_string(),
        reason: reason.into(),
    }
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T> {
    let text = std::fs::read_to_string(path).map_err(|e| err(path, e.to_string()))?;
    serde_json::from_str(&text).map_err(|e| err(path, format!("invalid JSON: {e}")))
}

impl Checkpoint {
    /// Whether `path` is a checkpoint directory (it has an index file).
    pub fn is_checkpoint(path: &Path) -> bool {
        path.join(INDEX_FILE).is_file()
    }

    /// Opens and validates the checkpoint in `dir`, mapping and hashing its shards in
    /// parallel.
    pub fn open(dir: &Path) -> Result<Self> {
        let config: CheckpointConfig = read_json(&dir.join(CONFIG_FILE))?;
        let index_path = dir.join(INDEX_FILE);
        let index: Index = read_json(&index_path)?;
        let position: HashMap<&str, usize> = index
            .metadata
            .shards
            .iter()
            .enumerate()
            .map(|(i, s)| (s.file.as_str(), i))
            .collect();
        let mut location = HashMap::with_capacity(index.weight_map.len());
        for (tensor, file) in &index.weight_map {
            let Some(&i) = position.get(file.as_str()) else {
                return Err(err(
                    &index_path,
                    format!("maps `{tensor}` to `{file}`, which is not a listed shard"),
                ));
            };
            location.insert(tensor.clone(), i);
        }
        let shards = index
            .metadata
            .shards
            .par_iter()
            .map(|record| Shard::open(dir, record))
            .collect::<Result<Vec<_>>>()?;
        for (tensor, &i) in &location {
            if !shards[i].tensors.contains_key(tensor) {
                let file = dir.join(&index.metadata.shards[i].file);
                return Err(err(
                    &file,
                    format!("the index puts `{tensor}` here, but the shard does not hold it"),
                ));
            }
        }
        Ok(Self {
            dir: dir.to_owned(),
            config,
            index,
            shards,
            location,
        })
    }

    /// The checkpoint's `config.json`.
    pub fn config(&self) -> &CheckpointConfig {
        &self.config
    }

    /// The checkpoint's index.
    pub fn index(&self) -> &Index {
        &self.index
    }

    /// The GGUF holding the tokenizer and chat template.
    pub fn tokenizer_path(&self) -> PathBuf {
        self.dir.join(TOKENIZER_FILE)
    }

    /// A stored tensor's info and bytes.
    fn stored(&self, name: &str) -> Option<(&TensorInfo, &[u8])> {
        let shard = &self.shards[*self.location.get(name)?];
        let info = shard.tensors.get(name)?;
        let (a, b) = info.data_offsets;
        Some((info, &shard.map[shard.data_start + a..shard.data_start + b]))
    }

    fn mxfp4(&self, name: &str) -> Result<Option<TensorData<'_>>> {
        let (blocks_name, scales_name) = (
            format!("{name}{BLOCKS_SUFFIX}"),
            format!("{name}{SCALES_SUFFIX}"),
        );
        let (Some((b, codes)), Some((s, scales))) =
            (self.stored(&blocks_name), self.stored(&scales_name))
        else {
            return Ok(None);
        };
        let bad = |m: String| ModelError::Input(format!("MXFP4 tensor `{name}`: {m}"));
        let [rows, cols] = b.shape[..] else {
            return Err(bad(format!("blocks have shape {:?}", b.shape)));
        };
        if b.dtype != Dtype::F4 || s.dtype != Dtype::F8_E8M0 {
            return Err(bad(format!("stored as {:?}/{:?}", b.dtype, s.dtype)));
        }
        if !cols.is_multiple_of(QK) || s.shape != [rows, cols / QK] {
            return Err(bad(format!(
                "scales {:?} for blocks {:?}",
                s.shape, b.shape
            )));
        }
        let mut bytes = Vec::with_capacity(rows * cols / QK * std::mem::size_of::<BlockMxfp4>());
        for (packed, &e) in codes.chunks_exact(QK / 2).zip(scales) {
            let block = BlockMxfp4::from_ocp(e, packed);
            bytes.push(block.e);
            bytes.extend_from_slice(&block.qs);
        }
        Ok(Some(TensorData {
            format: WeightFormat::Mxfp4,
            dims: vec![rows, cols],
            bytes: Cow::Owned(bytes),
        }))
    }
}

impl Shard {
    fn open(dir: &Path, record: &ShardRecord) -> Result<Self> {
        let path = dir.join(&record.file);
        let file = File::open(&path).map_err(|e| err(&path, format!("shard missing: {e}")))?;
        let len = file
            .metadata()
            .map_err(|e| err(&path, e.to_string()))?
            .len();
        if len != record.bytes {
            return Err(err(
                &path,
                format!(
                    "shard truncated or replaced: {len} bytes, the index records {}",
                    record.bytes
                ),
            ));
        }
        // SAFETY: read-only map of a file Osprey does not modify while it runs.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| err(&path, e.to_string()))?;
        let digest = hex(&Sha256::digest(&map[..]));
        if digest != record.sha256 {
            return Err(err(
                &path,
                format!(
                    "shard checksum mismatch: SHA-256 {digest}, the index records {}",
                    record.sha256
                ),
            ));
        }
        let (header, metadata) = SafeTensors::read_metadata(&map)
            .map_err(|e| err(&path, format!("not a safetensors file: {e}")))?;
        let tensors = metadata
            .tensors()
            .into_iter()
            .map(|(name, info)| (name, info.clone()))
            .collect();
        Ok(Self {
            map,
            data_start: 8 + header,
            tensors,
        })
    }
}

/// The GGUF file holding the tokenizer of the model at `path`: the file itself, or a
/// checkpoint directory's `tokenizer.gguf`.
pub fn tokenizer_file(path: &Path) -> PathBuf {
    if Checkpoint::is_checkpoint(path) {
        path.join(TOKENIZER_FILE)
    } else {
        path.to_owned()
    }
}

/// Lower-case hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The GGML type named `name` as its `Debug` form prints it (`Q4_1`, `Q6K`, ...).
fn ggml_type(name: &str) -> Option<GgmlDType> {
    use GgmlDType::*;
    [
        F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2K, Q3K, Q4K, Q5K, Q6K, Q8K,
    ]
    .into_iter()
    .find(|d| format!("{d:?}") == name)
}

impl WeightSource for Checkpoint {
    fn tensor(&self, name: &str) -> Result<Option<TensorData<'_>>> {
        let Some((info, bytes)) = self.stored(name) else {
            return self.mxfp4(name);
        };
        let format = match (info.dtype, self.index.metadata.formats.get(name)) {
            (Dtype::F32, _) => GgmlDType::F32,
            (Dtype::F16, _) => GgmlDType::F16,
            (Dtype::BF16, _) => GgmlDType::BF16,
            (Dtype::U8, Some(t)) => ggml_type(t).ok_or_else(|| {
                ModelError::Input(format!("tensor `{name}`: unknown block type `{t}`"))
            })?,
            (dtype, _) => {
                return Err(ModelError::Input(format!(
                    "tensor `{name}` is stored as {dtype:?}, which Osprey does not read"
                )));
            }
        };
        let mut dims = info.shape.clone();
        if info.dtype == Dtype::U8
            && let Some(last) = dims.last_mut()
        {
            // `[rows, row bytes]` → `[rows, cols]`.
            *last = *last / format.type_size() * format.block_size();
        }
        Ok(Some(TensorData {
            format: WeightFormat::Ggml(format),
            dims,
            bytes: Cow::Borrowed(bytes),
        }))
    }

    fn contains(&self, name: &str) -> bool {
        self.location.contains_key(name)
            || self
                .location
                .contains_key(&format!("{name}{BLOCKS_SUFFIX}"))
    }
}
