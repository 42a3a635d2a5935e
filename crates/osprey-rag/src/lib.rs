//! Retrieval-augmented generation, embedded: no server beside Osprey, indexes on disk.
//!
//! - [`document`] reads PDF, HTML, Markdown, text and JSONL records into [`Document`]s;
//! - [`chunk`] splits them into passages sized in the embedder's tokens, with their headings;
//! - a [`Collection`] keeps each passage in a tantivy index ([`passages`], BM25 and every
//!   stored field) and its all-MiniLM-L6-v2 embedding in an HNSW graph ([`vectors`]);
//! - [`search`] fuses BM25 and vector candidates, reranks them and keeps one per document,
//!   under the caller's ACL groups (filtered before anything is scored);
//! - [`jobs::IngestJobs`] runs ingests on one background thread, one job at a time;
//! - [`Library`] is a tenant's collections under `$OSPREY_HOME/collections/`.
//!
//! ```no_run
//! use osprey_rag::{Collection, SearchQuery, document};
//! let embedder = osprey_engine::Embedder::fetch_default().unwrap();
//! let collection = Collection::open(std::path::Path::new("/tmp/docs")).unwrap();
//! let docs = document::read_file("README.md".as_ref(), "README.md").unwrap();
//! collection.ingest(&docs, &Default::default(), &embedder, &mut |_| {}).unwrap();
//! let hits = collection.search(&SearchQuery::new("how do I start", 3, vec![]), &embedder).unwrap();
//! ```

pub mod chunk;
pub mod collection;
pub mod document;
pub mod jobs;
pub mod library;
pub mod passages;
pub mod search;
#[doc(hidden)]
pub mod testing;
pub mod vectors;

pub use collection::{Collection, IngestOptions, IngestReport, Meta};
pub use document::{Document, Format};
pub use library::Library;
pub use passages::{EVERYONE, Visibility};
pub use search::{Hit, Method, Rerank, SearchQuery};

/// What can go wrong.
#[derive(Debug, thiserror::Error)]
pub enum RagError {
    /// Reading files.
    #[error("{0}")]
    Io(String),
    /// A document that cannot be read.
    #[error("{0}")]
    Document(String),
    /// The indexes.
    #[error("index: {0}")]
    Index(String),
    /// The embedder.
    #[error("embedding: {0}")]
    Embed(String),
    /// Another writer holds the collection.
    #[error("{0}")]
    Busy(String),
    /// A name that cannot be a collection's.
    #[error("{0}")]
    Name(String),
}

/// What turns text into unit-length vectors, and counts its tokens.
pub trait Embed: Send + Sync {
    /// The embedding of `text`.
    fn embed(&self, text: &str) -> Result<Vec<f32>, String>;
    /// The embeddings of `texts` (together, where that is faster).
    fn embed_batch(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, String> {
        texts.iter().map(|t| self.embed(t)).collect()
    }
    /// Tokens in `text`, as the embedder counts them.
    fn count_tokens(&self, text: &str) -> usize;
}

impl Embed for osprey_engine::Embedder {
    fn embed(&self, text: &str) -> Result<Vec<f32>, String> {
        osprey_engine::Embedder::embed(self, text).map_err(|e| e.to_string())
    }
    fn embed_batch(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, String> {
        osprey_engine::Embedder::embed_batch(self, texts).map_err(|e| e.to_string())
    }
    fn count_tokens(&self, text: &str) -> usize {
        osprey_engine::Embedder::count_tokens(self, text)
    }
}

/// Now, Unix ms.
pub fn now_ms() -> i64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    since.map_or(0, |d| d.as_millis() as i64)
}
