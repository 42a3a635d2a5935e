//! Causal attention over the paged KV cache, for a batch of sequences at different positions.
//!
//! Keys and values are read in place through each sequence's block table, one cache block
//! ([`BLOCK_SIZE`] positions) at a time, flash-attention style; no sequence's history is ever
//! copied whole. A task (some query heads of one KV group, for a chunk of one sequence's new
//! tokens) converts each block of its KV head to f32 once, into a per-thread tile of
//! `2 × 16 × head_dim` floats (8 KiB at `head_dim` 64, so it stays in L1), and feeds it to
//! every query it serves whose causal window reaches into the block.
//!
//! Each query keeps an online softmax: a running maximum `m`, a running sum `l` of
//! `e^(score - m)`, and an unnormalised output `o`. A block's scores are computed for its
//! visible slots; if they raise the maximum, `l` and `o` are first rescaled by `e^(m_old -
//! m_new)`; then the block's weights are added to `l` and its weighted values to `o`. After the
//! last block, `o / l` is the output.
//!
//! Keys are stored transposed within a block (`[dim][slot]`, see [`KvCache::block`]), so a
//! query's 16 scores accumulate slot-parallel, one broadcast dimension at a time, with no
//! horizontal sums; values are `[slot][dim]` and accumulate into `o` in registers.
//!
//! **Batch invariance.** A query's arithmetic depends only on its own vector, its position and
//! the cache: every query walks its blocks in order with the same code, whichever task serves
//! it and whatever else is in the batch. The task split can therefore follow the batch (it
//! spreads a KV group's query heads over several tasks when there are few, as in decode)
//! without changing a single bit of the output.

use std::cell::RefCell;
use std::ops::Range;

use half::slice::HalfFloatSliceExt;
use rayon::prelude::*;

use super::ops::exp;
use super::par::SharedMut;
use crate::kv_cache::{BLOCK_SIZE, KvCache};

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
    /// Positions a query sees, its own included (a sliding window); `None` sees them all.
    pub window: Option<usize>,
}

/// Query rows per task. A task converts each block it reads once for all its queries (these
/// rows times its query heads), so larger chunks convert less often; smaller ones balance
/// better and keep the queries' outputs in L1.
const QUERY_CHUNK: usize = 32;

/// Independent FMA chains per score: dimension `d` accumulates in chain `d % 4`.
const DOT_CHAINS: usize = 4;

/// Output floats a query accumulates in registers at once (8 AVX registers).
const OUT_TILE: usize = 64;

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Per-thread buffers: one block of one KV head as f32, and the task's softmax states.
#[derive(Default)]
struct Scratch {
    /// Keys, `[dim][slot]`.
    keys_t: Vec<f32>,
    /// Values, `[slot][dim]`.
    values: Vec<f32>,
    /// One per query of the task, `[head][query row]`.
    running: Vec<Running>,
}

/// Online-softmax state of one query: the largest score so far and the sum of
/// `e^(score - max)` over the keys seen.
#[derive(Clone, Copy)]
struct Running {
    max: f32,
    sum: f32,
}

impl Running {
    const EMPTY: Self = Self {
        max: f32::NEG_INFINITY,
        sum: 0.0,
    };
}

/// A unit of parallel work: some query heads of one KV group, for a chunk of one sequence's
/// new tokens.
struct Task {
    /// Index into the batch's sequences.
    seq: usize,
    /// KV head whose blocks the task reads.
    kv_head: usize,
    /// The sequence's new tokens served (0 is its first new token).
    queries: Range<usize>,
    /// Query heads served, all in `kv_head`'s group.
    heads: Range<usize>,
}

