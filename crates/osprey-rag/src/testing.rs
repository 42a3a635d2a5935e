//! A stand-in embedder for unit tests of chunking and indexing: words hashed into buckets.
//! Tests of retrieval quality use the real model.

use crate::Embed;

/// One token per word; a bag-of-hashed-words vector, unit length.
pub struct WordEmbedder;

impl Embed for WordEmbedder {
    fn embed(&self, text: &str) -> Result<Vec<f32>, String> {
        let mut v = vec![0f32; 64];
        for word in text
            .split(|c: char| !c.is_alphanumeric())
            .filter(|w| !w.is_empty())
        {
            let h = word
                .to_lowercase()
                .bytes()
                .fold(7u64, |h, b| h.wrapping_mul(31) + u64::from(b));
            v[(h % 64) as usize] += 1.0;
        }
        let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-6);
        Ok(v.into_iter().map(|x| x / norm).collect())
    }
    fn count_tokens(&self, text: &str) -> usize {
        text.split_whitespace().count()
    }
}
