#!/usr/bin/env python3
"""Held-out known-item queries for `osprey bench rag`, made the way the dev queries were.

For pages of the corpus that no dev query targets, the query is the one-line description of
the page's NAME section, read from this machine's /usr/share/man (the corpus's text has that
section removed). 150 gcloud pages and 150 others, chosen with a fixed seed.

    python3 bench/rag/heldout-queries.py ../shared/data/retrieval > /tmp/heldout.jsonl
"""
import gzip
import json
import random
import re
import sys
from pathlib import Path

data = Path(sys.argv[1])
dev = {json.loads(l)["relevant"][0] for l in open(data / "manpages-queries-dev.jsonl")}
ids = [json.loads(l)["id"] for l in gzip.open(data / "manpages-corpus.jsonl.gz", "rt")]


def description(doc_id):
    path = Path("/usr/share/man") / (doc_id + ".gz")
    if not path.exists():
        return None
    lines = gzip.open(path, "rt", errors="replace").read().splitlines()
    try:
        start = next(i for i, l in enumerate(lines) if re.match(r'^\.S[Hh]\s+"?NAME', l))
    except StopIteration:
        return None
    name = []
    for line in lines[start + 1:]:
        if line.startswith(".SH") or line.startswith(".Sh"):
            break
        if not line.startswith(".") or line.startswith((".B ", ".I ")):
            name.append(re.sub(r"^\.[BI] ", "", line))
    text = " ".join(name)
    text = re.sub(r"\\f[BIRP]|\\f\(..|\\&|\\c", "", text).replace("\\(em", "-").replace("\\(en", "-")
    parts = re.split(r"\s\\?-\s", text, maxsplit=1)
    if len(parts) != 2:
        return None
    query = re.sub(r"\s+", " ", parts[1].replace("\\", "")).strip().strip(".")
    return query if 3 <= len(query.split()) <= 30 else None


rng = random.Random(7)
candidates = [i for i in ids if i not in dev]
rng.shuffle(candidates)
picked = {"gcloud": [], "other": []}
for doc_id in candidates:
    kind = "gcloud" if "/gcloud" in doc_id else "other"
    if len(picked[kind]) >= 150:
        continue
    query = description(doc_id)
    if query:
        picked[kind].append({"query": query, "relevant": [doc_id]})
    if all(len(v) >= 150 for v in picked.values()):
        break
for n, q in enumerate(picked["gcloud"] + picked["other"]):
    print(json.dumps({"qid": f"heldout-{n}", **q}))
