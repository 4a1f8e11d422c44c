#!/usr/bin/env bash
# The test command: every test of the workspace (unit, transcript vectors, integration
# over real sockets against the spawned binary).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace --locked "$@"
