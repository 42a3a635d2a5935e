//! Families checked without real weights: for each, a tiny random-weight GGUF (a few layers,
//! small widths, F32 tensors) is written here, deterministically, and its logits compared with
//! llama.cpp's on the same file (`osprey-testkit/data/golden/tiny-families.json`, made by
//! `scripts/tiny-families-golden.py` from the files this writes).
//!
//! Qwen2 (QKV biases), Qwen3 (QK-norm), Phi-3 (fused QKV and gate-up), Llama with grouped-query
//! attention and an untied output, and Gemma 3 (post-norms, GeGLU, scaled embeddings, a window
//! of 8 positions on five of six layers, so that 40 tokens leave it).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use candle_core::quantized::{QTensor, gguf_file};
use candle_core::{Device, Tensor};
use gguf_file::Value;
use osprey_models::{GgufFile, Transformer};
use serde::Deserialize;
use sha2::{Digest, Sha256};

const VOCAB: usize = 320;

/// A tiny model's shape and what its family has.
struct Tiny {
    name: &'static str,
    arch: &'static str,
    layers: usize,
    width: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    ffn: usize,
    qkv_bias: bool,
    qk_norm: bool,
    post_norms: bool,
    /// Q/K/V in `attn_qkv`, gate and up in `ffn_up`.
    fused: bool,
    untied_output: bool,
    window: Option<u32>,
}

const FAMILIES: [Tiny; 5] = [
    Tiny {
        name: "qwen2",
        arch: "qwen2",
        layers: 2,
        width: 64,
        heads: 4,
        kv_heads: 2,
        head_dim: 16,
        ffn: 96,
        qkv_bias: true,
        qk_norm: false,
        post_norms: false,
        fused: false,
        untied_output: false,
        window: None,
    },
    Tiny {
        name: "qwen3",
        arch: "qwen3",
        layers: 2,
        width: 64,
        heads: 4,
        kv_heads: 2,
        head_dim: 32,
        ffn: 96,
        qkv_bias: false,
        qk_norm: true,
        post_norms: false,
        fused: false,
        untied_output: true,
        window: None,
    },
    Tiny {
        name: "phi3",
        arch: "phi3",
        layers: 2,
        width: 96,
        heads: 4,
        kv_heads: 4,
        head_dim: 24,
        ffn: 128,
        qkv_bias: false,
        qk_norm: false,
        post_norms: false,
        fused: true,
        untied_output: true,
        window: None,
    },
    Tiny {
        name: "llama-gqa-untied",
        arch: "llama",
        layers: 3,
        width: 64,
        heads: 8,
        kv_heads: 2,
        head_dim: 8,
        ffn: 160,
        qkv_bias: false,
        qk_norm: false,
        post_norms: false,
        fused: false,
        untied_output: true,
        window: None,
    },
    Tiny {
        name: "gemma3",
        arch: "gemma3",
        layers: 6,
        width: 64,
        heads: 2,
        kv_heads: 1,
        head_dim: 32,
        ffn: 128,
        qkv_bias: false,
        qk_norm: true,
        post_norms: true,
        fused: false,
        untied_output: false,
        window: Some(8),
    },
];

/// splitmix64: the same numbers on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f32 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        // Uniform in [-1, 1).
        (z >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    fn tensor(&mut self, dims: &[usize], scale: f32, offset: f32) -> QTensor {
        let n: usize = dims.iter().product();
        let data: Vec<f32> = (0..n).map(|_| offset + scale * self.next()).collect();
        let t = Tensor::from_vec(data, dims, &Device::Cpu).unwrap();
        QTensor::quantize(&t, candle_core::quantized::GgmlDType::F32).unwrap()
    }
}

/// A SentencePiece vocabulary llama.cpp accepts: `<unk>`, `<s>`, `</s>`, the 256 bytes, then
/// pieces of one to two letters.
fn vocabulary() -> Vec<(String, f32, i32)> {
    let mut vocab: Vec<(String, f32, i32)> = vec![
        ("<unk>".into(), 0.0, 2),
        ("<s>".into(), 0.0, 3),
        ("</s>".into(), 0.0, 3),
    ];
    vocab.extend((0..=255u8).map(|b| (format!("<0x{b:02X}>"), 0.0, 6)));
    let letters: Vec<char> = ('a'..='z').collect();
    let mut i = 0;
    while vocab.len() < VOCAB {
        let piece = match i < letters.len() {
            true => format!("▁{}", letters[i]),
            false => format!("{}{}", letters[i % 26], letters[(i / 26) % 26]),
        };
        vocab.push((piece, -(i as f32), 1));
        i += 1;
    }
    vocab
}

