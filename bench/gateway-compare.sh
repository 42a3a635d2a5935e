#!/usr/bin/env bash
# Gateway overhead (../shared/BENCHMARKS.md workload G): fixed-rate HTTP load with `oha` on a
# zero-latency nginx mock upstream, straight to the mock and through each gateway in front of it:
#   direct        the mock itself                                         (port 18500)
#   litellm       LiteLLM proxy, 1 worker, model "mock"                   (port 18501)
#   osprey        osprey serve --no-engine --upstream mock=…, local limits (port 18502)
#   osprey-redis  the same with --redis redis://127.0.0.1:6379            (port 18503)
#   osprey-traced osprey, exporting every span over OTLP to a local sink   (port 18504)
#   osprey-quiet  osprey with --no-metrics --no-request-log, no traces    (port 18505)
#                 (osprey-traced against osprey-quiet: what observability costs; not in the
#                 default TARGETS)
# Each mode ("json": the mock's instant chat.completion; "stream": its SSE body at /stream/v1, with
# "stream": true) starts fresh gateways pointed at the matching mock path. Runs interleave per rate
# (order reversed on every other run); LiteLLM gets its own lower rates, direct is measured at both
# lists. Per target and rate: achieved rate (2xx/s), success ratio (2xx / all), latency
# p50/p99/p99.9 of 2xx answers, added latency p50/p99 (gateway minus direct in the same run at the
# same rate, median over runs), gateway CPU per request; per target: maximum sustained rate
# (median run ≥ 99.9% ok, p99 < 100 ms, and ≥ MIN_RATE_FRACTION of the asked rate: without that a
# saturated gateway behind -c 64 shows bounded latency at a lower rate) and peak RSS (VmHWM summed
# over its processes). Medians of RUNS sweeps. Table on stdout and in $OUT/gateway-compare.md;
# JSON (summary + every point) in $OUT/gateway-compare.json.
# Usage: bash bench/gateway-compare.sh [runs=3]
#   env: RATES=500,1000,2000,3000,4000,5000  LITELLM_RATES=25,50,100,200  DURATION=10 (s per point)
#        MODES="json stream"  TARGETS="direct litellm osprey osprey-redis"  CONNS=64  PAUSE=1 (s)
#        REQ_TIMEOUT=10s  MIN_RATE_FRACTION=0.95  LATENCY_CORRECTION=0 (1: oha --latency-correction)
#        TRACED_ARGS="--otlp-sample 0.1" (more flags for osprey-traced)
#        SKIP_BUILD=1 (use the built binary as is)  OSPREY=<a binary> (default: the build's)  REDIS_URL=redis://127.0.0.1:6379  OUT=bench/results
# Needs: oha (cargo install oha --locked), nginx (../shared/peers/mock-upstream.sh installs it),
# the LiteLLM venv (../shared/peers/litellm.sh makes it), python3, curl; redis-server for
# osprey-redis if nothing answers on REDIS_URL. Osprey targets are skipped (with a note) while the
# binary lacks `serve --upstream`. Default run: ~2 × 3 × 26 points × 10 s ≈ 30 min. All load goes to
# 127.0.0.1; the load generator shares the 2 cores with the gateway and the mock.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-${RUNS:-3}}
RATES=${RATES:-500,1000,2000,3000,4000,5000}
LITELLM_RATES=${LITELLM_RATES:-25,50,100,200}
DURATION=${DURATION:-10}
MODES=${MODES:-json stream}
TARGETS=${TARGETS:-direct litellm osprey osprey-redis}
CONNS=${CONNS:-64}
PAUSE=${PAUSE:-1}
REQ_TIMEOUT=${REQ_TIMEOUT:-10s}
MIN_RATE_FRACTION=${MIN_RATE_FRACTION:-0.95}
LATENCY_CORRECTION=${LATENCY_CORRECTION:-0}
REDIS_URL=${REDIS_URL:-redis://127.0.0.1:6379}
TRACED_ARGS=${TRACED_ARGS:-}
OUT=${OUT:-bench/results}
MOCK_PORT=${MOCK_PORT:-18500} LITELLM_PORT=${LITELLM_PORT:-18501}
OSPREY_PORT=${OSPREY_PORT:-18502} OSPREY_REDIS_PORT=${OSPREY_REDIS_PORT:-18503}
OSPREY_TRACED_PORT=${OSPREY_TRACED_PORT:-18504} OSPREY_QUIET_PORT=${OSPREY_QUIET_PORT:-18505}
SINK_PORT=${SINK_PORT:-18506}
PEER_SCRIPTS=${PEER_SCRIPTS:-../shared/peers}
OHA=${OHA:-$(command -v oha || echo "$HOME/.cargo/bin/oha")}
[ -x "$OHA" ] || { echo "oha not found: cargo install oha --locked" >&2; exit 1; }
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
LOGS=$OUT/gateway-logs; mkdir -p "$LOGS"
WORK=$(mktemp -d /tmp/gateway-compare.XXXXXX)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/osprey-target}
OSPREY=${OSPREY:-$CARGO_TARGET_DIR/release/osprey}
has() { [[ " $TARGETS " == *" $1 "* ]]; }

