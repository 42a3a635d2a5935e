//! Other GGUF layouts and tensor types, made from the default model's real weights: the same
//! network re-encoded as F32/F16/BF16/Q4_0/Q5_0/Q5_1/Q8_0/Q4_K/Q6_K tensors, and as a Qwen2-layout
//! file (NeoX rotary pairing, Q/K/V biases). Each must compute what the original computes.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use osprey_models::{GgufFile, ModelError, Transformer};
use osprey_testkit::{default_model, golden};

/// Perplexity of the model at `path` on the first `n` tokens of the golden perplexity text.
fn perplexity(path: &Path, n: usize) -> f64 {
    let model = Transformer::load(&GgufFile::open(path).unwrap()).unwrap();
    osprey_models::eval::perplexity(&model, &golden().perplexity.ids[..n]).1
}

/// Rewrites `src`: `retype` picks each tensor's new type (None keeps its bytes), `edit` may
/// change metadata and add or transform tensors.
fn rewrite(
    src: &Path,
    out: &Path,
    retype: impl Fn(&str) -> Option<GgmlDType>,
    edit: impl Fn(&mut HashMap<String, Value>, &mut Vec<(String, QTensor)>),
) -> PathBuf {
    let mut file = std::fs::File::open(src).unwrap();
    let content = gguf_file::Content::read(&mut file).unwrap();
    let mut names: Vec<&String> = content.tensor_infos.keys().collect();
    names.sort();
    let mut tensors: Vec<(String, QTensor)> = names
        .into_iter()
        .map(|name| {
            let t = content.tensor(&mut file, name, &Device::Cpu).unwrap();
            let t = match retype(name) {
                Some(dtype) if t.shape().dims().len() == 2 => {
                    QTensor::quantize(&t.dequantize(&Device::Cpu).unwrap(), dtype).unwrap()
                }
                _ => t,
            };
            (name.clone(), t)
        })
        .collect();
    let mut metadata = content.metadata.clone();
    edit(&mut metadata, &mut tensors);
    let meta: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut w = std::io::BufWriter::new(std::fs::File::create(out).unwrap());
    gguf_file::write(&mut w, &meta, &refs).unwrap();
    out.to_owned()
}

/// Picks a tensor's new storage type by name.
type Retype = fn(&str) -> Option<GgmlDType>;

fn scratch_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("formats");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn every_supported_tensor_type_computes_the_same_network() {
    // Candle's kernels for some of these types are scalar: keep the text short.
    const N: usize = 96;
    let base = perplexity(&default_model(), N);
    // Mixes that cover every kernel: K-quants need 256-wide rows, which only ffn_down has.
    let mixes: [(&str, Retype); 2] = [
        ("mix-a", |n| match n {
            n if n.contains("attn_q") || n.contains("attn_k") || n.contains("attn_v") => {
                Some(GgmlDType::Q4_0)
            }
            n if n.contains("attn_output") => Some(GgmlDType::Q5_1),
            n if n.contains("ffn_gate") || n.contains("ffn_up") => Some(GgmlDType::Q5_0),
            n if n.contains("ffn_down") => Some(GgmlDType::Q6K),
            "token_embd.weight" => Some(GgmlDType::F16),
            _ => None,
        }),
        ("mix-b", |n| match n {
            // Q in one type, K and V in another: the Q/K/V projection cannot be fused.
            n if n.contains("attn_q") => Some(GgmlDType::F32),
            n if n.contains("attn_k") || n.contains("attn_v") => Some(GgmlDType::Q8_0),
            n if n.contains("attn_output") => Some(GgmlDType::BF16),
            n if n.contains("ffn_gate") || n.contains("ffn_up") => Some(GgmlDType::F16),
            n if n.contains("ffn_down") => Some(GgmlDType::Q4K),
            "token_embd.weight" => Some(GgmlDType::Q8_0),
            _ => None,
        }),
    ];
    for (name, retype) in mixes {
        let dir = scratch_dir();
        let path = rewrite(
            &default_model(),
            &dir.join(format!("{name}.gguf")),
            retype,
            |_, _| {},
        );
        // The same weights dequantized to F32: the network itself, with no rounding of weights
        // or activations. Every kernel must compute it, up to its 8-bit activations.
        let reference = rewrite(
            &path,
            &dir.join(format!("{name}-f32.gguf")),
            |_| Some(GgmlDType::F32),
            |_, _| {},
        );
        let (ppl, ref_ppl) = (perplexity(&path, N), perplexity(&reference, N));
        eprintln!(
            "{name}: perplexity {ppl:.3}; its weights in F32: {ref_ppl:.3}; original Q4_1 file: {base:.3}"
        );
        // 8-bit activations (every quantized kernel's, Osprey's and candle's) cost up to ~2%
        // over these 96 tokens (mix-a, whose every matmul has them: 2.2%); a wrong layout or
        // scale costs far more.
        assert!(
            (ppl / ref_ppl - 1.0).abs() < 0.03,
            "{name}: perplexity {ppl} vs {ref_ppl} with the same weights in F32"
        );
        // Requantizing already-quantized weights to 4-6 bits costs something, not everything.
        assert!(
            ppl / base < 1.25,
            "{name}: perplexity {ppl} vs {base} for the original"
        );
    }
}

