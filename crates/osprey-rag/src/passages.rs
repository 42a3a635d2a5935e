//! The text index: every chunk is a tantivy document holding its words (BM25 over title,
//! headings and text, English-stemmed) and everything else about it (document id, source,
//! ACL groups, content hash, `indexed_at`, metadata, its embedding). It is the collection's
//! source of truth: the vector index only says which chunks are near.

use std::ops::Bound;
use std::path::Path;

use tantivy::collector::{DocSetCollector, TopDocs};
use tantivy::query::{
    AllQuery, BooleanQuery, BoostQuery, ConstScoreQuery, Occur, Query, RangeQuery, TermQuery,
};
use tantivy::schema::{
    Field, INDEXED, IndexRecordOption, STORED, STRING, Schema, TextFieldIndexing, TextOptions,
    Value,
};
use tantivy::{DocAddress, Index, IndexReader, IndexWriter, ReloadPolicy, TantivyDocument, Term};

use crate::RagError;

/// The ACL group of chunks anyone with access to the collection may read.
pub const EVERYONE: &str = "*";
/// How much more a word in the title counts than one in the text.
const TITLE_BOOST: f32 = 2.0;

/// The fields of a chunk.
#[derive(Clone, Copy)]
pub struct Fields {
    pub chunk_id: Field,
    pub document_id: Field,
    pub vector_id: Field,
    pub title: Field,
    pub heading: Field,
    pub text: Field,
    pub source: Field,
    pub acl: Field,
    pub hash: Field,
    pub indexed_at: Field,
    pub metadata: Field,
    pub vector: Field,
}

impl Fields {
    fn schema() -> (Schema, Self) {
        let mut s = Schema::builder();
        let words = TextOptions::default().set_stored().set_indexing_options(
            TextFieldIndexing::default()
                .set_tokenizer("en_stem")
                .set_index_option(IndexRecordOption::WithFreqsAndPositions),
        );
        let fields = Self {
            chunk_id: s.add_text_field("chunk_id", STRING | STORED),
            document_id: s.add_text_field("document_id", STRING | STORED),
            vector_id: s.add_u64_field("vector_id", INDEXED | STORED | tantivy::schema::FAST),
            title: s.add_text_field("title", words.clone()),
            heading: s.add_text_field("heading", words.clone()),
            text: s.add_text_field("text", words),
            source: s.add_text_field("source", STORED),
            acl: s.add_text_field("acl", STRING | STORED),
            hash: s.add_text_field("hash", STRING | STORED),
            indexed_at: s.add_i64_field("indexed_at", INDEXED | STORED | tantivy::schema::FAST),
            metadata: s.add_text_field("metadata", STORED),
            vector: s.add_bytes_field("vector", STORED),
        };
        (s.build(), fields)
    }
}

/// A chunk as stored.
#[derive(Clone, Debug, Default)]
pub struct StoredChunk {
    pub chunk_id: String,
    pub document_id: String,
    /// `None` for a chunk not embedded.
    pub vector_id: Option<u64>,
    pub title: String,
    pub heading: String,
    pub text: String,
    pub source: String,
    pub acl: Vec<String>,
    pub hash: String,
    pub indexed_at: i64,
    pub metadata: serde_json::Map<String, serde_json::Value>,
}

/// What a search may see: the caller's ACL groups, and how fresh a chunk must be.
#[derive(Clone, Debug, Default)]
pub struct Visibility {
    /// Groups the caller is in ([`EVERYONE`]'s chunks are always visible).
    pub groups: Vec<String>,
    /// Only chunks indexed at or after this time (Unix ms).
    pub indexed_after: Option<i64>,
    /// Only chunks of these documents.
    pub documents: Option<Vec<String>>,
}

/// The text index of a collection.
pub struct Passages {
    index: Index,
    reader: IndexReader,
    pub fields: Fields,
}

impl Passages {
    /// The index in `dir`, created if there is none.
    pub fn open(dir: &Path) -> Result<Self, RagError> {
        std::fs::create_dir_all(dir)
            .map_err(|e| RagError::Io(format!("{}: {e}", dir.display())))?;
        let (schema, fields) = Fields::schema();
        let directory = tantivy::directory::MmapDirectory::open(dir).map_err(index_error)?;
        let index = Index::open_or_create(directory, schema).map_err(index_error)?;
        let reader = (index.reader_builder())
            .reload_policy(ReloadPolicy::OnCommitWithDelay)
            .try_into()
            .map_err(index_error)?;
        Ok(Self {
            index,
            reader,
            fields,
        })
    }

