#!/usr/bin/env python3
"""Generates the task classifier's data: crates/osprey-router/data/tasks-{train,heldout}.jsonl.

Each line is {"text", "task"} with task one of rewrite, extraction, simple_qa, code, reasoning.
Requests are built from templates and fillers. The held-out split uses templates the training
split never sees (and its own fillers where they matter), so its accuracy measures
generalisation to new phrasings, not memorised ones. Deterministic (seeded):

    python3 scripts/gen_router_tasks.py
"""
import json
import random
from pathlib import Path

TOPICS = ["the quarterly report", "our refund policy", "the onboarding email", "this press release",
          "the product description", "my cover letter", "the meeting notes", "this blog post",
          "the support reply", "the release notes", "this paragraph", "the job posting",
          "the apology letter", "this tweet", "the landing page copy", "the privacy notice"]
TEXTS = ["We regret to inform you that the shipment is delayed by two weeks due to weather.",
         "Our new app lets you track expenses, split bills and export reports in one tap.",
         "The meeting moved to Thursday; please bring the budget numbers and the hiring plan.",
         "Customers who bought the premium plan before March get a free upgrade to the new tier.",
         "John Smith, 42, joined Acme Corp in Berlin on 3 May 2021 as head of logistics.",
         "Invoice 8841 from Globex, dated 12/01/2024, totals $4,310.50, due in 30 days.",
         "The patient reported headaches for three days and was prescribed ibuprofen 400 mg.",
         "Paris, Lyon and Marseille saw record rainfall this week, said Météo-France on Monday."]
STYLES = ["more formal", "friendlier", "shorter", "more concise", "clearer", "more persuasive",
          "less technical", "more professional", "simpler", "more polite"]
FIELDS = ["names", "dates", "email addresses", "company names", "amounts", "locations",
          "phone numbers", "product names", "the people mentioned", "all prices"]
FACTS = ["the capital of Australia", "the boiling point of water", "the author of Hamlet",
         "the largest planet", "the speed of light", "the population of Canada",
         "the currency of Japan", "the tallest mountain", "the chemical symbol for gold",
         "the year the Berlin Wall fell", "the longest river in Africa", "the inventor of the telephone"]
LANGS = ["Python", "Rust", "JavaScript", "Go", "SQL", "TypeScript", "Java", "C++", "Bash"]
CODE_TASKS = ["reverses a linked list", "parses a CSV file", "checks if a string is a palindrome",
              "merges two sorted arrays", "reads a JSON config", "computes a moving average",
              "retries an HTTP request with backoff", "deduplicates a list", "validates an email address",
              "finds the median of a list", "implements binary search", "counts word frequencies"]
SNIPPETS = ["def f(x):\n    return x * 2 if x > 0 else None", "for (let i = 0; i < n; i++) { total += a[i]; }",
            "fn main() { let v: Vec<u32> = (0..10).collect(); println!(\"{:?}\", v); }",
            "SELECT name, COUNT(*) FROM orders GROUP BY name HAVING COUNT(*) > 3;",
            "if err != nil { return nil, fmt.Errorf(\"open: %w\", err) }",
            "public static int sum(int[] xs) { int s = 0; for (int x : xs) s += x; return s; }"]
PUZZLES = ["a train leaves at 3 pm going 60 km/h and another at 4 pm going 80 km/h; when does the second catch up",
           "if all bloops are razzies and some razzies are lazzies, must some bloops be lazzies",
           "a bat and a ball cost $1.10 and the bat costs $1 more than the ball; what does the ball cost",
           "we can hire two engineers or buy the tool for $200k; which is better over three years",
           "three boxes are mislabelled apples, oranges and mixed; how few fruits must you draw",
           "should we expand to Germany or France first given our margins and team size",
           "prove that the square root of 2 is irrational",
           "how many ways can 8 people sit at a round table if two must sit together",
           "our churn doubled after the price change; what are the likely causes and how do we test them",
           "is it cheaper to lease or buy a car we keep for five years at 6% interest"]

