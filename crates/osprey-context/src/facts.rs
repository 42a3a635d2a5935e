//! Facts a user states about themselves, found in their own words by rules: the sentences in
//! the first person that say who they are, where they live or work, what they prefer, like or
//! dislike, or how to address them, rewritten in the third person ("I prefer short answers" →
//! "prefers short answers"). Questions, hypotheticals and requests about others are not facts.
//! Rules rather than the small model: they never invent a fact the user did not state.
//!
//! ```
//! let facts = osprey_context::facts::extract("Hi! My name is Ana and I prefer short answers.");
//! assert_eq!(facts, ["name is Ana", "prefers short answers"]);
//! ```

use std::sync::LazyLock;

use regex::Regex;

/// The patterns, each with the third-person form of its verb; the fact is that form and the
/// rest of the clause.
static RULES: LazyLock<Vec<(Regex, &'static str)>> = LazyLock::new(|| {
    [
        (r"^my name is\s+(.+)", "name is"),
        (r"^(?:please\s+)?call me\s+(.+)", "wants to be called"),
        (r"^i(?:'m| am) allergic to\s+(.+)", "is allergic to"),
        (r"^i(?:'m| am) (a|an)\s+(.+)", "is"),
        (r"^i(?:'m| am) from\s+(.+)", "is from"),
        (r"^i (?:really )?prefer\s+(.+)", "prefers"),
        (r"^i (?:really )?(?:like|love|enjoy)\s+(.+)", "likes"),
        (
            r"^i (?:really )?(?:dislike|hate|don't like|do not like)\s+(.+)",
            "dislikes",
        ),
        (r"^i live in\s+(.+)", "lives in"),
        (r"^i work (as|at|for|in)\s+(.+)", "works"),
        (r"^i speak\s+(.+)", "speaks"),
        (r"^i(?:'m| am) vegetarian\b(.*)", "is vegetarian"),
        (r"^i(?:'m| am) vegan\b(.*)", "is vegan"),
        (r"^(?:please\s+)?always\s+(.+)", "wants you to always"),
        (r"^(?:please\s+)?never\s+(.+)", "wants you to never"),
    ]
    .into_iter()
    .map(|(pattern, verb)| {
        let re = Regex::new(&format!("(?i){pattern}")).expect("the fact rules compile");
        (re, verb)
    })
    .collect()
});

/// Words that make a clause not a statement of fact about the user.
const NOT_FACTS: [&str; 7] = [
    "if ", "would ", "could ", "should ", "might ", "maybe ", "?",
];

/// The facts `text` states about its writer, in order, each once.
pub fn extract(text: &str) -> Vec<String> {
    let mut found: Vec<String> = Vec::new();
    for clause in clauses(text) {
        let lower = clause.to_lowercase();
        if NOT_FACTS.iter().any(|w| lower.contains(w)) {
            continue;
        }
        for (rule, verb) in RULES.iter() {
            let Some(c) = rule.captures(clause) else {
                continue;
            };
            let rest: Vec<&str> = c.iter().skip(1).flatten().map(|m| m.as_str()).collect();
            let rest = third_person(rest.join(" ").trim());
            let fact = match rest.is_empty() {
                true => (*verb).to_owned(),
                false => format!("{verb} {rest}"),
            };
            if !found.contains(&fact) {
                found.push(fact);
            }
            break;
        }
    }
    found
}

/// `text` split into sentences and `and`-joined clauses, trimmed.
fn clauses(text: &str) -> impl Iterator<Item = &str> {
    static SPLIT: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(r"(?i)[.!;\n]+|,?\s+(?:and|but|so)\s+(?:i\b|my\b|i')").expect("compiles")
    });
    // A split at "and I" keeps the "I" (or "my") for the next clause.
    let mut pieces = Vec::new();
    let mut start = 0;
    for m in SPLIT.find_iter(text) {
        let cut = m.as_str();
        let keep = match cut.to_lowercase() {
            c if c.ends_with("my") => 2,
            c if c.ends_with("i'") => 2,
            c if c.ends_with('i') => 1,
            _ => 0,
        };
        pieces.push(&text[start..m.start()]);
        start = m.end() - keep;
    }
    pieces.push(&text[start..]);
    pieces
        .into_iter()
        .map(|p| p.trim_matches(|c: char| c.is_whitespace() || c == ',' || c == '.' || c == '!'))
        .filter(|p| !p.is_empty())
        .map(|p| p.trim_start_matches(|c: char| !c.is_alphanumeric()))
        .map(strip_leading_filler)
}

/// A clause without a greeting or interjection before it ("Oh, I prefer ...").
fn strip_leading_filler(clause: &str) -> &str {
    static FILLER: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(
            r"(?i)^(?:(?:hi|hello|hey|oh|well|also|btw|by the way|and|but|so|actually)\b[,\s]*)+",
        )
        .expect("compiles")
    });
    match FILLER.find(clause) {
        Some(m) => &clause[m.end()..],
        None => clause,
    }
}

/// `text` with first-person words turned to the third person.
fn third_person(text: &str) -> String {
    let swap = |w: &str| match w.to_lowercase().as_str() {
        "i" => "they".to_owned(),
        "i'm" => "they're".to_owned(),
        "me" => "them".to_owned(),
        "my" => "their".to_owned(),
        "mine" => "theirs".to_owned(),
        "myself" => "themselves".to_owned(),
        _ => w.to_owned(),
    };
    text.split(' ').map(swap).collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::extract;

    #[test]
    fn first_person_statements_become_facts() {
        let cases = [
            ("I prefer concise answers.", vec!["prefers concise answers"]),
            (
                "Hello, I'm a nurse and I live in Porto.",
                vec!["is a nurse", "lives in Porto"],
            ),
            ("I am an engineer", vec!["is an engineer"]),
            (
                "Call me Sam! I work at a bakery",
                vec!["wants to be called Sam", "works at a bakery"],
            ),
            (
                "I hate long emails about my schedule",
                vec!["dislikes long emails about their schedule"],
            ),
            (
                "Please always answer in French.",
                vec!["wants you to always answer in French"],
            ),
            ("I'm allergic to peanuts", vec!["is allergic to peanuts"]),
        ];
        for (text, facts) in cases {
            assert_eq!(extract(text), facts, "{text}");
        }
    }

    #[test]
    fn questions_hypotheticals_and_other_people_are_not_facts() {
        for text in [
            "What is the capital of France?",
            "Do you prefer cats or dogs?",
            "If I lived in Paris, what would I see?",
            "My sister lives in Rome.",
            "He is a doctor.",
            "I think so.",
            "",
        ] {
            assert!(extract(text).is_empty(), "{text}: {:?}", extract(text));
        }
    }

    #[test]
    fn a_fact_said_twice_is_kept_once() {
        assert_eq!(extract("I like tea. I like tea!"), ["likes tea"]);
    }
}
