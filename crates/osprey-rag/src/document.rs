//! Documents as they come in: PDF, HTML, Markdown, plain text and JSONL records (plain or
//! gzipped), read into one shape, [`Document`], with the text cleaned for retrieval.
//!
//! The format is told by the file's name (`.pdf`, `.html`/`.htm`, `.md`/`.markdown`,
//! `.jsonl`/`.jsonl.gz`/`.ndjson`, anything else is text); a gzipped body is recognised by
//! its magic bytes.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::LazyLock;

use regex::Regex;
use serde_json::{Map, Value};

use crate::RagError;

/// What a document was read from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// A PDF's text layer.
    Pdf,
    /// An HTML page's readable text (no scripts, styles or navigation).
    Html,
    /// Markdown, kept as written so headings split it.
    Markdown,
    /// Plain text.
    Text,
    /// One JSONL record `{id, title, text, ...}`.
    Record,
}

/// A document, read and cleaned, not yet chunked.
#[derive(Clone, Debug, PartialEq)]
pub struct Document {
    /// Its id within the collection: a record's `id`, else the file's path below the root it
    /// was found under.
    pub id: String,
    /// Its title: a record's `title`, an HTML `<title>`, a Markdown `# heading`, else the
    /// file's name.
    pub title: String,
    /// The cleaned text.
    pub text: String,
    /// Where it came from (a path, or the name it was uploaded under).
    pub source: String,
    /// Its format.
    pub format: Format,
    /// Anything else a record carried.
    pub metadata: Map<String, Value>,
}

/// The files below `root` (or `root` itself), in a stable order, each with the id its
/// documents take: the path relative to `root`, or the file's name when `root` is a file.
pub fn files(root: &Path) -> Result<Vec<(PathBuf, String)>, RagError> {
    let io = |e: std::io::Error| RagError::Io(format!("{}: {e}", root.display()));
    if root.is_file() {
        let name = root.file_name().map(|n| n.to_string_lossy().into_owned());
        return Ok(vec![(root.to_owned(), name.unwrap_or_default())]);
    }
    let mut found = Vec::new();
    let mut pending = vec![root.to_owned()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).map_err(io)? {
            let path = entry.map_err(io)?.path();
            let hidden = path
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with('.'));
            if hidden {
                continue;
            } else if path.is_dir() {
                pending.push(path);
            } else {
                let id = path.strip_prefix(root).unwrap_or(&path);
                found.push((path.clone(), id.to_string_lossy().replace('\\', "/")));
            }
        }
    }
    found.sort();
    Ok(found)
}

/// The documents in the file at `path`, named `id` (records name themselves).
pub fn read_file(path: &Path, id: &str) -> Result<Vec<Document>, RagError> {
    let bytes =
        std::fs::read(path).map_err(|e| RagError::Io(format!("{}: {e}", path.display())))?;
    parse(id, &path.display().to_string(), &bytes)
}

/// The documents in `bytes`, uploaded or read under the name `name` (whose extension tells
/// the format) from `source`.
pub fn parse(name: &str, source: &str, bytes: &[u8]) -> Result<Vec<Document>, RagError> {
    let bad = |why: String| RagError::Document(format!("{name}: {why}"));
    let lower = name.to_ascii_lowercase();
    let lower = lower.strip_suffix(".gz").unwrap_or(&lower);
    let bytes = gunzip(bytes).map_err(|e| bad(format!("not valid gzip: {e}")))?;
    let stem = file_stem(name);
    let document = |title: String, text: String, format| Document {
        id: name.to_owned(),
        title,
        text,
        source: source.to_owned(),
        format,
        metadata: Map::new(),
    };
    let utf8 = || String::from_utf8(bytes.clone()).map_err(|_| bad("not UTF-8 text".into()));
    let one = if lower.ends_with(".jsonl") || lower.ends_with(".ndjson") {
        return records(source, &utf8()?).map_err(bad);
    } else if lower.ends_with(".pdf") {
        let text = pdf_text(&bytes)
            .map_err(|e| bad(format!("no text could be read from this PDF: {e}")))?;
        document(stem, clean(&text), Format::Pdf)
    } else if lower.ends_with(".html") || lower.ends_with(".htm") {
        let (title, text) = html(&utf8()?).map_err(bad)?;
        document(title.unwrap_or(stem), text, Format::Html)
    } else if lower.ends_with(".md") || lower.ends_with(".markdown") {
        let text = utf8()?;
        let title = text
            .lines()
            .find_map(|l| l.strip_prefix("# "))
            .map(str::trim);
        document(
            title.map_or(stem, str::to_owned),
            clean(&text),
            Format::Markdown,
        )
    } else {
        document(stem, clean(&utf8()?), Format::Text)
    };
    Ok(vec![one])
}

