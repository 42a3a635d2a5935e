//! The workloads of `../shared/BENCHMARKS.md` as request plans, with prompts generated from a
//! seed: the text differs between seeds, the shape (token counts, sharing) does not.

use osprey_engine::Tokenizer;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{Value, json};

/// Which workload to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum WorkloadId {
    /// Concurrency sweep: ~200-token varied prompts, 128 output tokens.
    A,
    /// 32 users sharing one 1,000-token system prompt, each with its own question.
    B,
    /// Interactive and batch requests mixed at a fixed ratio.
    F,
}

/// Scheduling class a request asks for (Osprey's `osprey.priority`; other servers ignore it).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Class {
    Interactive,
    Batch,
}

/// One chat request: messages and output length.
#[derive(Clone, Debug)]
pub struct RequestSpec {
    pub class: Class,
    pub messages: Value,
    pub max_tokens: usize,
}

impl RequestSpec {
    /// The JSON body for `model`, streamed with usage, exactly `max_tokens` long.
    pub fn body(&self, model: &str) -> Value {
        let mut body = json!({
            "model": model,
            "messages": self.messages,
            "max_tokens": self.max_tokens,
            "temperature": 0.0,
            "ignore_eos": true,
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        if self.class == Class::Batch {
            body["osprey"] = json!({"priority": "batch"});
        }
        body
    }
}

/// A simulated user: sends its requests one after another.
#[derive(Clone, Debug)]
pub struct ClientPlan {
    pub requests: Vec<RequestSpec>,
    /// Background load: repeats its requests until every foreground client is done, then is
    /// cut off (its partial output still counts towards throughput).
    pub background: bool,
}

/// One measured level of a workload (e.g. A at 8 streams).
#[derive(Clone, Debug)]
pub struct Level {
    pub name: String,
    /// Concurrent clients.
    pub concurrency: usize,
    pub clients: Vec<ClientPlan>,
    /// Requests sent once, unmeasured, before the level (the same for every server).
    pub warmup: Vec<RequestSpec>,
}

/// Options that shape the workloads.
#[derive(Clone, Debug)]
pub struct Shape {
    pub concurrency: Vec<usize>,
    /// Requests per client in measured levels (A: at least 3 per client, so 3 × concurrency).
    pub requests_per_client: usize,
    pub seed: u64,
    /// F: interactive clients and batch clients.
    pub interactive_clients: usize,
    pub batch_clients: usize,
}

/// Makes prompt text of an exact token length from the model's own vocabulary.
pub struct PromptMaker<'a> {
    tokenizer: &'a Tokenizer,
    words: Vec<String>,
    rng: ChaCha8Rng,
}

impl<'a> PromptMaker<'a> {
    pub fn new(tokenizer: &'a Tokenizer, seed: u64) -> Self {
        // Whole lowercase words of the vocabulary (byte-level BPE marks a leading space as 'Ġ').
        let words: Vec<String> = (0..tokenizer.vocab_size() as u32)
            .filter_map(|id| tokenizer.id_to_token(id))
            .filter_map(|t| t.strip_prefix('Ġ').map(str::to_owned))
            .filter(|w| w.len() >= 3 && w.chars().all(|c| c.is_ascii_lowercase()))
            .collect();
        assert!(words.len() > 100, "the vocabulary has too few plain words");
        Self {
            tokenizer,
            words,
            rng: ChaCha8Rng::seed_from_u64(seed),
        }
    }

    /// Text of `n` tokens (by this tokenizer): sentences of random words.
    pub fn text(&mut self, n: usize) -> String {
        let mut text = String::new();
        let mut sentence = 0;
        let mut words = 0;
        // Counting tokens is the slow part: count every 8 words, then trim.
        while words % 8 != 0 || self.tokenizer.encode(&text, false).len() < n {
            words += 1;
            let word = &self.words[self.rng.random_range(0..self.words.len())];
            if sentence == 0 {
                let mut c = word.chars();
                let first = c.next().map(|f| f.to_ascii_uppercase()).into_iter();
                text.extend(first.chain(c));
            } else {
                text.push(' ');
                text.push_str(word);
            }
            sentence += 1;
            if sentence >= self.rng.random_range(6..14) {
                text.push_str(". ");
                sentence = 0;
            }
        }
        // Trim whole words back to at most n tokens.
        while self.tokenizer.encode(&text, false).len() > n {
            let cut = text.trim_end().rfind(' ').unwrap_or(0);
            text.truncate(cut);
        }
        text
    }

