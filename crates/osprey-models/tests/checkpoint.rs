//! Sharded MXFP4 checkpoints of the default model: they load and compute, and a missing,
//! truncated or corrupt shard (or an index naming a shard that is not listed) is an error
//! naming the file at fault.

use std::path::{Path, PathBuf};

use osprey_models::checkpoint::layout::{INDEX_FILE, Index, shard_file};
use osprey_models::convert::Input;
use osprey_models::convert::quantize::{QuantizeOptions, quantize};
use osprey_models::eval::{all_logits, perplexity};
use osprey_models::{Checkpoint, ModelError, Transformer, WeightFormat};
use osprey_testkit::{default_model, golden};

const SHARDS: usize = 12;

fn quantized(dir: &Path, keep_embeddings: bool) {
    let input = Input::open(&default_model()).unwrap();
    let options = QuantizeOptions {
        format: WeightFormat::Mxfp4,
        shards: SHARDS,
        keep_embeddings,
    };
    quantize(&input, dir, &options, &|_| {}, &|_| {}).unwrap();
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

fn open_err(dir: &Path) -> String {
    match Checkpoint::open(dir) {
        Err(e @ ModelError::Checkpoint { .. }) => e.to_string(),
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("a broken checkpoint opened"),
    }
}

struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let p = std::env::temp_dir().join(format!("osprey-ckpt-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        Self(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn an_mxfp4_checkpoint_loads_computes_and_records_what_it_kept() {
    let dir = TempDir::new("ok");
    quantized(&dir.0, true);
    let ckpt = Checkpoint::open(&dir.0).unwrap();
    let index = ckpt.index();
    assert_eq!(index.metadata.shards.len(), SHARDS);
    assert_eq!(index.metadata.format, "mxfp4");
    assert_eq!(
        index.metadata.kept["token_embd.weight"],
        "embedding kept in F16 (--keep-embeddings)"
    );
    assert!(index.metadata.kept["blk.0.attn_norm.weight"].contains("F32"));
    assert!(index.weight_map.contains_key("blk.0.attn_q.weight.blocks"));
    assert!(index.weight_map.contains_key("blk.0.attn_q.weight.scales"));
    let json: Index =
        serde_json::from_str(&std::fs::read_to_string(dir.0.join(INDEX_FILE)).unwrap()).unwrap();
    assert_eq!(&json, index);

    // Near the Q4_1 original on the golden perplexity text (measured: 43.4 vs 29.2, an MXFP4
    // requantization of Q4_1 weights; a broken kernel or layout gives hundreds or more).
    let dense = Transformer::open(&default_model()).unwrap();
    let mx = Transformer::open(&dir.0).unwrap();
    let ids = &golden().perplexity.ids;
    let (_, ppl_q4) = perplexity(&dense, ids);
    let (_, ppl_mx) = perplexity(&mx, ids);
    assert!(ppl_mx.is_finite() && ppl_mx > 1.0);
    assert!(
        ppl_mx > ppl_q4 && ppl_mx < 2.0 * ppl_q4,
        "MXFP4 perplexity {ppl_mx:.3} vs Q4_1 {ppl_q4:.3}"
    );
    // Not the same numbers: the weights really are different.
    let a = all_logits(&dense, &ids[..8]);
    let b = all_logits(&mx, &ids[..8]);
    assert!(a.iter().zip(&b).any(|(x, y)| (x - y).abs() > 1e-3));
}

#[test]
fn broken_shards_are_named() {
    let good = TempDir::new("base");
    quantized(&good.0, false);
    let victim = shard_file(3, SHARDS);

    let missing = TempDir::new("missing");
    copy_dir(&good.0, &missing.0);
    std::fs::remove_file(missing.0.join(&victim)).unwrap();
    let e = open_err(&missing.0);
    assert!(e.contains(&victim) && e.contains("missing"), "{e}");

    let truncated = TempDir::new("truncated");
    copy_dir(&good.0, &truncated.0);
    let path = truncated.0.join(&victim);
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    let e = open_err(&truncated.0);
    assert!(e.contains(&victim) && e.contains("truncated"), "{e}");

    let corrupt = TempDir::new("corrupt");
    copy_dir(&good.0, &corrupt.0);
    let path = corrupt.0.join(&victim);
    let mut bytes = std::fs::read(&path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x40;
    std::fs::write(&path, &bytes).unwrap();
    let e = open_err(&corrupt.0);
    assert!(
        e.contains(&victim) && e.contains("checksum mismatch"),
        "{e}"
    );

    let stray = TempDir::new("stray");
    copy_dir(&good.0, &stray.0);
    let index_path = stray.0.join(INDEX_FILE);
    let mut index: Index =
        serde_json::from_str(&std::fs::read_to_string(&index_path).unwrap()).unwrap();
    index.weight_map.insert(
        "blk.0.attn_q.weight.blocks".into(),
        "model-99999.safetensors".into(),
    );
    std::fs::write(&index_path, serde_json::to_string(&index).unwrap()).unwrap();
    let e = open_err(&stray.0);
    assert!(
        e.contains("model-99999.safetensors") && e.contains(INDEX_FILE),
        "{e}"
    );
}
