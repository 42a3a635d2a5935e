#!/usr/bin/env bash
# Soak test: one `osprey serve` under a steady mixed load for a while, watched for leaks.
#
# 1. Starts `osprey serve` on a free port, with a temporary SQLite store and a temporary
#    $OSPREY_HOME (its models/ linked to the real one, so nothing is fetched twice), an API key
#    made through the admin API, and a small collection ingested for the rag requests.
# 2. Measures capacity: the mix at each concurrency of RAMP_LEVELS for RAMP_SECONDS each;
#    capacity is the best rate of successful requests.
# 3. Runs the mix for SOAK_SECONDS at 80% of that (reliability/load.py --rate), sampling every
#    SAMPLE_SECONDS the server's RSS, open file descriptors and KV-cache blocks from /metrics.
# 4. Once the load is over and the server idle: KV blocks and fds back to their baseline (taken
#    idle after the ramp), the RSS slope (least squares, MB/min, after the first minute), and
#    every acknowledged conversation write read back (load.py --verify).
# Prints one line, writes the JSON to --out, and exits 1 if a check failed.
#
# usage: reliability/soak.sh [--out FILE]          (default docs/results/soak.json)
# env:   SOAK_SECONDS (600), OSPREY_BIN (~/.cache/osprey-release/release/osprey),
#        RAMP_SECONDS (30; 10 when SOAK_SECONDS < 300), RAMP_LEVELS ("1 2 4 8"),
#        SOAK_MIX, SOAK_MAX_TOKENS (16), SOAK_CORPUS (crates/osprey-rag/tests/fixtures),
#        SAMPLE_SECONDS (10), FD_SLACK (8: fds allowed above baseline),
#        SOAK_KV_MEMORY (256MiB: the KV pool, --kv-cache-memory; the default pool, a tenth of
#        RAM, becomes resident block by block as the prefix cache cycles through it, which
#        would read as RSS growth for most of a 10-minute soak; a small pool is cycled
#        through during the ramp, so what RSS still gains in the soak is not the pool),
#        OSPREY_MODELS_HOME (where models/ is kept: $OSPREY_HOME or ~/.cache/osprey)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=$ROOT/docs/results/soak.json
while [ $# -gt 0 ]; do
  case $1 in
    --out) OUT=$2; shift 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$0"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
