//! Scores labelled JSONL sets (`{"text", "label"}`) with the standard pipeline, and prints, per
//! set, the share of texts whose attack score reaches each threshold (recall on attack sets,
//! the false-positive rate on benign ones), for the whole pipeline and the classifier alone.
//!
//! `cargo run --release -p osprey-policy --example score_sets -- SET.jsonl...`

use osprey_policy::classifier::{Classifier, parse};
use osprey_policy::pipeline::Pipeline;
use osprey_policy::{Category, Source};

const THRESHOLDS: [f32; 4] = [0.3, 0.5, 0.7, 0.8];

fn main() {
    let pipeline = Pipeline::default();
    println!("| set | n | pipeline ≥ 0.3 / 0.5 / 0.7 / 0.8 | classifier ≥ 0.3 / 0.5 / 0.7 / 0.8 |");
    for path in std::env::args().skip(1) {
        let examples = parse(&std::fs::read_to_string(&path).expect("a readable set"));
        let (mut whole, mut alone) = (Vec::new(), Vec::new());
        for e in &examples {
            let v = pipeline.check(&e.text, Source::User);
            whole.push(
                v.score(Category::PromptInjection)
                    .max(v.score(Category::Jailbreak)),
            );
            let p = Classifier::shipped().probabilities(&e.text);
            alone.push(p[1] + p[2]);
        }
        let rates = |scores: &[f32]| {
            (THRESHOLDS.iter())
                .map(|t| {
                    format!(
                        "{:.3}",
                        scores.iter().filter(|s| *s >= t).count() as f64 / scores.len() as f64
                    )
                })
                .collect::<Vec<_>>()
                .join(" / ")
        };
        let name = std::path::Path::new(&path)
            .file_stem()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        println!(
            "| {name} | {} | {} | {} |",
            examples.len(),
            rates(&whole),
            rates(&alone)
        );
        if std::env::var_os("SHOW").is_some() {
            for (e, s) in examples.iter().zip(&whole) {
                if (*s >= 0.5) == (e.label == "benign") {
                    let head: String = e.text.chars().take(160).collect();
                    println!("  {s:.2} {}", head.replace('\n', " "));
                }
            }
        }
    }
}
