//! A collection: a directory holding a text index ([`Passages`]), a vector index
//! ([`Vectors`]) and `collection.json` (which vector dump is current, the next vector id,
//! when it was last indexed and how often it should be).
//!
//! Writes are ingest jobs: each document's content hash decides whether it is new, changed
//! (its chunks are replaced) or unchanged (skipped). A job writes, in this order, the next
//! vector id, the vector dump, then the text index's commit: a crash between any two leaves
//! vectors the text index does not know, which searches never return.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tantivy::{DocAddress, TantivyDocument, Term};

use crate::chunk::chunks;
use crate::document::Document;
use crate::passages::{EVERYONE, Passages, StoredChunk, Visibility, index_error};
use crate::search::{Candidate, Hit, Method, SearchQuery};
use crate::vectors::{Allowed, Vectors};
use crate::{Embed, RagError, now_ms};

/// Candidates each method hands to fusion and rerank.
pub const CANDIDATES: usize = 100;
const META: &str = "collection.json";

/// What `collection.json` holds.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Meta {
    /// The current vector dump's name (empty: no vectors yet).
    #[serde(default)]
    pub vectors: String,
    /// The id the next chunk's vector takes.
    #[serde(default)]
    pub next_vector_id: u64,
    /// When an ingest job last finished, Unix ms.
    #[serde(default)]
    pub last_indexed_at: Option<i64>,
    /// How often the collection should be re-indexed; older than this, it is stale.
    #[serde(default)]
    pub reindex_interval_seconds: Option<u64>,
}

/// How an ingest job writes.
#[derive(Clone, Debug, Default)]
pub struct IngestOptions {
    /// The ACL groups whose members may read the documents (none: everyone).
    pub acl: Vec<String>,
    /// The groups of whoever writes: a document already indexed that they could not read is
    /// left alone (counted as refused). `None`: the operator, who may replace anything.
    pub writer_groups: Option<Vec<String>>,
    /// Delete the documents whose source starts with this and that are not being written.
    pub prune: Option<String>,
    /// Embed only a document's first this many chunks (the rest are found by their words
    /// alone): a cost cap for corpora of very long documents. `None`: every chunk.
    pub max_vectors_per_document: Option<usize>,
}

/// What an ingest job did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct IngestReport {
    /// Documents indexed for the first time.
    pub added: usize,
    /// Documents whose content changed, their chunks replaced.
    pub replaced: usize,
    /// Documents indexed before with the same content.
    pub unchanged: usize,
    /// Documents deleted (pruned).
    pub deleted: usize,
    /// Documents left alone: already indexed under groups the writer is not in.
    pub refused: usize,
    /// Chunks written (and embedded).
    pub chunks: usize,
}

/// One collection, open.
pub struct Collection {
    dir: PathBuf,
    passages: Passages,
    vectors: RwLock<(String, Arc<Vectors>)>,
    writing: Mutex<()>,
}

impl Collection {
    /// The collection in `dir`, created empty if it does not exist.
    pub fn open(dir: &Path) -> Result<Self, RagError> {
        let passages = Passages::open(&dir.join("text"))?;
        let meta = read_meta(dir)?;
        let vectors = load_vectors(dir, &meta, &passages)?;
        Ok(Self {
            dir: dir.to_owned(),
            passages,
            vectors: RwLock::new((meta.vectors, Arc::new(vectors))),
            writing: Mutex::new(()),
        })
    }

    /// Its settings and state.
    pub fn meta(&self) -> Result<Meta, RagError> {
        read_meta(&self.dir)
    }

    /// Sets how often it should be re-indexed.
    pub fn set_reindex_interval(&self, seconds: Option<u64>) -> Result<(), RagError> {
        let _writing = self.writing.lock().unwrap_or_else(|e| e.into_inner());
        let mut meta = read_meta(&self.dir)?;
        meta.reindex_interval_seconds = seconds;
        write_meta(&self.dir, &meta)
    }

    /// Chunks indexed.
    pub fn chunk_count(&self) -> u64 {
        self.passages.len()
    }

