"""Process helpers shared by the interop backends that start several processes of their
own (instances.py: two `dualera serve` on PostgreSQL; replicas.py: gateways sharing
Redis behind HAProxy): a free loopback port, and waiting for a line in a log."""

from __future__ import annotations

import socket
import subprocess
import time
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
