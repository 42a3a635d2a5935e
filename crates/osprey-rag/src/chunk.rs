//! Chunking: a document into retrieval-sized passages with `text-splitter`, sized in the
//! embedder's own tokens (so no passage is cut when embedded), overlapping a little, each
//! with the headings it sits under.

use text_splitter::{ChunkConfig, ChunkSizer, MarkdownSplitter, TextSplitter};

use crate::Embed;
use crate::document::{Document, Format};

/// Tokens a passage has at most: the embedder takes 256 with `[CLS]` and `[SEP]`, and the
/// title and headings go in front when it is embedded.
pub const MAX_TOKENS: usize = 200;
/// Tokens a passage has at least, where the text allows.
pub const MIN_TOKENS: usize = 100;
/// Tokens a passage shares with the one before it.
pub const OVERLAP_TOKENS: usize = 24;

/// A passage of a document.
#[derive(Clone, Debug, PartialEq)]
pub struct Chunk {
    /// Its place in the document, from 0.
    pub index: usize,
    /// The headings it sits under, outermost first, joined by " > " (may be empty).
    pub heading: String,
    /// Its text.
    pub text: String,
}

/// Sizes text in the embedder's tokens.
struct Tokens<'a>(&'a dyn Embed);

impl ChunkSizer for Tokens<'_> {
    fn size(&self, chunk: &str) -> usize {
        self.0.count_tokens(chunk)
    }
}

/// The passages of `document`: Markdown and HTML split on their structure first, other text
/// on paragraphs, lines and sentences.
pub fn chunks(document: &Document, embedder: &dyn Embed) -> Vec<Chunk> {
    let config = ChunkConfig::new(MIN_TOKENS..MAX_TOKENS)
        .with_sizer(Tokens(embedder))
        .with_overlap(OVERLAP_TOKENS)
        .expect("the overlap is smaller than the capacity");
    let text = document.text.as_str();
    let pieces: Vec<(usize, &str)> = match document.format {
        Format::Markdown | Format::Html => {
            MarkdownSplitter::new(config).chunk_indices(text).collect()
        }
        _ => TextSplitter::new(config).chunk_indices(text).collect(),
    };
    let headings = headings(text, document.format);
    pieces
        .into_iter()
        .enumerate()
        .map(|(index, (offset, piece))| Chunk {
            index,
            heading: heading_at(&headings, offset),
            text: piece.to_owned(),
        })
        .collect()
}

/// A heading: where it starts, its depth (1 outermost) and its words.
type Heading = (usize, usize, String);

/// The headings of `text`: `#` lines in Markdown and HTML; in other text, short lines in
/// capitals at the margin (as manual pages and many plain documents have).
fn headings(text: &str, format: Format) -> Vec<Heading> {
    let mut found = Vec::new();
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let trimmed = line.trim_end();
        let heading = match format {
            Format::Markdown | Format::Html => {
                let depth = trimmed.chars().take_while(|&c| c == '#').count();
                let words = trimmed[depth..].trim();
                (1..=6).contains(&depth) && trimmed[depth..].starts_with(' ') && !words.is_empty()
            }
            _ => is_capital_heading(trimmed),
        }
        .then(|| {
            let depth = trimmed.chars().take_while(|&c| c == '#').count().max(1);
            (
                offset,
                depth,
                trimmed.trim_start_matches('#').trim().to_owned(),
            )
        });
        found.extend(heading);
        offset += line.len();
    }
    found
}

fn is_capital_heading(line: &str) -> bool {
    let starts_at_margin = line.chars().next().is_some_and(|c| c.is_alphabetic());
    let has_letters = line.chars().any(char::is_alphabetic);
    starts_at_margin
        && has_letters
        && line.chars().count() <= 60
        && !line.chars().any(char::is_lowercase)
}

/// The headings in force at `offset`, outermost first.
fn heading_at(headings: &[Heading], offset: usize) -> String {
    let mut path: Vec<&Heading> = Vec::new();
    for h in headings.iter().take_while(|h| h.0 <= offset) {
        path.retain(|outer| outer.1 < h.1);
        path.push(h);
    }
    let words: Vec<&str> = path.iter().map(|h| h.2.as_str()).collect();
    words.join(" > ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::WordEmbedder;

    fn doc(text: &str, format: Format) -> Document {
        Document {
            id: "d".into(),
            title: "T".into(),
            text: text.into(),
            source: "s".into(),
            format,
            metadata: Default::default(),
        }
    }

    #[test]
    fn passages_fit_overlap_and_know_their_headings() {
        let para = |n: usize| format!("Sentence number {n} says a few words here. ").repeat(20);
        let text = format!(
            "# Guide\n\n{}\n\n## Install\n\n{}\n\n{}\n\n# Usage\n\n{}",
            para(1),
            para(2),
            para(3),
            para(4)
        );
        let chunks = chunks(&doc(&text, Format::Markdown), &WordEmbedder);
        assert!(chunks.len() >= 4, "{chunks:#?}");
        for c in &chunks {
            assert!(WordEmbedder.count_tokens(&c.text) <= MAX_TOKENS);
        }
        let under = |needle: &str| {
            &chunks
                .iter()
                .find(|c| c.text.contains(needle))
                .unwrap()
                .heading
        };
        assert_eq!(under("number 2"), "Guide > Install");
        assert_eq!(under("number 4"), "Usage");
        let manual = "NAME\n\nls\n\nDESCRIPTION\n       List information about the FILEs.\n";
        let chunks = super::chunks(&doc(manual, Format::Text), &WordEmbedder);
        assert_eq!(chunks.len(), 1);
        assert_eq!(
            heading_at(&headings(manual, Format::Text), 12),
            "DESCRIPTION"
        );
    }
}
