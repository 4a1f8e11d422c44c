#!/usr/bin/env python3
"""Interop suite: real hosts built on the official MCP SDKs, through dualera.

Clients (installed by this script, pinned, into .cache/interop/ and tests/interop/ts/node_modules),
one column per SDK x wire:
  python-legacy            mcp==1.30.0 (2025-11-25)   ClientSession over streamablehttp_client
  typescript-legacy        @modelcontextprotocol/sdk@1.32.2 (2025-11-25)  Client over StreamableHTTPClientTransport
  python-modern            mcp==2.3.0 (2026-07-28)    mcp.Client, pass-through, drives input_required itself
  python-legacy/sse        mcp==1.30.0, sse_client on the gateway's /sse (2024-11-05 HTTP+SSE)
  python-legacy/stdio      mcp==1.30.0, stdio_client spawning `dualera gateway --stdio --upstream <modern server>`
  typescript-legacy/sse    sdk 1.32.2, SSEClientTransport on /sse
  typescript-legacy/stdio  sdk 1.32.2, StdioClientTransport spawning `dualera gateway --stdio ...`
  python-legacy/tls        mcp==1.30.0, streamablehttp_client on https:// (`dualera up --tls`), httpx
                           verifying against the throw-away CA the gateway printed
  typescript-legacy/tls    sdk 1.32.2, StreamableHTTPClientTransport on https://, NODE_EXTRA_CA_CERTS=<that CA>
  python-legacy/instances, typescript-legacy/instances
                           the same clients against one gateway in front of two `dualera serve`
                           instances on one PostgreSQL (tests/interop/instances.py)
The sse, stdio, tls and instances columns run scenarios 2-4 (the elicitation and sampling rounds;
`--all-scenarios` runs all eight there too); the drivers and the expectations are the same
code for every wire. For the stdio columns the tap records the stdio gateway's upstream hop.
The instances columns also check, from the instances' logs, that every
round's retry went to the other instance; in scenario 3 one instance is killed (SIGKILL)
at the driver's after_decline checkpoint, and the rest of the scenario runs on the survivor.

Then the reverse part (tests/interop/reverse.py): modern-only hosts (mcp 2.3.0 pinned to
2026-07-28, @modelcontextprotocol/client 2.4.0 pinned) through `dualera gateway` to legacy
servers built on the TypeScript SDK 1.32.2 and mcp 1.30.0 over Streamable HTTP, stdio and
HTTP+SSE, checked from the hosts and from the servers' own records.

Every (client, scenario) case runs against its own freshly started `dualera up --dir <tmp>`
(gateway + modern server on free loopback ports, the demo workspace seeded with three notes
titled "TPS report") and is checked on what the client saw *and* on the notes store
(<tmp>/dualera.db, read with sqlite3), including store snapshots taken at checkpoints the
driver announces mid-scenario. A missing or broken peer fails its cases; nothing is skipped.

Usage: python3 tests/interop/run.py [--client NAME]... [--scenario NAME]... [--all-scenarios] [--keep] [--direct]
       [--reverse | --only-reverse] [--reverse-column NAME]...
Env:   DUALERA_BIN=path  use this binary instead of `cargo build --locked --features full --bin dualera`.
The last line printed is `N passed, M failed`; the exit status is 0 only when M is 0.
Standard library only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import queue
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.error
import urllib.request
from urllib.parse import urlsplit, urlunsplit
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
from wiretap import Wiretap  # noqa: E402
from instances import Instances  # noqa: E402
from replicas import Replicas  # noqa: E402

from procs import modern_call  # beside this file
import reverse  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CACHE = ROOT / ".cache" / "interop"
TS_DIR = HERE / "ts"
BROWSER_DIR = HERE / "browser"
ARTIFACTS = CACHE / "artifacts"

MODERN_VERSION = "2026-07-28"
LEGACY_VERSION = "2025-11-25"
TOOLS = {"notes_create", "notes_list", "notes_delete", "summarize_repo"}
TPS = "TPS report"
CASE_TIMEOUT = 90.0  # seconds for one driver run
LOG_TAIL = 80  # gateway log lines printed for a failing case
TRANSCRIPT_TAIL = 150  # client <-> gateway transcript lines printed for a failing case


# ---------------------------------------------------------------------------------------
# Peers


class PeerError(Exception):
    """A peer could not be installed or does not run: its cases fail."""


def sha256(*parts: bytes) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p)
        h.update(b"\0")
    return h.hexdigest()


def run_quiet(cmd: list[str], cwd: Path | None = None, timeout: float = 600) -> str:
    p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise PeerError(f"`{' '.join(cmd)}` exited {p.returncode}:\n{(p.stdout + p.stderr)[-3000:]}")
    return p.stdout


def ensure_venv(name: str, requirements: Path, package: str, version: str) -> list[str]:
    """A venv under .cache/interop with exactly `requirements` installed; its python."""
    venv = CACHE / f"venv-{name}"
    python = venv / "bin" / "python"
    stamp_file = venv / ".dualera-stamp"
    stamp = sha256(requirements.read_bytes(), sys.version.encode(), sys.executable.encode())
    if not (stamp_file.exists() and stamp_file.read_text() == stamp and python.exists()):
        print(f"  installing {package}=={version} into {venv.relative_to(ROOT)} ...", flush=True)
        shutil.rmtree(venv, ignore_errors=True)
        run_quiet([sys.executable, "-m", "venv", str(venv)])
        run_quiet([str(python), "-m", "pip", "install", "--disable-pip-version-check", "--no-input",
                   "-q", "-r", str(requirements)])
        stamp_file.write_text(stamp)
    got = run_quiet([str(python), "-c",
                     f"import importlib.metadata as m; print(m.version({package!r}))"]).strip()
    if got != version:
        raise PeerError(f"{venv} has {package} {got}, expected {version}")
    return [str(python)]


def ensure_ts() -> list[str]:
    node = shutil.which("node")
    npm = shutil.which("npm")
    if not node or not npm:
        raise PeerError("node and npm are required for the TypeScript peer (Node 18 or newer)")
    node_version = run_quiet([node, "--version"]).strip()
    if int(node_version.lstrip("v").split(".")[0]) < 18:
        raise PeerError(f"Node {node_version} is too old for @modelcontextprotocol/sdk (needs 18+)")
    lock = TS_DIR / "package-lock.json"
    stamp_file = TS_DIR / "node_modules" / ".dualera-stamp"
    stamp = sha256(lock.read_bytes(), (TS_DIR / "package.json").read_bytes(), node_version.encode())
    if not (stamp_file.exists() and stamp_file.read_text() == stamp):
        print("  installing @modelcontextprotocol/sdk and /client with npm ci ...", flush=True)
        run_quiet([npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=TS_DIR)
        stamp_file.write_text(stamp)
    for name, version in (("sdk", "1.32.2"), ("client", "2.4.0")):
        pkg = json.loads((TS_DIR / f"node_modules/@modelcontextprotocol/{name}/package.json").read_text())
        if pkg["version"] != version:
            raise PeerError(f"node_modules has @modelcontextprotocol/{name} {pkg['version']}, expected {version}")
    return [node]


@dataclass
class Peer:
    """One pinned SDK and the driver script built on it; installed once per run."""
    label: str
    install: Callable[[], list[str]]
    script: Path
    command: list[str] | None = None
    error: str | None = None
    tried: bool = False

    def ensure(self) -> None:
        if self.tried:
            return
        self.tried = True
        try:
            self.command = self.install()
        except Exception as e:  # noqa: BLE001 - a missing peer fails its cases, never skips
            self.error = str(e)


PY_LEGACY = Peer("mcp 1.30.0",
                 lambda: ensure_venv("mcp-1.30.0", HERE / "py" / "requirements-legacy.txt", "mcp", "1.30.0"),
                 HERE / "py" / "legacy_client.py")
TS_LEGACY = Peer("sdk 1.32.2", ensure_ts, TS_DIR / "client.mjs")
PY_MODERN = Peer("mcp 2.3.0",
                 lambda: ensure_venv("mcp-2.3.0", HERE / "py" / "requirements-modern.txt", "mcp", "2.3.0"),
                 HERE / "py" / "modern_client.py")
# The operating checks' peers: the official Python Prometheus client's parsers, and
# the Debian Chromium driven by playwright-core (pinned in tests/interop/browser).
PROM = Peer("prometheus_client 0.26.0",
            lambda: ensure_venv("prometheus-client-0.26.0", HERE / "py" / "requirements-ops.txt",
                                "prometheus_client", "0.26.0"),
            HERE / "py" / "parse_metrics.py")


def ensure_browser() -> list[str]:
    chromium = Path("/usr/bin/chromium")
    if not chromium.exists():
        raise PeerError("/usr/bin/chromium is missing: run `bash tests/services/debian.sh chromium`")
    node = shutil.which("node")
    npm = shutil.which("npm")
    if not node or not npm:
        raise PeerError("node and npm are required for playwright-core (Node 20 or newer)")
    node_version = run_quiet([node, "--version"]).strip()
    if int(node_version.lstrip("v").split(".")[0]) < 20:
        raise PeerError(f"Node {node_version} is too old for playwright-core (needs 20+)")
    lock = BROWSER_DIR / "package-lock.json"
    stamp_file = BROWSER_DIR / "node_modules" / ".dualera-stamp"
    stamp = sha256(lock.read_bytes(), (BROWSER_DIR / "package.json").read_bytes(), node_version.encode())
    if not (stamp_file.exists() and stamp_file.read_text() == stamp):
        print("  installing playwright-core with npm ci ...", flush=True)
        run_quiet([npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=BROWSER_DIR)
        stamp_file.write_text(stamp)
    pkg = json.loads((BROWSER_DIR / "node_modules/playwright-core/package.json").read_text())
    if pkg["version"] != "1.65.1":
        raise PeerError(f"node_modules has playwright-core {pkg['version']}, expected 1.65.1")
    run_quiet([str(chromium), "--version"])
    return [node]


BROWSER = Peer("playwright-core 1.65.1 + Debian chromium", ensure_browser, HERE / "browser" / "report.mjs")

# Wires (the driver's cfg["wire"]): how the client reaches the gateway.
HTTP, SSE, STDIO = "streamable-http", "sse", "stdio"
# What the sse and stdio columns run: scenarios 2-4.
ROUND_SCENARIOS = ("delete_accept", "delete_decline_cancel", "summarize", "sibling_failure")
# The instances columns: (scenario, checkpoint) at which the second instance is killed.
KILL_AT = {"delete_decline_cancel": "after_decline"}
# What the replicas columns run: 2-4 and the two interleaved sessions (8).
REPLICA_SCENARIOS = ("delete_accept", "delete_decline_cancel", "summarize", "interleave", "tasks")


@dataclass
class ClientKind:
    """A column of the table: one peer over one wire."""
    name: str
    peer: Peer
    era: str  # "legacy" or "modern"
    wire: str
    scenarios: tuple[str, ...] | None = None  # None: every scenario
    # "up": one `dualera up`; "replicas": three gateways sharing Redis behind HAProxy.
    backend: str = "up"
    tls: bool = False  # the gateway on https:// (`dualera up --tls`), the client trusting its CA
    # "up": one `dualera up`; "instances": a gateway in front of two instances on PostgreSQL.
    backend: str = "up"

    @property
    def label(self) -> str:
        return self.peer.label

    @property
    def wire_label(self) -> str:
        if self.era == "modern":
            return "pass-through"
        if self.backend == "instances":
            return "2 instances, postgres"
        if self.backend == "replicas":
            return "3 replicas + haproxy"
        label = {HTTP: "streamable http", SSE: "http+sse 2024-11-05", STDIO: "stdio"}[self.wire]
        return f"{label} + TLS" if self.tls else label

    def runs(self, scenario: str) -> bool:
        return self.scenarios is None or scenario in self.scenarios


CLIENTS = [
    ClientKind("python-legacy", PY_LEGACY, "legacy", HTTP),
    ClientKind("typescript-legacy", TS_LEGACY, "legacy", HTTP),
    ClientKind("python-modern", PY_MODERN, "modern", HTTP),
    ClientKind("python-legacy/sse", PY_LEGACY, "legacy", SSE, ROUND_SCENARIOS),
    ClientKind("python-legacy/stdio", PY_LEGACY, "legacy", STDIO, ROUND_SCENARIOS),
    ClientKind("typescript-legacy/sse", TS_LEGACY, "legacy", SSE, ROUND_SCENARIOS),
    ClientKind("typescript-legacy/stdio", TS_LEGACY, "legacy", STDIO, ROUND_SCENARIOS),
    ClientKind("python-legacy/tls", PY_LEGACY, "legacy", HTTP, ROUND_SCENARIOS, tls=True),
    ClientKind("typescript-legacy/tls", TS_LEGACY, "legacy", HTTP, ROUND_SCENARIOS, tls=True),
    ClientKind("python-legacy/instances", PY_LEGACY, "legacy", HTTP, ROUND_SCENARIOS, backend="instances"),
    ClientKind("typescript-legacy/instances", TS_LEGACY, "legacy", HTTP, ROUND_SCENARIOS, backend="instances"),
    ClientKind("python-legacy/replicas", PY_LEGACY, "legacy", HTTP, REPLICA_SCENARIOS, backend="replicas"),
    ClientKind("typescript-legacy/replicas", TS_LEGACY, "legacy", HTTP, REPLICA_SCENARIOS, backend="replicas"),
]


def target_dir() -> Path:
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    return target if target.is_absolute() else ROOT / target


def build_binary() -> Path:
    if os.environ.get("DUALERA_BIN"):
        return Path(os.environ["DUALERA_BIN"]).resolve()
    subprocess.run(["cargo", "build", "--locked", "--quiet", "--features", "full", "--bin", "dualera"], cwd=ROOT, check=True)
    return target_dir() / "debug" / "dualera"


def build_fixture() -> Path:
    """The conformance fixture upstream (examples/conformance_upstream.rs), for rounds
    the notes server cannot produce (several input requests in one round)."""
    if os.environ.get("DUALERA_FIXTURE_BIN"):
        return Path(os.environ["DUALERA_FIXTURE_BIN"]).resolve()
    subprocess.run(["cargo", "build", "--locked", "--quiet", "--features", "full", "--example", "conformance_upstream"],
                   cwd=ROOT, check=True)
    return target_dir() / "debug" / "examples" / "conformance_upstream"


# ---------------------------------------------------------------------------------------
# One running `dualera up`


def reader_thread(stream, q: queue.Queue) -> threading.Thread:
    def pump():
        for line in iter(stream.readline, ""):
            q.put(line)
        q.put(None)

    t = threading.Thread(target=pump, daemon=True)
    t.start()
    return t


def next_line(q: queue.Queue, deadline: float) -> str | None:
    """The next line a reader_thread queued, or None at EOF or past `deadline`."""
    try:
        return q.get(timeout=max(0.1, deadline - time.monotonic()))
    except queue.Empty:
        return None


def stop_process(proc: subprocess.Popen) -> None:
    """SIGTERM, up to 10 s to exit, then SIGKILL."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Dualera:
    def __init__(self, binary: Path, workdir: Path, tls: bool = False):
        self.dir = workdir / "demo"
        self.log_path = workdir / "dualera.log"
        self.log = open(self.log_path, "w")
        env = dict(os.environ, DUALERA_LOG="debug,dualera::wire=trace", NO_COLOR="1")
        self.proc = subprocess.Popen(
            [str(binary), "up", "--dir", str(self.dir), "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0",
             *(["--tls"] if tls else [])],
            stdout=subprocess.PIPE, stderr=self.log, stdin=subprocess.DEVNULL, text=True, env=env,
        )
        q: queue.Queue = queue.Queue()
        reader_thread(self.proc.stdout, q)
        info: dict[str, str] = {}
        deadline = time.monotonic() + 30
        while "Press Ctrl-C" not in info.get("_last", ""):
            line = next_line(q, deadline)
            if line is None:
                self.stop()
                raise RuntimeError(f"`dualera up` did not come up; log:\n{self.log_tail()}")
            info["_last"] = line
            key, _, value = line.strip().partition(": ")
            if value:
                info[key.strip()] = value.strip()
        self.url = info["gateway (legacy and modern hosts)"]
        self.ca = info.get("CA certificate (give it to hosts)")
        if tls and not (self.url.startswith("https://") and self.ca):
            self.stop()
            raise RuntimeError(f"`dualera up --tls` did not announce https and a CA: {info}")
        self.upstream = info["modern server (direct)"]
        self.admin = info["admin (health, metrics, report)"]
        self.workspace = info["notes workspace"]
        self.repo = info["repository"]
        self.db = self.dir / "dualera.db"

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

    def log_tail(self, n: int = LOG_TAIL) -> str:
        self.log.flush()
        lines = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(lines[-n:])

    def stop(self) -> None:
        stop_process(self.proc)
        self.log.close()