    /// Chunks indexed that `visibility` lets be seen.
    pub fn visible_chunk_count(&self, visibility: &Visibility) -> Result<u64, RagError> {
        self.passages
            .count(self.passages.visible(visibility).as_ref())
    }

    /// Indexes `documents` as `options` say, calling `progress` with each document's chunk
    /// count as it is written.
    pub fn ingest(
        &self,
        documents: &[Document],
        options: &IngestOptions,
        embedder: &dyn Embed,
        progress: &mut dyn FnMut(usize),
    ) -> Result<IngestReport, RagError> {
        let _writing = self.writing.lock().unwrap_or_else(|e| e.into_inner());
        let mut writer = self.passages.writer()?;
        let mut meta = read_meta(&self.dir)?;
        let vectors = self.current_vectors();
        let f = self.passages.fields;
        let acl: Vec<&str> = if options.acl.is_empty() {
            vec![EVERYONE]
        } else {
            options.acl.iter().map(String::as_str).collect()
        };
        let mut report = IngestReport::default();
        let now = now_ms();
        for document in documents {
            let hash = content_hash(document, &acl);
            match self.passages.first_chunk_of(&document.id)? {
                Some(old) if !readable(&old, options.writer_groups.as_deref()) => {
                    report.refused += 1;
                    progress(0);
                    continue;
                }
                Some(old) if old.hash == hash => {
                    report.unchanged += 1;
                    progress(0);
                    continue;
                }
                Some(_) => report.replaced += 1,
                None => report.added += 1,
            }
            writer.delete_term(Term::from_field_text(f.document_id, &document.id));
            let pieces = chunks(document, embedder);
            let embedded = pieces
                .len()
                .min(options.max_vectors_per_document.unwrap_or(usize::MAX));
            let texts: Vec<String> = (pieces[..embedded].iter())
                .map(|c| format!("{}\n{}\n{}", document.title, c.heading, c.text))
                .collect();
            let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
            let vectors_of = embedder.embed_batch(&texts).map_err(RagError::Embed)?;
            for (i, chunk) in pieces.iter().enumerate() {
                let mut doc = TantivyDocument::default();
                if let Some(vector) = vectors_of.get(i) {
                    let id = meta.next_vector_id;
                    meta.next_vector_id += 1;
                    vectors.insert(vector, id);
                    doc.add_u64(f.vector_id, id);
                    let bytes: Vec<u8> = vector.iter().flat_map(|x| x.to_le_bytes()).collect();
                    doc.add_bytes(f.vector, &bytes);
                }
                doc.add_text(f.chunk_id, format!("{}#{}", document.id, chunk.index));
                doc.add_text(f.document_id, &document.id);
                doc.add_text(f.title, &document.title);
                doc.add_text(f.heading, &chunk.heading);
                doc.add_text(f.text, &chunk.text);
                doc.add_text(f.source, &document.source);
                for group in &acl {
                    doc.add_text(f.acl, group);
                }
                doc.add_text(f.hash, &hash);
                doc.add_i64(f.indexed_at, now);
                doc.add_text(
                    f.metadata,
                    serde_json::to_string(&document.metadata).expect("JSON"),
                );
                writer.add_document(doc).map_err(index_error)?;
            }
            report.chunks += pieces.len();
            progress(pieces.len());
        }
        if let Some(prefix) = &options.prune {
            let kept: std::collections::HashSet<&str> =
                documents.iter().map(|d| d.id.as_str()).collect();
            for (id, source) in self.documents(None)? {
                if source.starts_with(prefix) && !kept.contains(id.as_str()) {
                    writer.delete_term(Term::from_field_text(f.document_id, &id));
                    report.deleted += 1;
                }
            }
        }
        // The order that keeps a crash harmless: ids, vectors, then the text index.
        write_meta(&self.dir, &meta)?;
        let dumped = if report.chunks > 0 {
            // A fresh name each time: the dump in use stays whole until the new one is.
            Some(vectors.dump(&self.dir, &format!("vectors-{}", meta.next_vector_id))?)
        } else {
            None
        };
        if let Some(name) = &dumped {
            meta.vectors = name.clone();
        }
        meta.last_indexed_at = Some(now);
        write_meta(&self.dir, &meta)?;
        writer.commit().map_err(index_error)?;
        self.passages.refresh()?;
        if let Some(name) = dumped {
            let old = std::mem::replace(&mut self.vectors.write().expect("not poisoned").0, name);
            if old != self.vectors.read().expect("not poisoned").0 {
                remove_dump(&self.dir, &old);
            }
        }
        Ok(report)
    }

