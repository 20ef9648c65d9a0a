#!/usr/bin/env bash
# What the test suite needs from outside PyPI, installed by the README's test command itself (so a fresh
# machine runs every test; nothing is skipped for want of a tool). Idempotent: a second run installs nothing.
#   Debian: chromium (the status page test), graphite-carbon + python3-whisper (StatsD -> carbon -> whisper),
#           redis-server (the response cache's redis tests start one on a free port)
#           prometheus (the Grafana dashboard's queries; its unit test uses promtool)
#   npm:    statsd 0.9.0, the reference StatsD daemon, into ~/.cache/triton_actor_test/npm
set -euo pipefail

SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi

debian_packages=(chromium graphite-carbon python3-whisper redis-server prometheus)
missing=()
for p in "${debian_packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "install_test_deps: apt-get install ${missing[*]}" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

NPM_DIR="${TRITON_ACTOR_TEST_CACHE:-$HOME/.cache/triton_actor_test}/npm"
if [ ! -f "$NPM_DIR/node_modules/statsd/stats.js" ]; then
  echo "install_test_deps: npm install statsd@0.9.0 into $NPM_DIR" >&2
  mkdir -p "$NPM_DIR"
  (cd "$NPM_DIR" && npm install --silent --no-audit --no-fund statsd@0.9.0 >/dev/null)
fi
echo "install_test_deps: ok" >&2
