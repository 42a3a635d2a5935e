//! `osprey bench rag`: retrieval quality and speed on a known-item corpus (JSONL records and
//! queries `{qid, query, relevant: [doc id]}`, as `../shared/data/retrieval` has them).
//!
//! Ingests the corpus into a collection if it is empty (reporting chunks/s, embedding
//! included), then scores BM25, vector, hybrid and hybrid + rerank by MRR@10 and Recall@10
//! over the queries, one document per result, and measures query latency at each
//! concurrency (threads calling the collection as the server's search route does).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use clap::Args;
use osprey_rag::{Collection, IngestOptions, Library, Method, SearchQuery, document};

/// `osprey bench rag`.
#[derive(Args, Debug)]
pub struct RagBenchArgs {
    /// The corpus: JSONL records `{id, title, text}` (plain or gzipped).
    #[arg(long)]
    corpus: PathBuf,
    /// The queries: JSONL `{qid, query, relevant}`.
    #[arg(long)]
    queries: PathBuf,
    /// The collection to build (or reuse, when it has chunks already).
    #[arg(long, default_value = "bench-retrieval")]
    collection: String,
    /// The tenant whose collection it is.
    #[arg(long, default_value = "bench")]
    tenant: String,
    /// Concurrent clients for the latency runs (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "1,8")]
    concurrency: Vec<usize>,
    /// Only the first N queries.
    #[arg(long)]
    limit: Option<usize>,
    /// When building: embed only each document's first N chunks.
    #[arg(long, value_name = "N")]
    max_vectors_per_document: Option<usize>,
}

struct Known {
    query: String,
    relevant: Vec<String>,
}

pub fn run(args: RagBenchArgs) -> anyhow::Result<()> {
    let library = Library::at_home();
    let collection = library
        .get(&args.tenant, &args.collection, true)?
        .expect("created");
    let embedder = Arc::new(osprey_engine::Embedder::fetch_default()?);
    if collection.chunk_count() == 0 {
        ingest(&collection, &args, embedder.as_ref())?;
    }
    let text = std::fs::read_to_string(&args.queries)?;
    let mut queries = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value = serde_json::from_str(line)?;
        let relevant = (v["relevant"].as_array().into_iter().flatten())
            .filter_map(|r| r.as_str().map(str::to_owned))
            .collect();
        let query = v["query"].as_str().unwrap_or_default().to_owned();
        queries.push(Known { query, relevant });
    }
    queries.truncate(args.limit.unwrap_or(usize::MAX));
    println!(
        "{} queries over {} chunks ({})",
        queries.len(),
        collection.chunk_count(),
        args.corpus.display()
    );
    println!("| method | MRR@10 | Recall@10 | p50 ms | p99 ms |");
    println!("|---|---|---|---|---|");
    let methods = [
        ("bm25", Method::Bm25, false),
        ("vector", Method::Vector, false),
        ("hybrid", Method::Hybrid, false),
        ("hybrid + rerank", Method::Hybrid, true),
    ];
    for (name, method, rerank) in methods {
        let (mut mrr, mut recall, mut latencies) = (0.0, 0.0, Vec::new());
        for q in &queries {
            let started = Instant::now();
            let hits = collection.search(&query(q, method, rerank), embedder.as_ref())?;
            latencies.push(started.elapsed().as_secs_f64() * 1000.0);
            let found = hits
                .iter()
                .position(|h| q.relevant.contains(&h.document_id));
            if let Some(rank) = found {
                mrr += 1.0 / (rank + 1) as f64;
                recall += 1.0;
            }
        }
        let n = queries.len().max(1) as f64;
        let (p50, p99) = percentiles(&mut latencies);
        println!(
            "| {name} | {:.3} | {:.3} | {p50:.1} | {p99:.1} |",
            mrr / n,
            recall / n
        );
    }
    println!();
    println!("| clients | rerank | queries/s | p50 ms | p99 ms |");
    println!("|---|---|---|---|---|");
    let queries = Arc::new(queries);
    for &clients in &args.concurrency {
        for rerank in [false, true] {
            let started = Instant::now();
            let threads: Vec<_> = (0..clients.max(1))
                .map(|t| {
                    let (c, e, qs) = (collection.clone(), embedder.clone(), queries.clone());
                    std::thread::spawn(move || {
                        let mut lat = Vec::new();
                        for q in qs.iter().skip(t).step_by(clients.max(1)) {
                            let started = Instant::now();
                            let _ = c.search(&query(q, Method::Hybrid, rerank), e.as_ref());
                            lat.push(started.elapsed().as_secs_f64() * 1000.0);
                        }
                        lat
                    })
                })
                .collect();
            let mut latencies: Vec<f64> = threads
                .into_iter()
                .flat_map(|t| t.join().unwrap_or_default())
                .collect();
            let qps = latencies.len() as f64 / started.elapsed().as_secs_f64();
            let (p50, p99) = percentiles(&mut latencies);
            println!("| {clients} | {rerank} | {qps:.1} | {p50:.1} | {p99:.1} |");
        }
    }
    Ok(())
}

fn query(q: &Known, method: Method, rerank: bool) -> SearchQuery {
    let mut query = SearchQuery::new(&q.query, 10, Vec::new());
    query.method = method;
    if !rerank {
        query.rerank = None;
    }
    query
}

fn ingest(
    collection: &Collection,
    args: &RagBenchArgs,
    embedder: &osprey_engine::Embedder,
) -> anyhow::Result<()> {
    let documents = document::read_file(&args.corpus, &args.corpus.display().to_string())?;
    let bar = indicatif::ProgressBar::new(documents.len() as u64);
    let started = Instant::now();
    let mut chunks = 0;
    // In slices, so a long build commits as it goes.
    for slice in documents.chunks(500) {
        let options = IngestOptions {
            max_vectors_per_document: args.max_vectors_per_document,
            ..IngestOptions::default()
        };
        collection.ingest(slice, &options, embedder, &mut |n| {
            chunks += n;
            bar.inc(1);
        })?;
    }
    bar.finish_and_clear();
    let secs = started.elapsed().as_secs_f64();
    println!(
        "ingested {} documents, {chunks} chunks in {secs:.0} s: {:.1} chunks/s (embedding included)",
        documents.len(),
        chunks as f64 / secs
    );
    Ok(())
}

/// The median and 99th percentile of `values`.
fn percentiles(values: &mut [f64]) -> (f64, f64) {
    if values.is_empty() {
        return (0.0, 0.0);
    }
    values.sort_by(f64::total_cmp);
    let at = |p: f64| values[((values.len() - 1) as f64 * p).round() as usize];
    (at(0.5), at(0.99))
}