STARTED=()   # pids this script started (and so stops)
OHA_PID=
cleanup() {
  [ -n "$OHA_PID" ] && kill "$OHA_PID" 2>/dev/null
  [ ${#STARTED[@]} -gt 0 ] && { kill "${STARTED[@]}" 2>/dev/null; for p in "${STARTED[@]}"; do
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done; done; }
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
stop() {  # stop PIDs started here and forget them
  local p q keep=()
  kill "$@" 2>/dev/null || true
  for p in "$@"; do for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done; done
  for q in "${STARTED[@]}"; do [[ " $* " == *" $q "* ]] || keep+=("$q"); done
  STARTED=("${keep[@]}")
}
port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
tree() { local p; echo "$1"; for p in $(pgrep -P "$1" 2>/dev/null); do tree "$p"; done; }
hwm_kib() { local s=0 p v; for p in $(tree "$1"); do
  v=$(awk '/^VmHWM/ {print $2}' "/proc/$p/status" 2>/dev/null || true); s=$((s + ${v:-0})); done; echo "$s"; }
rss_kib() { local s=0 p v; for p in $(tree "$1"); do
  v=$(awk '/^VmRSS/ {print $2}' "/proc/$p/status" 2>/dev/null || true); s=$((s + ${v:-0})); done; echo "$s"; }
cpu_ticks() { local s=0 p v; for p in $(tree "$1"); do   # utime + stime, fields 14-15 of stat
  v=$(sed 's/.*) //' "/proc/$p/stat" 2>/dev/null | awk '{print $12 + $13}' || true); s=$((s + ${v:-0})); done; echo "$s"; }

# --- what can run -------------------------------------------------------------------------------
declare -A SKIP=()
if has osprey || has osprey-redis || has osprey-traced || has osprey-quiet; then
  [ "${SKIP_BUILD:-0}" = 1 ] || cargo build --release -q
  if [ ! -x "$OSPREY" ]; then
    why="no binary at $OSPREY"
  elif ! "$OSPREY" serve --help 2>/dev/null | grep -q -- --upstream; then
    why="osprey serve has no --upstream yet"
  else why=; fi
  if [ -n "$why" ]; then for t in osprey osprey-redis osprey-traced osprey-quiet; do SKIP[$t]=$why; done
  elif has osprey-redis && ! "$OSPREY" serve --help | grep -q -- --redis; then
    SKIP[osprey-redis]="osprey serve has no --redis"
  fi
fi
REDIS_HOSTPORT=${REDIS_URL#redis://}; REDIS_HOSTPORT=${REDIS_HOSTPORT%%/*}; REDIS_HOSTPORT=${REDIS_HOSTPORT##*@}
REDIS_PORT=${REDIS_HOSTPORT##*:}
redis_up() { (exec 3<>"/dev/tcp/${REDIS_HOSTPORT%%:*}/$REDIS_PORT" && printf 'PING\r\n' >&3 &&
  read -r -t 2 l <&3 && [[ $l == +PONG* ]]) 2>/dev/null; }
if has osprey-redis && [ -z "${SKIP[osprey-redis]:-}" ] && ! redis_up; then
  if command -v redis-server >/dev/null; then
    redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --save '' --appendonly no \
      >"$LOGS/redis.log" 2>&1 &
    STARTED+=($!)
    for _ in $(seq 50); do redis_up && break; sleep 0.1; done
    redis_up || { echo "redis-server did not come up; see $LOGS/redis.log" >&2; exit 1; }
  else SKIP[osprey-redis]="nothing answers on $REDIS_URL and no redis-server"; fi
fi
ACTIVE=()
for t in direct litellm osprey osprey-redis osprey-traced osprey-quiet; do
  has "$t" || continue
  if [ -n "${SKIP[$t]:-}" ]; then echo "skipping $t: ${SKIP[$t]}" >&2; else ACTIVE+=("$t"); fi
done
for t in "${ACTIVE[@]}"; do
  case $t in litellm) p=$LITELLM_PORT;; osprey) p=$OSPREY_PORT;; osprey-redis) p=$OSPREY_REDIS_PORT;;
    osprey-traced) p=$OSPREY_TRACED_PORT;; osprey-quiet) p=$OSPREY_QUIET_PORT;; *) continue;; esac
  port_busy "$p" && { echo "port $p (for $t) is already in use; stop what listens there first" >&2; exit 1; }
