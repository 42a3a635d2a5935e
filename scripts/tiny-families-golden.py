#!/usr/bin/env python3
"""llama.cpp's logits on the tiny random-weight GGUFs of crates/osprey-models/tests/families.rs.

The test writes the files (and the ids it runs them on) under its CARGO_TARGET_TMPDIR, then
reads this script's output. With llama-cpp-python built from source (see
crates/osprey-testkit/data/golden/README.md):

    cargo test --release -p osprey-models --test models families::   # writes the files
    ~/.cache/golden-venv/bin/python scripts/tiny-families-golden.py \
        "$CARGO_TARGET_DIR/tmp/tiny-families" \
        crates/osprey-testkit/data/golden/tiny-families.json
"""

import hashlib
import json
import pathlib
import sys

from llama_cpp import Llama


def main():
    folder, out_path = pathlib.Path(sys.argv[1]), sys.argv[2]
    ids = json.loads((folder / "ids.json").read_text())
    families = {}
    for path in sorted(folder.glob("tiny-*.gguf")):
        name = path.stem.removeprefix("tiny-")
        llm = Llama(
            model_path=str(path),
            logits_all=True,
            n_ctx=128,
            n_batch=64,
            n_threads=2,
            verbose=False,
        )
        llm.reset()
        llm.eval(ids)
        families[name] = {
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
            "logits": [[round(float(x), 5) for x in llm.scores[i]] for i in range(len(ids))],
        }
        print(f"{name}: {len(ids)} positions")
    json.dump(
        {
            "reference": "llama.cpp via llama-cpp-python 0.3.36, CPU, 2 threads, n_batch 64",
            "ids": ids,
            "families": families,
        },
        open(out_path, "w"),
    )


if __name__ == "__main__":
    main()
