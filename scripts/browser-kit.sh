#!/usr/bin/env bash
# A real browser for the dashboard's tests: Debian's Chromium (installed with apt if missing)
# driven by playwright-core from the npm registry (installed under $OSPREY_HOME/browser-kit).
# Prints the playwright-core module's directory. Idempotent: a second run installs nothing.
set -euo pipefail
home="${OSPREY_HOME:-$HOME/.cache/osprey}"
kit="$home/browser-kit"
if [ ! -x /usr/bin/chromium ]; then
  echo "installing Debian's chromium (first run only)…" >&2
  export DEBIAN_FRONTEND=noninteractive
  sudo_=""
  [ "$(id -u)" -eq 0 ] || sudo_="sudo"
  $sudo_ apt-get update -qq >&2 || true
  $sudo_ apt-get install -y -qq --no-install-recommends chromium >&2
fi
if [ ! -d "$kit/node_modules/playwright-core" ]; then
  echo "installing playwright-core (first run only)…" >&2
  mkdir -p "$kit"
  (cd "$kit" && npm install --silent --no-audit --no-fund playwright-core@1 >&2)
fi
echo "$kit/node_modules/playwright-core"