done

# --- the mock upstream (reused if already up: it is stateless) --------------------------------
if curl -sf "http://127.0.0.1:$MOCK_PORT/v1/models" >/dev/null; then
  echo "reusing the mock upstream on port $MOCK_PORT" >&2
else
  STARTED+=("$(bash "$PEER_SCRIPTS/mock-upstream.sh" "$MOCK_PORT")")
fi

# --- a sink for osprey-traced's spans: an HTTP server that takes every POST and answers 200 ---
if has osprey-traced && [ -z "${SKIP[osprey-traced]:-}" ]; then
  python3 bench/otlp-sink.py "$SINK_PORT" >"$LOGS/otlp-sink.log" 2>&1 &
  STARTED+=($!)
fi

# --- per-target request set-up ------------------------------------------------------------------
declare -A URL=() AUTH=() PID=() RSS0=()
body() { if [ "$1" = stream ]; then
  echo '{"model":"mock","messages":[{"role":"user","content":"hi"}],"max_tokens":16,"stream":true}'
  else echo '{"model":"mock","messages":[{"role":"user","content":"hi"}],"max_tokens":16}'; fi; }
# check_answer MODE TARGET: one request by curl, the body must carry the mock's reply
check_answer() {
  local hdr=(-H 'Content-Type: application/json')
  [ -n "${AUTH[$2]:-}" ] && hdr+=(-H "Authorization: Bearer ${AUTH[$2]}")
  curl -s -m 30 "${hdr[@]}" -d "$(body "$1")" "${URL[$2]}" >"$WORK/check.out" || true
  python3 - "$1" "$WORK/check.out" <<'PY' || { echo "$2 ($1) gave a wrong answer: $(head -c 600 "$WORK/check.out")" >&2; return 1; }
import json, sys
mode, text = sys.argv[1], open(sys.argv[2]).read()
if mode == "json":
    ok = "fixed reply" in json.loads(text)["choices"][0]["message"]["content"]
else:
    data = [l[5:].strip() for l in text.splitlines() if l.startswith("data:")]
    content = "".join((json.loads(d)["choices"] or [{}])[0].get("delta", {}).get("content") or ""
                      for d in data[:-1])
    ok = data[-1] == "[DONE]" and content == "Hello! This is a fixed streamed reply."
sys.exit(0 if ok else 1)
PY
}
# oha_run MODE TARGET RATE SECONDS CONNS FILE [extra oha flags]: bounded fixed-rate load, JSON to FILE
oha_run() {
  local mode=$1 t=$2 rate=$3 secs=$4 conns=$5 file=$6; shift 6
  local hdr=(-T application/json)
  [ -n "${AUTH[$t]:-}" ] && hdr+=(-H "Authorization: Bearer ${AUTH[$t]}")
  timeout -k 5 $((secs + 60)) "$OHA" -q "$rate" -z "${secs}s" -c "$conns" -w -t "$REQ_TIMEOUT" \
    --no-tui --output-format json --stats-success-breakdown -m POST "${hdr[@]}" -d "$(body "$mode")" \
    "$@" "${URL[$t]}" >"$file" 2>"$file.err" &
  OHA_PID=$!; wait "$OHA_PID" || { OHA_PID=; echo "oha failed for $t at $rate req/s: $(head -c 300 "$file.err")" >&2; return 1; }
  OHA_PID=
}
wait_osprey() {  # PORT KEY PID LOG
  for _ in $(seq 300); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $2" "http://127.0.0.1:$1/v1/models")" = 200 ] && return 0
    kill -0 "$3" 2>/dev/null || break
    sleep 0.2
  done
  echo "osprey on port $1 did not come up; end of $4:" >&2; tail -20 "$4" >&2; exit 1
}
start_gateways() {  # MODE
  local mode=$1 base t port home log extra
  [ "$mode" = stream ] && base=http://127.0.0.1:$MOCK_PORT/stream/v1 || base=http://127.0.0.1:$MOCK_PORT/v1
  URL[direct]=$base/chat/completions
  for t in "${ACTIVE[@]}"; do case $t in
    litellm)
      PID[litellm]=$(bash "$PEER_SCRIPTS/litellm.sh" "$LITELLM_PORT" "$base" 1)
      STARTED+=("${PID[litellm]}")
      AUTH[litellm]=$(cat "/tmp/litellm-$LITELLM_PORT/master_key")
      URL[litellm]=http://127.0.0.1:$LITELLM_PORT/v1/chat/completions ;;
    osprey|osprey-redis|osprey-traced|osprey-quiet)
      case $t in
        osprey) port=$OSPREY_PORT; extra=() ;;
        osprey-redis) port=$OSPREY_REDIS_PORT; extra=(--redis "$REDIS_URL") ;;
        osprey-traced) port=$OSPREY_TRACED_PORT; extra=(--otlp-endpoint "http://127.0.0.1:$SINK_PORT" $TRACED_ARGS) ;;
        osprey-quiet) port=$OSPREY_QUIET_PORT; extra=(--no-metrics --no-request-log) ;;
      esac
      home=$WORK/home-$t-$mode; mkdir -p "$home"; log=$LOGS/$t-$mode.log
      AUTH[$t]=$(OSPREY_HOME=$home "$OSPREY" keys create --tenant bench --rpm 100000000 --tpm 100000000000 | tr -d '[:space:]')
      [ -n "${AUTH[$t]}" ] || { echo "osprey keys create printed no key" >&2; exit 1; }
      # Limits are checked on every request (key and tenant buckets) but set high enough never to bind.
      OSPREY_HOME=$home "$OSPREY" serve --no-engine --no-response-cache --port "$port" --upstream "mock=$base" "${extra[@]}" \
        --default-rpm 100000000 --default-tpm 100000000000 --default-max-concurrent 100000 \
        >"$log" 2>&1 &
      PID[$t]=$!; STARTED+=("${PID[$t]}")
      wait_osprey "$port" "${AUTH[$t]}" "${PID[$t]}" "$log"
      URL[$t]=http://127.0.0.1:$port/v1/chat/completions ;;
  esac; done
  for t in "${ACTIVE[@]}"; do
    check_answer "$mode" "$t" || exit 1
    oha_run "$mode" "$t" 50 3 8 "$WORK/warmup.json" || exit 1     # warm-up, not recorded
    [ -n "${PID[$t]:-}" ] && RSS0[$t]=$(rss_kib "${PID[$t]}")
  done
}

