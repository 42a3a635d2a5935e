//! Paged key/value storage: fixed blocks of [`BLOCK_SIZE`] token slots shared by all layers.
//!
//! A sequence's keys and values live in the blocks its block table lists, in order: token at
//! position `p` is slot `p % BLOCK_SIZE` of block `table[p / BLOCK_SIZE]`. Which blocks a
//! sequence owns is the engine's business (its `BlockAllocator`); this type only stores
//! vectors, as `f16`, per layer in `[block][kv_head]` order so that one head's keys (or values)
//! in a block are contiguous. Within that, values are `[slot][head_dim]` and keys transposed,
//! `[head_dim][slot]`, the shape attention consumes them in (see [`KvCache::block`]).

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
        let (hd, slot) = (self.head_dim, pos % BLOCK_SIZE);
        for h in 0..self.n_kv_heads {
            let (src_k, src_v) = (&k[h * hd..(h + 1) * hd], &v[h * hd..(h + 1) * hd]);
            // Keys are transposed within the block: dimension d of slot s at d * 16 + s.
            let start = self.offset(block, h, 0);
            let keys = &mut self.k[layer][start..start + BLOCK_SIZE * hd];
            for (d, &x) in src_k.iter().enumerate() {
                keys[d * BLOCK_SIZE + slot] = f16::from_f32(x).to_bits();
            }
            let o = self.offset(block, h, slot);
            self.v[layer][o..o + hd]
                .reinterpret_cast_mut::<f16>()
                .convert_from_f32_slice(src_v);
        }
    }

    /// Keys and values of KV head `head` in block `block` of layer `layer`, borrowed in place:
    /// `BLOCK_SIZE * head_dim` each, keys transposed (`[head_dim][slot]`: dimension `d` of slot
    /// `s` at `d * BLOCK_SIZE + s`), values slot by slot (`[slot][head_dim]`).
    ///
    /// Slots the owning sequence has not written yet hold whatever the block held before;
    /// readers must mask them.
    pub fn block(&self, layer: usize, block: u32, head: usize) -> (&[f16], &[f16]) {
        assert!(
            (block as usize) < self.num_blocks,
            "block {block} out of range"
        );
        let o = self.offset(block, head, 0);
        let span = o..o + BLOCK_SIZE * self.head_dim;
        (
            self.k[layer][span.clone()].reinterpret_cast::<f16>(),
            self.v[layer][span].reinterpret_cast::<f16>(),
        )
    }

    /// `f16` values one block holds over all layers, keys and values: the length of
    /// [`Self::read_block`]'s output.
    pub fn block_len(&self) -> usize {
        2 * self.k.len() * self.n_kv_heads * BLOCK_SIZE * self.head_dim
    }

    /// The shape of a block's contents: `(layers, kv_heads, head_dim)`.
    pub fn block_shape(&self) -> (usize, usize, usize) {
        (self.k.len(), self.n_kv_heads, self.head_dim)
    }

    /// Appends block `block`'s contents, as `f16` bits, to `out`: per layer, its keys then its
    /// values, each `[kv_head][BLOCK_SIZE · head_dim]` in the pool's layout.
    pub fn read_block(&self, block: u32, out: &mut Vec<u16>) {
        let len = self.n_kv_heads * BLOCK_SIZE * self.head_dim;
        let o = self.offset(block, 0, 0);
        for (k, v) in self.k.iter().zip(&self.v) {
            out.extend_from_slice(&k[o..o + len]);
            out.extend_from_slice(&v[o..o + len]);
        }
    }

    /// Overwrites block `block` with contents [`Self::read_block`] produced.
    pub fn write_block(&mut self, block: u32, data: &[u16]) {
        assert_eq!(data.len(), self.block_len(), "a block's contents");
        let len = self.n_kv_heads * BLOCK_SIZE * self.head_dim;
        let o = self.offset(block, 0, 0);
        let mut parts = data.chunks_exact(len);
        for (k, v) in self.k.iter_mut().zip(self.v.iter_mut()) {
            k[o..o + len].copy_from_slice(parts.next().expect("sized"));
            v[o..o + len].copy_from_slice(parts.next().expect("sized"));
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