    /// Deletes the document `id` if `groups` (`None`: the operator) may read it; whether it
    /// was there for them.
    pub fn delete_document(&self, id: &str, groups: Option<&[String]>) -> Result<bool, RagError> {
        let _writing = self.writing.lock().unwrap_or_else(|e| e.into_inner());
        if !(self.passages.first_chunk_of(id)?).is_some_and(|c| readable(&c, groups)) {
            return Ok(false);
        }
        let mut writer = self.passages.writer()?;
        writer.delete_term(Term::from_field_text(self.passages.fields.document_id, id));
        writer.commit().map_err(index_error)?;
        self.passages.refresh()?;
        Ok(true)
    }

    /// Every document `visibility` lets be seen (`None`: all), with its source, in id order.
    pub fn documents(
        &self,
        visibility: Option<&Visibility>,
    ) -> Result<Vec<(String, String)>, RagError> {
        let addresses = match visibility {
            Some(v) => self.passages.all(self.passages.visible(v).as_ref())?,
            None => self.passages.everything()?,
        };
        let mut seen = HashMap::new();
        for address in addresses {
            let chunk = self.passages.chunk(address)?;
            seen.entry(chunk.document_id).or_insert(chunk.source);
        }
        let mut documents: Vec<_> = seen.into_iter().collect();
        documents.sort();
        Ok(documents)
    }

    /// The chunks best matching `query`, best first.
    pub fn search(&self, query: &SearchQuery, embedder: &dyn Embed) -> Result<Vec<Hit>, RagError> {
        let candidates = self.candidates(query, embedder)?;
        Ok(crate::search::rank(query, candidates, &|t| {
            self.passages.terms(t)
        }))
    }

    /// What `query`'s methods find, unranked: each chunk with what each method said of it.
    pub fn candidates(
        &self,
        query: &SearchQuery,
        embedder: &dyn Embed,
    ) -> Result<Vec<(Candidate, StoredChunk)>, RagError> {
        self.reload_vectors_if_changed()?;
        let mut candidates: HashMap<DocAddress, Candidate> = HashMap::new();
        let visible = self.passages.visible(&query.visibility);
        let wants_vectors = query.method != Method::Bm25;
        let query_vector = if wants_vectors || query.rerank.is_some() {
            Some(embedder.embed(&query.text).map_err(RagError::Embed)?)
        } else {
            None
        };
        if query.method != Method::Vector {
            let found = self
                .passages
                .bm25(&query.text, CANDIDATES, visible.box_clone())?;
            for (rank, (score, address)) in found.into_iter().enumerate() {
                let c = candidates.entry(address).or_default();
                (c.bm25_rank, c.bm25) = (Some(rank), score);
            }
        }
        if let (true, Some(q)) = (wants_vectors, &query_vector) {
            let allowed = Allowed(self.passages.vector_ids(visible.as_ref())?);
            let near = self.current_vectors().search(q, CANDIDATES, &allowed);
            for (rank, (id, cosine)) in near.into_iter().enumerate() {
                if let Some(address) = self.passages.by_vector_id(id)? {
                    let c = candidates.entry(address).or_default();
                    (c.vector_rank, c.cosine) = (Some(rank), Some(cosine));
                }
            }
        }
        let mut found = Vec::with_capacity(candidates.len());
        for (address, mut candidate) in candidates {
            let chunk = self.passages.chunk(address)?;
            if let (Some(q), None) = (&query_vector, candidate.cosine) {
                let v = self.passages.vector(address)?;
                if !v.is_empty() {
                    candidate.cosine = Some(v.iter().zip(q).map(|(a, b)| a * b).sum());
                }
            }
            found.push((candidate, chunk));
        }
        Ok(found)
    }

