#!/usr/bin/env bash
# Schemathesis against a live `osprey serve`, driven by the server's own OpenAPI document
# (GET /openapi.json, generated from the handlers: crates/osprey-gateway/src/openapi.rs).
#
# 1. Starts `osprey serve` on a free port with a temporary SQLite store and $OSPREY_HOME (its
#    models/ linked to the real one, so nothing is fetched twice), an admin key, and a config
#    capping every tenant at ST_MAX_TOKENS output tokens (generation with the real model is
#    slow; the cap is the server's own tenant setting, so the schema stays honest) and the
#    context window at ST_MAX_MODEL_LEN (the dashboard's playground is not capped by tenant).
# 2. Makes a tenant key through the admin API, and gives schemathesis both keys, each for its
#    security scheme (`api_key` for /v1, `admin_key` for /admin).
# 3. Runs `st run` with the checks in ST_CHECKS, ST_MAX_EXAMPLES cases per operation, then
#    stops the server and prints one line: operations, test cases, failures.
# The full output stays in the work dir (st.log, server.log, the JUnit report).
#
# usage: reliability/schemathesis.sh [extra `st run` arguments]
# env:   OSPREY_BIN (~/.cache/osprey-release/release/osprey), ST (st on PATH, else /tmp/st/bin/st;
#        installed into /tmp/st with pip if neither exists), ST_MAX_EXAMPLES (10),
#        ST_CHECKS (not_a_server_error,status_code_conformance,content_type_conformance,
#        response_headers_conformance,response_schema_conformance), ST_MAX_TOKENS (8),
#        ST_MAX_MODEL_LEN (512), ST_WORKERS (2), ST_SEED (1),
#        OSPREY_MODELS_HOME (where models/ is kept: $OSPREY_HOME or ~/.cache/osprey)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${OSPREY_BIN:-$HOME/.cache/osprey-release/release/osprey}
MAX_EXAMPLES=${ST_MAX_EXAMPLES:-10}
CHECKS=${ST_CHECKS:-not_a_server_error,status_code_conformance,content_type_conformance,response_headers_conformance,response_schema_conformance}
MAX_TOKENS=${ST_MAX_TOKENS:-8}
MAX_MODEL_LEN=${ST_MAX_MODEL_LEN:-512}
WORKERS=${ST_WORKERS:-2}
SEED=${ST_SEED:-1}
MODELS_HOME=${OSPREY_MODELS_HOME:-${OSPREY_HOME:-$HOME/.cache/osprey}}

[ -x "$BIN" ] || { echo "no osprey binary at $BIN (set OSPREY_BIN)" >&2; exit 2; }
ST=${ST:-$(command -v st || echo /tmp/st/bin/st)}
if [ ! -x "$ST" ]; then
  python3 -m venv /tmp/st && /tmp/st/bin/pip install -q schemathesis
  ST=/tmp/st/bin/st
fi
WORK=$(mktemp -d /tmp/osprey-schemathesis.XXXXXX)
SERVER_PID=
cleanup() {
  [ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null && wait "$SERVER_PID" 2>/dev/null
  rm -rf "$WORK/home"
}
trap cleanup EXIT
log() { echo "[schemathesis $(date +%T)] $*" >&2; }
log "work dir $WORK; $("$ST" --version)"

mkdir -p "$MODELS_HOME/models" "$WORK/home"
ln -s "$MODELS_HOME/models" "$WORK/home/models"
export OSPREY_HOME=$WORK/home
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
URL=http://127.0.0.1:$PORT
ADMIN=st-admin-$RANDOM$RANDOM
cat >"$WORK/osprey.toml" <<EOF
[tenants.default]
max_tokens = $MAX_TOKENS
[tenants.schemathesis]
max_tokens = $MAX_TOKENS
EOF

log "starting $BIN on $URL"
"$BIN" serve --port "$PORT" --store "sqlite://$WORK/osprey.db" --admin-key "$ADMIN" \
  --config "$WORK/osprey.toml" --max-model-len "$MAX_MODEL_LEN" >"$WORK/server.log" 2>&1 &
SERVER_PID=$!
for _ in $(seq 600); do
  curl -sf "$URL/ready" >/dev/null 2>&1 && break
  kill -0 "$SERVER_PID" 2>/dev/null || { tail -20 "$WORK/server.log" >&2; exit 1; }
  sleep 0.5
done
curl -sf "$URL/ready" >/dev/null || { echo "server not ready" >&2; exit 1; }
KEY=$(curl -sf "$URL/admin/keys" -H "authorization: Bearer $ADMIN" -H 'content-type: application/json' \
  -d '{"tenant": "schemathesis", "name": "schemathesis"}' \
  | python3 -c 'import json,sys; print(json.load(sys.stdin)["key"])')
cat >"$WORK/schemathesis.toml" <<EOF
[auth.openapi.api_key]
bearer = "$KEY"
[auth.openapi.admin_key]
bearer = "$ADMIN"
EOF

log "st run: checks $CHECKS, $MAX_EXAMPLES examples an operation"
set +e
# From the work dir: st keeps its cache (.schemathesis/) where it runs.
(cd "$WORK" && "$ST" --no-color --config-file "$WORK/schemathesis.toml" run "$URL/openapi.json" \
  --checks "$CHECKS" --max-examples "$MAX_EXAMPLES" --workers "$WORKERS" --seed "$SEED" \
  --request-timeout 120 --report junit --report-dir "$WORK" "$@") >"$WORK/st.log" 2>&1
status=$?
set -e
tail -40 "$WORK/st.log" >&2
python3 - "$WORK" "$status" <<'EOF'
import glob, re, sys, xml.etree.ElementTree as ET
work, status = sys.argv[1], int(sys.argv[2])
log = open(f"{work}/st.log").read()
ops = re.search(r"(\d+) operations? (?:tested|selected)", log) or re.search(r"Operations:\s+(\d+)", log)
cases = re.search(r"Test cases:\s+(\d+)", log) or re.search(r"(\d+) (?:test cases|generated)", log)
failures = 0
for junit in glob.glob(f"{work}/**/*.xml", recursive=True):
    root = ET.parse(junit).getroot()
    failures += sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in root.iter("testsuite"))
print(f"schemathesis: {ops.group(1) if ops else '?'} operations, {cases.group(1) if cases else '?'} "
      f"test cases, {failures} failing operations (st exit {status}); log {work}/st.log")
EOF
exit "$status"