/// The most a gzipped document may unpack to: a small upload must not become gigabytes.
const MAX_UNPACKED_BYTES: u64 = 64 << 20;

/// `bytes`, gunzipped if they start with gzip's magic.
fn gunzip(bytes: &[u8]) -> std::io::Result<Vec<u8>> {
    if !bytes.starts_with(&[0x1f, 0x8b]) {
        return Ok(bytes.to_vec());
    }
    let mut out = Vec::new();
    (flate2::read::MultiGzDecoder::new(bytes).take(MAX_UNPACKED_BYTES + 1))
        .read_to_end(&mut out)?;
    if out.len() as u64 > MAX_UNPACKED_BYTES {
        return Err(std::io::Error::other(format!(
            "it unpacks to more than {} MiB",
            MAX_UNPACKED_BYTES >> 20
        )));
    }
    Ok(out)
}

/// The text of a PDF. The PDF reader is known to panic on some malformed files rather than
/// return an error; such a file is refused like any unreadable one.
fn pdf_text(bytes: &[u8]) -> Result<String, String> {
    let read = std::panic::catch_unwind(|| pdf_extract::extract_text_from_mem(bytes));
    match read {
        Ok(Ok(text)) => Ok(text),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("the file is malformed".to_owned()),
    }
}

fn file_stem(name: &str) -> String {
    let base = name.rsplit('/').next().unwrap_or(name);
    let base = base.strip_suffix(".gz").unwrap_or(base);
    base.rsplit_once('.')
        .map_or(base, |(stem, _)| stem)
        .to_owned()
}

/// JSONL records `{id, title, text, ...metadata}`, one a line; blank lines are skipped.
fn records(source: &str, text: &str) -> Result<Vec<Document>, String> {
    let mut out = Vec::new();
    for (n, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let at = |why: &str| format!("line {}: {why}", n + 1);
        let Ok(Value::Object(mut fields)) = serde_json::from_str::<Value>(line) else {
            return Err(at("not a JSON object"));
        };
        let mut string = |key: &str| match fields.remove(key) {
            Some(Value::String(s)) => Some(s),
            Some(Value::Number(n)) => Some(n.to_string()),
            _ => None,
        };
        let id = string("id").ok_or_else(|| at("a record needs an \"id\""))?;
        let text = string("text").ok_or_else(|| at("a record needs a \"text\""))?;
        let title = string("title").unwrap_or_else(|| id.clone());
        out.push(Document {
            id,
            title,
            text: clean(&text),
            source: source.to_owned(),
            format: Format::Record,
            metadata: fields,
        });
    }
    Ok(out)
}

/// An HTML page's title and readable text, as Markdown-ish text whose headings split it:
/// scripts, styles and the page's navigation, header, footer and asides are dropped.
fn html(page: &str) -> Result<(Option<String>, String), String> {
    static TITLE: LazyLock<Regex> =
        LazyLock::new(|| Regex::new(r"(?is)<title[^>]*>(.*?)</title>").expect("valid"));
    static BOILERPLATE: LazyLock<Regex> = LazyLock::new(|| {
        let tags = [
            "script", "style", "noscript", "nav", "header", "footer", "aside", "template",
        ];
        let alternatives: Vec<String> = tags
            .iter()
            .map(|t| format!(r"<{t}\b[^>]*>.*?</{t}\s*>"))
            .collect();
        Regex::new(&format!("(?is){}", alternatives.join("|"))).expect("valid")
    });
    let title = TITLE
        .captures(page)
        .map(|c| clean(&c[1]))
        .filter(|t| !t.is_empty());
    let body = BOILERPLATE.replace_all(page, " ");
    let text = html2text::config::rich()
        .string_from_read(body.as_bytes(), 100_000)
        .map_err(|e| format!("not readable HTML: {e}"))?;
    // The rich renderer marks emphasis and links; keep headings (`#`) and the words.
    static DECORATION: LazyLock<Regex> =
        LazyLock::new(|| Regex::new(r"\*\*|\[(\d+)\]|^\s*\[\d+\]: .*$").expect("valid"));
    let text = DECORATION.replace_all(&text, "");
    Ok((title, clean(&text)))
}

