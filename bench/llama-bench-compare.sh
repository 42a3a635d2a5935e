#!/usr/bin/env bash
# Single-stream speed, side by side: llama.cpp's llama-bench and `osprey bench model` on the
# same GGUF with the same thread count, runs interleaved (A B A B …), medians of N.
# Usage: bash bench/llama-bench-compare.sh [repetitions=3] [threads=2] [model=the default]
# (model: a name from `osprey models list`, e.g. gemma-3-270m)
# Needs llama.cpp's binaries: bash ../shared/peers/llama-cpp.sh builds them (~15 min, cached).
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-3}
THREADS=${2:-2}
MODEL_NAME=${3:-}
PEERS=${OSPREY_PEERS:-$HOME/.cache/osprey-peers}
LLAMA_BENCH=${LLAMA_BENCH:-$(ls "$PEERS"/llama.cpp-*/bin/llama-bench 2>/dev/null | head -1)}
[ -x "$LLAMA_BENCH" ] || { echo "llama-bench not found; run ../shared/peers/llama-cpp.sh first" >&2; exit 1; }
cargo build --release -q
OSPREY=${CARGO_TARGET_DIR:-target}/release/osprey
MODEL=$("$OSPREY" models fetch ${MODEL_NAME:+"$MODEL_NAME"})
out=$(mktemp -d)
for i in $(seq "$REPS"); do
  "$LLAMA_BENCH" -m "$MODEL" -t "$THREADS" -p 512 -n 128 -r 1 -o json 2>/dev/null >"$out/llama-$i.json"
  "$OSPREY" bench model --model "$MODEL" -t "$THREADS" -p 512 -n 128 -r 1 --json >"$out/osprey-$i.jsonl"
done
python3 - "$out" "$REPS" "$THREADS" "$LLAMA_BENCH" <<'PY'
import json, statistics, sys, pathlib
out, reps, threads, lb = pathlib.Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
llama = {"pp512": [], "tg128": []}
osprey = {"pp512": [], "tg128": []}
for i in range(1, reps + 1):
    for r in json.loads((out / f"llama-{i}.json").read_text()):
        test = f"pp{r['n_prompt']}" if r["n_prompt"] else f"tg{r['n_gen']}"
        llama[test].append(r["avg_ts"])
    for line in (out / f"osprey-{i}.jsonl").read_text().splitlines():
        r = json.loads(line)
        osprey[r["test"]].append(r["median"])
print(f"| test | llama.cpp t/s | Osprey t/s | Osprey / llama.cpp |")
print(f"|---|---:|---:|---:|")
for test in ("pp512", "tg128"):
    a, b = statistics.median(llama[test]), statistics.median(osprey[test])
    print(f"| {test} | {a:.1f} | {b:.1f} | {b / a:.2f}x |")
print(f"\n{reps} interleaved runs each, medians; {threads} threads; llama-bench: {lb}")
print("runs:", json.dumps({"llama.cpp": llama, "osprey": osprey}))
PY
