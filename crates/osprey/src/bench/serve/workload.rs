//! The workloads of `../shared/BENCHMARKS.md` as request plans, with prompts generated from a
//! seed: the text differs between seeds, the shape (token counts, sharing) does not.

use std::time::Duration;

use osprey_engine::Tokenizer;

use super::copying::{CopyPrompts, Kind};
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
    /// Cache-aware routing: users of 8 distinct 1,000-token system prompts, in random order,
    /// through a gateway in front of workers.
    C,
    /// Interactive and batch clients at a fixed ratio, over a fixed window.
    F,
    /// Speculative decoding: copy-heavy prompts (repeat, correct, list, rename, quote) and
    /// open-ended ones, greedy, each answered to its natural end (at most 256 tokens); at one
    /// stream a level per kind, at more a mix of every kind.
    S,
}

impl WorkloadId {
    /// Whether the servers compared share backends (C: gateways in front of the same workers),
    /// so each needs prompts of its own lest one be served from what the other cached.
    pub fn shares_backends(self) -> bool {
        self == Self::C
    }
}

/// Workload C: distinct system prompts the users share.
pub const C_SYSTEM_PROMPTS: usize = 8;

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
    /// Tokens of the generated message text (the chat template adds a few of its own).
    pub prompt_tokens: usize,
    pub max_tokens: usize,
    /// Whether the answer may end before `max_tokens` (else it runs to `max_tokens`, EOS
    /// ignored, so every server generates the same count).
    pub natural_end: bool,
}

impl RequestSpec {
    /// The JSON body for `model`, streamed with usage, exactly `max_tokens` long.
    pub fn body(&self, model: &str) -> Value {
        let mut body = json!({
            "model": model,
            "messages": self.messages,
            "max_tokens": self.max_tokens,
            "temperature": 0.0,
            "ignore_eos": !self.natural_end,
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        if self.class == Class::Batch {
            body["osprey"] = json!({"priority": "batch"});
        }
        body
    }

    /// The same request for the `round`-th pass over a client's list: its first message opens
    /// with the round number, so no prefix cache can serve it from an earlier pass.
    pub fn repeated(&self, round: usize) -> Self {
        let mut spec = self.clone();
        if round > 0
            && let Some(content) = spec.messages[0]["content"].as_str()
        {
            spec.messages[0]["content"] = format!("{round}. {content}").into();
        }
        spec
    }
}

/// A simulated user: sends its requests one after another.
#[derive(Clone, Debug)]
pub struct ClientPlan {
    pub requests: Vec<RequestSpec>,
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
    /// A fixed measurement window: every client goes round its requests until it ends, and
    /// whatever is still running then is cut off. Without one, each client sends its requests
    /// once and the level ends when the last is answered.
    pub window: Option<Duration>,
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
    /// F: the measurement window.
    pub window: Duration,
    /// F: when above 0, requests are written in four kinds of text ([`Topic`]), whose tokens
    /// favour different experts of an MoE model: this share in the hot one (code), the rest
    /// spread evenly over the others. At 0 every request is prose.
    pub hot_topic: f64,
    /// A: prompt tokens per request, at most (default 240; each is 2/3 of it or more).
    pub prompt_tokens: Option<usize>,
}

/// Makes prompt text of an exact token length from the model's own vocabulary.
pub struct PromptMaker<'a> {
    tokenizer: &'a Tokenizer,
    words: Vec<String>,
    rng: ChaCha8Rng,
}

/// A kind of text: sentences of words, or text whose tokens are of another sort.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Topic {
    /// Sentences of random words.
    Prose,
    /// Code: assignments and calls of made-up identifiers.
    Code,
    /// Figures: numbers, separators, units.
    Numbers,
    /// Markup lists: `- key: value` lines.
    Lists,
}

impl Topic {
    /// Every topic, the hot one of workload F first.
    pub const ALL: [Topic; 4] = [Topic::Code, Topic::Prose, Topic::Numbers, Topic::Lists];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Prose => "prose",
            Self::Code => "code",
            Self::Numbers => "numbers",
            Self::Lists => "lists",
        }
    }
}

