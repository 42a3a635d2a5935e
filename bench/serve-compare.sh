#!/usr/bin/env bash
# Osprey under load, side by side (../shared/BENCHMARKS.md workloads A, B, F), with
# `osprey bench serve` interleaving the servers run by run:
#   A: Osprey vs llama-server (--parallel = concurrency) at 1, 8, 32 streams, plus a chart;
#   B: Osprey vs Osprey without prefix caching vs llama-server --parallel 32;
#   F: Osprey's priority scheduling vs the same engine in FCFS order (16 seats, 32 clients);
#   M: memory: peak RSS of Osprey and llama-server at 32 streams of 2,000-token contexts;
#   W: M with Osprey's pool cut to the KV bytes llama-server allocates (its window-sized cache);
#   S: speculative decoding: Osprey's prompt lookup on and off, llama-server's own prompt lookup
#      (--spec-type ngram-simple, its defaults) on and off, at 1, 8 and 32 streams.
# Every server gets the same GGUF, 2 threads and the same KV memory (llama-server's -c tokens
# × the model's bytes per token of f16 K and V). Results: $OUT/*.json, tables on stdout.
# Usage: [MODEL_NAME=gemma-3-270m] bash bench/serve-compare.sh [runs=3] [workloads="a b f"]
# A and B need llama.cpp's binaries: bash ../shared/peers/llama-cpp.sh builds them (~15 min, cached).
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-3}
WORKLOADS=${2:-a b f}
OUT=${OUT:-bench/results}
SEED=${SEED:-0}
PEERS=${OSPREY_PEERS:-$HOME/.cache/osprey-peers}
LLAMA_SERVER=${LLAMA_SERVER:-$(ls "$PEERS"/llama.cpp-*/bin/llama-server 2>/dev/null | head -1 || true)}
mkdir -p "$OUT"
cargo build --release -q
OSPREY=${CARGO_TARGET_DIR:-target}/release/osprey
MODEL_NAME=${MODEL_NAME:-smollm2-135m-instruct}
MODEL=$("$OSPREY" models fetch "$MODEL_NAME")
# f16 K and V: layers × KV heads × head size × 2 × 2 bytes.
case $MODEL_NAME in
  gemma-3-270m) KV_TOKEN_BYTES=18432 ;; # 18 × 1 × 256 × 4
  *) KV_TOKEN_BYTES=23040 ;;            # SmolLM2-135M: 30 × 3 × 64 × 4
esac

PIDS=()
trap 'kill "${PIDS[@]}" 2>/dev/null || true' EXIT
wait_ready() {
  for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$1/v1/models" >/dev/null && return 0
    sleep 0.2
  done
  echo "server on port $1 did not start" >&2; exit 1
}
# start_osprey PORT KV_TOKENS [serve flags...]; sets PID
start_osprey() {
  local port=$1 tokens=$2; shift 2
  "$OSPREY" serve --no-response-cache --port "$port" --model "$MODEL" --threads 2 \
    --kv-cache-memory $((tokens * KV_TOKEN_BYTES)) "$@" >"$OUT/osprey-$port.log" 2>&1 &
  PID=$!; PIDS+=("$PID"); wait_ready "$port"
}
# start_llama PORT PARALLEL CTX_TOKENS [llama-server flags...]; sets PID
start_llama() {
  [ -x "$LLAMA_SERVER" ] || { echo "llama-server not found; run ../shared/peers/llama-cpp.sh first" >&2; exit 1; }
  local port=$1 parallel=$2 ctx=$3; shift 3
  "$LLAMA_SERVER" -m "$MODEL" -t 2 --host 127.0.0.1 --port "$port" --parallel "$parallel" -c "$ctx" \
    "$@" >"$OUT/llama-$port.log" 2>&1 &
  PID=$!; PIDS+=("$PID"); wait_ready "$port"
}
stop() { kill "$@" 2>/dev/null || true; wait "$@" 2>/dev/null || true; }
bench() { "$OSPREY" bench serve --runs "$RUNS" --seed "$SEED" --tokenizer "$MODEL" "$@"; }