/// For every new token of every sequence, attends its query heads over the keys and values of
/// positions `0..=pos` in `kv` (layer `layer`), or the last `window` of them, writing
/// `out[row][head * head_dim ..]`.
///
/// `q` holds the batch's query rows, each `q_stride` floats apart with the heads first; `out`
/// has `n_heads * head_dim` floats per row. Work is split by (sequence, KV head, chunk of
/// queries), and further by query heads when that gives too few tasks for the thread pool;
/// each task reads the blocks its queries can see one at a time, in place.
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
        window,
    } = shape;
    // The first position the query at `pos` sees.
    let first_seen = |pos: usize| window.map_or(0, |w| (pos + 1).saturating_sub(w));
    let group = n_heads / n_kv_heads;
    let out_stride = n_heads * hd;
    let scale = 1.0 / (hd as f32).sqrt();
    let out = SharedMut::new(out);
    let tasks = plan(shape, seqs, rayon::current_num_threads());
    tasks.par_iter().for_each(|task| {
        let seq = &seqs[task.seq];
        let (queries, heads) = (task.queries.clone(), task.heads.clone());
        debug_assert!(
            heads.start / group == task.kv_head && (heads.end - 1) / group == task.kv_head
        );
        let n_keys = seq.start_pos + queries.end;
        debug_assert!(seq.block_table.len() * BLOCK_SIZE >= n_keys);
        let q_at = |h: usize, i: usize| {
            let r = (seq.first_row + i) * q_stride + h * hd;
            &q[r..r + hd]
        };
        // SAFETY: tasks serve disjoint (query row, query head) pairs, so (row, head h) is
        // written by this task only.
        let out_at = |h: usize, i: usize| unsafe {
            out.slice((seq.first_row + i) * out_stride + h * hd, hd)
        };
        // Index of (head, query row) in `Scratch::running`.
        let state = |h: usize, i: usize| (h - heads.start) * queries.len() + i - queries.start;

        SCRATCH.with_borrow_mut(|sc| {
            sc.running.clear();
            sc.running
                .resize(heads.len() * queries.len(), Running::EMPTY);
            for h in heads.clone() {
                for i in queries.clone() {
                    out_at(h, i).fill(0.0);
                }
            }
            // Blocks before the first query's window are seen by none of the task's queries.
            let first_block = first_seen(seq.start_pos + queries.start) / BLOCK_SIZE;
            let blocks = &seq.block_table[..n_keys.div_ceil(BLOCK_SIZE)];
            for (b, &block) in blocks.iter().enumerate().skip(first_block) {
                let (keys_t, values) = kv.block(layer, block, task.kv_head);
                sc.keys_t.resize(BLOCK_SIZE * hd, 0.0);
                sc.values.resize(BLOCK_SIZE * hd, 0.0);
                keys_t.convert_to_f32_slice(&mut sc.keys_t);
                values.convert_to_f32_slice(&mut sc.values);
                let first_pos = b * BLOCK_SIZE;
                // Query i sees positions 0..=start_pos + i: this block from
                // i = first_pos - start_pos on.
                let first = queries.start.max(first_pos.saturating_sub(seq.start_pos));
                for h in heads.clone() {
                    for i in first..queries.end {
                        let pos = seq.start_pos + i;
                        let from = first_seen(pos).saturating_sub(first_pos);
                        if from >= BLOCK_SIZE {
                            continue;
                        }
                        let tile = Tile {
                            keys_t: &sc.keys_t,
                            values: &sc.values,
                            from,
                            visible: (pos + 1 - first_pos).min(BLOCK_SIZE),
                        };
                        let running = &mut sc.running[state(h, i)];
                        attend_block(q_at(h, i), scale, tile, running, out_at(h, i));
                    }
                }
            }
            for h in heads.clone() {
                for i in queries.clone() {
                    let inv = 1.0 / sc.running[state(h, i)].sum;
                    for o in out_at(h, i) {
                        *o *= inv;
                    }
                }
            }
        });
    });
}