    /// The one writer (another process writing this collection makes this an error).
    pub fn writer(&self) -> Result<IndexWriter, RagError> {
        self.index.writer(64 << 20).map_err(|e| match e {
            tantivy::TantivyError::LockFailure(..) => {
                RagError::Busy("another ingest is writing this collection".into())
            }
            e => index_error(e),
        })
    }

    /// Sees what the last commit wrote.
    pub fn refresh(&self) -> Result<(), RagError> {
        self.reader.reload().map_err(index_error)
    }

    /// Chunks in the index.
    pub fn len(&self) -> u64 {
        self.reader.searcher().num_docs()
    }

    /// Whether it has no chunks.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A chunk of the document `id` (whose hash, ACL and source are the document's), if it
    /// is indexed.
    pub fn first_chunk_of(&self, id: &str) -> Result<Option<StoredChunk>, RagError> {
        let query = TermQuery::new(
            Term::from_field_text(self.fields.document_id, id),
            IndexRecordOption::Basic,
        );
        let searcher = self.reader.searcher();
        let top = searcher
            .search(&query, &TopDocs::with_limit(1).order_by_score())
            .map_err(index_error)?;
        let Some((_, address)) = top.first() else {
            return Ok(None);
        };
        Ok(Some(self.chunk(*address)?))
    }

    /// The filter `visibility` puts on a search, as a query matching what may be seen.
    pub fn visible(&self, visibility: &Visibility) -> Box<dyn Query> {
        let term = |field, text: &str| -> Box<dyn Query> {
            let term = Term::from_field_text(field, text);
            Box::new(TermQuery::new(term, IndexRecordOption::Basic))
        };
        let any_of = |field, values: &mut dyn Iterator<Item = &str>| -> Box<dyn Query> {
            let clauses = values.map(|v| (Occur::Should, term(field, v))).collect();
            Box::new(BooleanQuery::new(clauses))
        };
        let mut groups =
            std::iter::once(EVERYONE).chain(visibility.groups.iter().map(String::as_str));
        let mut must: Vec<(Occur, Box<dyn Query>)> =
            vec![(Occur::Must, any_of(self.fields.acl, &mut groups))];
        if let Some(after) = visibility.indexed_after {
            let lower = Bound::Included(Term::from_field_i64(self.fields.indexed_at, after));
            must.push((
                Occur::Must,
                Box::new(RangeQuery::new(lower, Bound::Unbounded)),
            ));
        }
        if let Some(documents) = &visibility.documents {
            let mut ids = documents.iter().map(String::as_str);
            must.push((Occur::Must, any_of(self.fields.document_id, &mut ids)));
        }
        Box::new(BooleanQuery::new(must))
    }

    /// The `vector_id`s of every chunk `filter` matches, sorted: what a vector search may
    /// return.
    pub fn vector_ids(&self, filter: &dyn Query) -> Result<Vec<usize>, RagError> {
        let searcher = self.reader.searcher();
        let mut ids = searcher.search(filter, &VectorIds).map_err(index_error)?;
        ids.sort_unstable();
        Ok(ids)
    }

    /// The BM25 top `n` chunks for `words` among those `filter` matches, best first.
    pub fn bm25(
        &self,
        words: &str,
        n: usize,
        filter: Box<dyn Query>,
    ) -> Result<Vec<(f32, DocAddress)>, RagError> {
        let mut terms = self.terms(words);
        let mut seen = std::collections::HashSet::new();
        terms.retain(|t| seen.insert(t.clone()));
        if terms.is_empty() {
            return Ok(Vec::new());
        }
        let mut clauses: Vec<(Occur, Box<dyn Query>)> = Vec::new();
        for term in &terms {
            for (field, boost) in [
                (self.fields.title, TITLE_BOOST),
                (self.fields.heading, 1.0),
                (self.fields.text, 1.0),
            ] {
                let t = TermQuery::new(
                    Term::from_field_text(field, term),
                    IndexRecordOption::WithFreqs,
                );
                clauses.push((Occur::Should, Box::new(BoostQuery::new(Box::new(t), boost))));
            }
        }
        let query = BooleanQuery::new(vec![
            (
                Occur::Must,
                Box::new(BooleanQuery::new(clauses)) as Box<dyn Query>,
            ),
            (Occur::Must, Box::new(ConstScoreQuery::new(filter, 0.0))),
        ]);
        let searcher = self.reader.searcher();
        (searcher.search(&query, &TopDocs::with_limit(n).order_by_score())).map_err(index_error)
    }

