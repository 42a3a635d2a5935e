//! The vector index: HNSW (`hnsw_rs`) over unit-length embeddings by dot product, kept on disk
//! as `<name>.hnsw.graph` and `<name>.hnsw.data` beside the collection's other files.
//!
//! A point's id is its chunk's `vector_id`. Points are only added: a replaced or deleted
//! chunk's point stays in the graph but is never returned, because searches only accept ids
//! the text index still has (and the caller may read).

use std::path::Path;

use hnsw_rs::api::AnnT;
use hnsw_rs::hnswio::HnswIo;
use hnsw_rs::prelude::{Distance, FilterT, Hnsw};

use crate::RagError;

/// Neighbours kept per point per layer.
const CONNECTIONS: usize = 24;
/// Candidates weighed while inserting.
const EF_CONSTRUCTION: usize = 200;
/// Layers at most.
const LAYERS: usize = 16;

/// An HNSW graph of embeddings.
pub struct Vectors {
    graph: Hnsw<'static, f32, Cosine>,
}

impl Vectors {
    /// An empty index expecting about `capacity` points.
    pub fn new(capacity: usize) -> Self {
        Self {
            graph: Hnsw::new(
                CONNECTIONS,
                capacity.max(1024),
                LAYERS,
                EF_CONSTRUCTION,
                Cosine,
            ),
        }
    }

    /// The index dumped in `dir` under `name`.
    pub fn load(dir: &Path, name: &str) -> Result<Self, RagError> {
        // `hnsw_rs` ties a loaded graph's lifetime to its loader (which could map the data);
        // the loader is small and loaded once per collection and dump, so it is kept for good.
        let loader: &'static mut HnswIo = Box::leak(Box::new(HnswIo::new(dir, name)));
        let graph = loader
            .load_hnsw::<f32, Cosine>()
            .map_err(|e| RagError::Index(format!("loading vectors {name}: {e}")))?;
        Ok(Self { graph })
    }

    /// Writes the index to `dir` under a name starting `name` (made unique if taken), and
    /// returns the name used.
    pub fn dump(&self, dir: &Path, name: &str) -> Result<String, RagError> {
        if self.graph.get_nb_point() == 0 {
            return Ok(String::new());
        }
        (self.graph.file_dump(dir, name))
            .map_err(|e| RagError::Index(format!("writing vectors: {e}")))
    }

    /// Adds `vector` (unit length) as point `id`.
    pub fn insert(&self, vector: &[f32], id: u64) {
        self.graph.insert_slice((vector, id as usize));
    }

    /// Points in the index, replaced ones included.
    pub fn len(&self) -> usize {
        self.graph.get_nb_point()
    }

    /// Whether it has no points.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The `k` points nearest `query` among those `allowed` (sorted ids), nearest first, with
    /// their cosine similarity.
    pub fn search(&self, query: &[f32], k: usize, allowed: &Allowed) -> Vec<(u64, f32)> {
        if self.is_empty() || allowed.0.is_empty() {
            return Vec::new();
        }
        let ef = (2 * k).max(64);
        let found = self.graph.search_filter(query, k, ef, Some(allowed));
        found
            .into_iter()
            .map(|n| (n.d_id as u64, 1.0 - n.distance))
            .collect()
    }
}

/// `1 - a·b` for unit vectors, never below 0 (`hnsw_rs`'s own dot distance panics when
/// rounding takes the product of a vector with itself past 1).
#[derive(Clone, Copy, Debug, Default)]
pub struct Cosine;

impl Distance<f32> for Cosine {
    fn eval(&self, a: &[f32], b: &[f32]) -> f32 {
        let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
        (1.0 - dot).max(0.0)
    }
}

/// Point ids a search may return, sorted.
pub struct Allowed(pub Vec<usize>);

impl FilterT for Allowed {
    fn hnsw_filter(&self, id: &usize) -> bool {
        self.0.binary_search(id).is_ok()
    }
}
