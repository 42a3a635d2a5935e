//! Whole-sequence helpers on a model, outside the engine: logits of every position,
//! perplexity, greedy continuation. Used by the conversion tests and `osprey bench k3`.

use crate::batch::{BatchSeq, ForwardBatch, LogitsWanted};
use crate::kv_cache::{BLOCK_SIZE, KvCache};
use crate::transformer::{ForwardScratch, Transformer};

/// Logits after each token of `ids` (`ids.len()` rows of `vocab_size`), in one pass.
pub fn all_logits(model: &Transformer, ids: &[u32]) -> Vec<f32> {
    let (mut kv, tables) = KvCache::for_sequence(model.config(), ids.len());
    let seqs = [BatchSeq {
        n_tokens: ids.len(),
        start_pos: 0,
        block_tables: &tables,
        logits: LogitsWanted::All,
    }];
    let mut scratch = ForwardScratch::default();
    let batch = ForwardBatch {
        tokens: ids,
        seqs: &seqs,
    };
    model.forward(&batch, &mut kv, &mut scratch).to_vec()
}

/// Mean negative log-likelihood of `ids[1..]` given the tokens before, and its exponential
/// (perplexity), from one pass.
pub fn perplexity(model: &Transformer, ids: &[u32]) -> (f64, f64) {
    let v = model.config().vocab_size;
    let logits = all_logits(model, ids);
    let mut nll = 0f64;
    for (i, row) in logits.chunks_exact(v).take(ids.len() - 1).enumerate() {
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let lse = max as f64
            + row
                .iter()
                .map(|&x| ((x - max) as f64).exp())
                .sum::<f64>()
                .ln();
        nll += lse - row[ids[i + 1] as usize] as f64;
    }
    let mean = nll / (ids.len() - 1) as f64;
    (mean, mean.exp())
}

/// Perplexity as [`perplexity`] computes it, but one block of tokens per pass: after each full
/// block is written, `each_block` may rewrite its pages in the cache (say, through a lossy
/// encoding; it is called once per KV group), so every later token attends over what it left.
/// Returns (mean NLL, perplexity).
pub fn perplexity_blockwise(
    model: &Transformer,
    ids: &[u32],
    each_block: &mut dyn FnMut(&mut KvCache, u32),
) -> (f64, f64) {
    let v = model.config().vocab_size;
    let (mut kv, tables) = KvCache::for_sequence(model.config(), ids.len());
    let mut scratch = ForwardScratch::default();
    let mut nll = 0f64;
    for (b, chunk) in ids.chunks(BLOCK_SIZE).enumerate() {
        let start = b * BLOCK_SIZE;
        let seqs = [BatchSeq {
            n_tokens: chunk.len(),
            start_pos: start,
            block_tables: &tables,
            logits: LogitsWanted::All,
        }];
        let batch = ForwardBatch {
            tokens: chunk,
            seqs: &seqs,
        };
        let logits = model.forward(&batch, &mut kv, &mut scratch);
        for (i, row) in logits.chunks_exact(v).enumerate() {
            let Some(&next) = ids.get(start + i + 1) else {
                break;
            };
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let lse = max as f64
                + row
                    .iter()
                    .map(|&x| ((x - max) as f64).exp())
                    .sum::<f64>()
                    .ln();
            nll += lse - row[next as usize] as f64;
        }
        if chunk.len() == BLOCK_SIZE {
            for table in &tables {
                each_block(&mut kv, table[b]);
            }
        }
    }
    let mean = nll / (ids.len() - 1) as f64;
    (mean, mean.exp())
}

/// The index of the largest value (the first on ties): greedy decoding's choice, here and in
/// the engine.
pub fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as u32
}

/// `n` greedy tokens after `prompt`, decoding one token per pass.
pub fn greedy(model: &Transformer, prompt: &[u32], n: usize) -> Vec<u32> {
    let v = model.config().vocab_size;
    let (mut kv, tables) = KvCache::for_sequence(model.config(), prompt.len() + n);
    let mut scratch = ForwardScratch::default();
    let (mut tokens, mut pos, mut out) = (prompt.to_vec(), 0, Vec::with_capacity(n));
    while out.len() < n {
        let seqs = [BatchSeq {
            n_tokens: tokens.len(),
            start_pos: pos,
            block_tables: &tables,
            logits: LogitsWanted::Last,
        }];
        let batch = ForwardBatch {
            tokens: &tokens,
            seqs: &seqs,
        };
        let next = argmax(&model.forward(&batch, &mut kv, &mut scratch)[..v]);
        pos += tokens.len();
        tokens = vec![next];
        out.push(next);
    }
    out
}