impl<'a> PromptMaker<'a> {
    pub fn new(tokenizer: &'a Tokenizer, seed: u64) -> Self {
        // Whole lowercase words of the vocabulary (a leading space is 'Ġ' in byte-level BPE,
        // '▁' in SentencePiece).
        let words: Vec<String> = (0..tokenizer.vocab_size() as u32)
            .filter_map(|id| tokenizer.id_to_token(id))
            .filter_map(|t| {
                (t.strip_prefix('Ġ').or_else(|| t.strip_prefix('▁'))).map(str::to_owned)
            })
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
        self.prompt(n).0
    }

    /// Text of at most `n` tokens, and its exact length in tokens.
    pub fn prompt(&mut self, n: usize) -> (String, usize) {
        self.prompt_on(n, Topic::Prose)
    }

    /// Text of `topic` of at most `n` tokens, and its exact length in tokens.
    pub fn prompt_on(&mut self, n: usize, topic: Topic) -> (String, usize) {
        let mut text = String::new();
        let mut pieces = 0;
        // Counting tokens is the slow part: count every 8 pieces, then trim.
        while pieces % 8 != 0 || self.tokenizer.encode(&text, false).len() < n {
            pieces += 1;
            self.piece(topic, &mut text);
        }
        // Trim whole words back to at most n tokens.
        loop {
            let len = self.tokenizer.encode(&text, false).len();
            if len <= n {
                return (text, len);
            }
            let cut = text.trim_end().rfind(' ').unwrap_or(0);
            text.truncate(cut);
        }
    }

    /// Appends one piece (a word, a line, a figure) of `topic` to `text`.
    fn piece(&mut self, topic: Topic, text: &mut String) {
        use std::fmt::Write;
        let word = |m: &mut Self| m.words[m.rng.random_range(0..m.words.len())].clone();
        match topic {
            Topic::Prose => {
                let w = word(self);
                if text.is_empty() || text.ends_with(". ") {
                    let mut c = w.chars();
                    let first = c.next().map(|f| f.to_ascii_uppercase()).into_iter();
                    text.extend(first.chain(c));
                } else {
                    text.push(' ');
                    text.push_str(&w);
                }
                if self.rng.random_range(0..10) == 0 {
                    text.push_str(". ");
                }
            }
            Topic::Code => {
                let (a, b, c) = (word(self), word(self), word(self));
                let n = self.rng.random_range(0..64);
                let _ = match self.rng.random_range(0..3) {
                    0 => writeln!(text, "let {a}_{b} = {c}({n}, &{a});"),
                    1 => writeln!(text, "if {a}.{b}() > {n} {{ {c}.push({a}[{n}]); }}"),
                    _ => writeln!(text, "fn {a}({b}: u32) -> {c} {{ {b} * {n} }}"),
                };
            }
            Topic::Numbers => {
                let x: u32 = self.rng.random_range(0..100_000);
                let sep = [", ", "; ", " + ", " = ", "\n"][self.rng.random_range(0..5)];
                let _ = write!(text, "{}.{:02}{sep}", x / 100, x % 100);
            }
            Topic::Lists => {
                let (k, v) = (word(self), word(self));
                let _ = writeln!(text, "- {k}: {v}");
            }
        }
    }

    /// A request of `class` with a user message of about `n` tokens, after `system`.
    fn request(
        &mut self,
        class: Class,
        system: Option<&str>,
        n: usize,
        max_tokens: usize,
    ) -> RequestSpec {
        self.request_on(class, system, n, max_tokens, Topic::Prose)
    }

