//! The semantic cache's decision on labelled pairs: for each threshold, the share of
//! paraphrase pairs whose similarity reaches it (hits) and of near-miss pairs (false hits).
//! The cache answers a request with a kept answer exactly when the two last user messages'
//! similarity reaches the threshold, the rest of the request being the same.
//!
//! `cargo run --release -p osprey-engine --example semantic_pairs -- bench/semantic-cache/dev.jsonl`
//! (lines `{"a", "b", "same"}`).

use osprey_engine::Embedder;
use osprey_engine::embedder::cosine;

fn main() {
    let embedder = Embedder::fetch_default().expect("the embedder loads");
    for path in std::env::args().skip(1) {
        let text = std::fs::read_to_string(&path).expect("a pairs file");
        let (mut same, mut other) = (Vec::new(), Vec::new());
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let pair: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
            let e = |k: &str| embedder.embed(pair[k].as_str().unwrap()).unwrap();
            let sim = cosine(&e("a"), &e("b"));
            match pair["same"].as_bool() {
                Some(true) => same.push(sim),
                _ => {
                    other.push(sim);
                    if sim >= 0.85 {
                        println!("near miss at {sim:.3}: {} | {}", pair["a"], pair["b"]);
                    }
                }
            }
        }
        println!(
            "{path}: {} paraphrase pairs, {} near-miss pairs",
            same.len(),
            other.len()
        );
        println!("{:>9} {:>9} {:>10}", "threshold", "hit rate", "false hits");
        for t in [0.75, 0.8, 0.85, 0.875, 0.9, 0.925, 0.95] {
            let share = |v: &[f32]| v.iter().filter(|&&s| s >= t).count() as f64 / v.len() as f64;
            println!("{t:>9.3} {:>9.3} {:>10.3}", share(&same), share(&other));
        }
    }
}
