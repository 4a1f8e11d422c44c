#!/usr/bin/env bash
# A binary built without a part refuses, at start, a configuration or command that
# needs it, naming the feature to rebuild with. Usage: .ci/parts_refused.sh BINARY
# FEATURE… (the features BINARY was built without; each has one check below).
set -uo pipefail
bin="$1"
shift
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
status=0
expect() { # feature, then the command; the command must fail with the message
    local feature="$1"
    shift
    local out
    out="$(timeout 60 "$@" 2>&1 </dev/null)"
    local code=$?
    local want="this dualera was built without the \`$feature\` feature; rebuild with \`--features $feature\`"
    if [ "$code" -eq 0 ] || [[ "$out" != *"$want"* ]]; then
        echo "parts_refused: $feature: exit $code, output: $out"
        status=1
    else
        echo "parts_refused: $feature: refused ($code)"
    fi
}
for feature in "$@"; do
    case "$feature" in
    redis) expect redis "$bin" gateway --upstream http://127.0.0.1:9/mcp \
        --listen 127.0.0.1:0 --session-store redis://127.0.0.1:6379/0 ;;
    postgres) expect postgres env DUALERA_STORE_URL=postgres://u@127.0.0.1:9/db \
        "$bin" serve --listen 127.0.0.1:0 ;;
    kit) expect kit "$bin" vectors list ;;
    tls) expect tls "$bin" up --dir "$work/demo" --listen 127.0.0.1:0 \
        --admin 127.0.0.1:0 --tls ;;
    sqlite) printf '[report]\npath = "%s/report.db"\n' "$work" >"$work/report.toml"
        expect sqlite "$bin" gateway --upstream http://127.0.0.1:9/mcp \
        --listen 127.0.0.1:0 --config "$work/report.toml" ;;
    *) echo "parts_refused: no check for $feature"; status=1 ;;
    esac
done
exit $status