/// Writes `t`'s GGUF under `dir` and returns its path.
fn write(t: &Tiny, dir: &Path) -> PathBuf {
    let mut rng = Rng(0x05EE_D000 + t.name.len() as u64 * 7919 + t.layers as u64);
    let (d, hd) = (t.width, t.head_dim);
    let (q, kv) = (t.heads * hd, t.kv_heads * hd);
    let w = |rng: &mut Rng, rows: usize, cols: usize| {
        rng.tensor(&[rows, cols], 1.0 / (cols as f32).sqrt(), 0.0)
    };
    let norm = |rng: &mut Rng, n: usize| rng.tensor(&[n], 0.2, 1.0);
    let mut tensors: BTreeMap<String, QTensor> = BTreeMap::new();
    tensors.insert(
        "token_embd.weight".into(),
        rng.tensor(&[VOCAB, d], 1.0, 0.0),
    );
    tensors.insert("output_norm.weight".into(), norm(&mut rng, d));
    if t.untied_output {
        tensors.insert("output.weight".into(), w(&mut rng, VOCAB, d));
    }
    for l in 0..t.layers {
        let mut put = |name: &str, tensor: QTensor| {
            tensors.insert(format!("blk.{l}.{name}"), tensor);
        };
        put("attn_norm.weight", norm(&mut rng, d));
        if t.fused {
            put("attn_qkv.weight", w(&mut rng, q + 2 * kv, d));
        } else {
            put("attn_q.weight", w(&mut rng, q, d));
            put("attn_k.weight", w(&mut rng, kv, d));
            put("attn_v.weight", w(&mut rng, kv, d));
        }
        if t.qkv_bias {
            put("attn_q.bias", rng.tensor(&[q], 0.1, 0.0));
            put("attn_k.bias", rng.tensor(&[kv], 0.1, 0.0));
            put("attn_v.bias", rng.tensor(&[kv], 0.1, 0.0));
        }
        if t.qk_norm {
            put("attn_q_norm.weight", norm(&mut rng, hd));
            put("attn_k_norm.weight", norm(&mut rng, hd));
        }
        put("attn_output.weight", w(&mut rng, d, q));
        put("ffn_norm.weight", norm(&mut rng, d));
        if t.fused {
            put("ffn_up.weight", w(&mut rng, 2 * t.ffn, d));
        } else {
            put("ffn_gate.weight", w(&mut rng, t.ffn, d));
            put("ffn_up.weight", w(&mut rng, t.ffn, d));
        }
        put("ffn_down.weight", w(&mut rng, d, t.ffn));
        if t.post_norms {
            put("post_attention_norm.weight", norm(&mut rng, d));
            put("post_ffw_norm.weight", norm(&mut rng, d));
        }
    }

    let a = t.arch;
    let vocab = vocabulary();
    let mut meta: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(a.into())),
        // Not the family's name: llama.cpp reads a name with "phi3" in it as asking for
        // Phi-3's special tokens.
        (
            "general.name".into(),
            Value::String("tiny random model".into()),
        ),
        (format!("{a}.context_length"), Value::U32(512)),
        (format!("{a}.embedding_length"), Value::U32(d as u32)),
        (format!("{a}.block_count"), Value::U32(t.layers as u32)),
        (format!("{a}.feed_forward_length"), Value::U32(t.ffn as u32)),
        (
            format!("{a}.attention.head_count"),
            Value::U32(t.heads as u32),
        ),
        (
            format!("{a}.attention.head_count_kv"),
            Value::U32(t.kv_heads as u32),
        ),
        (format!("{a}.attention.key_length"), Value::U32(hd as u32)),
        (format!("{a}.attention.value_length"), Value::U32(hd as u32)),
        (format!("{a}.rope.dimension_count"), Value::U32(hd as u32)),
        (format!("{a}.rope.freq_base"), Value::F32(10_000.0)),
        (
            format!("{a}.attention.layer_norm_rms_epsilon"),
            Value::F32(1e-6),
        ),
        ("tokenizer.ggml.model".into(), Value::String("llama".into())),
        (
            "tokenizer.ggml.tokens".into(),
            Value::Array(vocab.iter().map(|v| Value::String(v.0.clone())).collect()),
        ),
        (
            "tokenizer.ggml.scores".into(),
            Value::Array(vocab.iter().map(|v| Value::F32(v.1)).collect()),
        ),
        (
            "tokenizer.ggml.token_type".into(),
            Value::Array(vocab.iter().map(|v| Value::I32(v.2)).collect()),
        ),
        ("tokenizer.ggml.bos_token_id".into(), Value::U32(1)),
        ("tokenizer.ggml.eos_token_id".into(), Value::U32(2)),
        ("tokenizer.ggml.unknown_token_id".into(), Value::U32(0)),
    ];
    if let Some(window) = t.window {
        meta.push((format!("{a}.attention.sliding_window"), Value::U32(window)));
    }
    let meta: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let path = dir.join(format!("tiny-{}.gguf", t.name));
    let mut out = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
    gguf_file::write(&mut out, &meta, &refs).unwrap();
    path
}