/// GGUF stores Llama's Q/K rows permuted for interleaved RoPE; Qwen2 keeps Hugging Face's order
/// (NeoX pairing). Undo the permutation, row by row within each head.
fn unpermute(t: &QTensor, n_heads: usize) -> QTensor {
    let w = t.dequantize(&Device::Cpu).unwrap();
    let rows = w.dims()[0];
    let hd = rows / n_heads;
    let order: Vec<u32> = (0..rows)
        .map(|r| {
            let (head, within) = (r / hd, r % hd);
            let (j, i) = (within / (hd / 2), within % (hd / 2));
            (head * hd + 2 * i + j) as u32
        })
        .collect();
    let idx = Tensor::new(order.as_slice(), &Device::Cpu).unwrap();
    QTensor::quantize(&w.index_select(&idx, 0).unwrap(), GgmlDType::F32).unwrap()
}

#[test]
fn a_qwen2_layout_file_computes_the_same_network() {
    let base = perplexity(&default_model(), 300);
    let path = rewrite(
        &default_model(),
        &scratch_dir().join("qwen2.gguf"),
        |_| None,
        |meta, tensors| {
            let keys: Vec<String> = meta
                .keys()
                .filter(|k| k.starts_with("llama."))
                .cloned()
                .collect();
            for k in keys {
                let v = meta.remove(&k).unwrap();
                meta.insert(k.replacen("llama.", "qwen2.", 1), v);
            }
            meta.insert("general.architecture".into(), Value::String("qwen2".into()));
            let heads = |meta: &HashMap<String, Value>, k: &str| meta[k].to_u32().unwrap() as usize;
            let (nh, nkv) = (
                heads(meta, "qwen2.attention.head_count"),
                heads(meta, "qwen2.attention.head_count_kv"),
            );
            let mut biases = Vec::new();
            for (name, t) in tensors.iter_mut() {
                if name.ends_with("attn_q.weight") {
                    *t = unpermute(t, nh);
                } else if name.ends_with("attn_k.weight") {
                    *t = unpermute(t, nkv);
                }
                for part in ["attn_q", "attn_k", "attn_v"] {
                    if name.ends_with(&format!("{part}.weight")) {
                        let rows = t.shape().dims()[0];
                        let zeros =
                            Tensor::zeros(rows, candle_core::DType::F32, &Device::Cpu).unwrap();
                        biases.push((
                            name.replace(".weight", ".bias"),
                            QTensor::quantize(&zeros, GgmlDType::F32).unwrap(),
                        ));
                    }
                }
            }
            tensors.extend(biases);
        },
    );
    let ppl = perplexity(&path, 300);
    eprintln!("qwen2 layout: perplexity {ppl:.3} vs {base:.3}");
    // Same weights; only Q and K moved from Q4_1 to exact F32 rows.
    assert!(
        (ppl / base - 1.0).abs() < 0.02,
        "qwen2 layout: perplexity {ppl} vs {base}"
    );
}

#[test]
fn unsupported_architectures_are_a_clear_error() {
    let path = rewrite(
        &default_model(),
        &scratch_dir().join("gpt2.gguf"),
        |_| None,
        |meta, _| {
            meta.insert("general.architecture".into(), Value::String("gpt2".into()));
        },
    );
    let err = Transformer::load(&GgufFile::open(&path).unwrap())
        .err()
        .expect("must not load");
    assert!(
        matches!(err, ModelError::UnsupportedArchitecture(ref a) if a == "gpt2"),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("unsupported model architecture `gpt2` (supported: llama, mistral, qwen2, qwen3, phi3, gemma3)"),
        "the error names the families that are covered: {err}"
    );
}

#[test]
fn tensors_that_disagree_with_the_metadata_are_refused_by_name() {
    // The file says the MLP is wider than its tensors are.
    let path = rewrite(
        &default_model(),
        &scratch_dir().join("wider-mlp.gguf"),
        |_| None,
        |meta, _| {
            meta.insert("llama.feed_forward_length".into(), Value::U32(1600));
        },
    );
    let err = Transformer::load(&GgufFile::open(&path).unwrap())
        .err()
        .expect("must not load");
    assert!(
        matches!(err, ModelError::Shape { ref tensor, .. } if tensor.ends_with(".ffn_gate.weight")),
        "{err}"
    );
    assert!(
        err.to_string().contains("ffn_gate.weight` has shape"),
        "{err}"
    );
    // A tensor the family needs is missing: a Llama file that says it is Gemma 3 has no Q/K
    // norms.
    let path = rewrite(
        &default_model(),
        &scratch_dir().join("no-q-norm.gguf"),
        |_| None,
        |meta, _| {
            meta.insert(
                "general.architecture".into(),
                Value::String("gemma3".into()),
            );
            for key in [
                "context_length",
                "embedding_length",
                "block_count",
                "feed_forward_length",
            ]
            .iter()
            .chain(&["attention.head_count", "attention.head_count_kv"])
            {
                let v = meta[&format!("llama.{key}")].clone();
                meta.insert(format!("gemma3.{key}"), v);
            }
            meta.insert("gemma3.attention.sliding_window".into(), Value::U32(512));
        },
    );
    let err = Transformer::load(&GgufFile::open(&path).unwrap())
        .err()
        .expect("must not load");
    assert!(
        err.to_string()
            .contains("attn_q_norm.weight` is missing from the model file"),
        "{err}"
    );
}

#[test]
fn truncated_files_are_a_clear_error() {
    let src = std::fs::read(default_model()).unwrap();
    let path = scratch_dir().join("truncated.gguf");
    std::fs::write(&path, &src[..src.len() / 2]).unwrap();
    let err = GgufFile::open(&path).err().expect("must not open");
    assert!(err.to_string().contains("not a valid GGUF file"), "{err}");
}
