//! Where a model's tensors come from: a GGUF file or a sharded safetensors checkpoint, seen
//! through one interface so the architectures load from either.

use std::borrow::Cow;

use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;
use crate::kernels::matmul::{QMatrix, WeightFormat};

/// A tensor's storage format, shape and bytes in that format's block layout.
pub struct TensorData<'a> {
    /// Storage format.
    pub format: WeightFormat,
    /// Shape, outermost dimension first (`[rows, cols]` for a matrix).
    pub dims: Vec<usize>,
    /// The bytes, borrowed from a mapped file when they are used as stored.
    pub bytes: Cow<'a, [u8]>,
}

/// A set of named tensors.
pub trait WeightSource: Sync {
    /// A tensor by name, or `None` when there is no such tensor.
    fn tensor(&self, name: &str) -> Result<Option<TensorData<'_>>>;

    /// Whether a tensor exists.
    fn contains(&self, name: &str) -> bool;

    /// A tensor the architecture requires.
    fn require(&self, name: &str) -> Result<TensorData<'_>> {
        self.tensor(name)?
            .ok_or_else(|| ModelError::MissingTensor(name.to_owned()))
    }

    /// A tensor checked to have shape `dims`.
    fn shaped(&self, name: &str, dims: &[usize]) -> Result<TensorData<'_>> {
        let t = self.require(name)?;
        if t.dims != dims {
            return Err(ModelError::Shape {
                tensor: name.to_owned(),
                actual: t.dims,
                expected: dims.to_vec(),
            });
        }
        Ok(t)
    }

    /// A `[rows, cols]` weight matrix.
    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<QMatrix> {
        let t = self.shaped(name, &[rows, cols])?;
        matrix(name, t.format, rows, cols, &t.bytes)
    }

    /// A 1-D tensor of `len` floats (norm weights, biases).
    fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        let t = self.shaped(name, &[len])?;
        let m = matrix(name, t.format, 1, len, &t.bytes)?;
        let mut out = vec![0.0; len];
        m.row_to_f32(0, &mut out);
        Ok(out)
    }
}

/// A matrix from bytes, with a clear error when the format has no kernel or the width does
/// not divide into its blocks.
pub fn matrix(
    name: &str,
    format: WeightFormat,
    rows: usize,
    cols: usize,
    bytes: &[u8],
) -> Result<QMatrix> {
    let unsupported = || ModelError::UnsupportedTensorType {
        tensor: name.to_owned(),
        format,
    };
    if !cols.is_multiple_of(format.block_size()) || bytes.len() != format.bytes(rows, cols) {
        return Err(unsupported());
    }
    QMatrix::from_bytes(format, rows, cols, bytes).ok_or_else(unsupported)
}

impl WeightSource for GgufFile {
    fn tensor(&self, name: &str) -> Result<Option<TensorData<'_>>> {
        Ok(GgufFile::tensor(self, name).map(|v| TensorData {
            format: WeightFormat::Ggml(v.dtype),
            dims: v.dims.to_vec(),
            bytes: Cow::Borrowed(v.bytes),
        }))
    }

    fn contains(&self, name: &str) -> bool {
        GgufFile::tensor(self, name).is_some()
    }
}
