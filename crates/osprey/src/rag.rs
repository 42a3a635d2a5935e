//! `osprey ingest` and `osprey search`: a tenant's collections from the command line, in the
//! same directories the server reads (`$OSPREY_HOME/collections`), so a folder ingested here
//! is searchable through the API at once.

use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use osprey_rag::{IngestOptions, Library, Method, SearchQuery, document};

/// `osprey ingest`.
#[derive(Args, Debug)]
pub struct IngestArgs {
    /// Files or folders (searched recursively): .pdf, .html, .md, .txt, .jsonl(.gz).
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    /// The collection to write (created if new).
    #[arg(long)]
    pub collection: String,
    /// The tenant whose collection it is.
    #[arg(long, default_value = "default")]
    pub tenant: String,
    /// Only members of this group may read the documents (repeatable; none: everyone).
    #[arg(long = "acl", value_name = "GROUP")]
    pub acl: Vec<String>,
    /// Delete documents found under these paths before that are no longer there.
    #[arg(long)]
    pub prune: bool,
    /// The collection counts as stale when not re-indexed for this many seconds.
    #[arg(long)]
    pub reindex_interval: Option<u64>,
    /// Embed only each document's first N chunks (the rest are found by their words alone).
    #[arg(long, value_name = "N")]
    pub max_vectors_per_document: Option<usize>,
}

/// `osprey search`.
#[derive(Args, Debug)]
pub struct SearchArgs {
    /// What to look for.
    pub query: String,
    /// The collection to search.
    #[arg(long)]
    pub collection: String,
    /// The tenant whose collection it is.
    #[arg(long, default_value = "default")]
    pub tenant: String,
    /// Search as a member of this group (repeatable).
    #[arg(long = "group", value_name = "GROUP")]
    pub groups: Vec<String>,
    /// Results wanted.
    #[arg(long, default_value_t = 5)]
    pub top_k: usize,
    /// bm25, vector or hybrid.
    #[arg(long, default_value = "hybrid", value_parser = parse_method)]
    pub method: Method,
    /// Skip the rerank.
    #[arg(long)]
    pub no_rerank: bool,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub fn parse_method(s: &str) -> Result<Method, String> {
    serde_json::from_value(serde_json::Value::String(s.into()))
        .map_err(|_| format!("`{s}` is not a method (bm25, vector, hybrid)"))
}

pub fn ingest(args: IngestArgs) -> anyhow::Result<()> {
    let library = Library::at_home();
    let collection =
        (library.get(&args.tenant, &args.collection, true))?.expect("created when missing");
    if args.reindex_interval.is_some() {
        collection.set_reindex_interval(args.reindex_interval)?;
    }
    eprintln!("loading the embedding model…");
    let embedder = osprey_engine::Embedder::fetch_default()?;
    let started = Instant::now();
    let mut total = osprey_rag::IngestReport::default();
    for root in &args.paths {
        let files = document::files(root)?;
        let mut documents = Vec::new();
        for (path, id) in &files {
            match document::read_file(path, id) {
                Ok(docs) => documents.extend(docs),
                Err(e) => eprintln!("skipped {}: {e}", path.display()),
            }
        }
        let bar = ProgressBar::new(documents.len() as u64).with_style(
            ProgressStyle::with_template(
                "{spinner} {msg:>24} [{bar:40}] {pos}/{len} documents, {per_sec}, eta {eta}",
            )
            .expect("valid template")
            .progress_chars("=> "),
        );
        bar.set_message(root.display().to_string());
        let mut chunks = 0usize;
        let options = IngestOptions {
            acl: args.acl.clone(),
            writer_groups: None,
            prune: args.prune.then(|| root.display().to_string()),
            max_vectors_per_document: args.max_vectors_per_document,
        };
        let report = collection.ingest(&documents, &options, &embedder, &mut |n| {
            chunks += n;
            bar.inc(1);
        })?;
        bar.finish_and_clear();
        eprintln!(
            "{}: {} added, {} replaced, {} unchanged, {} deleted, {} chunks",
            root.display(),
            report.added,
            report.replaced,
            report.unchanged,
            report.deleted,
            report.chunks
        );
        total.chunks += report.chunks;
    }
    let secs = started.elapsed().as_secs_f64();
    eprintln!(
        "collection {} ({}): {} chunks written in {secs:.1} s ({:.1} chunks/s), {} in all",
        args.collection,
        args.tenant,
        total.chunks,
        total.chunks as f64 / secs.max(1e-9),
        collection.chunk_count()
    );
    Ok(())
}

pub fn search(args: SearchArgs) -> anyhow::Result<()> {
    let library = Library::at_home();
    let Some(collection) = library.get(&args.tenant, &args.collection, false)? else {
        anyhow::bail!(
            "no collection {} for tenant {}",
            args.collection,
            args.tenant
        );
    };
    let embedder = osprey_engine::Embedder::fetch_default()?;
    let mut query = SearchQuery::new(&args.query, args.top_k, args.groups);
    query.method = args.method;
    if args.no_rerank {
        query.rerank = None;
    }
    let started = Instant::now();
    let hits = collection.search(&query, &embedder)?;
    let took = started.elapsed();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&hits)?);
        return Ok(());
    }
    for (i, hit) in hits.iter().enumerate() {
        let text: String = hit.text.split_whitespace().collect::<Vec<_>>().join(" ");
        let text: String = text.chars().take(160).collect();
        println!(
            "{:>2}. {:.3}  {}  ({})",
            i + 1,
            hit.score,
            hit.document_id,
            hit.chunk_id
        );
        println!("    {text}");
    }
    eprintln!(
        "{} results in {:.1} ms",
        hits.len(),
        took.as_secs_f64() * 1000.0
    );
    Ok(())
}
