//! How the reranker's weights were chosen: a coarse grid over the four feature weights,
//! scored by MRR@10 on the even-numbered queries of a known-item set and checked on the odd
//! ones (which played no part in the choice).
//!
//! ```text
//! cargo run --release -p osprey-rag --example rerank_weights -- \
//!     ~/.cache/osprey/collections/bench/manpages ../shared/data/retrieval/manpages-queries-dev.jsonl
//! ```

use std::collections::HashSet;

use osprey_rag::search::{Features, Rerank};
use osprey_rag::{Collection, SearchQuery};

struct Scored {
    relevant: String,
    /// (document id, features), one per candidate chunk.
    candidates: Vec<(String, Features)>,
    /// (document id, BM25 rank, vector rank), one per candidate chunk.
    ranks: Vec<(String, Option<usize>, Option<usize>)>,
}

/// The reciprocal rank of `relevant` among the first 10 documents of `ranked` (scored chunks).
fn reciprocal_rank(mut ranked: Vec<(f32, &str)>, relevant: &str) -> f64 {
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0));
    let mut seen = HashSet::new();
    let docs = ranked
        .into_iter()
        .map(|r| r.1)
        .filter(|d| seen.insert(*d))
        .take(10);
    docs.zip(1..)
        .find(|(d, _)| *d == relevant)
        .map_or(0.0, |(_, rank)| 1.0 / f64::from(rank))
}

/// MRR@10 of fusion alone: BM25 weight 1, vectors `vector_weight`, constant `k`.
fn fusion_mrr(queries: &[&Scored], k: f32, vector_weight: f32) -> f64 {
    let rrf = |r: Option<usize>| r.map_or(0.0, |r| 1.0 / (k + r as f32 + 1.0));
    let total: f64 = (queries.iter())
        .map(|q| {
            let ranked = (q.ranks.iter())
                .map(|(d, b, v)| (rrf(*b) + vector_weight * rrf(*v), d.as_str()))
                .collect();
            reciprocal_rank(ranked, &q.relevant)
        })
        .sum();
    total / queries.len() as f64
}

/// MRR@10 of the reranker with weights `w`.
fn mrr(queries: &[&Scored], w: &Rerank) -> f64 {
    let total: f64 = (queries.iter())
        .map(|q| {
            let ranked = (q.candidates.iter())
                .map(|(d, f)| (w.score(f), d.as_str()))
                .collect();
            reciprocal_rank(ranked, &q.relevant)
        })
        .sum();
    total / queries.len() as f64
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let collection = Collection::open(args[1].as_ref()).unwrap();
    let embedder = osprey_engine::Embedder::fetch_default().unwrap();
    let mut scored = Vec::new();
    for line in std::fs::read_to_string(&args[2]).unwrap().lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let query = SearchQuery::new(v["query"].as_str().unwrap(), 10, vec![]);
        let found = collection.candidates(&query, &embedder).unwrap();
        let terms = |t: &str| collection.terms(t);
        let query_terms = terms(&query.text);
        let best = found
            .iter()
            .map(|(c, _)| c.fused())
            .fold(f32::MIN, f32::max);
        let candidates = (found.iter())
            .map(|(c, chunk)| {
                (
                    chunk.document_id.clone(),
                    Features::of(&query_terms, c, chunk, best, &terms),
                )
            })
            .collect();
        let ranks = (found.iter())
            .map(|(c, chunk)| (chunk.document_id.clone(), c.bm25_rank, c.vector_rank))
            .collect();
        let relevant = v["relevant"][0].as_str().unwrap().to_owned();
        scored.push(Scored {
            relevant,
            candidates,
            ranks,
        });
    }
    let tune: Vec<&Scored> = scored.iter().step_by(2).collect();
    let check: Vec<&Scored> = scored.iter().skip(1).step_by(2).collect();
    for k in [10.0, 30.0, 60.0] {
        for vector_weight in [1.0, 1.5, 2.0, 3.0, 4.0] {
            println!(
                "fusion k {k} vector weight {vector_weight}: MRR@10 tune {:.3}  check {:.3}",
                fusion_mrr(&tune, k, vector_weight),
                fusion_mrr(&check, k, vector_weight)
            );
        }
    }
    let grid = [0.0, 0.25, 0.5, 1.0, 2.0];
    let mut best = (0.0, Rerank::DEFAULT);
    for fused in grid {
        for cosine in grid {
            for title in grid {
                for pairs in grid {
                    let w = Rerank {
                        fused,
                        cosine,
                        title,
                        pairs,
                    };
                    let m = mrr(&tune, &w);
                    if m > best.0 {
                        best = (m, w);
                    }
                }
            }
        }
    }
    let fused_only = Rerank {
        fused: 1.0,
        cosine: 0.0,
        title: 0.0,
        pairs: 0.0,
    };
    for (name, w) in [
        ("fusion alone", fused_only),
        ("default", Rerank::DEFAULT),
        ("best on tune", best.1),
    ] {
        println!(
            "{name:>14}: {w:?}  MRR@10 tune {:.3}  check {:.3}",
            mrr(&tune, &w),
            mrr(&check, &w)
        );
    }
}
