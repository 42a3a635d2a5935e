//! CPU kernels: quantized matmul, attention over the paged cache, and the small ops between.

pub mod attention;
pub mod blocks;
pub mod heat;
pub mod matmul;
pub mod mxfp4;
pub mod ops;
pub mod par;
pub mod tiles;