for w in $WORKLOADS; do
  case $w in
  a)
    files=()
    for c in 1 8 32; do
      # KV for 32 × 512 tokens on both sides; each level starts from fresh servers.
      start_osprey 8090 16384; osprey=$PID
      start_llama 8091 "$c" 16384; llama=$PID
      bench -w a -c "$c" --url http://127.0.0.1:8090 --label osprey --pid "$osprey" \
        --compare http://127.0.0.1:8091 --compare-label llama-server --compare-pid "$llama" \
        --json "$OUT/a-c$c.json"
      stop "$osprey" "$llama"
      files+=("$OUT/a-c$c.json")
    done
    "$OSPREY" bench serve --from-json "$(IFS=,; echo "${files[*]}")" --chart "$OUT/workload-a.svg" \
      --json "$OUT/a.json"
    ;;
  m)
    # 32 streams of 2,000-token contexts (prompts of up to 1,872 tokens, 128 generated), with
    # KV for all of them on both sides; llama-server keeps only the window on local layers.
    # The guards are off: the default jailbreak classifier refuses most of these long
    # word-salad prompts, and this measures memory, not screening.
    printf '[policies.none]\nguards = []\n[tenants.default]\npolicy = "none"\n' >"$OUT/no-guards.toml"
    start_osprey 8090 65536 --config "$OUT/no-guards.toml"; osprey=$PID
    start_llama 8091 32 65536; llama=$PID
    bench -w a -c 32 --prompt-tokens 1872 --requests-per-client 1 \
      --url http://127.0.0.1:8090 --label osprey --pid "$osprey" \
      --compare http://127.0.0.1:8091 --compare-label llama-server --compare-pid "$llama" \
      --json "$OUT/m.json"
    stop "$osprey" "$llama"
    ;;
  w)
    # Workload M in the KV memory llama-server actually allocates: for Gemma 3 its sliding-window
    # layers keep only the window's cells, so its KV is far below -c × bytes per token. Osprey's
    # pool gets the same bytes (the sizes llama-server logs, summed); Osprey's windowed layers
    # give their pages back as sequences advance, which is what lets the contexts fit.
    printf '[policies.none]\nguards = []\n[tenants.default]\npolicy = "none"\n' >"$OUT/no-guards.toml"
    start_llama 8091 32 65536 -lv 4; llama=$PID # -lv 4 logs the KV caches' sizes
    kv_mib=$(grep -o 'llama_kv_cache: size = *[0-9.]* MiB' "$OUT/llama-8091.log" |
      grep -o '[0-9.]* MiB' | awk '{s += $1} END {printf "%d", s}')
    [ "$kv_mib" -gt 0 ] || { echo "llama-server logged no KV size" >&2; exit 1; }
    echo "llama-server KV: $kv_mib MiB; Osprey's pool: the same"
    "$OSPREY" serve --no-response-cache --port 8090 --model "$MODEL" --threads 2 \
      --kv-cache-memory "${kv_mib}MiB" --config "$OUT/no-guards.toml" >"$OUT/osprey-8090.log" 2>&1 &
    osprey=$!; PIDS+=("$osprey"); wait_ready 8090
    bench -w a -c 32 --prompt-tokens 1872 --requests-per-client 1 \
      --url http://127.0.0.1:8090 --label osprey --pid "$osprey" \
      --compare http://127.0.0.1:8091 --compare-label llama-server --compare-pid "$llama" \
      --json "$OUT/w.json"
    stop "$osprey" "$llama"
    ;;
  b)
    # 32 × 1,280 tokens of KV for each server.
    start_osprey 8090 40960; osprey=$PID
    start_osprey 8092 40960 --no-prefix-caching; nocache=$PID
    start_llama 8091 32 40960; llama=$PID
    bench -w b --url http://127.0.0.1:8090 --label osprey --pid "$osprey" \
      --compare http://127.0.0.1:8092 --compare-label osprey-no-cache --compare-pid "$nocache" \
      --compare http://127.0.0.1:8091 --compare-label llama-server --compare-pid "$llama" \
      --json "$OUT/b.json"
    stop "$osprey" "$nocache" "$llama"
    ;;
  s)
    # 32 × 1,024 tokens of KV for each server; llama-server with 32 slots for every level.
    start_osprey 8090 32768; on=$PID
    start_osprey 8092 32768 --speculative off; off=$PID
    start_llama 8091 32 32768 --spec-type ngram-simple; llama_on=$PID
    start_llama 8093 32 32768; llama_off=$PID
    bench -w s --url http://127.0.0.1:8090 --label osprey-ngram --pid "$on" \
      --compare http://127.0.0.1:8092 --compare-label osprey-off --compare-pid "$off" \
      --compare http://127.0.0.1:8091 --compare-label llama-ngram --compare-pid "$llama_on" \
      --compare http://127.0.0.1:8093 --compare-label llama-off --compare-pid "$llama_off" \
      --json "$OUT/s.json" --chart "$OUT/s.svg"
    stop "$on" "$off" "$llama_on" "$llama_off"
    ;;
  f)
    # 16 seats for 8 interactive and 24 batch clients, so requests queue for admission.
    start_osprey 8090 40960 --max-num-seqs 16; prio=$PID
    start_osprey 8092 40960 --max-num-seqs 16 --scheduling-policy fcfs; fcfs=$PID
    bench -w f --interactive-clients 8 --batch-clients 24 --duration "${F_SECONDS:-60}" \
      --url http://127.0.0.1:8090 --label priority --pid "$prio" \
      --compare http://127.0.0.1:8092 --compare-label fcfs --compare-pid "$fcfs" \
      --json "$OUT/f.json"
    stop "$prio" "$fcfs"
    ;;
  esac
done