    /// The index terms of `text` (for reranking candidates outside a search).
    pub fn terms(&self, text: &str) -> Vec<String> {
        self.passages.terms(text)
    }

    fn current_vectors(&self) -> Arc<Vectors> {
        self.vectors.read().expect("not poisoned").1.clone()
    }

    /// Loads the vector dump another process (an `osprey ingest`) made current.
    fn reload_vectors_if_changed(&self) -> Result<(), RagError> {
        let meta = read_meta(&self.dir)?;
        if meta.vectors == self.vectors.read().expect("not poisoned").0 {
            return Ok(());
        }
        let _writing = self.writing.lock().unwrap_or_else(|e| e.into_inner());
        self.passages.refresh()?;
        let vectors = load_vectors(&self.dir, &meta, &self.passages)?;
        *self.vectors.write().expect("not poisoned") = (meta.vectors, Arc::new(vectors));
        Ok(())
    }
}

/// Whether members of `groups` (`None`: the operator) may read `chunk`.
fn readable(chunk: &StoredChunk, groups: Option<&[String]>) -> bool {
    groups.is_none_or(|groups| (chunk.acl.iter()).any(|g| g == EVERYONE || groups.contains(g)))
}

/// The vectors `meta` names; rebuilt from the embeddings the text index keeps if the dump is
/// missing or unreadable.
fn load_vectors(dir: &Path, meta: &Meta, passages: &Passages) -> Result<Vectors, RagError> {
    if !meta.vectors.is_empty() {
        match Vectors::load(dir, &meta.vectors) {
            Ok(v) => return Ok(v),
            Err(e) => tracing::warn!(error = %e, "rebuilding the vector index from the text index"),
        }
    }
    let everything = passages.everything()?;
    let vectors = Vectors::new(everything.len());
    for address in everything {
        let (chunk, vector) = (passages.chunk(address)?, passages.vector(address)?);
        if let Some(id) = chunk.vector_id.filter(|_| !vector.is_empty()) {
            vectors.insert(&vector, id);
        }
    }
    Ok(vectors)
}

fn remove_dump(dir: &Path, name: &str) {
    if name.is_empty() {
        return;
    }
    for ext in ["hnsw.graph", "hnsw.data"] {
        let _ = std::fs::remove_file(dir.join(format!("{name}.{ext}")));
    }
}

/// What decides whether a document changed: everything that goes into its chunks.
fn content_hash(document: &Document, acl: &[&str]) -> String {
    let mut h = Sha256::new();
    for part in [&document.title, &document.text, &document.source] {
        h.update(part.as_bytes());
        h.update([0]);
    }
    h.update(serde_json::to_vec(&document.metadata).unwrap_or_default());
    h.update(acl.join("\0").as_bytes());
    format!("{:x}", h.finalize())
}

pub(crate) fn read_meta(dir: &Path) -> Result<Meta, RagError> {
    match std::fs::read(dir.join(META)) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map_err(|e| RagError::Index(format!("{}: {e}", dir.join(META).display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Meta::default()),
        Err(e) => Err(RagError::Io(format!("{}: {e}", dir.display()))),
    }
}

/// Writes `collection.json` whole or not at all.
fn write_meta(dir: &Path, meta: &Meta) -> Result<(), RagError> {
    let io = |e: std::io::Error| RagError::Io(format!("{}: {e}", dir.display()));
    std::fs::create_dir_all(dir).map_err(io)?;
    let tmp = dir.join(format!("{META}.tmp"));
    let json = serde_json::to_vec_pretty(meta).expect("serialisable");
    std::fs::write(&tmp, json).map_err(io)?;
    std::fs::rename(&tmp, dir.join(META)).map_err(io)
}
