//! Paged key/value storage: fixed blocks of [`BLOCK_SIZE`] token slots shared by all layers.
//!
//! A sequence's keys and values live in the blocks its block table lists, in order: token at
//! position `p` is slot `p % BLOCK_SIZE` of block `table[p / BLOCK_SIZE]`. Which blocks a
//! sequence owns is the engine's business (its `BlockAllocator`); this type only stores
//! vectors, as `f16`, laid out `[block][kv_head][slot][head_dim]` per layer so that one head's
//! keys in a block are contiguous.

use half::f16;
use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};

use crate::config::ModelConfig;

/// Token slots per block.
pub const BLOCK_SIZE: usize = 16;

/// The KV memory pool of one model.
pub struct KvCache {
    n_kv_heads: usize,
    head_dim: usize,
    num_blocks: usize,
    /// Per layer: keys of every block, as f16 bits. (Stored as `u16` so the pool is allocated
    /// zeroed by the OS and its pages become resident only as blocks are first used.)
    k: Vec<Vec<u16>>,
    /// Per layer: values of every block, likewise.
    v: Vec<Vec<u16>>,
}

impl KvCache {
    /// A pool of `num_blocks` blocks. Memory is reserved lazily by the OS as blocks are used.
    pub fn new(config: &ModelConfig, num_blocks: usize) -> Self {
        let per_layer = num_blocks * BLOCK_SIZE * config.n_kv_heads * config.head_dim;
        let layers = || {
            (0..config.n_layers)
                .map(|_| vec![0u16; per_layer])
                .collect()
        };
        Self {
            n_kv_heads: config.n_kv_heads,
            head_dim: config.head_dim,
            num_blocks,
            k: layers(),
            v: layers(),
        }
    }

    /// Blocks in the pool.
    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// Blocks that fit in `bytes` of memory.
    pub fn blocks_for_bytes(config: &ModelConfig, bytes: usize) -> usize {
        bytes / (config.kv_bytes_per_token() * BLOCK_SIZE)
    }

    fn offset(&self, block: u32, head: usize, slot: usize) -> usize {
        ((block as usize * self.n_kv_heads + head) * BLOCK_SIZE + slot) * self.head_dim
    }

    /// Stores the keys and values of the token at `pos` (all KV heads, back to back).
    pub fn write(&mut self, layer: usize, table: &[u32], pos: usize, k: &[f32], v: &[f32]) {
        let block = table[pos / BLOCK_SIZE];
        assert!(
            (block as usize) < self.num_blocks,
            "block {block} out of range"
        );
        let hd = self.head_dim;
        for h in 0..self.n_kv_heads {
            let o = self.offset(block, h, pos % BLOCK_SIZE);
            let (src_k, src_v) = (&k[h * hd..(h + 1) * hd], &v[h * hd..(h + 1) * hd]);
            self.k[layer][o..o + hd]
                .reinterpret_cast_mut::<f16>()
                .convert_from_f32_slice(src_k);
            self.v[layer][o..o + hd]
                .reinterpret_cast_mut::<f16>()
                .convert_from_f32_slice(src_v);
        }
    }

    /// Copies keys and values of positions `0..n` of one KV head into `k` and `v` as f32
    /// (`n * head_dim` each).
    pub fn gather(
        &self,
        layer: usize,
        table: &[u32],
        head: usize,
        n: usize,
        k: &mut Vec<f32>,
        v: &mut Vec<f32>,
    ) {
        let hd = self.head_dim;
        k.resize(n * hd, 0.0);
        v.resize(n * hd, 0.0);
        for (b, &block) in table.iter().enumerate().take(n.div_ceil(BLOCK_SIZE)) {
            let slots = (n - b * BLOCK_SIZE).min(BLOCK_SIZE);
            let o = self.offset(block, head, 0);
            let dst = b * BLOCK_SIZE * hd..(b * BLOCK_SIZE + slots) * hd;
            let src = o..o + slots * hd;
            let keys = self.k[layer][src.clone()].reinterpret_cast::<f16>();
            keys.convert_to_f32_slice(&mut k[dst.clone()]);
            self.v[layer][src]
                .reinterpret_cast::<f16>()
                .convert_to_f32_slice(&mut v[dst]);
        }
    }

    /// Copies every layer's contents of block `src` into block `dst` (copy-on-write).
    pub fn copy_block(&mut self, src: u32, dst: u32) {
        let len = self.n_kv_heads * BLOCK_SIZE * self.head_dim;
        let (s, d) = (self.offset(src, 0, 0), self.offset(dst, 0, 0));
        for layer in self.k.iter_mut().chain(self.v.iter_mut()) {
            layer.copy_within(s..s + len, d);
        }
    }
}