/// Splits the batch into tasks: one per (sequence, KV head, chunk of [`QUERY_CHUNK`] queries),
/// each KV group's query heads spread over up to `group` tasks when there would otherwise be
/// fewer than two tasks per thread.
fn plan(shape: AttentionShape, seqs: &[AttentionSeq], threads: usize) -> Vec<Task> {
    let group = shape.n_heads / shape.n_kv_heads;
    let chunks: usize = seqs.iter().map(|s| s.n_new.div_ceil(QUERY_CHUNK)).sum();
    let base = chunks * shape.n_kv_heads;
    let parts = (2 * threads).div_ceil(base.max(1)).clamp(1, group);
    let mut tasks = Vec::with_capacity(base * parts);
    for (s, seq) in seqs.iter().enumerate() {
        for g in 0..shape.n_kv_heads {
            for c in (0..seq.n_new).step_by(QUERY_CHUNK) {
                for part in 0..parts {
                    let first_head = g * group;
                    tasks.push(Task {
                        seq: s,
                        kv_head: g,
                        queries: c..(c + QUERY_CHUNK).min(seq.n_new),
                        heads: first_head + part * group / parts
                            ..first_head + (part + 1) * group / parts,
                    });
                }
            }
        }
    }
    tasks
}

/// One block of one KV head, as f32, and how many of its slots the current query sees.
#[derive(Clone, Copy)]
struct Tile<'a> {
    /// `[dim][slot]`.
    keys_t: &'a [f32],
    /// `[slot][dim]`.
    values: &'a [f32],
    /// Slots `from..visible` are attended; the rest are masked.
    from: usize,
    /// See `from`.
    visible: usize,
}

/// Folds one block into a query's online softmax: `running` and `o` (unnormalised,
/// `head_dim` wide) are rescaled to the new maximum and the block's visible slots added.
#[inline]
fn attend_block(q: &[f32], scale: f32, tile: Tile, running: &mut Running, o: &mut [f32]) {
    let hd = q.len();
    let dots = dot_block(q, &tile.keys_t[..hd * BLOCK_SIZE]);
    let mut scores = [0f32; BLOCK_SIZE];
    let seen = tile.from..tile.visible;
    for (j, (s, &dot)) in scores.iter_mut().zip(&dots).enumerate() {
        *s = if seen.contains(&j) {
            dot * scale
        } else {
            f32::NEG_INFINITY
        };
    }
    let max = running.max.max(max_of(scores));
    let mut p = [0f32; BLOCK_SIZE];
    for (j, (p, &s)) in p.iter_mut().zip(&scores).enumerate() {
        // Masked slots get exactly 0 (`exp` clamps its argument, so it never returns 0).
        let e = exp(s - max);
        *p = if seen.contains(&j) { e } else { 0.0 };
    }
    // A new maximum rescales what was accumulated so far (there is nothing before the first
    // block; the multiplication by 0 there keeps `o` at exactly 0).
    let correction = (max > running.max).then(|| {
        let c = if running.max > f32::NEG_INFINITY {
            exp(running.max - max)
        } else {
            0.0
        };
        running.sum *= c;
        running.max = max;
        c
    });
    // In slot order. (Any fixed order is as accurate; on the 96-token perplexity checks of
    // tests/formats.rs, a pairwise order moved results by up to 0.7%.)
    running.sum += p.iter().sum::<f32>();
    accumulate(
        o,
        correction,
        &p[..tile.visible],
        &tile.values[..tile.visible * hd],
    );
}