RATE_LIST=$(python3 -c "import sys; print(' '.join(str(r) for r in sorted({int(x) for x in sys.argv[1:] if x})))" \
  ${RATES//,/ } ${LITELLM_RATES//,/ })
in_list() { [[ ",$2," == *",$1,"* ]]; }
MANIFEST=$WORK/manifest.tsv; : >"$MANIFEST"
RSSFILE=$WORK/rss.tsv; : >"$RSSFILE"
EXTRA=(); [ "$LATENCY_CORRECTION" = 1 ] && EXTRA=(--latency-correction)
CLK_TCK=$(getconf CLK_TCK)
echo "gateway-compare: targets ${ACTIVE[*]}; modes $MODES; $RUNS runs; ${DURATION}s per point; -c $CONNS" >&2
for mode in $MODES; do
  start_gateways "$mode"
  for run in $(seq "$RUNS"); do
    for rate in $RATE_LIST; do
      order=()
      for t in "${ACTIVE[@]}"; do
        if [ "$t" = direct ]; then in_list "$rate" "$RATES,$LITELLM_RATES" || continue
        elif [ "$t" = litellm ]; then in_list "$rate" "$LITELLM_RATES" || continue
        else in_list "$rate" "$RATES" || continue; fi
        order+=("$t")
      done
      if [ $((run % 2)) = 0 ]; then rev=(); for ((i=${#order[@]}-1; i>=0; i--)); do rev+=("${order[$i]}"); done; order=("${rev[@]}"); fi
      for t in "${order[@]}"; do
        f=$WORK/$mode-$run-$t-$rate.json
        c0=0; [ -n "${PID[$t]:-}" ] && c0=$(cpu_ticks "${PID[$t]}")
        echo "  $mode run $run/$RUNS: $t at $rate req/s" >&2
        if oha_run "$mode" "$t" "$rate" "$DURATION" "$CONNS" "$f" "${EXTRA[@]}"; then
          c1=0; [ -n "${PID[$t]:-}" ] && c1=$(cpu_ticks "${PID[$t]}")
          printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$mode" "$run" "$t" "$rate" "$f" "$((c1 - c0))" >>"$MANIFEST"
        fi
        sleep "$PAUSE"
      done
    done
  done
  stopping=()
  for t in "${ACTIVE[@]}"; do
    [ -n "${PID[$t]:-}" ] || continue
    printf '%s\t%s\t%s\t%s\n' "$mode" "$t" "$(hwm_kib "${PID[$t]}")" "${RSS0[$t]}" >>"$RSSFILE"
    stopping+=("${PID[$t]}"); unset "PID[$t]"
  done
  [ ${#stopping[@]} -gt 0 ] && stop "${stopping[@]}"
done

# --- report -------------------------------------------------------------------------------------
META=$WORK/meta.json SKIPFILE=$WORK/skipped.tsv; : >"$SKIPFILE"
for t in "${!SKIP[@]}"; do printf '%s\t%s\n' "$t" "${SKIP[$t]}" >>"$SKIPFILE"; done
COMMAND="RATES=$RATES LITELLM_RATES=$LITELLM_RATES DURATION=$DURATION MODES='$MODES' TARGETS='$TARGETS' CONNS=$CONNS LATENCY_CORRECTION=$LATENCY_CORRECTION${TRACED_ARGS:+ TRACED_ARGS='$TRACED_ARGS'} bash bench/gateway-compare.sh $RUNS" \
OHA_VERSION=$("$OHA" --version | sed "s/^oha //") \
OHA_FLAGS="-q RATE -z ${DURATION}s -c $CONNS -w -t $REQ_TIMEOUT --no-tui --output-format json --stats-success-breakdown -m POST -T application/json${EXTRA[*]:+ ${EXTRA[*]}}" \
NGINX_VERSION=$(nginx -v 2>&1 | sed 's/.*\///') \
LITELLM_VERSION=$("${OSPREY_PEERS:-$HOME/.cache/osprey-peers}/litellm-venv/bin/python" -c \
  'import importlib.metadata as m; print(m.version("litellm"))' 2>/dev/null || echo '?') \
OSPREY_REV=$(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet HEAD 2>/dev/null || echo +dirty) \
TRACED_ARGS="$TRACED_ARGS" \
python3 - "$META" "$SKIPFILE" "$RUNS" "$DURATION" "$CONNS" "$MIN_RATE_FRACTION" "$RATES" "$LITELLM_RATES" <<'PY'
import json, os, sys, time
meta, skipfile, runs, dur, conns, frac, rates, lrates = sys.argv[1:9]
e = os.environ
json.dump({
    "command": e["COMMAND"], "oha": e["OHA_VERSION"], "oha_flags": e["OHA_FLAGS"], "nginx": e["NGINX_VERSION"],
    "litellm": e["LITELLM_VERSION"], "osprey_rev": e["OSPREY_REV"], "traced_args": e["TRACED_ARGS"],
    "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "host_cpus": os.cpu_count(),
    "loadavg_at_end": open("/proc/loadavg").read().split()[:3],
    "runs": int(runs), "duration_s": float(dur), "connections": int(conns), "min_rate_fraction": float(frac),
    "rates": [int(r) for r in rates.split(",") if r], "litellm_rates": [int(r) for r in lrates.split(",") if r],
    "skipped": dict(l.rstrip("\n").split("\t", 1) for l in open(skipfile) if l.strip()),
}, open(meta, "w"))
PY
python3 - "$MANIFEST" "$RSSFILE" "$META" "$OUT" "$CLK_TCK" <<'PY'
import json, statistics, sys, pathlib
manifest, rssfile, metafile, out, clk = sys.argv[1:6]
clk = int(clk)
meta = json.load(open(metafile))
min_frac = meta["min_rate_fraction"]
points = []
for line in open(manifest):
    mode, run, target, rate, f, ticks = line.rstrip("\n").split("\t")
    d = json.load(open(f))
    codes = {int(k): v for k, v in d["statusCodeDistribution"].items()}
    errors = d["errorDistribution"]
    ok = sum(v for k, v in codes.items() if 200 <= k < 300)
    total = sum(codes.values()) + sum(errors.values())
    lat = d["latencyPercentilesSuccessful"]
    ms = lambda k: None if lat.get(k) is None else lat[k] * 1000
    ok_n = max(ok, 1)
    points.append({
        "mode": mode, "run": int(run), "target": target, "rate": int(rate),
        "achieved_rps": ok / d["summary"]["total"], "success": ok / total if total else 0.0,
        "requests": total, "ok": ok,
        "non_2xx": {str(k): v for k, v in codes.items() if not 200 <= k < 300}, "errors": errors,
        "p50_ms": ms("p50"), "p99_ms": ms("p99"), "p999_ms": ms("p99.9"),
        "ttfb_p50_ms": (d["firstBytePercentiles"].get("p50") or 0) * 1000,
        "cpu_us_per_req": None if target == "direct" else int(ticks) / clk * 1e6 / ok_n,
    })
rss = {}
for line in open(rssfile):
    mode, target, hwm, rss0 = line.rstrip("\n").split("\t")
    rss[(mode, target)] = {"peak_rss_mib": int(hwm) / 1024, "rss_after_warmup_mib": int(rss0) / 1024}

def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None

summary, lines = [], []
lat = lambda x: "–" if x is None else (f"{x:.3f}" if abs(x) < 10 else f"{x:.1f}")
num = lambda x: "–" if x is None else f"{x:.0f}"
for mode in dict.fromkeys(p["mode"] for p in points):
    lines += [f"\n### mode {mode}\n",
              "| target | rate req/s | achieved req/s | ok % | p50 ms | p99 ms | p99.9 ms | added p50 ms | added p99 ms | CPU µs/req |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    direct = {(p["run"], p["rate"]): p for p in points if p["mode"] == mode and p["target"] == "direct"}
    per_target = {}
    for target in dict.fromkeys(p["target"] for p in points if p["mode"] == mode):
        rows = []
        for rate in sorted({p["rate"] for p in points if p["mode"] == mode and p["target"] == target}):
            ps = [p for p in points if p["mode"] == mode and p["target"] == target and p["rate"] == rate]
            add = lambda k: med([p[k] - direct[(p["run"], rate)][k] for p in ps
                                 if (p["run"], rate) in direct and p[k] is not None
                                 and direct[(p["run"], rate)][k] is not None])
            r = {"mode": mode, "target": target, "rate": rate, "runs": len(ps),
                 **{k: med([p[k] for p in ps]) for k in
                    ("achieved_rps", "success", "p50_ms", "p99_ms", "p999_ms", "ttfb_p50_ms", "cpu_us_per_req")},
                 "added_p50_ms": None if target == "direct" else add("p50_ms"),
                 "added_p99_ms": None if target == "direct" else add("p99_ms")}
            r["sustained"] = (r["success"] >= 0.999 and r["p99_ms"] is not None and r["p99_ms"] < 100
                              and r["achieved_rps"] >= min_frac * rate)
            rows.append(r); summary.append(r)
            lines.append(f"| {target} | {rate} | {r['achieved_rps']:.0f} | {100 * r['success']:.2f} | "
                         f"{lat(r['p50_ms'])} | {lat(r['p99_ms'])} | {lat(r['p999_ms'])} | "
                         f"{lat(r['added_p50_ms'])} | {lat(r['added_p99_ms'])} | {num(r['cpu_us_per_req'])} |")
        passing = [r["rate"] for r in rows if r["sustained"]]
        per_target[target] = {"max_sustained_rps": max(passing) if passing else None,
                              "highest_rate_tried": max(r["rate"] for r in rows),
                              **rss.get((mode, target), {})}
    lines += ["", "| target | max sustained req/s | peak RSS MiB | RSS after warm-up MiB |", "|---|---:|---:|---:|"]
    for target, s in per_target.items():
        m = s["max_sustained_rps"]
        ms_ = f"≥ {m}" if m is not None and m == s["highest_rate_tried"] else (str(m) if m is not None else "none")
        lines.append(f"| {target} | {ms_} | {num(s.get('peak_rss_mib'))} | {num(s.get('rss_after_warmup_mib'))} |")
    meta.setdefault("targets", {})[mode] = per_target
notes = [f"\nMedians of {meta['runs']} interleaved runs, {meta['duration_s']} s per point, oha {meta['oha']}: "
         f"`oha {meta['oha_flags']}`. Sustained = median run ≥ 99.9% 2xx, p99 < 100 ms, achieved ≥ "
         f"{min_frac:.0%} of the rate. Added = gateway − direct in the same run at the same rate.",
         f"Command: `{meta['command']}` at osprey {meta['osprey_rev']}, LiteLLM {meta['litellm']}, nginx {meta['nginx']}."]
notes += [f"Skipped {t}: {why}." for t, why in meta["skipped"].items()]
text = "\n".join(lines + notes)
print(text)
out = pathlib.Path(out)
(out / "gateway-compare.md").write_text(text + "\n")
json.dump({**meta, "summary": summary, "points": points}, open(out / "gateway-compare.json", "w"), indent=1)
print(f"\nwrote {out / 'gateway-compare.json'} and {out / 'gateway-compare.md'}", file=sys.stderr)
PY
