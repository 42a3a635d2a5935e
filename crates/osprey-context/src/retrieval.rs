//! Retrieval-augmented chat: what a request asks of retrieval, the passages found put into
//! its prompt, and the citations of its answer. Searching is the server's (its collections,
//! its embedder, off the serving threads); this module is what comes before and after.
//!
//! A chat request with `"osprey": {"rag": {"collection": C, "top_k": K}}` has its last user
//! message searched in C. Each passage is screened as untrusted text by the tenant's
//! injection guard: one the policy would block never reaches the prompt (counted in
//! `osprey_rag_passages_dropped_total`). The rest are numbered `[1]`, `[2]`… and go in as a
//! system message after the request's own, or, with `"prompt": NAME`, as the variables
//! `context` and `question` of that registered prompt. The answer carries
//! `osprey.citations`: each passage's marker, document and chunk, and whether the answer cites
//! it.

use osprey_core::Error;
use osprey_core::api::{JsonBody, content_text};
use osprey_policy::pipeline::Pipeline;
use osprey_policy::{Action, Source};
use osprey_rag::Hit;
use serde_json::{Value, json};

/// Passages put in when the request does not say.
const DEFAULT_TOP_K: usize = 4;
/// Passages a request may ask for.
const MAX_TOP_K: usize = 20;
/// What the model is told, above the passages.
const INSTRUCTION: &str = "Answer the user's question using only the numbered passages \
below. Cite the passages you use by their number in brackets, like [1]. If the passages do \
not contain the answer, say that you do not know.";

/// Whether a chat body asks for retrieval.
pub fn wanted(body: &JsonBody) -> bool {
    !body.osprey("rag").is_null()
}

/// What a request asks of retrieval.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RagAsked {
    /// The collection to search.
    pub collection: String,
    /// How many passages to put in.
    pub top_k: usize,
    /// The registered prompt that takes the passages, if any (else a system message does).
    pub prompt: Option<String>,
    /// What to search for: the last user message.
    pub question: String,
}

impl RagAsked {
    /// Takes the `rag` option out of `body`: what it asks.
    pub fn take(body: &mut JsonBody) -> Result<Self, Error> {
        let v = body.edit();
        let rag = v["osprey"]
            .as_object_mut()
            .and_then(|o| o.remove("rag"))
            .unwrap_or_default();
        let Some(collection) = rag["collection"].as_str() else {
            return Err(Error::invalid(
                "osprey.rag.collection",
                "name the collection to search",
            ));
        };
        let top_k = match &rag["top_k"] {
            Value::Null => DEFAULT_TOP_K,
            k => (k.as_u64().map(|k| k as usize))
                .filter(|k| (1..=MAX_TOP_K).contains(k))
                .ok_or_else(|| {
                    Error::invalid("osprey.rag.top_k", format!("top_k is 1 to {MAX_TOP_K}"))
                })?,
        };
        let prompt = match &rag["prompt"] {
            Value::Null => None,
            Value::String(p) => Some(p.clone()),
            _ => {
                return Err(Error::invalid(
                    "osprey.rag.prompt",
                    "the name of a registered prompt",
                ));
            }
        };
        let question = (v["messages"].as_array())
            .and_then(|m| m.iter().rev().find(|m| m["role"] == "user"))
            .and_then(|m| content_text(&m["content"]))
            .filter(|q| !q.trim().is_empty())
            .ok_or_else(|| {
                Error::invalid("messages", "retrieval needs a user message to search for")
            })?;
        Ok(Self {
            collection: collection.to_owned(),
            top_k,
            prompt,
            question,
        })
    }
}

/// What retrieval put in a prompt, and the answer heard so far (to cite).
#[derive(Clone, Debug, Default)]
pub struct Retrieved {
    passages: Vec<Hit>,
    dropped: usize,
    /// The answer (its first choice) heard so far.
    answer: String,
}

impl Retrieved {
    /// `hits`, each screened by `pipeline` as untrusted text: a passage it would block is
    /// dropped, one it would redact is redacted.
    pub fn screened(hits: Vec<Hit>, pipeline: Option<&Pipeline>) -> Self {
        let mut retrieved = Self::default();
        for mut hit in hits {
            if let Some(pipeline) = pipeline {
                let verdict = pipeline.check(&hit.text, Source::Untrusted);
                match verdict.action {
                    Action::Block => {
                        tracing::warn!(document = %hit.document_id, chunk = %hit.chunk_id, "a retrieved passage was kept out of the prompt by the injection guard");
                        metrics::counter!(osprey_core::metrics::RAG_PASSAGES_DROPPED).increment(1);
                        retrieved.dropped += 1;
                        continue;
                    }
                    Action::Redact => {
                        let mut redactor = osprey_policy::redact::Redactor::default();
                        hit.text = redactor.redact(&hit.text, None);
                    }
                    Action::Allow | Action::Flag => {}
                }
            }
            retrieved.passages.push(hit);
        }
        retrieved
    }

