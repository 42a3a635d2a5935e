//! The injection and jailbreak classifier: a softmax regression over hashed features of the
//! folded text ([`crate::normalize::canonical`]): character 3- to 5-grams, words and word
//! pairs, each counted once, the vector scaled to unit length. Three classes: benign,
//! injection, jailbreak; as a guard, the likelier attack class is scored with the probability
//! of an attack of either kind.
//!
//! It is trained in-process on first use (the gateway does so before serving; 0.7 s here) from `data/injection-train.jsonl`,
//! which `scripts/build_safety_data.py` builds from registry packages' labelled data (sources
//! and licences in docs/safety.md); `data/injection-heldout.jsonl` is the held-out split.

use std::sync::LazyLock;

use crate::normalize::canonical;
use crate::{Category, Finding, Guard, Source};

/// Hash buckets of the features.
const BUCKETS: usize = 1 << 18;
/// Characters of a text read (long jailbreaks state their frame early).
const MAX_CHARS: usize = 6_000;
const EPOCHS: usize = 12;
const LEARNING_RATE: f32 = 0.5;
const L2: f32 = 1e-6;

/// A class.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// Neither.
    Benign = 0,
    /// Prompt injection.
    Injection = 1,
    /// Jailbreak.
    Jailbreak = 2,
}

impl Class {
    fn from_label(label: &str) -> Option<Self> {
        match label {
            "benign" => Some(Self::Benign),
            "injection" => Some(Self::Injection),
            "jailbreak" => Some(Self::Jailbreak),
            _ => None,
        }
    }
}

/// A labelled text.
#[derive(serde::Deserialize)]
pub struct Example {
    /// The text.
    pub text: String,
    /// `benign`, `injection` or `jailbreak`.
    pub label: String,
}

/// The trained model.
pub struct Classifier {
    /// Per bucket, a weight per class.
    weights: Vec<[f32; 3]>,
    bias: [f32; 3],
}

static SHIPPED: LazyLock<Classifier> = LazyLock::new(|| {
    let examples = parse(include_str!("../data/injection-train.jsonl"));
    Classifier::train(&examples)
});

/// The examples of a JSONL file.
pub fn parse(jsonl: &str) -> Vec<Example> {
    jsonl
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("a valid example line"))
        .collect()
}

/// The sparse features of `text`: bucket indices and their value (unit length).
fn features(text: &str) -> Vec<(usize, f32)> {
    let folded = canonical(text);
    let folded: String = folded.chars().take(MAX_CHARS).collect();
    let mut buckets = Buckets::default();
    let chars: Vec<char> = format!(" {folded} ").chars().collect();
    for n in 3..=5 {
        for w in chars.windows(n) {
            buckets.push(hash(1 + n as u64, w.iter().copied()));
        }
    }
    let words: Vec<&str> = folded
        .split(|c: char| !c.is_alphanumeric() && c != '\'')
        .filter(|w| !w.is_empty())
        .collect();
    for w in &words {
        buckets.push(hash(10, w.chars()));
    }
    for pair in words.windows(2) {
        buckets.push(hash(
            11,
            pair[0].chars().chain([' ']).chain(pair[1].chars()),
        ));
    }
    let buckets = buckets.into_vec();
    let value = 1.0 / (buckets.len().max(1) as f32).sqrt();
    buckets.into_iter().map(|b| (b, value)).collect()
}

thread_local! {
    /// A bit per bucket, all clear between uses.
    static SEEN: std::cell::RefCell<Vec<u64>> = std::cell::RefCell::new(vec![0; BUCKETS / 64]);
}

/// Distinct bucket indices, in first-seen order: a bitmap per thread marks those seen (a hash
/// set's hashing, then sorting, each cost a fifth of the guards' time).
#[derive(Default)]
struct Buckets(Vec<usize>);

impl Buckets {
    fn push(&mut self, b: usize) {
        let new = SEEN.with_borrow_mut(|seen| {
            let (word, bit) = (b / 64, 1u64 << (b % 64));
            let new = seen[word] & bit == 0;
            seen[word] |= bit;
            new
        });
        if new {
            self.0.push(b);
        }
    }

    fn into_vec(mut self) -> Vec<usize> {
        self.clear_bits();
        std::mem::take(&mut self.0)
    }

    fn clear_bits(&self) {
        SEEN.with_borrow_mut(|seen| {
            for &b in &self.0 {
                seen[b / 64] = 0;
            }
        });
    }
}

impl Drop for Buckets {
    fn drop(&mut self) {
        self.clear_bits();
    }
}

