#!/usr/bin/env python3
"""How often answer-level escalation (--auto-min-logprob) sends an `auto` answer up a tier.

Serve two tiers (both may be the local model), with a floor:

  printf '[[tiers]]\\nname = "small"\\nmodel = "smollm2-135m-instruct"\\n[[tiers]]\\nname = "large"\\nmodel = "smollm2-135m-instruct"\\n' > /tmp/tiers.toml
  osprey serve --config /tmp/tiers.toml --port 9320 --auto-min-logprob -1.0

then, with the official openai client installed:

  python3 scripts/eval_escalation.py --url http://127.0.0.1:9320/v1

It sends 100 held-out router tasks (shuffled with --seed, max_tokens 48, temperature 0) as
`model: auto` and counts the tiers answering and the answers escalated for low logprob.
"""
import argparse, collections, json, pathlib, random

from openai import OpenAI

ap = argparse.ArgumentParser()
ap.add_argument("--url", required=True)
ap.add_argument("--seed", type=int, default=11)
ap.add_argument("--requests", type=int, default=100)
args = ap.parse_args()
client = OpenAI(base_url=args.url, api_key="none")
tasks = pathlib.Path(__file__).resolve().parent.parent / "crates/osprey-router/data/tasks-heldout.jsonl"
rows = [json.loads(line) for line in tasks.read_text().splitlines()]
random.Random(args.seed).shuffle(rows)
tiers, escalated = collections.Counter(), 0
for r in rows[:args.requests]:
    raw = client.chat.completions.with_raw_response.create(
        model="auto", messages=[{"role": "user", "content": r["text"]}], max_tokens=48, temperature=0)
    assert raw.parse().choices[0].logprobs is None, "the check's logprobs are not passed on"
    tiers[raw.headers["x-osprey-tier"]] += 1
    escalated += "answer logprob" in raw.headers["x-osprey-route-reason"]
print(f"requests {sum(tiers.values())}, answered by tier {dict(tiers)}, escalated on their answer {escalated}")
