//! The forward pass against llama.cpp's outputs on the same GGUF (osprey-testkit's golden file).

use osprey_models::{
    BatchSeq, ForwardBatch, ForwardScratch, GgufFile, KvCache, LogitsWanted, Transformer,
};
use osprey_testkit::{default_model, golden};

fn load() -> Transformer {
    let gguf = GgufFile::open(&default_model()).unwrap();
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
    let model = load();
    let (mut all, mut all_agree, mut confident, mut confident_agree, mut abs_diff) =
        (0, 0, 0, 0, 0f64);
    for case in &golden().teacher_forced {
        let lps = all_logprobs(&model, &case.ids);
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
    let model = load();
    let case = &golden().perplexity;
    let lps = all_logprobs(&model, &case.ids);
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
    let model = load();
    let c = model.config();
    let ids = &golden().teacher_forced[0].ids[..40];
    let other = &golden().teacher_forced[1].ids[..23];
    let last_logits = |batch: &[(&[u32], usize, Vec<u32>)], kv: &mut KvCache| {
        let mut tokens = Vec::new();
        let seqs: Vec<BatchSeq> = batch
            .iter()
            .map(|(t, start, table)| {
                tokens.extend_from_slice(t);
                BatchSeq {
                    n_tokens: t.len(),
                    start_pos: *start,
                    block_table: table,
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
    let mut kv = KvCache::new(c, 16);
    let alone = last_logits(&[(ids, 0, vec![0, 1, 2])], &mut kv);
    // Same sequence as two chunks (25 + 15), the second one batched with another sequence.
    let mut kv = KvCache::new(c, 16);
    last_logits(&[(&ids[..25], 0, vec![3, 4, 5])], &mut kv);
    let both = last_logits(
        &[(other, 0, vec![0, 1]), (&ids[25..], 25, vec![3, 4, 5])],
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