/// `q · k_j` for the 16 slots of a block of keys stored `[dim][slot]`.
#[inline(always)]
fn dot_block(q: &[f32], keys_t: &[f32]) -> [f32; BLOCK_SIZE] {
    let mut chains = [[0f32; BLOCK_SIZE]; DOT_CHAINS];
    let (q_main, q_rest) = q.as_chunks::<DOT_CHAINS>();
    let (k_main, k_rest) = keys_t.as_chunks::<{ DOT_CHAINS * BLOCK_SIZE }>();
    for (qs, ks) in q_main.iter().zip(k_main) {
        for ((chain, &qd), kd) in chains
            .iter_mut()
            .zip(qs)
            .zip(ks.as_chunks::<BLOCK_SIZE>().0)
        {
            for (a, &k) in chain.iter_mut().zip(kd) {
                *a = qd.mul_add(k, *a);
            }
        }
    }
    for (&qd, kd) in q_rest.iter().zip(k_rest.chunks_exact(BLOCK_SIZE)) {
        for (a, &k) in chains[0].iter_mut().zip(kd) {
            *a = qd.mul_add(k, *a);
        }
    }
    let [c0, c1, c2, c3] = chains;
    std::array::from_fn(|j| (c0[j] + c1[j]) + (c2[j] + c3[j]))
}

/// `o = o * correction + Σ_j p_j v_j` (rows `v_j` of `values`, each `o.len()` wide), one
/// [`OUT_TILE`]-wide stretch of `o` at a time so it stays in registers across the slots.
#[inline(always)]
fn accumulate(o: &mut [f32], correction: Option<f32>, p: &[f32], values: &[f32]) {
    let hd = o.len();
    let (o_tiles, o_rest) = o.as_chunks_mut::<OUT_TILE>();
    for (t, o_tile) in o_tiles.iter_mut().enumerate() {
        let mut acc = *o_tile;
        if let Some(c) = correction {
            for a in &mut acc {
                *a *= c;
            }
        }
        for (&p, v) in p.iter().zip(values.chunks_exact(hd)) {
            let v: &[f32; OUT_TILE] = v[t * OUT_TILE..][..OUT_TILE].try_into().unwrap();
            for (a, &v) in acc.iter_mut().zip(v) {
                *a = p.mul_add(v, *a);
            }
        }
        *o_tile = acc;
    }
    // Heads not a multiple of OUT_TILE wide: the rest, same arithmetic, through memory.
    let done = hd - o_rest.len();
    if let Some(c) = correction {
        for a in o_rest.iter_mut() {
            *a *= c;
        }
    }
    for (&p, v) in p.iter().zip(values.chunks_exact(hd)) {
        for (a, &v) in o_rest.iter_mut().zip(&v[done..]) {
            *a = p.mul_add(v, *a);
        }
    }
}

