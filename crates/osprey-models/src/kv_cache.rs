//! Paged key/value storage: fixed pages of [`BLOCK_SIZE`] token slots, each holding one KV
//! group's layers.
//!
//! Layers are split into *KV groups* of equal size ([`KvLayout`]): all layers form one group
//! when every layer attends to the whole sequence; a model with sliding-window layers (Gemma 3)
//! has groups of full-attention layers and groups of windowed ones, so that a sequence can give
//! back the pages of its windowed groups once they fall behind the window while keeping the
//! full groups' pages. A sequence has one block table per group: its keys and values for a
//! layer at position `p` are in slot `p % BLOCK_SIZE` of page `table[p / BLOCK_SIZE]` of the
//! layer's group. Which pages a sequence owns is the engine's business (its `BlockAllocator`);
//! this type only stores vectors, as `f16`, per slot of a group in `[page][kv_head]` order so
//! that one head's keys (or values) in a page are contiguous. Within that, values are
//! `[slot][head_dim]` and keys transposed, `[head_dim][slot]`, the shape attention consumes them
//! in (see [`KvCache::block`]).

use half::f16;
use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};

use crate::config::ModelConfig;

/// Token slots per block.
pub const BLOCK_SIZE: usize = 16;

/// A block-table entry a window group has given back: never read (attention skips the blocks
/// before a query's window).
pub const NO_BLOCK: u32 = u32::MAX;

/// Layers that share block tables: each page of the pool holds one group's layers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvGroup {
    /// Its layers, in order.
    pub layers: Vec<usize>,
    /// The positions its layers see (the widest of their windows); `None`: all of them.
    pub window: Option<usize>,
}

/// How a model's layers split into KV groups of equal size: full-attention layers first, then
/// windowed ones. Groups are as large as the counts of the two kinds allow (their greatest
/// common divisor): Gemma 3 270M's 3 full and 15 windowed layers make 6 groups of 3.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvLayout {
    groups: Vec<KvGroup>,
    /// Per layer: its group and its slot within the group.
    place: Vec<(usize, usize)>,
}

impl KvLayout {
    /// The layout of `config`'s layers.
    pub fn new(config: &ModelConfig) -> Self {
        let windows: Vec<Option<usize>> = (0..config.n_layers)
            .map(|l| config.layer_attention(l).window)
            .collect();
        let (full, windowed): (Vec<usize>, Vec<usize>) =
            (0..config.n_layers).partition(|&l| windows[l].is_none());
        let size = gcd(full.len(), windowed.len()).max(1);
        let groups: Vec<KvGroup> = (full.chunks(size).map(|layers| KvGroup {
            layers: layers.to_vec(),
            window: None,
        }))
        .chain(windowed.chunks(size).map(|layers| KvGroup {
            layers: layers.to_vec(),
            window: layers.iter().filter_map(|&l| windows[l]).max(),
        }))
        .collect();
        let mut place = vec![(0, 0); config.n_layers];
        for (g, group) in groups.iter().enumerate() {
            for (slot, &l) in group.layers.iter().enumerate() {
                place[l] = (g, slot);
            }
        }
        Self { groups, place }
    }

    /// The groups, full-attention ones first.
    pub fn groups(&self) -> &[KvGroup] {
        &self.groups
    }

    /// Each group's window, in group order.
    pub fn windows(&self) -> Vec<Option<usize>> {
        self.groups.iter().map(|g| g.window).collect()
    }

    /// The group layer `layer` belongs to.
    pub fn group(&self, layer: usize) -> usize {
        self.place[layer].0
    }

    /// Layers per group: how many layers one page holds.
    pub fn layers_per_group(&self) -> usize {
        self.groups.first().map_or(0, |g| g.layers.len())
    }
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// The KV memory pool of one model.
pub struct KvCache {
    n_kv_heads: usize,
    head_dim: usize,
    num_blocks: usize,
    layout: KvLayout,
    /// Per slot of a group: keys of every page, as f16 bits. (Stored as `u16` so the pool is
    /// allocated zeroed by the OS and its pages become resident only as they are first used.)
    k: Vec<Vec<u16>>,
    /// Per slot: values of every page, likewise.
    v: Vec<Vec<u16>>,
}

impl KvCache {
    /// A pool of `num_blocks` pages. Memory is reserved lazily by the OS as pages are used.
    pub fn new(config: &ModelConfig, num_blocks: usize) -> Self {
        let layout = KvLayout::new(config);
        let per_slot = num_blocks * BLOCK_SIZE * config.n_kv_heads * config.head_dim;
        let slots = || {
            (0..layout.layers_per_group())
                .map(|_| vec![0u16; per_slot])
                .collect()
        };
        Self {
            n_kv_heads: config.n_kv_heads,
            head_dim: config.head_dim,
            num_blocks,
            k: slots(),
            v: slots(),
            layout,
        }
    }