/// Where the tiny files are written (the golden script reads them there).
fn tiny_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("tiny-families");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The token ids every family is run on: 40, past Gemma's window of 8.
fn ids() -> Vec<u32> {
    (0..40u32)
        .map(|i| 3 + (i * 37 + 11) % (VOCAB as u32 - 3))
        .collect()
}

#[derive(Deserialize)]
struct Golden {
    ids: Vec<u32>,
    families: BTreeMap<String, FamilyGolden>,
}

#[derive(Deserialize)]
struct FamilyGolden {
    sha256: String,
    /// llama.cpp's logits after `ids[..=i]`, for every `i`.
    logits: Vec<Vec<f32>>,
}

fn golden() -> Golden {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../osprey-testkit/data/golden/tiny-families.json");
    let text = std::fs::read_to_string(&path).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn sha256(path: &Path) -> String {
    let bytes = std::fs::read(path).unwrap();
    Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[test]
fn tiny_families_compute_what_llama_cpp_computes() {
    let dir = tiny_dir();
    let files: Vec<(&Tiny, PathBuf)> = FAMILIES.iter().map(|t| (t, write(t, &dir))).collect();
    std::fs::write(dir.join("ids.json"), serde_json::to_string(&ids()).unwrap()).unwrap();
    let golden = golden();
    assert_eq!(golden.ids, ids(), "the golden file was made from other ids");
    for (tiny, path) in files {
        let want = &golden.families[tiny.name];
        assert_eq!(
            sha256(&path),
            want.sha256,
            "{}: the writer no longer writes the file the goldens were made from; run \
             scripts/tiny-families-golden.py again",
            tiny.name
        );
        let model = Transformer::load(&GgufFile::open(&path).unwrap())
            .unwrap_or_else(|e| panic!("{}: {e}", tiny.name));
        let ours = osprey_models::eval::all_logits(&model, &golden.ids);
        let (mut worst, mut argmax_agree) = (0f32, 0);
        for (row, theirs) in ours.chunks_exact(VOCAB).zip(&want.logits) {
            for (a, b) in row.iter().zip(theirs) {
                worst = worst.max((a - b).abs());
            }
            let top = |r: &[f32]| (0..r.len()).fold(0, |b, i| if r[i] > r[b] { i } else { b });
            argmax_agree += usize::from(top(row) == top(theirs));
        }
        eprintln!(
            "{}: max |Δ logit| {worst:.5}, argmax agrees at {argmax_agree} of {} positions",
            tiny.name,
            want.logits.len()
        );
        // F32 weights on both sides; what differs is rounding (f16 KV on both, summation order).
        assert!(
            worst < 0.01,
            "{}: logits differ by up to {worst}",
            tiny.name
        );
        assert_eq!(argmax_agree, want.logits.len(), "{}", tiny.name);
    }
}
