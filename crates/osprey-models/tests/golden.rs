//! The forward pass against llama.cpp's outputs on the same GGUF (osprey-testkit's golden
//! files): SmolLM2 (Llama family) and Gemma 3 (normed Q and K, post-norms, GeGLU, five
//! sliding-window layers to one global; its perplexity text is three times its 512-token
//! window).

use std::path::Path;

use osprey_models::{
    BatchSeq, ForwardBatch, ForwardScratch, GgufFile, KvCache, KvLayout, LogitsWanted, NO_BLOCK,
    Transformer,
};
use osprey_testkit::{Golden, default_model, gemma_golden, gemma_model, golden};

fn load() -> Transformer {
    load_from(&default_model())
}

fn load_from(path: &Path) -> Transformer {
    let gguf = GgufFile::open(path).unwrap();
    Transformer::load(&gguf).unwrap()
}

/// Log-softmax of every position of `ids`, computed in one forward pass.
fn all_logprobs(model: &Transformer, ids: &[u32]) -> Vec<Vec<f32>> {
    osprey_models::eval::all_logits(model, ids)
        .chunks_exact(model.config().vocab_size)
        .map(|row| {
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let lse = max + row.iter().map(|x| (x - max).exp()).sum::<f32>().ln();
            row.iter().map(|x| x - lse).collect()
        })
        .collect()
}

fn argmax(row: &[f32]) -> u32 {
    (0..row.len()).fold(0, |b, i| if row[i] > row[b] { i } else { b }) as u32
}

#[test]
fn teacher_forced_predictions_agree_with_llama_cpp() {
    check_teacher_forced(&load(), golden());
}

#[test]
fn gemma_teacher_forced_predictions_agree_with_llama_cpp() {
    check_teacher_forced(&load_from(&gemma_model()), gemma_golden());
}

/// Top-1 agreement ≥ 99% where llama.cpp's margin is ≥ 0.35 nats and ≥ 93% overall, mean
/// |Δ logprob| ≤ 0.10.
fn check_teacher_forced(model: &Transformer, golden: &Golden) {
    let (mut all, mut all_agree, mut confident, mut confident_agree, mut abs_diff) =
        (0, 0, 0, 0, 0f64);
    for case in &golden.teacher_forced {
        let lps = all_logprobs(model, &case.ids);
        for i in 0..case.ids.len() - 1 {
            let ours = argmax(&lps[i]);
            let theirs = case.top1[i];
            let margin = case.top5[i][0].1 - case.top5[i][1].1;
            all += 1;
            all_agree += usize::from(ours == theirs);
            if margin >= 0.35 {
                confident += 1;
                confident_agree += usize::from(ours == theirs);
            }
            abs_diff += (lps[i][case.ids[i + 1] as usize] as f64 - case.next_logprob[i]).abs();
        }
    }
    let confident_rate = confident_agree as f64 / confident as f64;
    let all_rate = all_agree as f64 / all as f64;
    let mean_abs = abs_diff / all as f64;
    eprintln!(
        "top-1 agreement: confident {confident_rate:.4} ({confident} positions), all {all_rate:.4} ({all}); mean |Δ logprob| {mean_abs:.4}"
    );
    assert!(
        confident_rate >= 0.99,
        "confident top-1 agreement {confident_rate:.4} < 0.99"
    );
    assert!(all_rate >= 0.93, "top-1 agreement {all_rate:.4} < 0.93");
    assert!(mean_abs <= 0.10, "mean |Δ logprob| {mean_abs:.4} > 0.10");
}

#[test]
fn perplexity_matches_llama_cpp_within_one_percent() {
    check_perplexity(&load(), golden());
}

#[test]
fn gemma_perplexity_matches_llama_cpp_within_one_percent() {
    check_perplexity(&load_from(&gemma_model()), gemma_golden());
}