    /// Puts the passages into `body` as `asked` says: the variables of its prompt, or a
    /// system message after the request's own.
    pub fn put_in(&self, asked: RagAsked, body: &mut JsonBody) -> Result<(), Error> {
        let v = body.edit();
        let context = self.context();
        match asked.prompt {
            Some(name) => {
                let osprey = v["osprey"].as_object_mut().map(|o| {
                    o.entry("prompt").or_insert_with(|| json!({"name": name}));
                });
                if osprey.is_none() {
                    v["osprey"] = json!({"prompt": {"name": name}});
                }
                let vars = &mut v["osprey"]["prompt"]["variables"];
                if vars.is_null() {
                    *vars = json!({});
                }
                vars["context"] = context.into();
                vars["question"] = asked.question.into();
            }
            None => {
                let Some(messages) = v["messages"].as_array_mut() else {
                    return Err(Error::invalid("messages", "messages must be a list"));
                };
                let lead = (messages.iter())
                    .take_while(|m| matches!(m["role"].as_str(), Some("system" | "developer")))
                    .count();
                let content = format!("{INSTRUCTION}\n\n{context}");
                messages.insert(lead, json!({"role": "system", "content": content}));
            }
        }
        Ok(())
    }

    /// What went in, said in short (`passages=3; dropped=1`).
    pub fn summary(&self) -> String {
        format!("passages={}; dropped={}", self.passages.len(), self.dropped)
    }

    /// Hears more of the answer (its first choice) as it streams.
    pub fn hear(&mut self, text: &str) {
        self.answer.push_str(text);
    }

    /// The citations of the answer heard.
    pub fn citations_heard(&self) -> Value {
        self.citations(&self.answer)
    }

    /// The passages, numbered, as the model reads them.
    fn context(&self) -> String {
        if self.passages.is_empty() {
            return "(no passages were found)".into();
        }
        let numbered: Vec<String> = (self.passages.iter().enumerate())
            .map(|(i, p)| format!("[{}] {}\n{}", i + 1, p.title, p.text.trim()))
            .collect();
        numbered.join("\n\n")
    }

    /// The citations of `answer`: every passage, and whether the answer cites it.
    pub fn citations(&self, answer: &str) -> Value {
        let list: Vec<Value> = (self.passages.iter().enumerate())
            .map(|(i, p)| {
                let marker = format!("[{}]", i + 1);
                json!({
                    "marker": marker,
                    "cited": answer.contains(&marker),
                    "document_id": p.document_id,
                    "chunk_id": p.chunk_id,
                    "title": p.title,
                    "source": p.source,
                    "score": p.score,
                })
            })
            .collect();
        Value::Array(list)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hit(n: usize, text: &str) -> Hit {
        Hit {
            document_id: format!("doc{n}"),
            chunk_id: format!("doc{n}#0"),
            score: 1.0,
            text: text.into(),
            title: format!("Title {n}"),
            heading: String::new(),
            source: String::new(),
            indexed_at: 0,
            metadata: Default::default(),
        }
    }

    fn body(json: Value) -> JsonBody {
        let Value::Object(o) = json else { panic!() };
        JsonBody::from_object(o)
    }

    #[test]
    fn passages_go_in_after_the_system_messages_and_the_answer_cites_them() {
        let mut b = body(json!({"messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is Osprey?"}
        ], "osprey": {"rag": {"collection": "docs", "top_k": 2}}}));
        let asked = RagAsked::take(&mut b).unwrap();
        assert_eq!(asked.collection, "docs");
        assert_eq!(asked.top_k, 2);
        assert_eq!(asked.question, "What is Osprey?");
        assert!(b.osprey("rag").is_null());
        let retrieved = Retrieved::screened(vec![hit(1, "a server"), hit(2, "a bird")], None);
        retrieved.put_in(asked, &mut b).unwrap();
        let messages = b.value()["messages"].as_array().unwrap();
        assert_eq!(messages.len(), 3);
        let system = messages[1]["content"].as_str().unwrap();
        assert!(system.starts_with(INSTRUCTION));
        assert!(system.contains("[1] Title 1\na server") && system.contains("[2] Title 2"));
        let cited = retrieved.citations("It is a server [1].");
        assert_eq!(cited[0]["cited"], true);
        assert_eq!(cited[1]["cited"], false);
        assert_eq!(retrieved.summary(), "passages=2; dropped=0");
    }

    #[test]
    fn a_named_prompt_takes_the_passages_as_variables() {
        let mut b = body(json!({"messages": [{"role": "user", "content": "Why?"}],
            "osprey": {"rag": {"collection": "docs", "prompt": "qa"}}}));
        let asked = RagAsked::take(&mut b).unwrap();
        Retrieved::screened(vec![], None)
            .put_in(asked, &mut b)
            .unwrap();
        let prompt = b.osprey("prompt");
        assert_eq!(prompt["name"], "qa");
        assert_eq!(prompt["variables"]["question"], "Why?");
        assert_eq!(prompt["variables"]["context"], "(no passages were found)");
        assert_eq!(b.value()["messages"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn a_bad_option_is_refused_by_name() {
        let mut no_user = body(json!({"messages": [], "osprey": {"rag": {"collection": "c"}}}));
        assert_eq!(
            RagAsked::take(&mut no_user).unwrap_err().param.as_deref(),
            Some("messages")
        );
        let mut big = body(json!({"messages": [{"role": "user", "content": "q"}],
            "osprey": {"rag": {"collection": "c", "top_k": 99}}}));
        assert_eq!(
            RagAsked::take(&mut big).unwrap_err().param.as_deref(),
            Some("osprey.rag.top_k")
        );
    }
}
