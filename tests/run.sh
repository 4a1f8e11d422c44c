#!/usr/bin/env bash
# The test command: every test of the workspace (unit, transcript vectors, integration
# over real sockets against the spawned binary), then the interop suite with the official
# MCP SDKs as hosts, and its reverse part: modern-only SDK hosts through the gateway to
# legacy SDK servers (installs its pinned peers into .cache/ and tests/interop/ts/ on first
# run; needs python3 and node; ends with the line "N passed, M failed"), then the official
# conformance suite against the fixture upstream, the gateway, and the gateway in front of a
# legacy (session-based) server (tests/conformance/run.sh:
# installs the pinned suite and a Node 22 into .cache/conformance; same closing line),
# then authorization end to end (tests/auth/run.py: oidc-provider, the modern server as
# OAuth resource server behind the gateway, both SDKs as hosts; same closing line).
# Right after the cargo tests, the chaos soak, 40 s per session store (tests/soak.sh: in
# memory, then on a throw-away Redis).
# Between the interop suite and conformance, the adapter test kit's third-party
# scoreboard (tests/kit/run.sh: `dualera vectors run` against the pinned mcp-remote;
# its failures are the score).
set -euo pipefail
cd "$(dirname "$0")/.."
# The real peers of the service-backed tests (Redis, HAProxy, PostgreSQL, Chromium),
# installed from Debian when missing.
bash tests/services/debian.sh
# The legacy servers the cargo tests spawn: the interop suite's mcp 1.30.0 venv and its
# pinned TypeScript SDK (tests/legacy_upstream.rs, tests/reverse_*.rs).
python3 tests/interop/run.py --prepare-legacy-peers
cargo test --workspace --locked --all-features "$@"
bash tests/soak.sh
python3 tests/interop/run.py
bash tests/kit/run.sh
bash tests/conformance/run.sh
python3 tests/auth/run.py
