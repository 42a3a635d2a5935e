//! Causal attention over the paged KV cache, for a batch of sequences at different positions.

use std::cell::RefCell;

use super::ops::softmax;
use super::par::SharedMut;
use crate::kv_cache::KvCache;
use rayon::prelude::*;

/// One sequence's share of a batch, as attention sees it.
#[derive(Clone, Copy, Debug)]
pub struct AttentionSeq<'a> {
    /// Row of the batch holding this sequence's first new token.
    pub first_row: usize,
    /// New tokens (queries) this step.
    pub n_new: usize,
    /// Tokens already in the cache before this step (the first new token's position).
    pub start_pos: usize,
    /// The sequence's block table.
    pub block_table: &'a [u32],
}

/// Head layout of an attention layer.
#[derive(Clone, Copy, Debug)]
pub struct AttentionShape {
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads.
    pub n_kv_heads: usize,
    /// Width of a head.
    pub head_dim: usize,
}

/// Queries per task: keys are gathered once per task, so larger chunks gather less often,
/// smaller ones balance better.
const QUERY_CHUNK: usize = 32;

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Per-thread buffers: one KV head's keys (transposed) and values as f32, and scores.
#[derive(Default)]
struct Scratch {
    keys_t: Vec<f32>,
    values: Vec<f32>,
    scores: Vec<f32>,
}

/// For every new token of every sequence, attends its query heads over the keys and values of
/// positions `0..=pos` in `kv` (layer `layer`), writing `out[row][head * head_dim ..]`.
///
/// `q` holds the batch's query rows, each `q_stride` floats apart with the heads first; `out`
/// has `n_heads * head_dim` floats per row. Work is split by (sequence, KV head, chunk of
/// queries); each task converts the keys and values its queries can see to f32 once and
/// serves all query heads of its KV group from them.
pub fn attention(
    shape: AttentionShape,
    q: &[f32],
    q_stride: usize,
    kv: &KvCache,
    layer: usize,
    seqs: &[AttentionSeq],
    out: &mut [f32],
) {
    let AttentionShape {
        n_heads,
        n_kv_heads,
        head_dim: hd,
    } = shape;
    let group = n_heads / n_kv_heads;
    let out_stride = n_heads * hd;
    let scale = 1.0 / (hd as f32).sqrt();
    let out = SharedMut::new(out);
    let tasks: Vec<(usize, usize, usize)> = seqs
        .iter()
        .enumerate()
        .flat_map(|(s, seq)| {
            (0..n_kv_heads)
                .flat_map(move |g| (0..seq.n_new).step_by(QUERY_CHUNK).map(move |c| (s, g, c)))
        })
        .collect();
    tasks.par_iter().for_each(|&(s, g, chunk)| {
        let seq = &seqs[s];
        let queries = chunk..(chunk + QUERY_CHUNK).min(seq.n_new);
        let n_keys = seq.start_pos + queries.end;
        debug_assert!(seq.block_table.len() * crate::kv_cache::BLOCK_SIZE >= n_keys);
        SCRATCH.with_borrow_mut(|sc| {
            kv.gather(
                layer,
                seq.block_table,
                g,
                n_keys,
                &mut sc.keys_t,
                &mut sc.values,
            );
            transpose_in_place(&mut sc.keys_t, n_keys, hd, &mut sc.scores);
            for h in g * group..(g + 1) * group {
                for i in queries.clone() {
                    let row = seq.first_row + i;
                    let visible = seq.start_pos + i + 1;
                    let qh = &q[row * q_stride + h * hd..row * q_stride + (h + 1) * hd];
                    let scores = &mut sc.scores;
                    scores.clear();
                    scores.resize(visible, 0.0);
                    // scores[j] = q · k_j, accumulated one dimension at a time across keys.
                    for (d, &qd) in qh.iter().enumerate() {
                        let kd = &sc.keys_t[d * n_keys..d * n_keys + visible];
                        for (s, &k) in scores.iter_mut().zip(kd) {
                            *s = qd.mul_add(k, *s);
                        }
                    }
                    for s in scores.iter_mut() {
                        *s *= scale;
                    }
                    softmax(scores);
                    // SAFETY: (row, head h) is written by this task only: rows belong to one
                    // sequence and query chunk, heads to one KV group.
                    let o = unsafe { out.slice(row * out_stride + h * hd, hd) };
                    o.fill(0.0);
                    for (&p, v) in scores.iter().zip(sc.values.chunks_exact(hd)) {
                        for (o, &v) in o.iter_mut().zip(v) {
                            *o = p.mul_add(v, *o);
                        }
                    }
                }
            }
        });
    });
}

/// Turns `m` (`rows × cols`, row-major) into its transpose, using `tmp` as scratch.
fn transpose_in_place(m: &mut Vec<f32>, rows: usize, cols: usize, tmp: &mut Vec<f32>) {
    tmp.clear();
    tmp.resize(rows * cols, 0.0);
    for (r, row) in m.chunks_exact(cols).enumerate() {
        for (c, &v) in row.iter().enumerate() {
            tmp[c * rows + r] = v;
        }
    }
    std::mem::swap(m, tmp);
}
