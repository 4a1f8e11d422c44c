#!/usr/bin/env bash
# The chaos soak (examples/soak.rs) as part of the test command, once per session
# store: in memory, then with gateways A and B keeping their Streamable HTTP sessions in
# a throw-away Redis (persistence off, loopback, a free port, stopped on exit). A short
# run of each, so that "the soak passes over both stores" is checked on every run and
# not only claimed; `cargo run --release --example soak -- --secs 120` is the long one
# (README, "Soak run"). The soak exits 1 when any of its checks fails.
#
# Usage: bash tests/soak.sh [SECS]   (default 40 per store)
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-40}"
target="${CARGO_TARGET_DIR:-target}"
# The binary with every part (the Redis store is a feature), and the soak beside it.
cargo build --locked --all-features --bin dualera --example soak
soak=("$target/debug/examples/soak" --no-build --secs "$secs" --sessions 10 --half-open 20)

echo "soak: in memory, ${secs} s" >&2
"${soak[@]}"

port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
dir="$(mktemp -d)"
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" \
  --protected-mode yes >"$dir/redis.log" 2>&1 &
redis=$!
trap 'kill "$redis" 2>/dev/null || true; wait "$redis" 2>/dev/null || true; rm -rf "$dir"' EXIT
for _ in $(seq 1 100); do
  [ "$(redis-cli -p "$port" ping 2>/dev/null)" = "PONG" ] && break
  sleep 0.1
done
[ "$(redis-cli -p "$port" ping 2>/dev/null)" = "PONG" ] || {
  echo "soak: redis-server did not answer on 127.0.0.1:$port" >&2
  cat "$dir/redis.log" >&2
  exit 1
}
echo "soak: Redis store (127.0.0.1:$port), ${secs} s" >&2
"${soak[@]}" --session-store "redis://127.0.0.1:$port/0"