fn check_perplexity(model: &Transformer, golden: &Golden) {
    let case = &golden.perplexity;
    let lps = all_logprobs(model, &case.ids);
    let nll: f64 = (1..case.ids.len())
        .map(|i| -(lps[i - 1][case.ids[i] as usize] as f64))
        .sum();
    let ppl = (nll / (case.ids.len() - 1) as f64).exp();
    let rel = (ppl - case.perplexity).abs() / case.perplexity;
    eprintln!(
        "perplexity {ppl:.4} vs llama.cpp {:.4} ({:+.3}%)",
        case.perplexity,
        100.0 * (ppl / case.perplexity - 1.0)
    );
    assert!(
        rel < 0.01,
        "perplexity {ppl:.4} is {:.2}% from llama.cpp's {:.4}",
        rel * 100.0,
        case.perplexity
    );
}

#[test]
fn a_sequence_computes_the_same_alone_in_chunks_and_in_a_batch() {
    let g = golden();
    check_chunked(
        &load(),
        &g.teacher_forced[0].ids[..40],
        &g.teacher_forced[1].ids[..23],
        25,
    );
}

/// Past the sliding window: 1,200 tokens, the second chunk's queries (from position 700 on)
/// see only the last 512 positions on the local layers and everything on the global ones.
#[test]
fn gemma_computes_the_same_alone_in_chunks_and_in_a_batch_past_its_window() {
    let g = gemma_golden();
    let ids = &g.perplexity.ids[..1200];
    check_chunked(
        &load_from(&gemma_model()),
        ids,
        &g.teacher_forced[1].ids[..23],
        700,
    );
}

/// The last logits of `ids` in one pass equal, bit for bit, those of `ids` in two chunks
/// (split at `split`), the second batched with `other`. Between the chunks, the windowed KV
/// groups give back the pages behind the window, as the engine does: attention must not read
/// them.
fn check_chunked(model: &Transformer, ids: &[u32], other: &[u32], split: usize) {
    /// A sequence's new tokens, its start position and its block tables.
    type Part<'a> = (&'a [u32], usize, Vec<Vec<u32>>);
    let c = model.config();
    let last_logits = |batch: &[Part], kv: &mut KvCache| {
        let mut tokens = Vec::new();
        let seqs: Vec<BatchSeq> = batch
            .iter()
            .map(|(t, start, tables)| {
                tokens.extend_from_slice(t);
                BatchSeq {
                    n_tokens: t.len(),
                    start_pos: *start,
                    block_tables: tables,
                    logits: LogitsWanted::Last,
                }
            })
            .collect();
        let mut scratch = ForwardScratch::default();
        model
            .forward(
                &ForwardBatch {
                    tokens: &tokens,
                    seqs: &seqs,
                },
                kv,
                &mut scratch,
            )
            .to_vec()
    };
    let layout = KvLayout::new(c);
    let groups = layout.groups().len() as u32;
    let blocks = |n: usize| n.div_ceil(osprey_models::BLOCK_SIZE) as u32;
    let (n, m) = (blocks(ids.len()), blocks(other.len()));
    // Group g's pages of a sequence are its pages in a pool per group, offset by g pools.
    let tables = |pages: std::ops::Range<u32>| -> Vec<Vec<u32>> {
        (0..groups)
            .map(|g| pages.clone().map(|b| b + g * (n + m)).collect())
            .collect()
    };
    let mut kv = KvCache::new(c, (groups * (n + m)) as usize);
    let alone = last_logits(&[(ids, 0, tables(0..n))], &mut kv);
    // The same sequence in other blocks, as two chunks, the second batched with another
    // sequence.
    let mut moved = tables(m..m + n);
    let mut kv = KvCache::new(c, (groups * (n + m)) as usize);
    last_logits(&[(&ids[..split], 0, moved.clone())], &mut kv);
    for (table, group) in moved.iter_mut().zip(layout.groups()) {
        if let Some(w) = group.window {
            let behind = (split + 1).saturating_sub(w) / osprey_models::BLOCK_SIZE;
            table[..behind].fill(NO_BLOCK);
        }
    }
    let both = last_logits(
        &[(other, 0, tables(0..m)), (&ids[split..], split, moved)],
        &mut kv,
    );
    let chunked = &both[c.vocab_size..];
    assert_eq!(alone.len(), chunked.len());
    let max_diff = alone
        .iter()
        .zip(chunked)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert_eq!(
        max_diff, 0.0,
        "chunked+batched logits differ from the single pass by up to {max_diff}"
    );
}
