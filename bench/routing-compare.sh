#!/usr/bin/env bash
# Workload C (../shared/BENCHMARKS.md): cache-aware routing against round-robin, in one run.
#
# Two `osprey worker`s (one compute thread each: this machine has 2 cores) behind two gateways
# over the same workers, one per policy; `osprey bench serve -w c` sends users of 8 distinct
# 1,000-token system prompts in random order through each gateway in turn, fresh prompts for
# every (run, gateway), and reports TTFT and tokens/s side by side.
#
# Each worker's KV cache is KV_CACHE (default 128MiB: about 5 of the 8 system prompts), so the
# fleet's cache holds the working set but one worker's does not: the case routing decides.
#
#   SKIP_BUILD=1 RUNS=3 USERS=16 PER_USER=4 bash bench/routing-compare.sh
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-3}
USERS=${USERS:-16}
PER_USER=${PER_USER:-4}
KV_CACHE=${KV_CACHE:-128MiB}
SEED=${SEED:-0}
OUT=${OUT:-docs/results/c.json}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/osprey-target}
[ -n "${SKIP_BUILD:-}" ] || cargo build --release
BIN=$CARGO_TARGET_DIR/release/osprey
PORT=${PORT:-9300}
W1=$((PORT + 1)) W2=$((PORT + 2)) CA=$((PORT + 3)) RR=$((PORT + 4))
STATE=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$STATE"; }
trap cleanup EXIT
for p in $W1 $W2; do
  "$BIN" worker --port "$p" --threads 1 --kv-cache-memory "$KV_CACHE" >"$STATE/worker-$p.log" 2>&1 &
  pids+=($!)
done
workers=(--worker "http://127.0.0.1:$W1" --worker "http://127.0.0.1:$W2")
"$BIN" serve --no-response-cache --port "$CA" "${workers[@]}" --routing-policy cache_aware --store "sqlite://$STATE/ca.db" \
  >"$STATE/gateway-ca.log" 2>&1 &
pids+=($!)
"$BIN" serve --no-response-cache --port "$RR" "${workers[@]}" --routing-policy round_robin --store "sqlite://$STATE/rr.db" \
  >"$STATE/gateway-rr.log" 2>&1 &
pids+=($!)
for p in $CA $RR; do
  for _ in $(seq 300); do
    [ "$(curl -sf "http://127.0.0.1:$p/ready" | grep -o '"live":true' | wc -l)" = 2 ] && break
    sleep 0.5
  done
done
curl -sf "http://127.0.0.1:$CA/ready" >/dev/null || { cat "$STATE"/*.log; exit 1; }
"$BIN" bench serve -w c --runs "$RUNS" -c "$USERS" --requests-per-client "$PER_USER" --seed "$SEED" \
  --url "http://127.0.0.1:$CA" --label cache-aware \
  --compare "http://127.0.0.1:$RR" --compare-label round-robin \
  --json "$OUT"
for p in $W1 $W2; do
  echo "worker :$p prefix cache: $(curl -s "http://127.0.0.1:$p/metrics" | grep -E '^osprey_prefix_cache_(hit|queried)_tokens_total' | tr '\n' ' ')"
done