TRAIN = {
    "rewrite": ["Rewrite {topic} to be {style}.", "Can you make {topic} {style}?",
                "Please rephrase this so it sounds {style}: {text}", "Paraphrase the following: {text}",
                "Polish the wording of {topic}.", "Edit this text to be {style}: {text}",
                "Reword {topic} in a {style} tone.", "Improve the grammar and flow: {text}",
                "Make this {style}: {text}", "Rewrite this sentence: {text}"],
    "extraction": ["Extract the {field} from this text: {text}", "List all {field} in: {text}",
                   "Pull out {field} and return them as JSON: {text}", "Tag the {field} in the following: {text}",
                   "Which {field} appear here? {text}", "Find every mention of {field}: {text}",
                   "Classify the sentiment of this review: {text}", "Give me a table of {field} from: {text}",
                   "Label each entity in: {text}", "Return the {field} as a comma-separated list: {text}"],
    "simple_qa": ["What is {fact}?", "Tell me {fact}.", "Quick question: what's {fact}?",
                  "Do you know {fact}?", "Who or what is {fact}?", "I need {fact}, please.",
                  "What's {fact} again?", "Briefly, what is {fact}?", "Name {fact}.", "Can you tell me {fact}?"],
    "code": ["Write a {lang} function that {code}.", "How do I write {lang} code that {code}?",
             "Fix the bug in this code:\n{snippet}", "Explain what this code does:\n{snippet}",
             "Implement in {lang}: a program that {code}.", "Refactor this {lang} code:\n{snippet}",
             "Give me a {lang} script that {code}.", "Why does this fail to compile?\n{snippet}",
             "Write unit tests for a {lang} function that {code}.", "Convert this to {lang}:\n{snippet}"],
    "reasoning": ["Solve step by step: {puzzle}?", "Think carefully: {puzzle}?", "Work out {puzzle}.",
                  "Reason through this problem: {puzzle}?", "Explain your reasoning: {puzzle}?",
                  "Analyse the trade-offs: {puzzle}?", "Walk me through the logic: {puzzle}?",
                  "Can you figure out {puzzle}?", "Derive the answer: {puzzle}?", "Carefully evaluate {puzzle}."],
}
HELDOUT = {
    "rewrite": ["Turn {topic} into something {style}.", "I'd like {topic} rewritten, {style} please.",
                "Could you tidy up this wording? {text}", "Say this differently: {text}"],
    "extraction": ["From the text below, get the {field}. {text}", "Identify {field} mentioned in: {text}",
                   "Output only the {field}: {text}", "Annotate the {field} in this passage: {text}"],
    "simple_qa": ["Remind me: {fact}?", "Just the answer: {fact}?", "What would {fact} be?",
                  "Hey, {fact}?"],
    "code": ["Show me how to do this in {lang}: something that {code}.", "Debug this for me:\n{snippet}",
             "Can you code up a {lang} class that {code}?", "Review this snippet:\n{snippet}"],
    "reasoning": ["Let's think this through: {puzzle}?", "Puzzle for you: {puzzle}?",
                  "Give a justified answer: {puzzle}?", "Weigh the options: {puzzle}?"],
}


def fill(template, rng):
    return template.format(topic=rng.choice(TOPICS), style=rng.choice(STYLES), text=rng.choice(TEXTS),
                           field=rng.choice(FIELDS), fact=rng.choice(FACTS), lang=rng.choice(LANGS),
                           code=rng.choice(CODE_TASKS), snippet=rng.choice(SNIPPETS),
                           puzzle=rng.choice(PUZZLES))


def generate(templates, per_class, seed):
    rng = random.Random(seed)
    rows = []
    for task, ts in templates.items():
        seen = set()
        while len(seen) < per_class:
            seen.add(fill(rng.choice(ts), rng))
        rows += [{"text": t, "task": task} for t in sorted(seen)]
    rng.shuffle(rows)
    return rows


def main():
    out = Path(__file__).resolve().parent.parent / "crates/osprey-router/data"
    for name, templates, n, seed in [("train", TRAIN, 100, 1), ("heldout", HELDOUT, 40, 2)]:
        rows = generate(templates, n, seed)
        with open(out / f"tasks-{name}.jsonl", "w") as f:
            for r in rows:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
        print(f"{name}: {len(rows)} rows")


if __name__ == "__main__":
    main()