class FixtureGateway:
    """`dualera gateway` in front of the conformance fixture upstream, for scenarios
    whose rounds the notes server cannot produce. Same interface as `Dualera` (it has
    no notes store: `notes()` is empty)."""

    def __init__(self, binary: Path, fixture: Path, workdir: Path):
        self.log_path = workdir / "dualera.log"
        self.log = open(self.log_path, "w")
        self.fixture_log = open(workdir / "fixture.log", "w")
        self.workspace = ""
        self.repo = ""
        self.procs: list[subprocess.Popen] = []
        fx = subprocess.Popen([str(fixture), "--listen", "127.0.0.1:0"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                              env=dict(os.environ, DUALERA_LOG="warn", NO_COLOR="1"))
        self.procs.append(fx)
        q: queue.Queue = queue.Queue()
        reader_thread(fx.stderr, q)
        deadline = time.monotonic() + 30
        self.upstream = ""
        while not self.upstream:
            try:
                line = q.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                line = None
            if line is None:
                self.stop()
                raise RuntimeError("the conformance fixture did not come up")
            self.fixture_log.write(line)
            if "listening on" in line:
                self.upstream = line.split()[-1]
        threading.Thread(target=lambda: [self.fixture_log.write(ln) for ln in iter(q.get, None)],
                         daemon=True).start()
        env = dict(os.environ, DUALERA_LOG="debug,dualera::wire=trace", NO_COLOR="1")
        gw = subprocess.Popen([str(binary), "gateway", "--upstream", self.upstream, "--listen", "127.0.0.1:0"],
                              stdout=subprocess.DEVNULL, stderr=self.log, stdin=subprocess.DEVNULL, env=env)
        self.procs.append(gw)
        self.url = ""
        while not self.url:
            if time.monotonic() > deadline or gw.poll() is not None:
                self.stop()
                raise RuntimeError(f"`dualera gateway` did not come up; log:\n{self.log_tail()}")
            for line in self.log_path.read_text(errors="replace").splitlines():
                if "gateway listening on" in line:
                    self.url = line.split()[-1]
            time.sleep(0.05)

    def notes(self) -> dict:
        return {}

    def log_tail(self, n: int = LOG_TAIL) -> str:
        self.log.flush()
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        self.log.close()


# ---------------------------------------------------------------------------------------
# Scenarios: configuration for the drivers, and the expectations


class Fail(AssertionError):
    pass


def expect(cond: bool, msg: str) -> None:
    if not cond:
        raise Fail(msg)


def text_of(call: dict) -> str:
    res = call.get("result") or {}
    return "\n".join(b.get("text", "") for b in res.get("content", []) if b.get("type") == "text")


def ok_result(call: dict, what: str) -> dict:
    expect("result" in call, f"{what}: expected a result, got error {call.get('error')}")
    res = call["result"]
    expect(not res.get("isError"), f"{what}: isError result: {text_of(call)!r}")
    return res


def error_text(call: dict) -> str:
    """The message of a JSON-RPC error, or the text of an isError tool result; '' otherwise."""
    if "error" in call:
        return call["error"].get("message") or ""
    if (call.get("result") or {}).get("isError"):
        return text_of(call)
    return ""


def without(notes: dict, *ids: str) -> dict:
    return {k: v for k, v in notes.items() if k not in ids}


def ids_titled(notes: dict, workspace: str, title: str) -> list[str]:
    return sorted((k for k, v in notes.items() if v["workspace"] == workspace and v["title"] == title),
                  key=lambda k: int(k.split("-")[1]))


def offered(elicitation: dict) -> list[str]:
    return ((elicitation.get("requestedSchema") or {}).get("properties", {}).get("note_id") or {}).get("enum") or []


def check_form(el: dict, expected_ids: list[str], what: str) -> None:
    expect(el.get("mode", "form") == "form", f"{what}: elicitation mode {el.get('mode')!r}, expected form")
    expect(sorted(offered(el)) == sorted(expected_ids),
           f"{what}: the form offered {offered(el)}, expected the candidates {expected_ids}")
    schema = el.get("requestedSchema") or {}
    expect(set(schema.get("required", [])) >= {"note_id", "confirm"},
           f"{what}: requestedSchema.required is {schema.get('required')}")
    expect(schema.get("properties", {}).get("confirm", {}).get("type") == "boolean",
           f"{what}: confirm is not a boolean field: {schema.get('properties')}")


def no_unexpected(obs: dict, *, elicitations=0, samplings=0, roots=0) -> None:
    expect(len(obs.get("elicitations", [])) == elicitations,
           f"elicitation handler called {len(obs.get('elicitations', []))} times, expected {elicitations}")
    expect(len(obs.get("samplings", [])) == samplings,
           f"sampling handler called {len(obs.get('samplings', []))} times, expected {samplings}")
    expect(obs.get("roots_calls", 0) == roots,
           f"roots handler called {obs.get('roots_calls', 0)} times, expected {roots}")


@dataclass
class Ctx:
    client: ClientKind
    up: Dualera
    cfg: dict
    workdir: Path = Path(".")
    tap: Wiretap | None = None
    obs: dict = field(default_factory=dict)
    snaps: dict = field(default_factory=dict)
    reference: dict = field(default_factory=dict)
    detail: str = ""


PICKS = ["README.md", "src/lib.rs"]
SUMMARY = "tinyledger is a tiny double-entry ledger library with a CLI [summary-marker-7f3a]."


def cfg_discover(up: Dualera) -> dict:
    return {}


def check_discover(cx: Ctx) -> None:
    o = cx.obs
    want_version = MODERN_VERSION if cx.client.era == "modern" else LEGACY_VERSION
    expect(o["info"]["protocolVersion"] == want_version,
           f"negotiated {o['info']['protocolVersion']!r}, expected {want_version!r}")
    expect((o["info"].get("serverInfo") or {}).get("name") == "dualera-notes",
           f"serverInfo is {o['info'].get('serverInfo')}")
    expect("tools" in (o["info"].get("capabilities") or {}), f"no tools capability: {o['info'].get('capabilities')}")
    got = {t["name"]: t for t in o["tools"]}
    expect(set(got) == TOOLS, f"tools/list names {sorted(got)}, expected {sorted(TOOLS)}")
    reference = {t["name"]: t for t in cx.reference["tools"]}
    for name, ref in reference.items():
        for key in ("inputSchema", "outputSchema", "title", "description", "annotations"):
            if key in ref:
                expect(got[name].get(key) == ref[key],
                       f"{name}.{key} differs from the modern server's own tools/list:\n"
                       f"  client saw: {json.dumps(got[name].get(key), sort_keys=True)}\n"
                       f"  upstream:   {json.dumps(ref[key], sort_keys=True)}")
    no_unexpected(o)
    cx.detail = f"{o['info']['protocolVersion']}, 4 tools, schemas identical to upstream"


def cfg_delete_accept(up: Dualera) -> dict:
    return {"title": TPS, "answers": [{"action": "accept", "pick": 1, "confirm": True}]}


def check_delete_accept(cx: Ctx) -> None:
    o, start, end = cx.obs, cx.snaps["start"], cx.snaps["end"]
    tps = ids_titled(start, cx.up.workspace, TPS)
    expect(len(tps) == 3, f"the seeded store has {len(tps)} '{TPS}' notes, expected 3")
    no_unexpected(o, elicitations=1)
    el = o["elicitations"][0]
    check_form(el, tps, "elicitation")
    expect(TPS in el.get("message", ""), f"the form message does not name the title: {el.get('message')!r}")
    chosen = offered(el)[1]
    res = ok_result(o["call"], "notes_delete")
    expect(chosen in text_of(o["call"]), f"the result does not name {chosen}: {text_of(o['call'])!r}")
    if "structuredContent" in res:
        expect(res["structuredContent"].get("deleted") == chosen,
               f"structuredContent.deleted = {res['structuredContent'].get('deleted')!r}, expected {chosen!r}")
    expect(end == without(start, chosen),
           f"store after: {sorted(end)}; expected exactly {chosen} gone from {sorted(start)}")
    cx.detail = f"form offered {len(tps)} ids; {chosen} deleted, others intact"


def cfg_delete_decline_cancel(up: Dualera) -> dict:
    return {"title": TPS, "answers": [{"action": "decline"}, {"action": "cancel"},
                                      {"action": "accept", "pick": 0, "confirm": True}]}


def check_delete_decline_cancel(cx: Ctx) -> None:
    o, s = cx.obs, cx.snaps
    start = s["start"]
    tps = ids_titled(start, cx.up.workspace, TPS)
    no_unexpected(o, elicitations=3)
    for i, el in enumerate(o["elicitations"]):
        check_form(el, tps, f"elicitation #{i + 1}")
    d, c, fresh = o["calls"]
    ok_result(d, "decline")
    expect("declined" in text_of(d).lower(), f"decline result: {text_of(d)!r}")
    expect(s["after_decline"] == start, f"decline changed the store: {sorted(s['after_decline'])}")
    ok_result(c, "cancel")
    expect("cancelled" in text_of(c).lower() or "canceled" in text_of(c).lower(), f"cancel result: {text_of(c)!r}")
    expect(s["after_cancel"] == start, f"cancel changed the store: {sorted(s['after_cancel'])}")
    chosen = offered(o["elicitations"][2])[0]
    ok_result(fresh, "fresh call after cancel")
    expect(chosen in text_of(fresh), f"the fresh call's result does not name {chosen}: {text_of(fresh)!r}")
    expect(s["end"] == without(start, chosen), f"store after the fresh call: {sorted(s['end'])}")
    cx.detail = f"decline/cancel deleted nothing; fresh call deleted {chosen}"


def cfg_summarize(up: Dualera) -> dict:
    return {"samples": [json.dumps(PICKS), SUMMARY]}


def sampling_text(params: dict) -> str:
    out = []
    for m in params.get("messages", []):
        blocks = m.get("content")
        for b in blocks if isinstance(blocks, list) else [blocks]:
            if isinstance(b, dict) and b.get("type") == "text":
                out.append(b.get("text", ""))
    return "\n".join(out)


def check_summarize(cx: Ctx) -> None:
    o = cx.obs
    no_unexpected(o, samplings=2)
    pick, summary = (sampling_text(p) for p in o["samplings"])
    expect("JSON array" in pick and all(f in pick for f in ("README.md", "src/lib.rs", "docs/intro.md")),
           f"round 1 (pick_files) prompt: {pick[:300]!r}")
    expect("=== README.md ===" in summary and "=== src/lib.rs ===" in summary
           and "=== Cargo.toml ===" not in summary,
           f"round 2 (summary) prompt does not carry exactly the picked files: {summary[:300]!r}")
    for i, p in enumerate(o["samplings"]):
        expect(isinstance(p.get("maxTokens"), int), f"sampling #{i + 1} has no maxTokens: {p.keys()}")
    res = ok_result(o["call"], "summarize_repo")
    sc = res.get("structuredContent") or {}
    expect(sc.get("files") == PICKS, f"structuredContent.files = {sc.get('files')}, expected {PICKS}")
    expect(sc.get("summary") == SUMMARY, f"structuredContent.summary = {sc.get('summary')!r}")
    t = text_of(o["call"])
    expect(SUMMARY in t and ", ".join(PICKS) in t, f"the text result lacks the summary or the files: {t!r}")
    ok_result(o["after"], "notes_list afterwards")
    expect(cx.snaps["end"] == cx.snaps["start"], "summarize_repo changed the notes store")
    cx.detail = "2 sampling rounds; result names the picks and carries the summary"


def cfg_tasks(up: Dualera) -> dict:
    return {"samples": [json.dumps(PICKS), SUMMARY]}


RELATED_TASK = "io.modelcontextprotocol/related-task"


def stored_tasks(db: Path) -> dict[str, str]:
    """The modern server's stored tasks (its SQLite file): id -> status."""
    con = sqlite3.connect(str(db), timeout=10)
    try:
        rows = con.execute("SELECT id, body FROM tasks").fetchall()
    finally:
        con.close()
    return {r[0]: json.loads(r[1])["status"] for r in rows}


def check_tasks(cx: Ctx) -> None:
    o = cx.obs
    caps = o["info"]["capabilities"].get("tasks") or {}
    expect("list" in caps and "cancel" in caps and (caps.get("requests") or {}).get("tools", {}).get("call") == {},
           f"initialize does not advertise tasks (list, cancel, tools/call): {o['info']['capabilities']}")
    t = o["created"].get("result", {}).get("task") or {}
    expect(t.get("status") == "working" and t.get("ttl") and t.get("createdAt"),
           f"tools/call with params.task did not give a working CreateTaskResult: {o['created']}")
    task = t["taskId"]
    seen = [(p.get("result") or {}).get("status") for p in o["polls"]]
    expect(seen and seen[-1] == "input_required", f"tasks/get never showed input_required: {seen}")
    no_unexpected(o, samplings=2)
    pick, summary = (sampling_text(p) for p in o["samplings"])
    expect("JSON array" in pick and "=== README.md ===" in summary,
           f"the two sampling rounds are not pick then summary: {pick[:120]!r} / {summary[:120]!r}")
    for p in o["samplings"]:
        expect((p.get("_meta") or {}).get(RELATED_TASK) == {"taskId": task},
               f"a task's sampling request lacks the related-task _meta: {p.get('_meta')}")
    res = ok_result(o["result"], "tasks/result")
    expect((res.get("structuredContent") or {}).get("summary") == SUMMARY,
           f"tasks/result is not summarize_repo's result: {res}")
    expect((res.get("_meta") or {}).get(RELATED_TASK) == {"taskId": task},
           f"tasks/result lacks the related-task _meta: {res.get('_meta')}")
    expect((o["done"].get("result") or {}).get("status") == "completed", f"tasks/get after the result: {o['done']}")
    listed = {x["taskId"]: x["status"] for x in (o["listed"].get("result") or {}).get("tasks", [])}
    expect(listed == {task: "completed"}, f"tasks/list after the first task: {listed}")
    task2 = o["created2"]["result"]["task"]["taskId"]
    seen2 = [(p.get("result") or {}).get("status") for p in o["polls2"]]
    expect(seen2 and seen2[-1] == "input_required", f"the second task never showed input_required: {seen2}")
    expect((o["cancelled"].get("result") or {}).get("status") == "cancelled", f"tasks/cancel: {o['cancelled']}")
    expect((o["after_cancel"].get("result") or {}).get("status") == "cancelled",
           f"tasks/get after cancel: {o['after_cancel']}")
    expect((o["cancel_again"].get("error") or {}).get("code") == -32602,
           f"cancelling a cancelled task must be -32602: {o['cancel_again']}")
    listed2 = {x["taskId"]: x["status"] for x in (o["listed2"].get("result") or {}).get("tasks", [])}
    expect(listed2 == {task: "completed", task2: "cancelled"}, f"tasks/list at the end: {listed2}")
    stored = stored_tasks(cx.up.db)
    expect(stored.get(task) == "completed" and stored.get(task2) == "cancelled",
           f"the store's tasks: {stored} (want {task}: completed, {task2}: cancelled)")
    expect(cx.snaps["end"] == cx.snaps["start"], "the tasks changed the notes store")
    cx.detail = "task: input_required, tasks/result ran 2 sampling rounds, completed; 2nd task cancelled; store agrees"


def cfg_summarize_bad_pick(up: Dualera) -> dict:
    return {"samples": ["I would pick README.md and src/lib.rs.", SUMMARY]}


def check_summarize_bad_pick(cx: Ctx) -> None:
    o = cx.obs
    no_unexpected(o, samplings=1)
    msg = error_text(o["call"])
    expect(msg != "", f"expected an error, got a successful result: {text_of(o['call'])!r}")
    expect("JSON array" in msg or "pick_files" in msg, f"the error does not say what was wrong: {msg!r}")
    if "error" in o["call"]:
        expect(o["call"]["error"].get("code") == -32602,
               f"JSON-RPC error code {o['call']['error'].get('code')}, expected -32602")
        kind = f"JSON-RPC error {o['call']['error'].get('code')}"
    else:
        kind = "isError tool result"
    after = ok_result(o["after"], "notes_list after the error")
    expect(len((after.get("structuredContent") or {}).get("notes", [])) == 5,
           f"notes_list after the error: {text_of(o['after'])!r}")
    expect(cx.snaps["end"] == cx.snaps["start"], "the failed summarize_repo changed the notes store")
    cx.detail = f"{kind}: {msg[:70]!r}; session still usable"


def cfg_roots(up: Dualera) -> dict:
    ws = up.workspace
    outside = "file://" + str(up.dir.parent / "elsewhere")
    return {"roots_answers": [[ws], [ws, outside, ws + "-evil"], [outside, ws + "-evil"]]}


def check_roots(cx: Ctx) -> None:
    o, ws = cx.obs, cx.up.workspace
    n = len(cx.cfg["roots_answers"])
    no_unexpected(o, roots=n)
    in_ws = sorted((k for k, v in cx.snaps["start"].items() if v["workspace"] == ws),
                   key=lambda k: int(k.split("-")[1]))
    for i, call in enumerate(o["calls"]):
        res = ok_result(call, f"notes_list #{i + 1}")
        sc = res.get("structuredContent") or {}
        got = sorted((nt["id"] for nt in sc.get("notes", [])), key=lambda k: int(k.split("-")[1]))
        if i < 2:
            expect(sc.get("workspaces") == [ws], f"call #{i + 1}: workspaces {sc.get('workspaces')}, expected [{ws}]")
            expect(got == in_ws, f"call #{i + 1}: notes {got}, expected {in_ws}")
        else:
            expect(sc.get("workspaces") == [] and got == [],
                   f"call #{i + 1} (roots outside the grants): workspaces {sc.get('workspaces')}, notes {got}")
    expect(cx.snaps["end"] == cx.snaps["start"], "notes_list changed the store")
    cx.detail = f"roots asked {o['roots_calls']}x; outside roots selected nothing"


def cfg_no_elicitation(up: Dualera) -> dict:
    return {"title": TPS}


def check_no_elicitation(cx: Ctx) -> None:
    o = cx.obs
    no_unexpected(o)
    msg = error_text(o["call"])
    expect(msg != "", f"expected an error, got a successful result: {text_of(o['call'])!r}")
    expect("elicitation" in msg.lower(), f"the error does not name the missing capability: {msg!r}")
    ok_result(o["after"], "notes_list after the refusal")
    expect(cx.snaps["end"] == cx.snaps["start"], "something was deleted without elicitation")
    code = o["call"]["error"].get("code") if "error" in o["call"] else "isError"
    cx.detail = f"{code}: {msg[:70]!r}"


def cfg_interleave(up: Dualera) -> dict:
    return {"parties": {
        "A": {"title": TPS, "answer": {"action": "accept", "pick": 1, "confirm": True}},
        "B": {"title": "Standup", "answer": {"action": "accept", "pick": 0, "confirm": True}},
    }}


def check_interleave(cx: Ctx) -> None:
    o, start, end = cx.obs, cx.snaps["start"], cx.snaps["end"]
    ws = cx.up.workspace
    want = {"A": ids_titled(start, ws, TPS), "B": ids_titled(start, ws, "Standup")}
    deleted = []
    for name in ("A", "B"):
        p = o[name]
        expect(len(p["elicitations"]) == 1, f"{name}: {len(p['elicitations'])} elicitations, expected 1")
        check_form(p["elicitations"][0], want[name], f"{name}'s form")
        pick = cx.cfg["parties"][name]["answer"]["pick"]
        chosen = offered(p["elicitations"][0])[pick]
        ok_result(p["call"], f"{name}'s notes_delete")
        expect(chosen in text_of(p["call"]), f"{name}'s result does not name {chosen}: {text_of(p['call'])!r}")
        deleted.append(chosen)
    expect(end == without(start, *deleted), f"store after: {sorted(end)}; expected {deleted} gone")
    cx.detail = f"A deleted {deleted[0]} (of 3), B deleted {deleted[1]} (of 1)"


def check_instances(up: Instances, scenario: str) -> str:
    """From the instances' logs: every MRTR retry went to the other instance than the
    round it answers while both ran; after a kill, the rounds ran on the survivor."""
    rounds = up.rounds()
    expect(rounds, "the instances logged no MRTR retry at all")
    unknown = [r for r in rounds if r["asked"] is None]
    expect(not unknown, f"retries echoing a state no instance logged issuing: {unknown}")
    split = [r for r in rounds if r["asked"] != r["answered"]]
    same = [r for r in rounds if r["asked"] == r["answered"]]
    if not up.killed:
        expect(not same, f"a retry went to the instance that asked for it: {same}")
        return f"{len(split)} retries, each on the other instance"
    survivors = set(range(len(up.instances))) - set(up.killed)
    expect(bool(split), f"no retry changed instance before the kill: {rounds}")
    expect(all(r["answered"] in survivors for r in same),
           f"a round and its retry stayed on one instance that was not the survivor: {same}")
    expect(bool(same), f"no round ran on the survivor after instance {up.killed} was killed: {rounds}")
    return (f"{len(split)} retries on the other instance, then instance {up.killed[0]} killed: "
            f"{len(same)} rounds on the survivor")
def check_spread(up: Replicas) -> str:
    """Every session's requests were served by more than one replica, and consecutive
    requests mostly by different ones (round-robin, no stickiness), per the logs."""
    spread = up.spread()
    expect(spread, "the gateways logged no session at all")
    changes = pairs = 0
    for sid, replicas in spread.items():
        expect(len(set(replicas)) >= 2,
               f"session {sid[:8]}…: all {len(replicas)} requests were served by {replicas[0]}")
        pairs += len(replicas) - 1
        changes += sum(1 for a, b in zip(replicas, replicas[1:]) if a != b)
    expect(changes * 2 >= pairs,
           f"only {changes} of {pairs} consecutive requests changed replica: {spread}")
    return f"{len(spread)} session(s), {changes}/{pairs} consecutive requests on another replica"


REFUSAL = {"code": -32603, "message": "the host's model is unavailable [refusal-marker-51c2]"}


def cfg_sibling_failure(up) -> dict:
    return {"tool": "test_input_required_result_multiple_inputs", "tool_after": "test_simple_text",
            "answer_delay": 0.5, "refusal": REFUSAL}


def check_sibling_failure(cx: Ctx) -> None:
    o = cx.obs
    no_unexpected(o, elicitations=1, samplings=1, roots=1)
    call = o["call"]
    expect("result" in call, f"the tool call must end with the failure result, not a JSON-RPC error: {call}")
    expect(call["result"].get("isError") is True, f"expected an isError result: {call}")
    text = text_of(call)
    expect("sampling/createMessage" in text and REFUSAL["message"] in text,
           f"the failure result does not name the refused request: {text!r}")
    ok_result(o["after"], "the next tool call in the same session")
    err = (cx.workdir / "client.stderr").read_text(errors="replace")
    for bad in ("Traceback", "Error in post_writer", "Exception"):
        expect(bad not in err, f"the client's stderr has {bad!r}:\n{err[-3000:]}")
    if cx.tap is not None and cx.client.wire != STDIO:
        failed = [s for s in cx.tap.statuses if s[1] >= 400]
        expect(not failed, f"HTTP errors between client and gateway: {failed}")
    log = cx.workdir / ("gateway-stdio.log" if cx.client.wire == STDIO else "dualera.log")
    late = log.read_text(errors="replace").count("late or duplicate reply dropped")
    expect(late >= 1, "no reply arrived after the round was given up (the case did not test a late reply)")
    http = "" if cx.client.wire == STDIO else f", {len(cx.tap.statuses) if cx.tap else '?'} HTTP exchanges, none >= 400"
    cx.detail = f"isError result naming the refusal, {late} late repl{'y' if late == 1 else 'ies'} dropped{http}"


@dataclass
class Scenario:
    name: str
    title: str
    make_cfg: Callable[[Dualera], dict]
    check: Callable[[Ctx], None]
    # "fixture": the gateway fronts the conformance fixture instead of `dualera up`.
    upstream: str = "notes"
    # Which columns run it (None: every column whose matrix includes it).
    only: Callable[[ClientKind], bool] | None = None


SCENARIOS = [
    Scenario("discover", "initialize/discover + tools/list: 4 tools, schemas intact", cfg_discover, check_discover),
    Scenario("delete_accept", "notes_delete: form with 3 ids, accept+confirm one", cfg_delete_accept, check_delete_accept),
    Scenario("delete_decline_cancel", "notes_delete: decline, cancel, then a fresh call", cfg_delete_decline_cancel,
             check_delete_decline_cancel),
    Scenario("summarize", "summarize_repo: two sampling rounds", cfg_summarize, check_summarize),
    Scenario("summarize_bad_pick", "summarize_repo: pick reply not a JSON array", cfg_summarize_bad_pick,
             check_summarize_bad_pick),
    Scenario("roots", "notes_list without workspaceUri: roots", cfg_roots, check_roots),
    Scenario("no_elicitation", "notes_delete from a client without elicitation", cfg_no_elicitation,
             check_no_elicitation),
    Scenario("interleave", "two sessions, interleaved elicitation rounds", cfg_interleave, check_interleave),
    Scenario("sibling_failure", "one live request of a round fails, the host answers the others late",
             cfg_sibling_failure, check_sibling_failure, upstream="fixture",
             # The fixture gateway serves plain HTTP: the TLS columns prove the transport
             # with the notes server's rounds (2-4); late replies are wire logic.
             # The instances columns run the notes server's rounds on two instances.
             only=lambda c: c.peer is PY_LEGACY and not c.tls and c.backend != "instances"),
    Scenario("tasks", "summarize_repo as a 2025-11-25 task (get, result with 2 sampling rounds, list, cancel)",
             cfg_tasks, check_tasks,
             # The tasks translation is the session machine's, the same on every wire;
             # the legacy SDKs' experimental task APIs over Streamable HTTP, on one
             # gateway and on three replicas on Redis (any replica serves any task step).
             only=lambda c: c.era == "legacy" and c.wire == HTTP and not c.tls and c.backend != "instances"),
]


# ---------------------------------------------------------------------------------------
# Running one case


def run_driver(client: ClientKind, cfg: dict, up: Dualera, snaps: dict, stderr_path: Path,
               on_checkpoint: Callable[[str], None] | None = None) -> dict:
    env = dict(os.environ)
    if client.tls:
        # The TypeScript SDK's fetch trusts what Node trusts; the Python driver passes
        # cfg["ca"] to httpx itself.
        env["NODE_EXTRA_CA_CERTS"] = up.ca
    with open(stderr_path, "w") as err:
        proc = subprocess.Popen(
            [*client.peer.command, str(client.peer.script), json.dumps(cfg)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True, cwd=client.peer.script.parent,
            env=env,
        )
        q: queue.Queue = queue.Queue()
        reader_thread(proc.stdout, q)
        deadline = time.monotonic() + CASE_TIMEOUT
        try:
            while True:
                try:
                    line = q.get(timeout=max(0.05, deadline - time.monotonic()))
                except queue.Empty:
                    raise Fail(f"the client did not finish within {CASE_TIMEOUT:.0f}s")
                if line is None:
                    raise Fail(f"the client exited ({proc.wait()}) without reporting")
                try:
                    msg = json.loads(line)
                except json.JSONDecodeError:
                    continue  # stray output from a library
                if msg.get("event") == "checkpoint":
                    snaps[msg["name"]] = up.notes()
                    if on_checkpoint is not None:
                        on_checkpoint(msg["name"])
                    proc.stdin.write("\n")
                    proc.stdin.flush()
                elif msg.get("event") == "done":
                    return msg["obs"]
                elif msg.get("event") == "error":
                    raise Fail(f"the client raised:\n{msg['error']}")
        finally:
            if proc.poll() is None:
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def run_case(binary: Path, client: ClientKind, sc: Scenario, keep: bool, direct: bool,
             fixture: Callable[[], Path] | None = None,
             shared: Dualera | None = None) -> tuple[bool, str, str]:
    """(passed, one-line detail, failure report). With `shared`, the case runs against that
    running `dualera up` (no tap: the client talks to the gateway itself); scenarios whose
    upstream is the conformance fixture get one from `fixture`."""
    if client.peer.error:
        return False, "peer missing", f"peer {client.name} ({client.label}) is not available:\n{client.peer.error}"
    workdir = Path(tempfile.mkdtemp(prefix=f"dualera-interop-{client.name.replace('/', '-')}-{sc.name}-"))
    up = None
    tap = None
    tap_hop = "client <-> gateway transcript (hop 1"
    stdio_log = workdir / "gateway-stdio.log"
    cx = None
    try:
        if shared is not None:
            up = shared
        elif sc.upstream == "fixture":
            assert fixture is not None, f"scenario {sc.name} needs the conformance fixture"
            up = FixtureGateway(binary, fixture(), workdir)
        elif client.backend == "instances":
            up = Instances(binary, workdir)
        else:
            up = (Replicas(binary, workdir) if client.backend == "replicas"
                  else Dualera(binary, workdir, tls=client.tls))
        direct = direct or shared is not None
        wire = {"wire": client.wire}
        if client.wire == STDIO:
            # The client spawns the gateway; the tap records its upstream hop instead.
            upstream = up.upstream
            if not direct:
                tap = Wiretap(up.upstream, client="gateway", server="upstream")
                upstream = tap.url
                tap_hop = "gateway (stdio) <-> modern server transcript (hop 2"
            wire["stdio"] = {
                "command": str(binary),
                "args": ["gateway", "--stdio", "--upstream", upstream],
                "env": {"DUALERA_LOG": "debug,dualera::wire=trace", "NO_COLOR": "1"},
                "stderr": str(stdio_log),
            }
        elif client.tls:
            # No tap on this hop (it is TLS end to end); the gateway log has the wire trace.
            wire["url"] = up.url
            wire["ca"] = up.ca
        else:
            target = up.url if client.wire == HTTP else urlunsplit(urlsplit(up.url)._replace(path="/sse"))
            wire["url"] = target
            if not direct:
                tap = Wiretap(target)
                wire["url"] = tap.url
        cfg = {"scenario": sc.name, **wire, "workspace": up.workspace, "repo": up.repo, **sc.make_cfg(up)}
        cx = Ctx(client=client, up=up, cfg=cfg, workdir=workdir, tap=tap)
        if sc.name == "discover":
            cx.reference = up.upstream_call("tools/list")["result"]
        cx.snaps["start"] = up.notes()
        on_checkpoint = None
        if isinstance(up, Instances) and KILL_AT.get(sc.name):
            def on_checkpoint(name: str, up=up, at=KILL_AT[sc.name]) -> None:
                if name == at:
                    up.kill(1)
        cx.obs = run_driver(client, cfg, up, cx.snaps, workdir / "client.stderr", on_checkpoint)
        cx.snaps["end"] = up.notes()
        want = MODERN_VERSION if client.era == "modern" else LEGACY_VERSION
        seen = cx.obs.get("protocol_versions") or []
        expect(seen and all(v == want for v in seen),
               f"sessions negotiated {seen}; a {client.era} client must negotiate {want} through the gateway")
        sc.check(cx)
        if isinstance(up, Instances):
            cx.detail += "; " + check_instances(up, sc.name)
        if client.backend == "replicas":
            cx.detail += "; " + check_spread(up)
        return True, cx.detail, ""
    except Exception as e:  # noqa: BLE001 - every failure becomes a report
        reason = str(e) if isinstance(e, Fail) else traceback.format_exc()
        report = [f"--- {client.name} / {sc.name}: FAILED", reason.rstrip()]
        if cx is not None and cx.obs:
            report.append("--- client observations:\n" + json.dumps(cx.obs, indent=1)[:4000])
        err = workdir / "client.stderr"
        if err.exists() and err.stat().st_size:
            report.append("--- client stderr (tail):\n" + "\n".join(err.read_text(errors="replace").splitlines()[-40:]))
        if tap is not None:
            report.append(f"--- {tap_hop}, recorded by tests/interop/wiretap.py):\n"
                          f"{tap.transcript(TRANSCRIPT_TAIL)}")
        if stdio_log.exists():
            report.append(f"--- `dualera gateway --stdio` log, DUALERA_LOG=debug (tail {LOG_TAIL}, full: {stdio_log}):\n"
                          + "\n".join(stdio_log.read_text(errors="replace").splitlines()[-LOG_TAIL:]))
        if up is not None:
            report.append(f"--- dualera log, DUALERA_LOG=debug: gateway and upstream spans (hop 2) "
                          f"(tail {LOG_TAIL}, full: {up.log_path}):\n{up.log_tail()}")
        report.append(f"--- kept: {workdir}")
        keep = True
        first = reason.strip().splitlines()[0] if reason.strip() else type(e).__name__
        return False, first[:100], "\n".join(report)
    finally:
        if up is not None and shared is None:
            up.stop()
        if tap is not None:
            (workdir / "transcript.txt").write_text(tap.transcript() + "\n")
            tap.close()
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)



# ---------------------------------------------------------------------------------------
# Operating: one gateway serves the three HTTP clients, then its admin listener is read


# The clients and scenarios the shared gateway serves, in this order (each
# delete_decline_cancel deletes one of the three seeded "TPS report" notes).
OPS_CLIENTS = ("python-legacy", "typescript-legacy", "python-modern")
OPS_SCENARIOS = ("discover", "delete_decline_cancel", "summarize", "roots")
# What a legacy host answers live in each scenario: (kind, outcome) -> count.
OPS_LIVE = {
    "discover": {},
    "delete_decline_cancel": {("elicitation_form", "decline"): 1, ("elicitation_form", "cancel"): 1,
                              ("elicitation_form", "accept"): 1},
    "summarize": {("sampling", "accept"): 2},
    "roots": {("roots", "accept"): 3},
}
# MRTR rounds its tools/call requests take, in all.
OPS_ROUNDS = {"discover": 0, "delete_decline_cancel": 3, "summarize": 2, "roots": 3}
MRTR_VERDICT = "answers form elicitation, sampling and roots/list live: needs an MRTR-capable client"
OPS_HOSTS = {  # client kind -> (clientInfo name, version, revision)
    "python-legacy": ("interop-python-legacy", "1.30.0", LEGACY_VERSION),
    "typescript-legacy": ("interop-typescript-legacy", "1.32.2", LEGACY_VERSION),
    "python-modern": ("interop-python-modern", "2.3.0", MODERN_VERSION),
}


def http_get(url: str, accept: str | None = None) -> tuple[int, str, str]:
    req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read().decode()


def parse_metrics(fmt: str, path: Path) -> list[dict]:
    """The samples of an exposition, as the official Python Prometheus client parses it."""
    if PROM.error or not PROM.command:
        raise Fail(f"the Prometheus parser is not available:\n{PROM.error}")
    p = subprocess.run([*PROM.command, str(PROM.script), fmt, str(path)], capture_output=True, text=True,
                       timeout=60)
    if p.returncode != 0:
        raise Fail(f"prometheus_client could not parse the {fmt} exposition:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout)


def value(samples: list[dict], name: str, **labels: str) -> float:
    return sum(s["value"] for s in samples
               if s["name"] == name and all(s["labels"].get(k) == v for k, v in labels.items()))


def check_histograms(samples: list[dict]) -> int:
    """Every histogram's buckets are cumulative and +Inf equals its count; how many."""
    series: dict[tuple, dict] = {}
    for s in samples:
        if s["type"] != "histogram":
            continue
        key_labels = tuple(sorted((k, v) for k, v in s["labels"].items() if k != "le"))
        h = series.setdefault((s["family"], key_labels), {"buckets": [], "count": None})
        if s["name"].endswith("_bucket"):
            le = s["labels"]["le"]
            h["buckets"].append((float("inf") if le == "+Inf" else float(le), s["value"]))
        elif s["name"].endswith("_count"):
            h["count"] = s["value"]
    for (family, labels), h in series.items():
        b = sorted(h["buckets"])
        expect(bool(b) and b[-1][0] == float("inf"), f"{family}{dict(labels)} has no +Inf bucket")
        expect(all(x[1] <= y[1] for x, y in zip(b, b[1:])), f"{family}{dict(labels)} buckets not cumulative: {b}")
        expect(b[-1][1] == h["count"], f"{family}{dict(labels)}: +Inf {b[-1][1]} != count {h['count']}")
    return len(series)


def ops_live_expected(ran: list[tuple["ClientKind", str]], kind: str | None = None) -> dict:
    """(kind, outcome) -> count the legacy clients' (or one client's) scenarios answered live."""
    want: dict[tuple[str, str], int] = {}
    for client, scenario in ran:
        if client.era != "legacy" or (kind is not None and client.name != kind):
            continue
        for k, n in OPS_LIVE[scenario].items():
            want[k] = want.get(k, 0) + n
    return want


def ops_metrics(up: Dualera, ran: list[tuple["ClientKind", str]]) -> str:
    status, ctype, text = http_get(f"{up.admin}/metrics")
    expect(status == 200, f"/metrics answered {status}")
    expect(ctype.startswith("text/plain; version=0.0.4"), f"/metrics content type {ctype!r}")
    _, octype, om = http_get(f"{up.admin}/metrics", "application/openmetrics-text; version=1.0.0")
    expect(octype.startswith("application/openmetrics-text"), f"OpenMetrics content type {octype!r}")
    (ARTIFACTS / "metrics.txt").write_text(text)
    (ARTIFACTS / "metrics.openmetrics.txt").write_text(om)
    samples = parse_metrics("prometheus", ARTIFACTS / "metrics.txt")
    om_samples = parse_metrics("openmetrics", ARTIFACTS / "metrics.openmetrics.txt")
    histograms = check_histograms(samples)
    # Live requests: exactly what the legacy clients' scenarios answered.
    want = ops_live_expected(ran)
    rounds = sum(OPS_ROUNDS[sc] for c, sc in ran if c.era == "legacy")
    for fmt, got_samples in (("Prometheus text", samples), ("OpenMetrics", om_samples)):
        got = {(s["labels"]["kind"], s["labels"]["outcome"]): int(s["value"]) for s in got_samples
               if s["name"] == "dualera_live_requests_total" and s["value"]}
        expect(got == want, f"{fmt} dualera_live_requests_total: {got}; the scenarios answered {want}")
    got_rounds = value(samples, "dualera_request_rounds_sum", route="/mcp", mcp_method_name="tools/call")
    expect(got_rounds == rounds, f"dualera_request_rounds_sum (tools/call) {got_rounds}; the scenarios took {rounds}")
    legacy_inits = value(samples, "dualera_requests_total", era="legacy", mcp_method_name="initialize", outcome="ok")
    modern_calls = value(samples, "dualera_requests_total", era="modern", mcp_method_name="tools/call")
    modern_discovers = value(samples, "dualera_requests_total", era="modern", mcp_method_name="server/discover")
    legacy_cases = sum(1 for c, _ in ran if c.era == "legacy")
    expect(legacy_inits >= legacy_cases, f"{legacy_inits} legacy initialize requests counted for {legacy_cases} cases")
    expect(modern_calls > 0 and modern_discovers > 0,
           f"modern pass-through: {modern_calls} tools/call, {modern_discovers} server/discover counted")
    expect(value(samples, "dualera_upstream_ready", route="/mcp") == 1, "dualera_upstream_ready is not 1")
    expect(any(s["name"] == "dualera_cache_misses_total" for s in samples), "no cache counters")
    expect(value(samples, "dualera_report_hosts") >= 3, "dualera_report_hosts below 3")
    accepted = want.get(("elicitation_form", "accept"), 0)
    declined = want.get(("elicitation_form", "decline"), 0)
    cancelled = want.get(("elicitation_form", "cancel"), 0)
    return (f"{len(samples)} samples parsed in both formats, {histograms} histograms consistent; elicitations "
            f"{accepted} accepted, {declined} declined, {cancelled} cancelled; {rounds} rounds")


def ops_report(up: Dualera, ran: list[tuple["ClientKind", str]]) -> tuple[str, dict]:
    status, ctype, body = http_get(f"{up.admin}/report")
    expect(status == 200 and ctype.startswith("application/json"), f"/report answered {status} {ctype}")
    (ARTIFACTS / "report.json").write_text(body)
    report = json.loads(body)
    hosts = report["hosts"]
    names = sorted((h["name"], h["version"]) for h in hosts)
    details = []
    for kind, (name, version, revision) in OPS_HOSTS.items():
        rows = [h for h in hosts if h["name"] == name and h["version"] == version]
        expect(len(rows) == 1, f"{name} {version}: {len(rows)} rows in /report (rows: {names})")
        h = rows[0]
        expect(h["revision"] == revision and h["wire"] == "streamable-http",
               f"{name}: revision {h['revision']}, wire {h['wire']}")
        if kind == "python-modern":
            expect(h["era"] == "modern" and h["verdict"] == "already modern", f"{name}: {h['era']}, {h['verdict']!r}")
            expect(h["features"] == {}, f"{name} used legacy features: {h['features']}")
            expect(h["requests"].get("server/discover", 0) > 0 and h["requests"].get("tools/call", 0) > 0,
                   f"{name}: requests {h['requests']}")
            details.append(f"{name}: already modern ({h['requestTotal']} requests)")
            continue
        live: dict[str, dict[str, int]] = {}
        for (k, outcome), n in ops_live_expected(ran, kind).items():
            live.setdefault(k, {})[outcome] = n
        features = {k: sum(o.values()) for k, o in live.items()}
        expect(h["era"] == "legacy", f"{name}: era {h['era']}")
        for feature, n in features.items():
            expect(h["features"].get(feature) == n, f"{name}: {feature} {h['features'].get(feature)}, expected {n}")
        expect(h["live"] == live, f"{name}: live outcomes {h['live']}, expected {live}")
        cases = sum(1 for c, _ in ran if c.name == kind)
        expect(h["sessions"] >= cases, f"{name}: {h['sessions']} sessions for {cases} cases")
        expect(MRTR_VERDICT in h["verdict"], f"{name}: verdict {h['verdict']!r}")
        extra = {k: v for k, v in h["features"].items() if k not in features}
        details.append(f"{name}: {features}, also {extra or 'nothing else'}")
    known = {(n, v) for n, v, _ in OPS_HOSTS.values()}
    others = [(h["name"], h["version"], h["requests"]) for h in hosts if (h["name"], h["version"]) not in known]
    expect(not others, f"rows beyond the three clients: {others}")
    status, _, page = http_get(f"{up.admin}/report.html")
    expect(status == 200, f"/report.html answered {status}")
    (ARTIFACTS / "report.html").write_text(page)
    return "; ".join(details), report


def ops_page(up: Dualera, report: dict, workdir: Path) -> str:
    if BROWSER.error or not BROWSER.command:
        raise Fail(f"the browser peer is not available:\n{BROWSER.error}")
    expect(bool(report), "no report to check (the /report check failed)")
    shot = ARTIFACTS / "report.png"
    cfg = {"url": f"{up.admin}/report.html", "screenshot": str(shot), "profile": str(workdir / "chromium-profile"),
           "hosts": report["hosts"]}
    p = subprocess.run([*BROWSER.command, str(BROWSER.script), json.dumps(cfg)], capture_output=True, text=True,
                       timeout=180, cwd=BROWSER_DIR)
    try:
        out = json.loads(p.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        raise Fail(f"report.mjs printed no verdict (exit {p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}")
    expect(out["ok"], "the page does not show the report:\n" + "\n".join(out["errors"]))
    expect(shot.exists() and shot.stat().st_size > 10_000, f"no screenshot at {shot}")
    return f"{len(out['rows'])} rows and their feature bars checked in Chromium; screenshot {shot.relative_to(ROOT)}"


def ops_terminal(binary: Path, up: Dualera) -> str:
    p = subprocess.run([str(binary), "report", "--admin", up.admin], capture_output=True, text=True, timeout=60)
    expect(p.returncode == 0, f"dualera report exited {p.returncode}: {p.stderr}")
    (ARTIFACTS / "report.txt").write_text(p.stdout)
    lines = p.stdout.splitlines()
    for name, version, _ in OPS_HOSTS.values():
        expect(any(ln.startswith(name) and version in ln for ln in lines), f"no row for {name}:\n{p.stdout}")
    expect("already modern" in p.stdout and ("needs:    " + MRTR_VERDICT) in p.stdout, p.stdout)
    return f"a table of {len(lines)} lines naming the three clients"


def run_operating(binary: Path, keep: bool) -> list[tuple[str, bool, str, str]]:
    """The three HTTP clients' scenarios against one `dualera up`, then its admin
    listener: /metrics (parsed by prometheus_client), /report, /report.html (in
    Chromium), `dualera report`. One result per case and per check."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for stale in ARTIFACTS.iterdir():
        if stale.is_file():
            stale.unlink()
    workdir = Path(tempfile.mkdtemp(prefix="dualera-interop-operating-"))
    results: list[tuple[str, bool, str, str]] = []
    up = None
    try:
        up = Dualera(binary, workdir)
        by_name = {c.name: c for c in CLIENTS}
        ran: list[tuple[ClientKind, str]] = []
        for name in OPS_CLIENTS:
            client = by_name[name]
            for sc_name in OPS_SCENARIOS:
                sc = next(s for s in SCENARIOS if s.name == sc_name)
                passed, detail, report = run_case(binary, client, sc, keep, True, shared=up)
                if passed:
                    ran.append((client, sc_name))
                results.append((f"{name} / {sc_name}", passed, detail, report))
        report: dict = {}

        def report_check() -> str:
            detail, r = ops_report(up, ran)
            report.update(r)
            return detail

        checks = [
            ("/metrics (prometheus_client)", lambda: ops_metrics(up, ran)),
            ("/report", report_check),
            ("/report.html (Chromium)", lambda: ops_page(up, report, workdir)),
            ("dualera report", lambda: ops_terminal(binary, up)),
        ]
        for name, check in checks:
            try:
                results.append((name, True, check(), ""))
            except Exception as e:  # noqa: BLE001 - every failure becomes a report
                reason = str(e) if isinstance(e, Fail) else traceback.format_exc()
                first = reason.strip().splitlines()[0] if reason.strip() else type(e).__name__
                results.append((name, False, first[:100],
                                f"--- operating / {name}: FAILED\n{reason.rstrip()}\n"
                                f"--- artefacts: {ARTIFACTS}\n--- dualera log (tail):\n{up.log_tail()}"))
        return results
    finally:
        if up is not None:
            up.stop()
        if keep or not all(ok for _, ok, _, _ in results):
            print(f"  operating: kept {workdir}", flush=True)
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def reverse_part(binary: Path, keep: bool, columns: list[str] | None) -> tuple[int, int]:
    """The reverse bridge (tests/interop/reverse.py): modern hosts in front of legacy
    servers; prints its cases and its table, returns (passed, total)."""
    print("\ninterop: reverse - modern hosts (mcp 2.3.0, client 2.4.0) through `dualera gateway` "
          "to legacy servers (sdk 1.32.2, mcp 1.30.0)")
    t0 = time.monotonic()
    hosts = {"python-modern": (PY_MODERN, HERE / "py" / "reverse_host.py"),
             "typescript-modern": (TS_LEGACY, TS_DIR / "reverse_host.mjs")}
    commands = {"py": PY_LEGACY.command or ["python3"], "ts": TS_LEGACY.command or ["node"]}
    cells: dict[tuple[str, str], dict[str, bool]] = {}
    passed = 0
    results = reverse.run(binary, hosts, commands, keep, columns)
    for col, host, sc, ok, detail, report in results:
        print(f"  {'PASS' if ok else 'FAIL'}  {col:<26} {host:<18} {sc:<16} {detail}", flush=True)
        if report:
            print(report, flush=True)
        cells.setdefault((col, host), {})[sc] = ok
        passed += ok
    if PY_LEGACY.error:
        print(f"  (the Python legacy server needs mcp 1.30.0: {PY_LEGACY.error})")
    if results:
        keys = list(cells)
        print()
        print(f"{'scenario':<18}" + "".join(f"{c:<27}" for c, _ in keys))
        print(f"{'':<18}" + "".join(f"{h:<27}" for _, h in keys))
        print("-" * (18 + 27 * len(keys)))
        for sc in (*reverse.SCENARIOS, "principals"):
            row = f"{sc:<18}"
            for key in keys:
                cell = cells[key].get(sc)
                row += f"{'-' if cell is None else 'PASS' if cell else 'FAIL':<27}"
            print(row)
        print("(principals: the Streamable HTTP and HTTP+SSE columns)")
    print(f"interop: reverse, {passed} of {len(results)} passed in {time.monotonic() - t0:.0f}s")
    return passed, len(results)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--client", action="append", choices=[c.name for c in CLIENTS])
    ap.add_argument("--scenario", action="append", choices=[s.name for s in SCENARIOS])
    ap.add_argument("--keep", action="store_true", help="keep every case's temporary directory")
    ap.add_argument("--direct", action="store_true", help="no recording tap between client and gateway")
    ap.add_argument("--all-scenarios", action="store_true",
                    help="run every scenario on every column (the sse and stdio columns run 2-4 by default)")
    ap.add_argument("--operating", action="store_true",
                    help="run the operating checks (default: only when no --client/--scenario is given)")
    ap.add_argument("--only-operating", action="store_true", help="run only the operating checks")
    ap.add_argument("--reverse", action="store_true",
                    help="run the reverse part (default: only when no --client/--scenario is given)")
    ap.add_argument("--only-reverse", action="store_true", help="run only the reverse part")
    ap.add_argument("--reverse-column", action="append", choices=[c.name for c in reverse.COLUMNS],
                    help="the reverse part's legacy server columns to run (default: all)")
    ap.add_argument("--prepare-legacy-python", action="store_true",
                    help="only install the mcp 1.30.0 venv (the legacy upstream of tests/legacy_upstream.rs)")
    ap.add_argument("--prepare-legacy-peers", action="store_true",
                    help="only install the legacy servers the cargo tests spawn: the mcp 1.30.0 venv "
                         "and the TypeScript SDK 1.32.2 in tests/interop/ts (tests/reverse_resume.rs)")
    args = ap.parse_args()
    if args.prepare_legacy_peers:
        try:
            ensure_ts()
        except PeerError as e:
            print(f"TypeScript SDK 1.32.2: NOT AVAILABLE: {e}", flush=True)
            return 1
    if args.prepare_legacy_python or args.prepare_legacy_peers:
        CACHE.mkdir(parents=True, exist_ok=True)
        PY_LEGACY.ensure()
        if PY_LEGACY.error:
            print(f"mcp 1.30.0: NOT AVAILABLE: {PY_LEGACY.error}", flush=True)
            return 1
        print(PY_LEGACY.command[0], flush=True)
        return 0
    clients = [c for c in CLIENTS if not args.client or c.name in args.client]
    scenarios = [s for s in SCENARIOS if not args.scenario or s.name in args.scenario]
    operating = args.operating or args.only_operating or not (args.client or args.scenario or args.only_reverse)
    run_reverse = args.reverse or args.only_reverse or not (args.client or args.scenario or args.only_operating)
    if args.only_operating:
        clients = [c for c in CLIENTS if c.name in OPS_CLIENTS]
        scenarios = []
    if args.only_reverse:
        clients, scenarios = [], []

    print("interop: preparing peers (pinned; cached under .cache/interop and tests/interop/ts/node_modules)")
    CACHE.mkdir(parents=True, exist_ok=True)
    peers = [c.peer for c in clients] + ([PROM, BROWSER] if operating else []) + \
        ([PY_MODERN, PY_LEGACY, TS_LEGACY] if run_reverse else [])
    for peer in peers:
        if not peer.tried:
            peer.ensure()
            if peer.error:
                print(f"  {peer.label}: NOT AVAILABLE: {peer.error}", flush=True)
    binary = build_binary()
    print(f"interop: dualera binary {binary}")
    built: list[Path] = []

    def fixture() -> Path:
        if not built:
            built.append(build_fixture())
        return built[0]

    results: dict[tuple[str, str], tuple[bool, str]] = {}
    reports = []
    t_all = time.monotonic()
    for c in clients:
        for sc in scenarios:
            if not (args.all_scenarios or c.runs(sc.name)) or (sc.only and not sc.only(c)):
                continue
            t0 = time.monotonic()
            passed, detail, report = run_case(binary, c, sc, args.keep, args.direct, fixture)
            results[(c.name, sc.name)] = (passed, detail)
            print(f"  {'PASS' if passed else 'FAIL'}  {c.name:<23} {sc.name:<22} {time.monotonic() - t0:5.1f}s  {detail}",
                  flush=True)
            if report:
                reports.append(report)
                print(report, flush=True)

    if scenarios:
        print()
        w = max(len(s.name) for s in scenarios) + 4
        cw = max(max(len(c.name), len(c.wire_label)) for c in clients) + 2
        header = f"{'scenario':<{w}}" + "".join(f"{c.name:<{cw}}" for c in clients)
        print(header)
        print(f"{'':<{w}}" + "".join(f"{c.label:<{cw}}" for c in clients))
        print(f"{'':<{w}}" + "".join(f"{c.wire_label:<{cw}}" for c in clients))
        print("-" * len(header))
        for sc in scenarios:
            row = f"{f'{SCENARIOS.index(sc) + 1} {sc.name}':<{w}}"
            for c in clients:
                cell = results.get((c.name, sc.name))
                row += f"{'-' if cell is None else 'PASS' if cell[0] else 'FAIL':<{cw}}"
            print(row)
        print("(-: not part of that column's matrix)")
    passed = sum(1 for ok, _ in results.values() if ok)
    failed = len(results) - passed
    total = len(results)
    if operating:
        print("\ninterop: operating - one gateway for python-legacy, typescript-legacy and python-modern "
              f"({', '.join(OPS_SCENARIOS)}), then its admin listener (artefacts: {ARTIFACTS.relative_to(ROOT)})")
        t0 = time.monotonic()
        for name, ok, detail, report in run_operating(binary, args.keep):
            print(f"  {'PASS' if ok else 'FAIL'}  {name:<38} {detail}", flush=True)
            if report:
                print(report, flush=True)
            passed += ok
            failed += not ok
            total += 1
        print(f"interop: operating in {time.monotonic() - t0:.0f}s")
    if run_reverse:
        r_passed, r_total = reverse_part(binary, args.keep, args.reverse_column)
        passed += r_passed
        failed += r_total - r_passed
        total += r_total
    print(f"\ninterop: {total} cases and checks in {time.monotonic() - t_all:.0f}s")
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
