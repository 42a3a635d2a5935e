//! GGUF files: metadata and tensor bytes, memory-mapped.
//!
//! Parsing of the header is candle's (`candle_core::quantized::gguf_file`); this module adds the
//! typed metadata accessors the architectures need and zero-copy access to tensor data.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use candle_core::quantized::GgmlDType;
use candle_core::quantized::gguf_file::{Content, Value};
use memmap2::Mmap;

use crate::error::{ModelError, Result};

/// An open GGUF file: its parsed header and a read-only map of its bytes.
pub struct GgufFile {
    path: PathBuf,
    content: Content,
    map: Mmap,
}

/// A tensor's description and its raw bytes inside the mapped file.
#[derive(Clone, Copy)]
pub struct TensorView<'a> {
    /// Storage type of the elements.
    pub dtype: GgmlDType,
    /// Shape, outermost dimension first (`[rows, cols]` for a matrix).
    pub dims: &'a [usize],
    /// The raw bytes, exactly `elements / block_size * type_size` long.
    pub bytes: &'a [u8],
}

impl GgufFile {
    /// Opens and maps `path`, parsing and bounds-checking its header.
    pub fn open(path: &Path) -> Result<Self> {
        let display = path.display().to_string();
        let io = |source| ModelError::Io {
            path: display.clone(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        // The header is tens of thousands of small reads (one per vocabulary entry): buffer them.
        let content = Content::read(&mut std::io::BufReader::new(&file)).map_err(|e| {
            ModelError::InvalidGguf {
                path: display.clone(),
                // candle appends a backtrace to some errors: the first line says what is wrong.
                reason: e.to_string().lines().next().unwrap_or_default().to_owned(),
            }
        })?;
        // SAFETY: the map is read-only and the file is not modified while Osprey runs; a model
        // file being rewritten underneath a running server is outside what any loader defends.
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        let gguf = Self {
            path: path.to_owned(),
            content,
            map,
        };
        gguf.check_tensor_bounds()?;
        Ok(gguf)
    }

    /// The file this was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// All metadata entries.
    pub fn metadata(&self) -> &HashMap<String, Value> {
        &self.content.metadata
    }

    /// Names of all tensors in the file.
    pub fn tensor_names(&self) -> impl Iterator<Item = &str> {
        self.content.tensor_infos.keys().map(String::as_str)
    }

    /// A tensor by name, or `None` when the file has no such tensor.
    pub fn tensor(&self, name: &str) -> Option<TensorView<'_>> {
        let info = self.content.tensor_infos.get(name)?;
        let start = (self.content.tensor_data_offset + info.offset) as usize;
        let len = tensor_size(info.ggml_dtype, info.shape.elem_count())
            .expect("every tensor's size was checked at open");
        Some(TensorView {
            dtype: info.ggml_dtype,
            dims: info.shape.dims(),
            bytes: &self.map[start..start + len],
        })
    }

    /// A tensor the architecture requires.
    pub fn require(&self, name: &str) -> Result<TensorView<'_>> {
        self.tensor(name)
            .ok_or_else(|| ModelError::MissingTensor(name.to_owned()))
    }

    /// A string metadata value.
    pub fn str(&self, key: &str) -> Result<&str> {
        match self.metadata().get(key) {
            Some(Value::String(s)) => Ok(s),
            _ => Err(missing(key)),
        }
    }

    /// An integer metadata value of any width.
    pub fn uint(&self, key: &str) -> Result<u64> {
        self.opt_uint(key)?.ok_or_else(|| missing(key))
    }

    /// An optional integer metadata value; present with the wrong type is an error.
    pub fn opt_uint(&self, key: &str) -> Result<Option<u64>> {
        let Some(v) = self.metadata().get(key) else {
            return Ok(None);
        };
        let n = match *v {
            Value::U8(x) => x as u64,
            Value::U16(x) => x as u64,
            Value::U32(x) => x as u64,
            Value::U64(x) => x,
            Value::I8(x) if x >= 0 => x as u64,
            Value::I16(x) if x >= 0 => x as u64,
            Value::I32(x) if x >= 0 => x as u64,
            Value::I64(x) if x >= 0 => x as u64,
            _ => return Err(missing(key)),
        };
        Ok(Some(n))
    }

    /// An optional float metadata value.
    pub fn opt_f32(&self, key: &str) -> Result<Option<f32>> {
        match self.metadata().get(key) {
            None => Ok(None),
            Some(Value::F32(x)) => Ok(Some(*x)),
            Some(Value::F64(x)) => Ok(Some(*x as f32)),
            Some(_) => Err(missing(key)),
        }
    }

    /// An optional boolean metadata value.
    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        match self.metadata().get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(missing(key)),
        }
    }

    /// An optional array metadata value.
    pub fn opt_array(&self, key: &str) -> Result<Option<&[Value]>> {
        match self.metadata().get(key) {
            None => Ok(None),
            Some(Value::Array(a)) => Ok(Some(a)),
            Some(_) => Err(missing(key)),
        }
    }

    /// Every tensor must lie inside the file: checked once so `tensor` can slice freely.
    fn check_tensor_bounds(&self) -> Result<()> {
        for (name, info) in &self.content.tensor_infos {
            let invalid = |reason: String| ModelError::InvalidGguf {
                path: self.path.display().to_string(),
                reason,
            };
            // The header's dimensions are untrusted: their product may not fit (found by the
            // `gguf_header` fuzz target).
            let elems = (info.shape.dims().iter())
                .try_fold(1usize, |n, &d| n.checked_mul(d))
                .ok_or_else(|| invalid(format!("tensor `{name}` has more elements than fit")))?;
            if elems % info.ggml_dtype.block_size() != 0 {
                return Err(invalid(format!(
                    "tensor `{name}` has {elems} elements, not a multiple of its block size"
                )));
            }
            let end = (self.content.tensor_data_offset)
                .checked_add(info.offset)
                .and_then(|s| s.checked_add(tensor_size(info.ggml_dtype, elems)? as u64));
            if end.is_none_or(|end| end > self.map.len() as u64) {
                return Err(invalid(format!(
                    "tensor `{name}` extends past the end of the file"
                )));
            }
        }
        Ok(())
    }
}

fn tensor_size(dtype: GgmlDType, elems: usize) -> Option<usize> {
    (elems / dtype.block_size()).checked_mul(dtype.type_size())
}

fn missing(key: &str) -> ModelError {
    ModelError::Metadata {
        key: key.to_owned(),
    }
}