/// FNV-1a over a kind tag and characters, into a bucket.
fn hash(kind: u64, chars: impl Iterator<Item = char>) -> usize {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ kind;
    for c in chars {
        h ^= c as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    (h as usize) & (BUCKETS - 1)
}

impl Classifier {
    /// The model trained on the shipped data.
    pub fn shipped() -> &'static Self {
        &SHIPPED
    }

    /// Trains on `examples` (classes weighed by their inverse frequency), with SGD.
    pub fn train(examples: &[Example]) -> Self {
        let data: Vec<(Vec<(usize, f32)>, usize)> = examples
            .iter()
            .filter_map(|e| Some((features(&e.text), Class::from_label(&e.label)? as usize)))
            .collect();
        let mut counts = [0usize; 3];
        for (_, y) in &data {
            counts[*y] += 1;
        }
        let class_weight: Vec<f32> = (counts.iter())
            .map(|&c| data.len() as f32 / (3.0 * c.max(1) as f32))
            .collect();
        let mut model = Self {
            weights: vec![[0.0; 3]; BUCKETS],
            bias: [0.0; 3],
        };
        let mut order: Vec<usize> = (0..data.len()).collect();
        let mut state: u64 = 0x2545_f491_4f6c_dd1d;
        for epoch in 0..EPOCHS {
            // A fixed shuffle per epoch (xorshift), so training is reproducible.
            for i in (1..order.len()).rev() {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                order.swap(i, (state % (i as u64 + 1)) as usize);
            }
            let rate = LEARNING_RATE / (1.0 + epoch as f32);
            for &i in &order {
                let (x, y) = &data[i];
                let p = model.probabilities_of(x);
                for (k, pk) in p.iter().enumerate() {
                    let grad = (pk - f32::from(k == *y)) * class_weight[*y];
                    model.bias[k] -= rate * grad;
                    for &(b, v) in x {
                        let w = &mut model.weights[b][k];
                        *w -= rate * (grad * v + L2 * *w);
                    }
                }
            }
        }
        model
    }

    fn probabilities_of(&self, x: &[(usize, f32)]) -> [f32; 3] {
        let mut z = self.bias;
        for &(b, v) in x {
            for (zk, wk) in z.iter_mut().zip(self.weights[b]) {
                *zk += wk * v;
            }
        }
        let max = z.iter().copied().fold(f32::MIN, f32::max);
        let e = z.map(|zk| (zk - max).exp());
        let sum: f32 = e.iter().sum();
        e.map(|ek| ek / sum)
    }

    /// The probabilities of benign, injection and jailbreak for `text`.
    pub fn probabilities(&self, text: &str) -> [f32; 3] {
        self.probabilities_of(&features(text))
    }
}

/// The classifier, as a guard: a finding per attack class, scored by its probability.
#[derive(Clone, Copy, Debug, Default)]
pub struct InjectionClassifier;

impl Guard for InjectionClassifier {
    fn name(&self) -> &'static str {
        "injection_classifier"
    }

    fn check(&self, text: &str, _source: Source) -> Vec<Finding> {
        let p = Classifier::shipped().probabilities(text);
        let (injection, jailbreak) = (p[Class::Injection as usize], p[Class::Jailbreak as usize]);
        // The likelier attack class carries the probability of an attack at all; the other
        // its own.
        let attack = injection + jailbreak;
        let scores = match injection >= jailbreak {
            true => [
                (Category::PromptInjection, attack),
                (Category::Jailbreak, jailbreak),
            ],
            false => [
                (Category::PromptInjection, injection),
                (Category::Jailbreak, attack),
            ],
        };
        scores
            .into_iter()
            .filter(|(_, score)| *score >= 0.05)
            .map(|(category, score)| Finding {
                category,
                rule: "classifier",
                score,
                span: None,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Held-out recall of attacks (either class) at the standard threshold, and the false
    /// positive rate on benign texts; printed with `--nocapture`.
    #[test]
    fn held_out_attacks_are_caught_and_benign_texts_pass() {
        let heldout = parse(include_str!("../data/injection-heldout.jsonl"));
        let model = Classifier::shipped();
        let (mut tp, mut fn_, mut fp, mut tn) = (0, 0, 0, 0);
        for e in &heldout {
            let p = model.probabilities(&e.text);
            let attack = p[1] + p[2] >= 0.5;
            match (e.label != "benign", attack) {
                (true, true) => tp += 1,
                (true, false) => fn_ += 1,
                (false, true) => fp += 1,
                (false, false) => tn += 1,
            }
        }
        let recall = tp as f64 / (tp + fn_) as f64;
        let fpr = fp as f64 / (fp + tn) as f64;
        println!(
            "held out: recall {recall:.3} ({tp}/{}), FPR {fpr:.3} ({fp}/{})",
            tp + fn_,
            fp + tn
        );
        assert!(recall > 0.5 && fpr < 0.2, "the classifier learnt something");
    }
}
