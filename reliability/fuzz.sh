#!/usr/bin/env bash
# Runs every fuzz target (fuzz/fuzz_targets; entry points in fuzz/src/lib.rs) for SECONDS each
# with cargo-fuzz on nightly, growing the kept corpus in fuzz/corpus/TARGET. Crashes, timeouts
# and out-of-memory inputs do not stop a run (libFuzzer's fork mode): they are left in
# fuzz/artifacts/TARGET/. Once one is fixed, copy it to fuzz/regressions/TARGET/: CI replays
# the corpus and the regressions through the same entry points (crates/osprey/tests/fuzz_corpus.rs).
# Prints a line per target and writes docs/results/fuzz.json.
#
# usage: reliability/fuzz.sh [SECONDS] [TARGET ...]      (default 120 s, every target)
# Not part of CI: the first build of the instrumented targets takes ~40 minutes on 2 cores.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT/fuzz"
SECONDS_EACH=${1:-120}
shift || true
TARGET_DIR=${OSPREY_FUZZ_TARGET_DIR:-$HOME/.cache/osprey-fuzz}
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || mapfile -t TARGETS < <(cargo +nightly fuzz list)
# No sanitizer: the code is safe Rust; what the fuzzers look for is panics, hangs and unbounded
# allocation, which libFuzzer catches itself (-timeout, -rss_limit_mb, -malloc_limit_mb).
FUZZ=(cargo +nightly fuzz run -s none --target-dir "$TARGET_DIR")
cargo +nightly fuzz build -s none --target-dir "$TARGET_DIR" >/dev/null
OUT=$ROOT/docs/results/fuzz.json
echo "[" > "$OUT.tmp"
for t in "${TARGETS[@]}"; do
  mkdir -p "corpus/$t" "artifacts/$t"
  before=$(ls "artifacts/$t" | wc -l)
  log=$(mktemp)
  start=$(date +%s)
  "${FUZZ[@]}" "$t" "corpus/$t" -- -fork=1 -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1 \
    -max_total_time="$SECONDS_EACH" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024 -max_len=65536 \
    -print_final_stats=1 >"$log" 2>&1 || true
  took=$(( $(date +%s) - start ))
  execs=$(grep -oE '^#[0-9]+' "$log" | tail -1 | tr -d '#')
  crashes=$(grep -cE 'deadly signal|panicked at|==ERROR|Timeout|out-of-memory' "$log" || true)
  found=$(( $(ls "artifacts/$t" | wc -l) - before ))
  corpus=$(ls "corpus/$t" | wc -l)
  printf '%-18s %5s s  %10s execs  corpus %5s  new artifacts %s\n' "$t" "$took" "${execs:-0}" "$corpus" "$found"
  [ "$found" -eq 0 ] || { echo "  artifacts in fuzz/artifacts/$t; the log: $log"; grep -m3 -E 'panicked at|ERROR' "$log" | sed 's/^/  /'; }
  printf '  {"target": "%s", "seconds": %s, "executions": %s, "corpus": %s, "new_artifacts": %s, "crash_lines": %s},\n' \
    "$t" "$took" "${execs:-0}" "$corpus" "$found" "$crashes" >> "$OUT.tmp"
done
sed '$ s/,$//' "$OUT.tmp" > "$OUT" && echo "]" >> "$OUT" && rm "$OUT.tmp"
echo "figures in $OUT"
