//! Ranking: BM25 and vector candidates fused by reciprocal rank, optionally reranked on
//! features of each candidate against the query, then cut to one chunk per document (unless
//! asked not to) and to `top_k`.
//!
//! The reranker is ours: no cross-encoder ships in a package that runs offline here, and the
//! local model is far too slow to score a hundred passages per query. It is a fixed linear
//! blend of the fused score, the embedding similarity, how much of the query the chunk's
//! title and headings hold, and how many of the query's word pairs occur in the chunk in the
//! same order — signals a cross-encoder learns, computed in microseconds.

use std::collections::HashSet;

use serde::Serialize;

use crate::passages::{StoredChunk, Visibility};

/// How candidates are found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Method {
    /// Words only (BM25).
    Bm25,
    /// Embeddings only.
    Vector,
    /// Both, fused.
    #[default]
    Hybrid,
}

/// A search.
#[derive(Clone, Debug)]
pub struct SearchQuery {
    /// What is looked for.
    pub text: String,
    /// Results wanted.
    pub top_k: usize,
    /// What the caller may see.
    pub visibility: Visibility,
    /// How candidates are found.
    pub method: Method,
    /// How the candidates are reranked (`None`: by the method's own score).
    pub rerank: Option<Rerank>,
    /// One result per document (the best chunk).
    pub group_by_document: bool,
}

impl SearchQuery {
    /// A hybrid, reranked search for `text` returning `top_k` documents, seen with `groups`.
    pub fn new(text: &str, top_k: usize, groups: Vec<String>) -> Self {
        Self {
            text: text.to_owned(),
            top_k,
            visibility: Visibility {
                groups,
                ..Visibility::default()
            },
            method: Method::Hybrid,
            rerank: Some(Rerank::DEFAULT),
            group_by_document: true,
        }
    }
}

/// What the methods said of one chunk.
#[derive(Clone, Debug, Default)]
pub struct Candidate {
    /// Its place in BM25's list, from 0.
    pub bm25_rank: Option<usize>,
    /// Its BM25 score (0 if BM25 did not find it).
    pub bm25: f32,
    /// Its place in the vector search's list, from 0.
    pub vector_rank: Option<usize>,
    /// Cosine similarity of its embedding to the query's.
    pub cosine: Option<f32>,
}

/// The constant of reciprocal rank fusion: a rank `r` (from 1) scores `1 / (K + r)`.
const RRF_K: f32 = 10.0;
/// How much more a vector rank counts than a BM25 rank in the fusion.
const VECTOR_WEIGHT: f32 = 3.0;

impl Candidate {
    /// Its reciprocal-rank-fusion score.
    pub fn fused(&self) -> f32 {
        let rrf = |rank: Option<usize>| rank.map_or(0.0, |r| 1.0 / (RRF_K + r as f32 + 1.0));
        rrf(self.bm25_rank) + VECTOR_WEIGHT * rrf(self.vector_rank)
    }
}

/// One result.
#[derive(Clone, Debug, Serialize)]
pub struct Hit {
    /// The document's id.
    pub document_id: String,
    /// The chunk's id (`document_id#n`).
    pub chunk_id: String,
    /// Its score; higher is better (comparable within one search only).
    pub score: f32,
    /// The chunk's text.
    pub text: String,
    /// The document's title.
    pub title: String,
    /// The headings the chunk sits under.
    pub heading: String,
    /// Where the document came from.
    pub source: String,
    /// When the chunk was indexed, Unix ms.
    pub indexed_at: i64,
    /// The document's metadata.
    pub metadata: serde_json::Map<String, serde_json::Value>,
}

/// The reranker: weights of its features.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rerank {
    /// The fused score, relative to the best candidate's.
    pub fused: f32,
    /// Cosine similarity of the chunk's embedding to the query's.
    pub cosine: f32,
    /// The share of the query's terms in the title and headings.
    pub title: f32,
    /// The share of the query's adjacent term pairs found in order in the text.
    pub pairs: f32,
}

