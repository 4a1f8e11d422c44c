"""Replicas behind a load balancer, for the interop suite's `*/replicas` columns.

`Replicas` stands where `run.Dualera` stands (same attributes: url, upstream, workspace,
repo, db, notes(), upstream_call(), log_tail(), stop()): a private `redis-server`
(persistence off) and HAProxy (round-robin, no stickiness) on free loopback ports, in
front of three `dualera gateway --session-store redis://…` processes sharing that Redis
and one `dualera serve --demo`. Both come from Debian (tests/services/debian.sh); a
missing one fails the case.

`spread()` reads the gateways' logs afterwards: which replica served each request of
each session, in time order, so a case can assert that consecutive requests of one
session landed on different replicas.
"""

from __future__ import annotations

import os
import queue
import re
import shutil
import socket
import sqlite3
import subprocess
import time
import urllib.request
from pathlib import Path

from procs import free_port, modern_call, wait_line

REPLICAS = 3
# What a gateway logs once per request it serves of a shared session.
SERVED = re.compile(r"^(\S+)\s+INFO\s.*?(legacy session opened|legacy request served|legacy message served|"
                    r"standalone stream opened|stream resumed).*?session=(\w+).*?replica=(\S+)")


def program(name: str) -> str:
    for d in ("/usr/bin", "/usr/sbin", "/usr/local/bin", "/usr/local/sbin"):
        p = Path(d) / name
        if p.exists():
            return str(p)
    raise RuntimeError(f"{name} is not installed: run `bash tests/services/debian.sh redis-server haproxy`")


def wait_port(port: int, what: str, proc: subprocess.Popen, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not listen on port {port}")
            time.sleep(0.02)


class Replicas:
    def __init__(self, binary: Path, workdir: Path):
        self.dir = workdir / "demo"
        self.workdir = workdir
        self.procs: list[subprocess.Popen] = []
        self.gateway_logs: list[Path] = []
        self.log_path = workdir / "serve.log"
        try:
            self._start(binary)
        except Exception:
            self.stop()
            raise

    def _spawn(self, args: list[str], log: Path, env: dict | None = None) -> subprocess.Popen:
        out = open(log, "w")
        p = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             env=env or os.environ.copy())
        out.close()
        self.procs.append(p)
        return p

    def _start(self, binary: Path) -> None:
        self.redis_port = free_port()
        redis_dir = self.workdir / "redis"
        redis_dir.mkdir()
        redis = self._spawn([program("redis-server"), "--port", str(self.redis_port), "--bind", "127.0.0.1",
                             "--save", "", "--appendonly", "no", "--dir", str(redis_dir)],
                            self.workdir / "redis.log")
        wait_port(self.redis_port, "redis-server", redis)
        env = dict(os.environ, DUALERA_LOG="info", NO_COLOR="1")
        serve = self._spawn([str(binary), "serve", "--demo", str(self.dir), "--listen", "127.0.0.1:0"],
                            self.log_path, env)
        line = wait_line(self.log_path, "modern server listening on", serve)
        self.upstream = line.split()[-1]
        demo = wait_line(self.log_path, "demo workspace", serve)
        m = re.search(r"demo workspace (\S+) and repository (.+)$", demo)
        self.workspace, self.repo = m.group(1), m.group(2).strip()
        self.db = self.dir / "dualera.db"
        store = f"redis://127.0.0.1:{self.redis_port}/0"
        env = dict(os.environ, DUALERA_LOG="info,dualera_gateway::store::redis=debug", NO_COLOR="1")
        backends = []
        for i in range(REPLICAS):
            log = self.workdir / f"gateway-{i}.log"
            self.gateway_logs.append(log)
            g = self._spawn([str(binary), "gateway", "--upstream", self.upstream, "--listen", "127.0.0.1:0",
                             "--session-store", store], log, env)
            backends.append(wait_line(log, "gateway listening on", g).split()[-1]
                            .removeprefix("http://").removesuffix("/mcp"))
        port = free_port()
        cfg = self.workdir / "haproxy.cfg"
        cfg.write_text(
            "global\n  maxconn 4096\n\ndefaults\n  mode http\n  timeout connect 2s\n  timeout client 120s\n"
            "  timeout server 120s\n  option redispatch\n  retries 3\n\n"
            f"frontend mcp\n  bind 127.0.0.1:{port}\n  default_backend gateways\n\n"
            "backend gateways\n  balance roundrobin\n"
            + "".join(f"  server g{i} {b} check inter 300ms fall 1 rise 2\n" for i, b in enumerate(backends)))
        lb = self._spawn([program("haproxy"), "-db", "-f", str(cfg)], self.workdir / "haproxy.log")
        wait_port(port, "haproxy", lb)
        self.url = f"http://127.0.0.1:{port}/mcp"

    def notes(self) -> dict[str, dict[str, str]]:
        con = sqlite3.connect(str(self.db), timeout=10)
        try:
            rows = con.execute("SELECT id, workspace, title, body FROM notes ORDER BY id").fetchall()
        finally:
            con.close()
        return {f"note-{r[0]}": {"workspace": r[1], "title": r[2], "body": r[3]} for r in rows}

    def upstream_call(self, method: str, params: dict | None = None) -> dict:
        """A raw 2026-07-28 request straight to the modern server (the reference answer)."""
        return modern_call(self.upstream, method, params)

    def spread(self) -> dict[str, list[str]]:
        """Session id -> the replicas that served its requests, in time order."""
        events = []
        for log in self.gateway_logs:
            for line in log.read_text(errors="replace").splitlines():
                m = SERVED.match(line)
                if m:
                    events.append((m.group(1), m.group(3), m.group(4)))
        events.sort()
        out: dict[str, list[str]] = {}
        for _, sid, replica in events:
            out.setdefault(sid, []).append(replica)
        return out

    def log_tail(self, n: int = 80) -> str:
        parts = []
        for log in [self.log_path, *self.gateway_logs]:
            if log.exists():
                lines = log.read_text(errors="replace").splitlines()[-(n // 4):]
                parts.append(f"[{log.name}]\n" + "\n".join(lines))
        return "\n".join(parts)

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        shutil.rmtree(self.workdir / "redis", ignore_errors=True)