/// Text with control characters dropped, trailing spaces trimmed, and runs of blank lines
/// folded to one.
pub fn clean(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut blank = 0;
    for line in text.lines() {
        let line: String = line
            .trim_end()
            .chars()
            .filter(|c| !c.is_control() || *c == '\t')
            .collect();
        if line.trim().is_empty() {
            blank += 1;
            continue;
        }
        if !out.is_empty() {
            out.push_str(if blank > 0 { "\n\n" } else { "\n" });
        }
        blank = 0;
        out.push_str(&line);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gzip_bomb_is_refused_rather_than_unpacked() {
        use std::io::Write;
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        let zeros = vec![0u8; 1 << 20];
        for _ in 0..(MAX_UNPACKED_BYTES >> 20) + 1 {
            gz.write_all(&zeros).unwrap();
        }
        let bomb = gz.finish().unwrap();
        assert!(bomb.len() < 1 << 20, "a small upload: {} bytes", bomb.len());
        let e = parse("bomb.txt.gz", "upload", &bomb)
            .unwrap_err()
            .to_string();
        assert!(e.contains("more than 64 MiB"), "{e}");
    }

    #[test]
    fn a_malformed_pdf_is_an_error_not_a_panic() {
        // A catalog without its pages, and a bare header.
        for bytes in [&b"%PDF-1.4\n1 0 obj\n<< /Type /Catalog /Pages 2 0 R >>\nendobj\ntrailer\n<< /Root 1 0 R >>\n%%EOF"[..], b"%PDF-"] {
            assert!(parse("x.pdf", "upload", bytes).is_err());
        }
    }

    #[test]
    fn records_name_themselves_and_keep_their_metadata() {
        let jsonl = "{\"id\": \"a\", \"title\": \"A\", \"text\": \"one\\n\\n\\n\\ntwo\", \"lang\": \"en\"}\n\n{\"id\": 7, \"text\": \"x\"}\n";
        let docs = parse("r.jsonl", "r.jsonl", jsonl.as_bytes()).unwrap();
        assert_eq!(docs.len(), 2);
        assert_eq!((docs[0].id.as_str(), docs[0].title.as_str()), ("a", "A"));
        assert_eq!(docs[0].text, "one\n\ntwo");
        assert_eq!(docs[0].metadata["lang"], "en");
        assert_eq!((docs[1].id.as_str(), docs[1].title.as_str()), ("7", "7"));
        let err = parse("r.jsonl", "r", b"{\"title\": \"no id\"}").unwrap_err();
        assert!(err.to_string().contains("line 1"), "{err}");
    }

    #[test]
    fn html_loses_scripts_and_navigation_but_keeps_headings() {
        let page = "<html><head><title>Guide</title><style>p{}</style></head><body>\
            <nav><a href=\"/\">Home</a></nav><h1>Setup</h1><p>Run <b>make</b>.</p>\
            <script>alert('x')</script><footer>(c) 2026</footer></body></html>";
        let docs = parse("g.html", "g.html", page.as_bytes()).unwrap();
        assert_eq!(docs[0].title, "Guide");
        let text = &docs[0].text;
        assert!(
            text.contains("# Setup") && text.contains("Run make."),
            "{text}"
        );
        for gone in ["alert", "Home", "(c) 2026", "p{}"] {
            assert!(!text.contains(gone), "{gone} in {text}");
        }
    }
}
