#!/usr/bin/env bash
# What observability costs (docs/observability.md): the same server with metrics, the request
# log and OTLP trace export on ("traced": spans to a local sink) and off ("quiet":
# --no-metrics --no-request-log, no export), in one run, interleaved.
#   A: two engines (osprey serve), `osprey bench serve -w a` at CONCURRENCY, medians of RUNS.
#   G: two gateways in front of the nginx mock, bench/gateway-compare.sh with the targets
#      direct, osprey-traced and osprey-quiet at RATES.
# Usage: bash bench/observability-overhead.sh [runs=3]
#   env: CONCURRENCY=1,8  RATES=1000,3000  MODES=json  DURATION=10  OUT=bench/results
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-3}
CONCURRENCY=${CONCURRENCY:-1,8}
OUT=${OUT:-bench/results}
mkdir -p "$OUT"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/osprey-target}
cargo build --release -q
OSPREY=$CARGO_TARGET_DIR/release/osprey
WORK=$(mktemp -d /tmp/observability.XXXXXX)
PIDS=()
cleanup() { [ ${#PIDS[@]} -gt 0 ] && kill "${PIDS[@]}" 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT

# An OTLP sink: takes every POST, answers 200.
python3 bench/otlp-sink.py 18516 >/dev/null 2>&1 &
PIDS+=($!)

serve() {  # NAME PORT FLAGS...
  local name=$1 port=$2; shift 2
  mkdir -p "$WORK/$name"
  OSPREY_HOME=$WORK/$name "$OSPREY" serve --port "$port" --threads 2 --store "sqlite://$WORK/$name/store.db" \
    --kv-cache-memory 512MiB "$@" >"$WORK/$name.log" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 600); do curl -sf "http://127.0.0.1:$port/ready" >/dev/null && return 0; sleep 0.2; done
  echo "$name did not come up" >&2; tail "$WORK/$name.log" >&2; exit 1
}
# The model is fetched once into the default home and shared.
MODEL=$("$OSPREY" models fetch 2>/dev/null | tail -1)
serve traced 18511 --model "$MODEL" --otlp-endpoint http://127.0.0.1:18516
serve quiet 18512 --model "$MODEL" --no-metrics --no-request-log
echo "== workload A: traced vs quiet" >&2
"$OSPREY" bench serve -w a -c "$CONCURRENCY" -r "$RUNS" --url http://127.0.0.1:18511 --label traced \
  --compare http://127.0.0.1:18512 --compare-label quiet --json "$OUT/observability-a.json" | tee "$OUT/observability-a.txt"
kill "${PIDS[@]:1}" 2>/dev/null || true

echo "== workload G: traced vs quiet" >&2
TARGETS="direct osprey-traced osprey-quiet" RATES=${RATES:-1000,3000} MODES=${MODES:-json} \
  DURATION=${DURATION:-10} SKIP_BUILD=1 OUT=$OUT bash bench/gateway-compare.sh "$RUNS"