case $OUT in /*) ;; *) OUT=$PWD/$OUT ;; esac

BIN=${OSPREY_BIN:-$HOME/.cache/osprey-release/release/osprey}
SOAK_SECONDS=${SOAK_SECONDS:-600}
if [ "$SOAK_SECONDS" -lt 300 ]; then RAMP_SECONDS=${RAMP_SECONDS:-10}; else RAMP_SECONDS=${RAMP_SECONDS:-30}; fi
RAMP_LEVELS=${RAMP_LEVELS:-1 2 4 8}
MIX=${SOAK_MIX:-chat=5,stream=3,cancel=1,rag=1,tools=1,conversation=1}
MAX_TOKENS=${SOAK_MAX_TOKENS:-16}
CORPUS=${SOAK_CORPUS:-$ROOT/crates/osprey-rag/tests/fixtures}
SAMPLE_SECONDS=${SAMPLE_SECONDS:-10}
FD_SLACK=${FD_SLACK:-8}
KV_MEMORY=${SOAK_KV_MEMORY:-256MiB}
MODELS_HOME=${OSPREY_MODELS_HOME:-${OSPREY_HOME:-$HOME/.cache/osprey}}
LOAD="python3 $ROOT/reliability/load.py"

[ -x "$BIN" ] || { echo "no osprey binary at $BIN (set OSPREY_BIN)" >&2; exit 2; }
LOADAVG_START=$(cat /proc/loadavg)
WORK=$(mktemp -d /tmp/osprey-soak.XXXXXX)
SERVER_PID=
cleanup() {
  [ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null && wait "$SERVER_PID" 2>/dev/null
  rm -rf "$WORK/home"
}
trap cleanup EXIT
log() { echo "[soak $(date +%T)] $*" >&2; }
log "work dir $WORK (server log, load outputs and samples stay there)"

# ------------------------------------------------------------------ the server
mkdir -p "$MODELS_HOME/models" "$WORK/home"
ln -s "$MODELS_HOME/models" "$WORK/home/models"
export OSPREY_HOME=$WORK/home
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
URL=http://127.0.0.1:$PORT
ADMIN=soak-admin-$RANDOM$RANDOM
COLLECTION=soak

log "ingesting $CORPUS into collection $COLLECTION"
"$BIN" ingest "$CORPUS" --collection "$COLLECTION" >"$WORK/ingest.log" 2>&1 \
  || { cat "$WORK/ingest.log" >&2; exit 1; }

log "starting $BIN on $URL"
"$BIN" serve --port "$PORT" --store "sqlite://$WORK/osprey.db" --admin-key "$ADMIN" --kv-cache-memory "$KV_MEMORY" \
  >"$WORK/server.log" 2>&1 &
SERVER_PID=$!
for _ in $(seq 600); do
  curl -sf "$URL/ready" >/dev/null 2>&1 && break
  kill -0 "$SERVER_PID" 2>/dev/null || { tail -20 "$WORK/server.log" >&2; exit 1; }
  sleep 0.5
done
curl -sf "$URL/ready" >/dev/null || { echo "server not ready" >&2; exit 1; }
KEY=$(curl -sf "$URL/admin/keys" -H "authorization: Bearer $ADMIN" -H 'content-type: application/json' \
  -d '{"tenant": "default", "name": "soak"}' | python3 -c 'import json,sys; print(json.load(sys.stdin)["key"])')

# One sample of the server: time, RSS (kB), fds, and the engine's gauges from /metrics.
sample() {
  local rss fds metrics
  rss=$(awk '/^VmRSS/ {print $2}' "/proc/$SERVER_PID/status" 2>/dev/null || true)
  fds=$(ls "/proc/$SERVER_PID/fd" 2>/dev/null | wc -l || true)
  metrics=$(curl -sf -m 5 "$URL/metrics" || true)
  printf '{"t": %s, "rss_kb": %s, "fds": %s' "$(date +%s.%N)" "${rss:-null}" "${fds:-null}"
  for m in osprey_kv_blocks_used osprey_kv_blocks_free osprey_kv_blocks_evicted_total \
           osprey_running_sequences osprey_waiting_sequences osprey_requests_in_flight; do
    printf ', "%s": %s' "${m#osprey_}" \
      "$(awk -v m="$m" '$1 == m || index($1, m "{") == 1 {s += $2; f = 1} END {print f ? s : "null"}' <<<"$metrics")"
  done
  printf '}\n'
}
# Waits (at most 120 s) until nothing runs, waits or is in flight.
wait_idle() {
  for _ in $(seq 120); do
    sample | python3 -c 'import json,sys; s=json.load(sys.stdin); sys.exit(any(s[k] for k in ("running_sequences","waiting_sequences","requests_in_flight")))' && break
    sleep 1
  done
  sleep 2
}

sample >"$WORK/start.json"

# ------------------------------------------------------------------ capacity
best_rps=0; best_c=1
for c in $RAMP_LEVELS; do
  $LOAD --url "$URL" --key "$KEY" --concurrency "$c" --duration "$RAMP_SECONDS" --mix "$MIX" \
    --collection "$COLLECTION" --max-tokens "$MAX_TOKENS" --seed "$c" --out "$WORK/ramp-$c.json" 2>/dev/null
  rps=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["throughput_ok_per_s"])' "$WORK/ramp-$c.json")
  log "ramp: concurrency $c: $rps ok/s"
  if python3 -c 'import sys; sys.exit(not float(sys.argv[1]) > float(sys.argv[2]))' "$rps" "$best_rps"; then
    best_rps=$rps; best_c=$c
  fi
done
RATE=$(python3 -c "print(round(0.8 * $best_rps, 3))")
CONCURRENCY=$((best_c * 2 > 4 ? best_c * 2 : 4))
wait_idle
sample >"$WORK/baseline.json"
log "capacity $best_rps ok/s at concurrency $best_c; soak at $RATE/s (≤ $CONCURRENCY in flight) for $SOAK_SECONDS s"

# ------------------------------------------------------------------ the soak
$LOAD --url "$URL" --key "$KEY" --concurrency "$CONCURRENCY" --rate "$RATE" --duration "$SOAK_SECONDS" \
  --mix "$MIX" --collection "$COLLECTION" --max-tokens "$MAX_TOKENS" --seed 100 \
  --out "$WORK/soak-load.json" 2>"$WORK/soak-load.log" &
LOAD_PID=$!
: >"$WORK/samples.jsonl"
while kill -0 "$LOAD_PID" 2>/dev/null; do
  sample >>"$WORK/samples.jsonl"
  for _ in $(seq "$SAMPLE_SECONDS"); do kill -0 "$LOAD_PID" 2>/dev/null && sleep 1; done
done
wait "$LOAD_PID" || { cat "$WORK/soak-load.log" >&2; exit 1; }
wait_idle
sample >"$WORK/end.json"
VERIFY=$($LOAD --verify "$WORK/soak-load.json" --url "$URL" --key "$KEY" 2>"$WORK/verify.log" || true)
kill -0 "$SERVER_PID" 2>/dev/null && ALIVE=1 || ALIVE=0

# ------------------------------------------------------------------ the report
mkdir -p "$(dirname "$OUT")"
KV_MEMORY=$KV_MEMORY LOADAVG_START=$LOADAVG_START python3 - "$WORK" "$OUT" "$VERIFY" "$ALIVE" "$best_rps" "$best_c" "$RATE" "$CONCURRENCY" "$FD_SLACK" \
  "$RAMP_LEVELS" "$SOAK_SECONDS" "$BIN" "$MIX" "$MAX_TOKENS" <<'EOF'
import json, os, sys, time
work, out, verify, alive, cap, cap_c, rate, conc, fd_slack, levels, seconds, binary, mix, max_tokens = sys.argv[1:]
read = lambda name: json.load(open(os.path.join(work, name)))
start, base, end = read("start.json"), read("baseline.json"), read("end.json")
samples = [json.loads(l) for l in open(os.path.join(work, "samples.jsonl")) if l.strip()]
soak = read("soak-load.json")
ramp = []
for c in levels.split():
    r = read(f"ramp-{c}.json")
    ramp.append({"concurrency": int(c), "ok_per_s": r["throughput_ok_per_s"], "requests": r["requests"],
                 "failed": r["failed"], "errors_5xx": r["errors_5xx"], "p50_ms": (r["latency"] or {}).get("p50_ms")})

# RSS slope: least squares over the samples after the first minute of the soak.
t0 = samples[0]["t"] if samples else 0
pts = [((s["t"] - t0) / 60, s["rss_kb"] / 1024) for s in samples if s["t"] - t0 >= 60 and s["rss_kb"]]
slope = None
if len(pts) >= 3:
    mx, my = sum(x for x, _ in pts) / len(pts), sum(y for _, y in pts) / len(pts)
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    slope = round(sum((x - mx) * (y - my) for x, y in pts) / sxx, 3) if sxx else None
lost, total = (int(verify.split()[1]), int(verify.split()[3])) if verify.startswith("lost ") else (None, None)

mb = lambda s: round(s["rss_kb"] / 1024, 1) if s["rss_kb"] else None
checks = {
    "server_alive": alive == "1",
    "no_5xx": soak["errors_5xx"] == 0,
    "all_errors_enveloped": soak["non_envelope_errors"] == 0,
    "no_transport_errors": soak["transport_errors"] == 0,
    "kv_blocks_back_to_baseline": end["kv_blocks_used"] is not None and end["kv_blocks_used"] <= (base["kv_blocks_used"] or 0),
    "fds_back_to_baseline": end["fds"] is not None and end["fds"] <= base["fds"] + int(fd_slack),
    "no_acknowledged_write_lost": lost == 0,
}
kinds = {k: {"requests": v["requests"], **{o: v.get(o, 0) for o in ("ok", "shed", "http_error", "stream_error", "incomplete", "transport")},
             "p50_ms": (v["latency"] or {}).get("p50_ms"), "p95_ms": (v["latency"] or {}).get("p95_ms"),
             **({"ops": {op: {q: (l or {}).get(q) for q in ("n", "p50_ms", "p95_ms")} for op, l in v["ops"].items()}}
                if "ops" in v else {})}
         for k, v in soak["per_kind"].items()}
doc = {
    "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    "machine": {"cpus": os.cpu_count(), "loadavg_start": os.environ["LOADAVG_START"].split()[:3],
                "loadavg_end": open("/proc/loadavg").read().split()[:3]},
    "binary": binary, "kv_cache_memory": os.environ.get("KV_MEMORY"),
    "capacity": {"ramp": ramp, "best_ok_per_s": float(cap), "best_concurrency": int(cap_c)},
    "soak": {
        "seconds": int(seconds), "rate_per_s": float(rate), "max_in_flight": int(conc), "mix": mix,
        "max_tokens": int(max_tokens), "requests": soak["requests"], "ok": soak["ok"], "failed": soak["failed"],
        "ok_per_s": soak["throughput_ok_per_s"], "per_kind": kinds, "outcomes": soak["outcomes"],
        "status": soak["status"], "errors_5xx": soak["errors_5xx"], "shed": soak["shed"],
        "rate_limited": soak["rate_limited"], "non_envelope_errors": soak["non_envelope_errors"],
        "stream_errors": soak["stream_errors"], "incomplete_streams": soak["incomplete_streams"],
        "transport_errors": soak["transport_errors"], "latency": soak["latency"],
        "failure_samples": soak["failure_samples"][:20], "notes": soak["notes"],
    },
    "resources": {
        "rss_mb": {"start": mb(start), "baseline": mb(base), "soak_first": mb(samples[0]) if samples else None,
                   "max": max((mb(s) or 0 for s in samples), default=None), "end": mb(end)},
        "rss_slope_mb_per_min": slope,
        "fds": {"start": start["fds"], "baseline": base["fds"], "max": max((s["fds"] or 0 for s in samples), default=None), "end": end["fds"]},
        "kv_blocks_used": {"baseline": base["kv_blocks_used"], "max": max((s["kv_blocks_used"] or 0 for s in samples), default=None),
                           "end": end["kv_blocks_used"], "total": end["kv_blocks_used"] + end["kv_blocks_free"],
                           "evicted_before_soak": base["kv_blocks_evicted_total"], "evicted_end": end["kv_blocks_evicted_total"]},
        "samples": [{"t": round(s["t"] - t0, 1), "rss_mb": mb(s), "fds": s["fds"], "kv_used": s["kv_blocks_used"],
                     "running": s["running_sequences"], "waiting": s["waiting_sequences"]} for s in samples],
    },
    "acknowledged_writes": {"total": total, "lost": lost},
    "checks": checks,
    "pass": all(checks.values()),
}
with open(out, "w") as f:
    json.dump(doc, f, indent=1)
    f.write("\n")
lat = soak["latency"] or {}
print(f"soak {'PASS' if doc['pass'] else 'FAIL'}: capacity {cap} ok/s (c={cap_c}); {seconds}s at {rate}/s "
      f"(achieved {soak['throughput_ok_per_s']} ok/s): "
      f"{soak['requests']} requests, {soak['failed']} failed, 5xx {soak['errors_5xx']}, shed {soak['shed']}, "
      f"non-envelope {soak['non_envelope_errors']}, transport {soak['transport_errors']}; "
      f"p50/p95 {lat.get('p50_ms')}/{lat.get('p95_ms')} ms; RSS {mb(base)}->{mb(end)} MB "
      f"(slope {slope} MB/min); fds {base['fds']}->{end['fds']}; KV used {base['kv_blocks_used']}->{end['kv_blocks_used']}; "
      f"writes lost {lost} of {total}" + ("" if doc["pass"] else
      f"; failed checks: {', '.join(k for k, v in checks.items() if not v)}"))
sys.exit(0 if doc["pass"] else 1)
EOF