    /// The index terms of `text`, in order: lower-cased, English-stemmed words.
    pub fn terms(&self, text: &str) -> Vec<String> {
        let Ok(mut analyzer) = self.index.tokenizer_for_field(self.fields.text) else {
            return Vec::new();
        };
        let mut terms = Vec::new();
        analyzer
            .token_stream(text)
            .process(&mut |t| terms.push(t.text.clone()));
        terms
    }

    /// The chunk whose `vector_id` is `id`.
    pub fn by_vector_id(&self, id: u64) -> Result<Option<DocAddress>, RagError> {
        let term = Term::from_field_u64(self.fields.vector_id, id);
        let query = TermQuery::new(term, IndexRecordOption::Basic);
        let searcher = self.reader.searcher();
        let top = searcher
            .search(&query, &TopDocs::with_limit(1).order_by_score())
            .map_err(index_error)?;
        Ok(top.first().map(|(_, a)| *a))
    }

    /// Every chunk `filter` matches (for listings; not for searches).
    pub fn all(&self, filter: &dyn Query) -> Result<Vec<DocAddress>, RagError> {
        let searcher = self.reader.searcher();
        let mut found: Vec<_> = (searcher.search(filter, &DocSetCollector))
            .map_err(index_error)?
            .into_iter()
            .collect();
        found.sort();
        Ok(found)
    }

    /// How many chunks `filter` matches.
    pub fn count(&self, filter: &dyn Query) -> Result<u64, RagError> {
        let searcher = self.reader.searcher();
        let n = searcher
            .search(filter, &tantivy::collector::Count)
            .map_err(index_error)?;
        Ok(n as u64)
    }

    /// Every chunk.
    pub fn everything(&self) -> Result<Vec<DocAddress>, RagError> {
        self.all(&AllQuery)
    }

    /// The chunk at `address`.
    pub fn chunk(&self, address: DocAddress) -> Result<StoredChunk, RagError> {
        let doc: TantivyDocument = self.reader.searcher().doc(address).map_err(index_error)?;
        let f = &self.fields;
        let text = |field| {
            doc.get_first(field)
                .and_then(|v| v.as_str())
                .unwrap_or_default()
                .to_owned()
        };
        let metadata = serde_json::from_str(&text(f.metadata)).unwrap_or_default();
        Ok(StoredChunk {
            chunk_id: text(f.chunk_id),
            document_id: text(f.document_id),
            vector_id: doc.get_first(f.vector_id).and_then(|v| v.as_u64()),
            title: text(f.title),
            heading: text(f.heading),
            text: text(f.text),
            source: text(f.source),
            acl: (doc
                .get_all(f.acl)
                .filter_map(|v| v.as_str())
                .map(str::to_owned))
            .collect(),
            hash: text(f.hash),
            indexed_at: doc
                .get_first(f.indexed_at)
                .and_then(|v| v.as_i64())
                .unwrap_or_default(),
            metadata,
        })
    }

    /// The embedding stored with the chunk at `address`.
    pub fn vector(&self, address: DocAddress) -> Result<Vec<f32>, RagError> {
        let doc: TantivyDocument = self.reader.searcher().doc(address).map_err(index_error)?;
        let bytes = doc
            .get_first(self.fields.vector)
            .and_then(|v| v.as_bytes())
            .unwrap_or_default();
        Ok(bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect())
    }
}

/// A tantivy error, as ours.
pub fn index_error(e: impl std::fmt::Display) -> RagError {
    RagError::Index(e.to_string())
}

/// Collects the `vector_id` fast field of every matching chunk (read straight from the
/// column, no document set in between).
struct VectorIds;

struct SegmentVectorIds {
    column: tantivy::columnar::Column<u64>,
    ids: Vec<usize>,
}

impl tantivy::collector::Collector for VectorIds {
    type Fruit = Vec<usize>;
    type Child = SegmentVectorIds;

    fn for_segment(
        &self,
        _: tantivy::SegmentOrdinal,
        segment: &tantivy::SegmentReader,
    ) -> tantivy::Result<SegmentVectorIds> {
        Ok(SegmentVectorIds {
            column: segment.fast_fields().u64("vector_id")?,
            ids: Vec::new(),
        })
    }

    fn requires_scoring(&self) -> bool {
        false
    }

    fn merge_fruits(&self, fruits: Vec<Vec<usize>>) -> tantivy::Result<Vec<usize>> {
        Ok(fruits.concat())
    }
}

impl tantivy::collector::SegmentCollector for SegmentVectorIds {
    type Fruit = Vec<usize>;

    fn collect(&mut self, doc: tantivy::DocId, _: tantivy::Score) {
        self.ids
            .extend(self.column.first(doc).map(|id| id as usize));
    }

    fn harvest(self) -> Vec<usize> {
        self.ids
    }
}
