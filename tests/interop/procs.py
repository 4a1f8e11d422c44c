"""Process helpers shared by the interop backends that start several processes of their
own (instances.py: two `dualera serve` on PostgreSQL; replicas.py: gateways sharing
Redis behind HAProxy): a free loopback port, waiting for a line in a log, a raw request to a modern
server."""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_line(path: Path, pattern: str, proc: subprocess.Popen, timeout: float = 60) -> str:
    """The first line of the log at `path` containing `pattern`; fails when `proc` exits
    first or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in path.read_text(errors="replace").splitlines():
            if pattern in line:
                return line
        if proc.poll() is not None:
            break
        time.sleep(0.02)
    raise RuntimeError(f"{proc.args[:2]} did not print {pattern!r}:\n{path.read_text(errors='replace')[-3000:]}")


def modern_call(url: str, method: str, params: dict | None = None) -> dict:
    """A raw 2026-07-28 request straight to a modern server at `url` (the reference
    answer a scenario compares the gateway's with)."""
    params = dict(params or {})
    params["_meta"] = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                       "io.modelcontextprotocol/clientCapabilities": {}}
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).encode()
    req = urllib.request.Request(url, data=body, method="POST", headers={
        "Content-Type": "application/json", "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2026-07-28", "Mcp-Method": method})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read().decode())
