//! The k3 forward pass on real weights: SmolLM2 upcycled by identity must compute the dense
//! model's logits; MoEfied with every expert selected and full latent width it must too; fewer
//! experts must cost quality, not correctness.

use std::path::{Path, PathBuf};

use candle_core::quantized::GgmlDType;
use osprey_models::convert::Input;
use osprey_models::convert::quantize::{QuantizeOptions, quantize};
use osprey_models::convert::upcycle::{UpcycleMode, UpcycleOptions, upcycle};
use osprey_models::eval::{all_logits, greedy, perplexity};
use osprey_models::{
    BatchSeq, Checkpoint, ForwardBatch, ForwardScratch, KvCache, LogitsWanted, Transformer,
    WeightFormat,
};
use osprey_testkit::{default_model, golden};

struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let p = std::env::temp_dir().join(format!("osprey-k3-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        Self(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn upcycled(src: &Path, dst: &Path, mode: UpcycleMode, experts: usize, top_k: usize) {
    upcycled_with(src, dst, mode, (experts, top_k), calibration())
}

/// Calibration tokens for MoEfication: golden text the tests below never score.
fn calibration() -> Vec<u32> {
    golden().perplexity.ids[600..1000].to_vec()
}

fn upcycled_with(
    src: &Path,
    dst: &Path,
    mode: UpcycleMode,
    (experts, top_k): (usize, usize),
    calibration: Vec<u32>,
) {
    let options = UpcycleOptions {
        mode,
        experts,
        top_k,
        shards: 8,
        expert_format: WeightFormat::Ggml(GgmlDType::F32),
        calibration,
    };
    upcycle(&Input::open(src).unwrap(), dst, &options, &|_| {}, &|_| {}).unwrap();
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn prompt() -> Vec<u32> {
    golden().greedy[0].prompt_ids.clone()
}

#[test]
fn identity_upcycle_reproduces_the_dense_model() {
    let dst = TempDir::new("identity");
    upcycled(&default_model(), &dst.0, UpcycleMode::Identity, 4, 2);
    let dense = Transformer::open(&default_model()).unwrap();
    let k3 = Transformer::open(&dst.0).unwrap();
    let plan = k3.k3().expect("a k3 model");
    assert!(
        plan.layers
            .iter()
            .all(|l| l.moe.as_ref().is_some_and(|m| m.experts == 4))
    );
    assert!(plan.layers[1..].iter().all(|l| l.attn_res.is_some()));

    let ids = &golden().perplexity.ids[..200];
    let diff = max_abs_diff(&all_logits(&dense, ids), &all_logits(&k3, ids));
    assert!(diff < 1e-3, "max abs logit difference {diff}");
    assert_eq!(greedy(&dense, &prompt(), 24), greedy(&k3, &prompt(), 24));
}

#[test]
fn moefication_is_exact_with_every_expert_and_lossy_with_fewer() {
    // A dense F32 reference, so the MoE's F32 experts are compared like for like.
    let dense_dir = TempDir::new("dense-f32");
    let options = QuantizeOptions {
        format: WeightFormat::Ggml(GgmlDType::F32),
        shards: 4,
        keep_embeddings: false,
    };
    quantize(
        &Input::open(&default_model()).unwrap(),
        &dense_dir.0,
        &options,
        &|_| {},
        &|_| {},
    )
    .unwrap();
    let dense = Transformer::open(&dense_dir.0).unwrap();
    let full = TempDir::new("moefy-all");
    upcycled(
        &dense_dir.0,
        &full.0,
        UpcycleMode::Moefy { latent_dim: 576 },
        4,
        4,
    );
    let all = Transformer::open(&full.0).unwrap();

    let ids = &golden().perplexity.ids[..300];
    // Equal up to the order of float sums (the down projection adds four partial dot
    // products instead of one): measured 0.018 over 300 × 49,152 logits of magnitude ~20.
    let diff = max_abs_diff(&all_logits(&dense, ids), &all_logits(&all, ids));
    assert!(diff < 0.05, "k = E: max abs logit difference {diff}");
    assert_eq!(greedy(&dense, &prompt(), 24), greedy(&all, &prompt(), 24));

    // The same experts with fewer chosen per token: quality falls as k does.
    let (_, ppl_dense) = perplexity(&dense, ids);
    let (_, ppl_all) = perplexity(&all, ids);
    assert!(
        (ppl_all / ppl_dense - 1.0).abs() < 1e-3,
        "{ppl_all} vs {ppl_dense}"
    );
    let ckpt = Checkpoint::open(&full.0).unwrap();
    let with_k = |k| {
        let mut c = ckpt.config().clone();
        for layer in &mut c.k3.as_mut().unwrap().layers {
            layer.moe.as_mut().unwrap().top_k = k;
        }
        Transformer::from_source(c.model, c.k3, &ckpt).unwrap()
    };
    let (three, two) = (with_k(3), with_k(2));
    let (_, ppl_3) = perplexity(&three, ids);
    let (_, ppl_2) = perplexity(&two, ids);
    assert!(
        ppl_dense < ppl_3 && ppl_3 < ppl_2,
        "k=4 {ppl_dense}, k=3 {ppl_3}, k=2 {ppl_2}"
    );
    let sparse = two;
    assert!(sparse.weight_bytes() < dense.weight_bytes());
}

/// Mean over MoE layers of the busiest expert's share of `ids`' tokens, times the experts.
fn imbalance(model: &Transformer, ids: &[u32]) -> f32 {
    let (e, k) = model.moe_layout()[0];
    let (mut kv, tables) = KvCache::for_sequence(model.config(), ids.len());
    let seqs = [BatchSeq {
        n_tokens: ids.len(),
        start_pos: 0,
        block_tables: &tables,
        logits: LogitsWanted::Last,
    }];
    let mut scratch = ForwardScratch::default();
    model.forward(
        &ForwardBatch {
            tokens: ids,
            seqs: &seqs,
        },
        &mut kv,
        &mut scratch,
    );
    let mut slots = Vec::new();
    scratch.routed_slots(0..ids.len(), &mut slots);
    let layers = model.moe_layout().len();
    let mut counts = vec![0usize; layers * e];
    for s in slots {
        counts[s as usize] += 1;
    }
    let per_layer = counts
        .chunks(e)
        .map(|c| *c.iter().max().unwrap() as f32 * e as f32 / (ids.len() * k) as f32);
    per_layer.sum::<f32>() / layers as f32
}

#[test]
fn centred_routers_spread_tokens_over_experts() {
    let (plain, centred) = (TempDir::new("router-plain"), TempDir::new("router-centred"));
    let mode = UpcycleMode::Moefy { latent_dim: 576 };
    upcycled_with(&default_model(), &plain.0, mode, (4, 1), Vec::new());
    upcycled_with(&default_model(), &centred.0, mode, (4, 1), calibration());
    let ids = &golden().perplexity.ids[..300];
    let before = imbalance(&Transformer::open(&plain.0).unwrap(), ids);
    let after = imbalance(&Transformer::open(&centred.0).unwrap(), ids);
    // 4 is every token on one expert, 1 an even spread.
    assert!(after < before, "centred {after} vs plain {before}");
}