/// The largest of a block's 16 scores, folded pairwise (lane j with j + 8, then j + 4, ...),
/// which vectorizes.
#[inline(always)]
fn max_of(mut x: [f32; BLOCK_SIZE]) -> f32 {
    let mut width = BLOCK_SIZE / 2;
    while width > 0 {
        for j in 0..width {
            x[j] = x[j].max(x[j + width]);
        }
        width /= 2;
    }
    x[0]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Arch, ModelConfig, RopeConfig, RopeStyle};

    const N_HEADS: usize = 6;
    const N_KV_HEADS: usize = 2;

    fn config(head_dim: usize) -> ModelConfig {
        ModelConfig {
            arch: Arch::Llama,
            name: None,
            n_layers: 2,
            d_model: N_HEADS * head_dim,
            n_heads: N_HEADS,
            n_kv_heads: N_KV_HEADS,
            head_dim,
            ffn_dim: 1,
            vocab_size: 1,
            context_length: 4096,
            rms_eps: 1e-5,
            rope: RopeConfig {
                base: 10_000.0,
                dims: head_dim,
                style: RopeStyle::Interleaved,
                linear_factor: 1.0,
                freq_factors: None,
            },
            family: Default::default(),
        }
    }

    /// Deterministic values in about [-2, 2).
    fn noise(seed: u64, n: usize) -> Vec<f32> {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 40) as f32 / (1u64 << 22) as f32 - 2.0
            })
            .collect()
    }

    /// A cache holding `len` positions of random keys and values in layer 1 for each table.
    fn filled_cache(head_dim: usize, tables: &[(&[u32], usize)]) -> KvCache {
        let blocks = tables.iter().flat_map(|t| t.0).max().unwrap() + 1;
        let mut kv = KvCache::new(&config(head_dim), blocks as usize);
        let width = N_KV_HEADS * head_dim;
        for (s, &(table, len)) in tables.iter().enumerate() {
            for pos in 0..len {
                let seed = (s * 100_000 + pos) as u64;
                let (k, v) = (noise(seed, width), noise(seed + 50_000, width));
                kv.write(1, table, pos, &k, &v);
            }
        }
        kv
    }

    /// Attention in f64, straight from the definition, reading the cache's f16 values back
    /// through `KvCache::block`.
    fn reference(
        head_dim: usize,
        kv: &KvCache,
        table: &[u32],
        pos: usize,
        head: usize,
        q: &[f32],
        window: Option<usize>,
    ) -> Vec<f64> {
        let first = window.map_or(0, |w| (pos + 1).saturating_sub(w));
        let g = head / (N_HEADS / N_KV_HEADS);
        let key = |p: usize, d: usize| {
            let (k, _) = kv.block(1, table[p / BLOCK_SIZE], g);
            k[d * BLOCK_SIZE + p % BLOCK_SIZE].to_f64()
        };
        let value = |p: usize, d: usize| {
            let (_, v) = kv.block(1, table[p / BLOCK_SIZE], g);
            v[(p % BLOCK_SIZE) * head_dim + d].to_f64()
        };
        let scores: Vec<f64> = (first..=pos)
            .map(|p| {
                let dot: f64 = (0..head_dim).map(|d| q[d] as f64 * key(p, d)).sum();
                dot / (head_dim as f64).sqrt()
            })
            .collect();
        let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
        let total: f64 = weights.iter().sum();
        (0..head_dim)
            .map(|d| {
                (first..=pos)
                    .map(|p| weights[p - first] * value(p, d))
                    .sum::<f64>()
                    / total
            })
            .collect()
    }

    struct Seq {
        table: Vec<u32>,
        len: usize,
        q: Vec<f32>,
    }

    /// Two sequences with scattered blocks; `len` positions each, queries for all of them.
    fn sequences(head_dim: usize) -> (Vec<Seq>, KvCache) {
        let q_width = N_HEADS * head_dim;
        let seqs = vec![
            Seq {
                table: vec![7, 2, 9, 0, 5, 11, 3],
                len: 100,
                q: noise(1, 100 * q_width),
            },
            Seq {
                table: vec![4, 10, 1, 8],
                len: 53,
                q: noise(2, 53 * q_width),
            },
        ];
        let kv = filled_cache(
            head_dim,
            &seqs
                .iter()
                .map(|s| (&s.table[..], s.len))
                .collect::<Vec<_>>(),
        );
        (seqs, kv)
    }

    /// Runs attention over `steps`: `(sequence, first new position, new tokens)` each, as one
    /// batch, and returns each step's output rows.
    fn run(
        head_dim: usize,
        kv: &KvCache,
        seqs: &[Seq],
        steps: &[(usize, usize, usize)],
    ) -> Vec<Vec<f32>> {
        run_windowed(head_dim, kv, seqs, steps, None)
    }

    /// [`run`] through a sliding window.
    fn run_windowed(
        head_dim: usize,
        kv: &KvCache,
        seqs: &[Seq],
        steps: &[(usize, usize, usize)],
        window: Option<usize>,
    ) -> Vec<Vec<f32>> {
        let q_width = N_HEADS * head_dim;
        let mut q = Vec::new();
        let mut batch = Vec::new();
        for &(s, start, n) in steps {
            batch.push(AttentionSeq {
                first_row: q.len() / q_width,
                n_new: n,
                start_pos: start,
                block_table: &seqs[s].table,
            });
            q.extend_from_slice(&seqs[s].q[start * q_width..(start + n) * q_width]);
        }
        let shape = AttentionShape {
            n_heads: N_HEADS,
            n_kv_heads: N_KV_HEADS,
            head_dim,
            window,
        };
        let mut out = vec![f32::NAN; q.len()];
        attention(shape, &q, q_width, kv, 1, &batch, &mut out);
        batch
            .iter()
            .map(|b| out[b.first_row * q_width..(b.first_row + b.n_new) * q_width].to_vec())
            .collect()
    }

    #[test]
    fn matches_the_definition() {
        // 70 exercises the tails of the dot-product chains and the output tiles; a window of
        // 20 starts inside a block, 32 on a block's edge, and 200 is longer than every
        // sequence.
        let cases = [
            (64, None),
            (70, None),
            (64, Some(20)),
            (70, Some(32)),
            (64, Some(200)),
        ];
        for (head_dim, window) in cases {
            let (seqs, kv) = sequences(head_dim);
            let steps = [(0, 0, seqs[0].len), (1, 0, seqs[1].len)];
            let outs = run_windowed(head_dim, &kv, &seqs, &steps, window);
            let mut worst = 0f64;
            for (s, seq) in seqs.iter().enumerate() {
                for pos in 0..seq.len {
                    for h in 0..N_HEADS {
                        let at = (pos * N_HEADS + h) * head_dim;
                        let q = &seq.q[at..at + head_dim];
                        let want = reference(head_dim, &kv, &seq.table, pos, h, q, window);
                        for (got, want) in outs[s][at..at + head_dim].iter().zip(want) {
                            worst = worst.max((*got as f64 - want).abs());
                        }
                    }
                }
            }
            assert!(
                worst < 5e-6,
                "head_dim {head_dim}, window {window:?}: worst error {worst}"
            );
        }
    }

    #[test]
    fn output_does_not_depend_on_batching_or_threads() {
        let head_dim = 64;
        let (seqs, kv) = sequences(head_dim);
        let q_width = N_HEADS * head_dim;
        let whole = run(head_dim, &kv, &seqs, &[(0, 0, 100)]).remove(0);
        // The same positions as prefix-cache hit plus prompt, in pieces, decoded one by one,
        // and in batches with the other sequence, on pools of several sizes.
        for threads in [1, 2, 5] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| {
                let mut pieces = run(head_dim, &kv, &seqs, &[(0, 0, 37)]);
                pieces.push(run(head_dim, &kv, &seqs, &[(1, 0, 53), (0, 37, 40)]).remove(1));
                for pos in 77..100 {
                    pieces.push(run(head_dim, &kv, &seqs, &[(1, 52, 1), (0, pos, 1)]).remove(1));
                }
                let pieces = pieces.concat();
                assert_eq!(pieces.len(), 100 * q_width);
                for (i, (a, b)) in pieces.iter().zip(&whole).enumerate() {
                    assert_eq!(a.to_bits(), b.to_bits(), "{threads} threads, element {i}");
                }
            });
        }
    }

    #[test]
    fn plan_covers_every_query_head_once() {
        let shape = AttentionShape {
            n_heads: 9,
            n_kv_heads: 3,
            head_dim: 64,
            window: None,
        };
        let table = [0u32; 8];
        let seq = |n_new| AttentionSeq {
            first_row: 0,
            n_new,
            start_pos: 0,
            block_table: &table,
        };
        for (seqs, threads) in [
            (vec![seq(1)], 2),
            (vec![seq(1)], 64),
            (vec![seq(1), seq(70)], 2),
            (vec![seq(100)], 1),
        ] {
            let mut seen = std::collections::HashSet::new();
            for task in plan(shape, &seqs, threads) {
                assert!(!task.heads.is_empty());
                for h in task.heads.clone() {
                    assert_eq!(h / 3, task.kv_head);
                    for i in task.queries.clone() {
                        assert!(seen.insert((task.seq, h, i)), "served twice");
                    }
                }
            }
            let total: usize = seqs.iter().map(|s| s.n_new * 9).sum();
            assert_eq!(seen.len(), total);
        }
    }
}
