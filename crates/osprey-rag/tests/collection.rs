//! Collections with the real embedder (all-MiniLM-L6-v2): every format read from small real
//! files, found by what they say; ACLs that hide documents from outsiders; re-indexing that
//! replaces a changed document, skips an unchanged one, and deletes a removed one from both
//! indexes; a collection reopened from disk.

use std::path::{Path, PathBuf};

use osprey_engine::Embedder;
use osprey_rag::{Collection, Document, IngestOptions, Method, SearchQuery, Visibility, document};

fn embedder() -> Embedder {
    Embedder::fetch(&osprey_models::osprey_home()).expect("the embedder loads")
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn read_all(root: &Path) -> Vec<Document> {
    let files = document::files(root).unwrap();
    (files.iter())
        .flat_map(|(path, id)| document::read_file(path, id).unwrap())
        .collect()
}

fn top(c: &Collection, e: &Embedder, text: &str, groups: &[&str]) -> Vec<String> {
    let groups = groups.iter().map(|g| g.to_string()).collect();
    let hits = c.search(&SearchQuery::new(text, 3, groups), e).unwrap();
    hits.into_iter().map(|h| h.document_id).collect()
}

#[test]
fn every_format_is_read_chunked_and_found() {
    let e = embedder();
    let dir = tempfile::tempdir().unwrap();
    let c = Collection::open(dir.path()).unwrap();
    let docs = read_all(&fixtures());
    let mut ids: Vec<&str> = docs.iter().map(|d| d.id.as_str()).collect();
    ids.sort();
    assert_eq!(
        ids,
        [
            "battery.pdf",
            "faq.html",
            "guide.md",
            "gz-1",
            "kb-1",
            "kb-2",
            "notes.txt"
        ]
    );
    let pdf = docs.iter().find(|d| d.id == "battery.pdf").unwrap();
    assert!(pdf.text.contains("sixty percent"), "{}", pdf.text);
    let report = c
        .ingest(&docs, &IngestOptions::default(), &e, &mut |_| {})
        .unwrap();
    assert_eq!((report.added, report.chunks >= 7), (7, true), "{report:?}");

    let cases = [
        (
            "how should I store the drone battery over the winter",
            "battery.pdf",
        ),
        ("where do ospreys build their nests", "gz-1"),
        ("how to rotate an API key", "guide.md"),
        ("a filesystem kept in RAM", "notes.txt"),
        ("how long until my order ships", "kb-1"),
        ("where are the indexes stored", "faq.html"),
    ];
    for (query, expected) in cases {
        assert_eq!(top(&c, &e, query, &[])[0], expected, "{query}");
    }
    // Each method finds them on its own too.
    for method in [Method::Bm25, Method::Vector] {
        let mut q = SearchQuery::new("drone battery winter storage", 1, vec![]);
        (q.method, q.rerank) = (method, None);
        assert_eq!(
            c.search(&q, &e).unwrap()[0].document_id,
            "battery.pdf",
            "{method:?}"
        );
    }
    let hit = &c
        .search(&SearchQuery::new("rotate an API key", 1, vec![]), &e)
        .unwrap()[0];
    assert!(hit.heading.starts_with("Osprey guide"), "{hit:?}");
    assert!(hit.chunk_id.starts_with("guide.md#"));
    let shipping = &c
        .search(&SearchQuery::new("order shipping", 1, vec![]), &e)
        .unwrap()[0];
    assert_eq!(shipping.metadata["team"], "logistics");
    let faq = &c
        .search(&SearchQuery::new("indexes stored", 1, vec![]), &e)
        .unwrap()[0];
    assert!(!faq.text.contains("tracking") && !faq.text.contains("Home | About"));
}

#[test]
fn acl_groups_hide_documents_from_everyone_outside_them() {
    let e = embedder();
    let dir = tempfile::tempdir().unwrap();
    let c = Collection::open(dir.path()).unwrap();
    let docs = document::read_file(&fixtures().join("records.jsonl"), "records.jsonl").unwrap();
    let (public, hr): (Vec<_>, Vec<_>) = docs.into_iter().partition(|d| d.id == "kb-1");
    c.ingest(&public, &IngestOptions::default(), &e, &mut |_| {})
        .unwrap();
    let only_hr = IngestOptions {
        acl: vec!["hr".into()],
        ..IngestOptions::default()
    };
    c.ingest(&hr, &only_hr, &e, &mut |_| {}).unwrap();

    let query = "engineering salary bands review";
    assert!(!top(&c, &e, query, &[]).contains(&"kb-2".to_string()));
    assert!(!top(&c, &e, query, &["sales"]).contains(&"kb-2".to_string()));
    assert_eq!(top(&c, &e, query, &["hr"])[0], "kb-2");
    for method in [Method::Bm25, Method::Vector] {
        let mut q = SearchQuery::new(query, 10, vec!["sales".into()]);
        q.method = method;
        let ids: Vec<_> = c
            .search(&q, &e)
            .unwrap()
            .into_iter()
            .map(|h| h.document_id)
            .collect();
        assert!(
            !ids.contains(&"kb-2".to_string()),
            "{method:?} shows only what sales may read"
        );
        if method == Method::Vector {
            assert_eq!(ids, ["kb-1"], "the nearest of what sales may read");
        }
    }

    let listed = |groups: &[&str]| {
        let v = Visibility {
            groups: groups.iter().map(|g| g.to_string()).collect(),
            ..Visibility::default()
        };
        let docs = c.documents(Some(&v)).unwrap();
        docs.into_iter().map(|(id, _)| id).collect::<Vec<_>>()
    };
    assert_eq!(listed(&[]), ["kb-1"]);
    assert_eq!(listed(&["hr"]), ["kb-1", "kb-2"]);

    // Outsiders can neither delete nor overwrite it.
    assert!(!c.delete_document("kb-2", Some(&[])).unwrap());
    let mut forged = hr.clone();
    forged[0].text = "Salary bands are public now.".into();
    let outsider = IngestOptions {
        writer_groups: Some(vec!["sales".into()]),
        ..IngestOptions::default()
    };
    let report = c.ingest(&forged, &outsider, &e, &mut |_| {}).unwrap();
    assert_eq!((report.refused, report.replaced), (1, 0));
    assert_eq!(listed(&[]), ["kb-1"]);
    assert!(c.delete_document("kb-2", Some(&["hr".into()])).unwrap());
    assert_eq!(listed(&["hr"]), ["kb-1"]);
}

#[test]
fn reindexing_replaces_changed_documents_and_deletes_removed_ones() {
    let e = embedder();
    let (dir, src) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let write = |name: &str, text: &str| std::fs::write(src.path().join(name), text).unwrap();
    write(
        "a.txt",
        "The staging cluster is called heron and runs in Frankfurt.",
    );
    write("b.txt", "Lunch is served at noon in the glass atrium.");
    let prune = IngestOptions {
        prune: Some(src.path().display().to_string()),
        ..IngestOptions::default()
    };
    {
        let c = Collection::open(dir.path()).unwrap();
        let r = c
            .ingest(&read_all(src.path()), &prune, &e, &mut |_| {})
            .unwrap();
        assert_eq!((r.added, r.unchanged), (2, 0));
        let r = c
            .ingest(&read_all(src.path()), &prune, &e, &mut |_| {})
            .unwrap();
        assert_eq!(
            (r.added, r.unchanged, r.chunks),
            (0, 2, 0),
            "unchanged: skipped"
        );
    }
    // Reopened from disk (the vector index reloaded): the document changes.
    let c = Collection::open(dir.path()).unwrap();
    assert_eq!(
        top(&c, &e, "which city hosts the staging cluster", &[])[0],
        "a.txt"
    );
    write(
        "a.txt",
        "The staging cluster was renamed kestrel and moved to Dublin.",
    );
    let r = c
        .ingest(&read_all(src.path()), &prune, &e, &mut |_| {})
        .unwrap();
    assert_eq!((r.replaced, r.unchanged), (1, 1));
    for method in [Method::Bm25, Method::Vector, Method::Hybrid] {
        let mut q = SearchQuery::new("staging cluster heron Frankfurt", 10, vec![]);
        (q.method, q.group_by_document) = (method, false);
        let hits = c.search(&q, &e).unwrap();
        let a: Vec<_> = hits.iter().filter(|h| h.document_id == "a.txt").collect();
        assert_eq!(a.len(), 1, "{method:?}: one chunk of a.txt, the new one");
        assert!(a[0].text.contains("kestrel"), "{method:?}: {}", a[0].text);
    }
    // A removed file is pruned from both indexes.
    std::fs::remove_file(src.path().join("b.txt")).unwrap();
    let r = c
        .ingest(&read_all(src.path()), &prune, &e, &mut |_| {})
        .unwrap();
    assert_eq!(r.deleted, 1);
    for method in [Method::Bm25, Method::Vector] {
        let mut q = SearchQuery::new("lunch in the atrium at noon", 10, vec![]);
        q.method = method;
        let ids: Vec<_> = c
            .search(&q, &e)
            .unwrap()
            .into_iter()
            .map(|h| h.document_id)
            .collect();
        assert_eq!(ids, ["a.txt"], "{method:?}");
    }
    // Freshness: nothing was indexed after now.
    let mut q = SearchQuery::new("staging cluster", 10, vec![]);
    q.visibility.indexed_after = Some(osprey_rag::now_ms() + 1000);
    assert!(c.search(&q, &e).unwrap().is_empty());
    assert!(c.meta().unwrap().last_indexed_at.is_some());
}
