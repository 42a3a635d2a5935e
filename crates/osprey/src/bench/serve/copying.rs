//! Workload S's prompts: work that copies from its prompt (repeat a passage, correct its
//! typos, turn it into a list, rename a function in code, answer from a quoted passage), where
//! speculative decoding's drafts are accepted, and open-ended requests, where they are not.
//! Every prompt is made from a seed: passages are sentences of templates with their slots
//! filled at random, code is functions of made-up names.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// What a request of workload S asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Repeat a passage word for word.
    Repeat,
    /// Correct the typos of a passage.
    Correct,
    /// Turn a passage into a bulleted list.
    List,
    /// Rename a function in a piece of code.
    Rename,
    /// Answer a question from a quoted passage, quoting it.
    Quote,
    /// Write something new: a story, an explanation, advice.
    Open,
}

impl Kind {
    /// Every kind, the copying ones first.
    pub const ALL: [Kind; 6] = [
        Kind::Repeat,
        Kind::Correct,
        Kind::List,
        Kind::Rename,
        Kind::Quote,
        Kind::Open,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Repeat => "repeat",
            Kind::Correct => "correct",
            Kind::List => "list",
            Kind::Rename => "rename",
            Kind::Quote => "quote",
            Kind::Open => "open",
        }
    }
}

const PEOPLE: [&str; 12] = [
    "Marta",
    "the harbour master",
    "Doctor Okafor",
    "the old baker",
    "Ines",
    "the inspector",
    "Tomasz",
    "the head gardener",
    "Priya",
    "the ferry captain",
    "Lena",
    "the night porter",
];
const PLACES: [&str; 12] = [
    "the market hall",
    "the north quay",
    "the railway station",
    "the library",
    "the vineyard",
    "the lighthouse",
    "the town square",
    "the mill",
    "the observatory",
    "the school",
    "the bakery on Bridge Street",
    "the museum",
];
const THINGS: [&str; 12] = [
    "a crate of oranges",
    "the brass telescope",
    "a parcel of letters",
    "the spare keys",
    "a basket of mussels",
    "the old ledger",
    "a box of candles",
    "the wooden sign",
    "a sack of flour",
    "the silver kettle",
    "a roll of maps",
    "the broken clock",
];
const TIMES: [&str; 8] = [
    "at six in the morning",
    "shortly after noon",
    "on Tuesday evening",
    "before the storm",
    "at the end of the harvest",
    "every second Sunday",
    "late in the autumn",
    "at first light",
];
const TEMPLATES: [&str; 10] = [
    "{p} walked to {l} {t} and left {o} by the door.",
    "Nobody at {l} could remember who had ordered {o}.",
    "{p} said that {o} had been kept at {l} for {n} years.",
    "{t}, {p} counted {n} visitors at {l}.",
    "The people of {l} still argue about {o}, which {p} found {t}.",
    "{p} wrote down the price of {o}: {n} crowns, far more than anyone expected.",
    "When the bell rang {t}, {p} closed {l} and carried {o} home.",
    "According to {p}, {l} needs {n} new windows before the winter.",
    "{p} repaired {o} in a single afternoon and returned it to {l}.",
    "It took {n} people to move {o} from {l} to the harbour.",
];

/// Makes workload S's prompts from one random stream.
pub struct CopyPrompts {
    rng: ChaCha8Rng,
}

impl CopyPrompts {
    pub fn new(seed: u64) -> Self {
        Self {
            rng: ChaCha8Rng::seed_from_u64(seed ^ 0x5_0ec5),
        }
    }

    fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
        from[self.rng.random_range(0..from.len())]
    }

    /// A passage of `sentences` sentences.
    fn passage(&mut self, sentences: usize) -> String {
        (0..sentences)
            .map(|_| {
                let t = self.pick(&TEMPLATES);
                let s = t
                    .replace("{p}", self.pick(&PEOPLE))
                    .replace("{l}", self.pick(&PLACES))
                    .replace("{o}", self.pick(&THINGS))
                    .replace("{t}", self.pick(&TIMES))
                    .replace("{n}", &self.rng.random_range(2..60).to_string());
                let mut c = s.chars();
                c.next()
                    .map(|f| f.to_uppercase().chain(c).collect())
                    .unwrap_or_default()
            })
            .collect::<Vec<String>>()
            .join(" ")
    }

    /// `text` with about one word in six misspelt (two letters swapped).
    fn with_typos(&mut self, text: &str) -> String {
        (text.split(' '))
            .map(|w| {
                let chars: Vec<char> = w.chars().collect();
                if chars.len() >= 4 && self.rng.random_range(0..6) == 0 {
                    let i = self.rng.random_range(1..chars.len() - 2);
                    let mut c = chars.clone();
                    c.swap(i, i + 1);
                    c.into_iter().collect()
                } else {
                    w.to_owned()
                }
            })
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// A made-up identifier.
    fn name(&mut self) -> String {
        const PARTS: [&str; 12] = [
            "load", "parse", "total", "order", "record", "merge", "count", "fetch", "price",
            "stock", "entry", "batch",
        ];
        format!("{}_{}", self.pick(&PARTS), self.pick(&PARTS))
    }

    /// Code of a few small functions, one of them `f`, called by the others.
    fn code(&mut self, f: &str) -> String {
        let mut out = format!(
            "def {f}(items, limit):\n    result = []\n    for item in items:\n        if item.size <= limit:\n            result.append(item)\n    return result\n\n"
        );
        for _ in 0..3 {
            let g = self.name();
            let n = self.rng.random_range(2..100);
            out += &format!(
                "def {g}(items):\n    kept = {f}(items, {n})\n    print(\"{g}:\", len(kept))\n    return kept\n\n"
            );
        }
        out
    }

    /// The user message of a request of `kind`.
    pub fn message(&mut self, kind: Kind) -> String {
        match kind {
            Kind::Repeat => format!(
                "Repeat the following passage exactly, word for word.\n\n{}",
                self.passage(8)
            ),
            Kind::Correct => {
                let passage = self.passage(8);
                format!(
                    "Correct the spelling mistakes in this text and write out the corrected text.\n\n{}",
                    self.with_typos(&passage)
                )
            }
            Kind::List => format!(
                "Rewrite this passage as a bulleted list, one sentence per item.\n\n{}",
                self.passage(8)
            ),
            Kind::Rename => {
                let (old, new) = (self.name(), self.name());
                format!(
                    "Rename the function `{old}` to `{new}` everywhere in this code and show the whole code.\n\n```python\n{}```",
                    self.code(&old)
                )
            }
            Kind::Quote => {
                let person = self.pick(&PEOPLE);
                format!(
                    "Passage:\n\"{} {} {}\"\n\nQuote every sentence of the passage that mentions {person}.",
                    self.passage(2),
                    TEMPLATES[0]
                        .replace("{p}", person)
                        .replace("{l}", self.pick(&PLACES))
                        .replace("{o}", self.pick(&THINGS))
                        .replace("{t}", self.pick(&TIMES)),
                    self.passage(2),
                )
            }
            Kind::Open => {
                const ASKS: [&str; 4] = [
                    "Write a short story about",
                    "Explain to a child what is special about",
                    "Give three pieces of advice to someone who looks after",
                    "Describe a day in the life of someone who works at",
                ];
                let ask = self.pick(&ASKS);
                let person = self.pick(&PEOPLE);
                format!("{ask} {}, and about {person}.", self.pick(&PLACES))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_depend_on_the_seed_only() {
        for kind in Kind::ALL {
            let a = CopyPrompts::new(7).message(kind);
            assert_eq!(a, CopyPrompts::new(7).message(kind));
            assert_ne!(a, CopyPrompts::new(8).message(kind), "{kind:?}");
        }
        let typo = CopyPrompts::new(1).message(Kind::Correct);
        assert!(typo.len() > 200, "{typo}");
    }
}