    /// A length drawn uniformly from `range`.
    pub fn len(&mut self, range: std::ops::RangeInclusive<usize>) -> usize {
        self.rng.random_range(range)
    }
}

fn user(text: String) -> Value {
    json!([{"role": "user", "content": text}])
}

fn system_user(system: &str, text: String) -> Value {
    json!([{"role": "system", "content": system}, {"role": "user", "content": text}])
}

/// The levels of a workload.
pub fn levels(id: WorkloadId, shape: &Shape, tokenizer: &Tokenizer) -> Vec<Level> {
    let mut p = PromptMaker::new(tokenizer, shape.seed);
    match id {
        WorkloadId::A => shape
            .concurrency
            .iter()
            .map(|&c| {
                let clients = (0..c)
                    .map(|_| ClientPlan {
                        requests: (0..shape.requests_per_client)
                            .map(|_| {
                                let n = p.len(160..=240);
                                RequestSpec {
                                    class: Class::Interactive,
                                    messages: user(p.text(n)),
                                    max_tokens: 128,
                                }
                            })
                            .collect(),
                        background: false,
                    })
                    .collect();
                Level {
                    name: format!("A c={c}"),
                    concurrency: c,
                    clients,
                    warmup: vec![RequestSpec {
                        class: Class::Interactive,
                        messages: user(p.text(32)),
                        max_tokens: 8,
                    }],
                }
            })
            .collect(),
        WorkloadId::B => {
            let system = p.text(1000);
            let users = shape.concurrency.first().copied().unwrap_or(32);
            let clients = (0..users)
                .map(|_| ClientPlan {
                    requests: (0..shape.requests_per_client)
                        .map(|_| {
                            let n = p.len(40..=60);
                            RequestSpec {
                                class: Class::Interactive,
                                messages: system_user(&system, p.text(n)),
                                max_tokens: 64,
                            }
                        })
                        .collect(),
                    background: false,
                })
                .collect();
            // The system prompt has been seen before, as in any deployment that has been up.
            let warmup = vec![RequestSpec {
                class: Class::Interactive,
                messages: system_user(&system, p.text(20)),
                max_tokens: 4,
            }];
            vec![Level {
                name: format!("B users={users}"),
                concurrency: users,
                clients,
                warmup,
            }]
        }
        WorkloadId::F => {
            let mut clients = Vec::new();
            for _ in 0..shape.interactive_clients {
                let requests = (0..shape.requests_per_client)
                    .map(|_| {
                        let n = p.len(80..=120);
                        RequestSpec {
                            class: Class::Interactive,
                            messages: user(p.text(n)),
                            max_tokens: 32,
                        }
                    })
                    .collect();
                clients.push(ClientPlan {
                    requests,
                    background: false,
                });
            }
            for _ in 0..shape.batch_clients {
                let requests = (0..3)
                    .map(|_| {
                        let n = p.len(600..=900);
                        RequestSpec {
                            class: Class::Batch,
                            messages: user(p.text(n)),
                            max_tokens: 128,
                        }
                    })
                    .collect();
                clients.push(ClientPlan {
                    requests,
                    background: true,
                });
            }
            let (i, b) = (shape.interactive_clients, shape.batch_clients);
            vec![Level {
                name: format!("F {i}i+{b}b"),
                concurrency: i + b,
                clients,
                warmup: vec![RequestSpec {
                    class: Class::Interactive,
                    messages: user(p.text(32)),
                    max_tokens: 8,
                }],
            }]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokenizer() -> Tokenizer {
        let gguf = osprey_models::GgufFile::open(&osprey_testkit::default_model()).unwrap();
        Tokenizer::from_gguf(&gguf).unwrap()
    }

    #[test]
    fn prompts_have_the_asked_length_and_differ_by_seed() {
        let t = tokenizer();
        let mut a = PromptMaker::new(&t, 1);
        let mut b = PromptMaker::new(&t, 2);
        for n in [50, 200, 1000] {
            let (x, y) = (a.text(n), b.text(n));
            assert_ne!(x, y);
            for text in [&x, &y] {
                let len = t.encode(text, false).len();
                assert!((n - 3..=n).contains(&len), "{len} tokens for {n}");
            }
        }
    }

    #[test]
    fn shared_prefix_workload_shares_one_system_prompt() {
        let t = tokenizer();
        let shape = Shape {
            concurrency: vec![4],
            requests_per_client: 2,
            seed: 7,
            interactive_clients: 0,
            batch_clients: 0,
        };
        let levels = levels(WorkloadId::B, &shape, &t);
        let requests: Vec<&RequestSpec> =
            levels[0].clients.iter().flat_map(|c| &c.requests).collect();
        assert_eq!(requests.len(), 8);
        let system = &requests[0].messages[0]["content"];
        assert!(requests.iter().all(|r| &r.messages[0]["content"] == system));
        let questions: std::collections::HashSet<String> = requests
            .iter()
            .map(|r| r.messages[1]["content"].to_string())
            .collect();
        assert_eq!(questions.len(), 8, "every user asks their own question");
    }
}