    /// A pool for one sequence of up to `positions` tokens, and its block tables (one per
    /// group, its pages in order): for whole-sequence work outside the engine.
    pub fn for_sequence(config: &ModelConfig, positions: usize) -> (Self, Vec<Vec<u32>>) {
        let n = positions.div_ceil(BLOCK_SIZE).max(1);
        let groups = KvLayout::new(config).groups.len();
        let tables = (0..groups)
            .map(|g| (g * n..(g + 1) * n).map(|b| b as u32).collect())
            .collect();
        (Self::new(config, groups * n), tables)
    }

    /// Pages in the pool.
    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// How the layers split into groups.
    pub fn layout(&self) -> &KvLayout {
        &self.layout
    }

    /// Pages that fit in `bytes` of memory.
    pub fn blocks_for_bytes(config: &ModelConfig, bytes: usize) -> usize {
        let layers = KvLayout::new(config).layers_per_group().max(1);
        let per_layer_token = config.kv_bytes_per_token() / config.n_layers.max(1);
        bytes / (per_layer_token * layers * BLOCK_SIZE)
    }

    fn offset(&self, block: u32, head: usize, slot: usize) -> usize {
        ((block as usize * self.n_kv_heads + head) * BLOCK_SIZE + slot) * self.head_dim
    }

    /// Stores the keys and values of the token at `pos` (all KV heads, back to back) in layer
    /// `layer`, whose group's block table is `table`.
    pub fn write(&mut self, layer: usize, table: &[u32], pos: usize, k: &[f32], v: &[f32]) {
        let block = table[pos / BLOCK_SIZE];
        let slot_of_layer = self.layout.place[layer].1;
        assert!(
            (block as usize) < self.num_blocks,
            "block {block} out of range"
        );
        let (hd, slot) = (self.head_dim, pos % BLOCK_SIZE);
        for h in 0..self.n_kv_heads {
            let (src_k, src_v) = (&k[h * hd..(h + 1) * hd], &v[h * hd..(h + 1) * hd]);
            // Keys are transposed within the block: dimension d of slot s at d * 16 + s.
            let start = self.offset(block, h, 0);
            let keys = &mut self.k[slot_of_layer][start..start + BLOCK_SIZE * hd];
            for (d, &x) in src_k.iter().enumerate() {
                keys[d * BLOCK_SIZE + slot] = f16::from_f32(x).to_bits();
            }
            let o = self.offset(block, h, slot);
            self.v[slot_of_layer][o..o + hd]
                .reinterpret_cast_mut::<f16>()
                .convert_from_f32_slice(src_v);
        }
    }

    /// Keys and values of KV head `head` in page `block` of layer `layer` (a page of the
    /// layer's group), borrowed in place:
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
        let slot = self.layout.place[layer].1;
        (
            self.k[slot][span.clone()].reinterpret_cast::<f16>(),
            self.v[slot][span].reinterpret_cast::<f16>(),
        )
    }

    /// `f16` values one page holds over its group's layers, keys and values: the length of
    /// [`Self::read_block`]'s output.
    pub fn block_len(&self) -> usize {
        2 * self.k.len() * self.n_kv_heads * BLOCK_SIZE * self.head_dim
    }

    /// The shape of a page's contents: `(layers of a group, kv_heads, head_dim)`.
    pub fn block_shape(&self) -> (usize, usize, usize) {
        (self.k.len(), self.n_kv_heads, self.head_dim)
    }

    /// Appends page `block`'s contents, as `f16` bits, to `out`: per layer of its group, its
    /// keys then its values, each `[kv_head][BLOCK_SIZE · head_dim]` in the pool's layout.
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

    /// Copies page `src`'s contents into page `dst` (copy-on-write).
    pub fn copy_block(&mut self, src: u32, dst: u32) {
        let len = self.n_kv_heads * BLOCK_SIZE * self.head_dim;
        let (s, d) = (self.offset(src, 0, 0), self.offset(dst, 0, 0));
        for layer in self.k.iter_mut().chain(self.v.iter_mut()) {
            layer.copy_within(s..s + len, d);
        }
    }
}