    /// [`Self::request`], in text of `topic`.
    fn request_on(
        &mut self,
        class: Class,
        system: Option<&str>,
        n: usize,
        max_tokens: usize,
        topic: Topic,
    ) -> RequestSpec {
        let (text, len) = self.prompt_on(n, topic);
        let messages = match system {
            Some(system) => {
                json!([{"role": "system", "content": system}, {"role": "user", "content": text}])
            }
            None => json!([{"role": "user", "content": text}]),
        };
        RequestSpec {
            class,
            messages,
            prompt_tokens: len,
            max_tokens,
            natural_end: false,
        }
    }

    /// A length drawn uniformly from `range`.
    pub fn len(&mut self, range: std::ops::RangeInclusive<usize>) -> usize {
        self.rng.random_range(range)
    }

    /// Workload F's topic for the next request: prose when `hot` is 0, else the hot topic with
    /// probability `hot` and any other evenly.
    fn topic(&mut self, hot: f64) -> Topic {
        if hot <= 0.0 {
            Topic::Prose
        } else if self.rng.random_bool(hot.min(1.0)) {
            Topic::ALL[0]
        } else {
            Topic::ALL[self.rng.random_range(1..Topic::ALL.len())]
        }
    }
}

/// The levels of a workload.
pub fn levels(id: WorkloadId, shape: &Shape, tokenizer: &Tokenizer) -> Vec<Level> {
    let mut p = PromptMaker::new(tokenizer, shape.seed);
    let per_client = shape.requests_per_client;
    match id {
        WorkloadId::A => shape
            .concurrency
            .iter()
            .map(|&c| {
                let clients = (0..c)
                    .map(|_| ClientPlan {
                        requests: (0..per_client)
                            .map(|_| {
                                let most = shape.prompt_tokens.unwrap_or(240);
                                let n = p.len(most * 2 / 3..=most);
                                p.request(Class::Interactive, None, n, 128)
                            })
                            .collect(),
                    })
                    .collect();
                Level {
                    name: format!("A c={c}"),
                    concurrency: c,
                    clients,
                    warmup: vec![p.request(Class::Interactive, None, 32, 8)],
                    window: None,
                }
            })
            .collect(),
        WorkloadId::B => {
            let system = p.text(1000);
            let users = shape.concurrency.first().copied().unwrap_or(32);
            let clients = (0..users)
                .map(|_| ClientPlan {
                    requests: (0..per_client)
                        .map(|_| {
                            let n = p.len(40..=60);
                            p.request(Class::Interactive, Some(&system), n, 64)
                        })
                        .collect(),
                })
                .collect();
            // The system prompt has been seen before, as in any deployment that has been up.
            let warmup = vec![p.request(Class::Interactive, Some(&system), 20, 4)];
            vec![Level {
                name: format!("B users={users}"),
                concurrency: users,
                clients,
                warmup,
                window: None,
            }]
        }
        WorkloadId::C => {
            let systems: Vec<String> = (0..C_SYSTEM_PROMPTS).map(|_| p.text(1000)).collect();
            let users = shape.concurrency.first().copied().unwrap_or(16);
            let clients = (0..users)
                .map(|_| ClientPlan {
                    requests: (0..per_client)
                        .map(|_| {
                            let system = &systems[p.len(0..=C_SYSTEM_PROMPTS - 1)];
                            let n = p.len(40..=60);
                            p.request(Class::Interactive, Some(system), n, 32)
                        })
                        .collect(),
                })
                .collect();
            // Each system prompt has been seen once, as in a fleet that has been up: cold
            // starts are not what routing is measured on.
            let warmup = (systems.iter())
                .map(|system| p.request(Class::Interactive, Some(system), 16, 4))
                .collect();
            vec![Level {
                name: format!("C users={users}"),
                concurrency: users,
                clients,
                warmup,
                window: None,
            }]
        }
        WorkloadId::F => {
            let mut clients = Vec::new();
            for _ in 0..shape.interactive_clients {
                let requests = (0..per_client)
                    .map(|_| {
                        let n = p.len(80..=120);
                        let topic = p.topic(shape.hot_topic);
                        p.request_on(Class::Interactive, None, n, 32, topic)
                    })
                    .collect();
                clients.push(ClientPlan { requests });
            }
            for _ in 0..shape.batch_clients {
                let requests = (0..3)
                    .map(|_| {
                        let n = p.len(600..=900);
                        let topic = p.topic(shape.hot_topic);
                        p.request_on(Class::Batch, None, n, 128, topic)
                    })
                    .collect();
                clients.push(ClientPlan { requests });
            }
            let (i, b) = (shape.interactive_clients, shape.batch_clients);
            let name = if shape.hot_topic > 0.0 {
                format!("F {i}i+{b}b hot={}", shape.hot_topic)
            } else {
                format!("F {i}i+{b}b")
            };
            vec![Level {
                name,
                concurrency: i + b,
                clients,
                warmup: vec![p.request(Class::Interactive, None, 32, 8)],
                window: Some(shape.window),
            }]
        }
        WorkloadId::S => speculation_levels(shape, tokenizer, &mut p),
    }
}