/// What the reranker weighs of one candidate.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Features {
    /// Its fused score over the best candidate's, 0 to 1.
    pub fused: f32,
    /// Cosine similarity of its embedding to the query's (0 when it has none).
    pub cosine: f32,
    /// The share of the query's terms in its title and headings.
    pub title: f32,
    /// The share of the query's adjacent term pairs found in order in its text.
    pub pairs: f32,
}

impl Features {
    /// The features of `chunk` (found as `candidate`) for a query of `query_terms`, the best
    /// fused score among the candidates being `best_fused`.
    pub fn of(
        query_terms: &[String],
        candidate: &Candidate,
        chunk: &StoredChunk,
        best_fused: f32,
        terms: &dyn Fn(&str) -> Vec<String>,
    ) -> Self {
        let title = terms(&format!("{} {}", chunk.title, chunk.heading));
        Self {
            fused: candidate.fused() / best_fused.max(f32::MIN_POSITIVE),
            cosine: candidate.cosine.unwrap_or_default(),
            title: coverage(query_terms, &title),
            pairs: pairs_in_order(query_terms, &terms(&chunk.text)),
        }
    }
}

impl Rerank {
    /// The score of a candidate with `f`.
    pub fn score(&self, f: &Features) -> f32 {
        self.fused * f.fused + self.cosine * f.cosine + self.title * f.title + self.pairs * f.pairs
    }

    /// The weights in use (how they were chosen: docs/rag.md).
    pub const DEFAULT: Self = Self {
        fused: 0.0,
        cosine: 1.0,
        title: 0.5,
        pairs: 0.25,
    };
}

/// `candidates` ranked for `query`, cut to `top_k`; `terms` splits text into index terms.
pub fn rank(
    query: &SearchQuery,
    candidates: Vec<(Candidate, StoredChunk)>,
    terms: &dyn Fn(&str) -> Vec<String>,
) -> Vec<Hit> {
    let query_terms = terms(&query.text);
    let best_fused = (candidates.iter().map(|(c, _)| c.fused())).fold(f32::MIN, f32::max);
    let mut scored: Vec<(f32, StoredChunk)> = candidates
        .into_iter()
        .map(|(c, chunk)| {
            let score = match &query.rerank {
                None => match query.method {
                    Method::Bm25 => c.bm25,
                    Method::Vector => c.cosine.unwrap_or_default(),
                    Method::Hybrid => c.fused(),
                },
                Some(w) => w.score(&Features::of(&query_terms, &c, &chunk, best_fused, terms)),
            };
            (score, chunk)
        })
        .collect();
    scored.sort_by(|a, b| {
        b.0.total_cmp(&a.0)
            .then_with(|| a.1.chunk_id.cmp(&b.1.chunk_id))
    });
    let mut seen = HashSet::new();
    scored
        .into_iter()
        .filter(|(_, c)| !query.group_by_document || seen.insert(c.document_id.clone()))
        .take(query.top_k)
        .map(|(score, c)| Hit {
            document_id: c.document_id,
            chunk_id: c.chunk_id,
            score,
            text: c.text,
            title: c.title,
            heading: c.heading,
            source: c.source,
            indexed_at: c.indexed_at,
            metadata: c.metadata,
        })
        .collect()
}

/// The share of the query's distinct terms found in `field`.
fn coverage(query: &[String], field: &[String]) -> f32 {
    if query.is_empty() {
        return 0.0;
    }
    let field: HashSet<&String> = field.iter().collect();
    query.iter().filter(|t| field.contains(t)).count() as f32 / query.len() as f32
}

/// The share of the query's adjacent term pairs found adjacent, in order, in `body`.
fn pairs_in_order(query: &[String], body: &[String]) -> f32 {
    if query.len() < 2 {
        return 0.0;
    }
    let pairs: HashSet<(&String, &String)> = body.windows(2).map(|w| (&w[0], &w[1])).collect();
    let found = query
        .windows(2)
        .filter(|w| pairs.contains(&(&w[0], &w[1])))
        .count();
    found as f32 / (query.len() - 1) as f32
}