/// Workload S: at one stream, a level per kind of prompt; at more, clients sending every kind
/// in turn.
fn speculation_levels(shape: &Shape, tokenizer: &Tokenizer, p: &mut PromptMaker) -> Vec<Level> {
    let mut prompts = CopyPrompts::new(shape.seed);
    let mut request = |kind: Kind| {
        let text = prompts.message(kind);
        RequestSpec {
            class: Class::Interactive,
            prompt_tokens: tokenizer.encode(&text, false).len(),
            messages: json!([{"role": "user", "content": text}]),
            max_tokens: 256,
            natural_end: true,
        }
    };
    let warmup = vec![p.request(Class::Interactive, None, 32, 8)];
    let mut levels = Vec::new();
    for &c in &shape.concurrency {
        if c == 1 {
            for kind in Kind::ALL {
                let requests = (0..shape.requests_per_client)
                    .map(|_| request(kind))
                    .collect();
                levels.push(Level {
                    name: format!("S {} c=1", kind.as_str()),
                    concurrency: 1,
                    clients: vec![ClientPlan { requests }],
                    warmup: warmup.clone(),
                    window: None,
                });
            }
            continue;
        }
        let clients = (0..c)
            .map(|i| ClientPlan {
                requests: (0..shape.requests_per_client)
                    .map(|j| request(Kind::ALL[(i + j) % Kind::ALL.len()]))
                    .collect(),
            })
            .collect();
        levels.push(Level {
            name: format!("S mix c={c}"),
            concurrency: c,
            clients,
            warmup: warmup.clone(),
            window: None,
        });
    }
    levels
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
            let ((x, x_len), (y, y_len)) = (a.prompt(n), b.prompt(n));
            assert_ne!(x, y);
            for (text, counted) in [(&x, x_len), (&y, y_len)] {
                let len = t.encode(text, false).len();
                assert_eq!(len, counted);
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
            window: Duration::from_secs(1),
            hot_topic: 0.0,
            prompt_tokens: None,
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
        let again = requests[0].repeated(1);
        assert_ne!(
            again.messages[0]["content"], *system,
            "a repeat starts differently"
        );
        assert_eq!(again.messages[1], requests[0].messages[1]);
    }

    #[test]
    fn every_topic_makes_prompts_of_the_asked_length() {
        let t = tokenizer();
        let mut m = PromptMaker::new(&t, 5);
        for topic in Topic::ALL {
            let (text, len) = m.prompt_on(120, topic);
            assert_eq!(t.encode(&text, false).len(), len);
            assert!((110..=120).contains(&len), "{topic:?}: {len} tokens");
        }
        let code = m.prompt_on(60, Topic::Code).0;
        assert!(code.contains('(') && code.contains(';'), "{code}");
        let figures = m.prompt_on(60, Topic::Numbers).0;
        let digits = figures.chars().filter(char::is_ascii_digit).count();
        let visible = figures.chars().filter(|c| !c.is_whitespace()).count();
        assert!(digits * 3 > visible * 2, "mostly digits: {figures}");
    }
}
