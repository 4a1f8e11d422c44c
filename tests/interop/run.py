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
The sse and stdio columns run scenarios 2-4 (the elicitation and sampling rounds;
`--all-scenarios` runs all eight there too); the drivers and the expectations are the same
code for every wire. For the stdio columns the tap records the stdio gateway's upstream hop.

Every (client, scenario) case runs against its own freshly started `dualera up --dir <tmp>`
(gateway + modern server on free loopback ports, the demo workspace seeded with three notes
titled "TPS report") and is checked on what the client saw *and* on the notes store
(<tmp>/dualera.db, read with sqlite3), including store snapshots taken at checkpoints the
driver announces mid-scenario. A missing or broken peer fails its cases; nothing is skipped.

Usage: python3 tests/interop/run.py [--client NAME]... [--scenario NAME]... [--all-scenarios] [--keep] [--direct]
Env:   DUALERA_BIN=path  use this binary instead of `cargo build --locked --bin dualera`.
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
import urllib.request
from urllib.parse import urlsplit, urlunsplit
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
from wiretap import Wiretap  # noqa: E402
from replicas import Replicas  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CACHE = ROOT / ".cache" / "interop"
TS_DIR = HERE / "ts"

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
        print("  installing @modelcontextprotocol/sdk with npm ci ...", flush=True)
        run_quiet([npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=TS_DIR)
        stamp_file.write_text(stamp)
    pkg = json.loads((TS_DIR / "node_modules/@modelcontextprotocol/sdk/package.json").read_text())
    if pkg["version"] != "1.32.2":
        raise PeerError(f"node_modules has @modelcontextprotocol/sdk {pkg['version']}, expected 1.32.2")
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

# Wires (the driver's cfg["wire"]): how the client reaches the gateway.
HTTP, SSE, STDIO = "streamable-http", "sse", "stdio"
# What the sse and stdio columns run: scenarios 2-4.
ROUND_SCENARIOS = ("delete_accept", "delete_decline_cancel", "summarize")
# What the replicas columns run: 2-4 and the two interleaved sessions (8).
REPLICA_SCENARIOS = (*ROUND_SCENARIOS, "interleave")


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

    @property
    def label(self) -> str:
        return self.peer.label

    @property
    def wire_label(self) -> str:
        if self.era == "modern":
            return "pass-through"
        if self.backend == "replicas":
            return "3 replicas + haproxy"
        return {HTTP: "streamable http", SSE: "http+sse 2024-11-05", STDIO: "stdio"}[self.wire]

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
    ClientKind("python-legacy/replicas", PY_LEGACY, "legacy", HTTP, REPLICA_SCENARIOS, "replicas"),
    ClientKind("typescript-legacy/replicas", TS_LEGACY, "legacy", HTTP, REPLICA_SCENARIOS, "replicas"),
]


def build_binary() -> Path:
    if os.environ.get("DUALERA_BIN"):
        return Path(os.environ["DUALERA_BIN"]).resolve()
    subprocess.run(["cargo", "build", "--locked", "--quiet", "--bin", "dualera"], cwd=ROOT, check=True)
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    if not target.is_absolute():
        target = ROOT / target
    return target / "debug" / "dualera"


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
    def __init__(self, binary: Path, workdir: Path):
        self.dir = workdir / "demo"
        self.log_path = workdir / "dualera.log"
        self.log = open(self.log_path, "w")
        env = dict(os.environ, DUALERA_LOG="debug,dualera::wire=trace", NO_COLOR="1")
        self.proc = subprocess.Popen(
            [str(binary), "up", "--dir", str(self.dir), "--listen", "127.0.0.1:0"],
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
        self.upstream = info["modern server (direct)"]
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
        params = dict(params or {})
        params["_meta"] = {
            "io.modelcontextprotocol/protocolVersion": MODERN_VERSION,
            "io.modelcontextprotocol/clientCapabilities": {},
        }
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).encode()
        req = urllib.request.Request(self.upstream, data=body, method="POST", headers={
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": MODERN_VERSION,
            "Mcp-Method": method,
        })
        with urllib.request.urlopen(req, timeout=10) as r:
            text = r.read().decode()
            if "text/event-stream" in r.headers.get("Content-Type", ""):
                data = [ln[5:].strip() for ln in text.splitlines() if ln.startswith("data:")]
                text = data[-1]
        return json.loads(text)

    def log_tail(self, n: int = LOG_TAIL) -> str:
        self.log.flush()
        lines = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(lines[-n:])

    def stop(self) -> None:
        stop_process(self.proc)
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


@dataclass
class Scenario:
    name: str
    title: str
    make_cfg: Callable[[Dualera], dict]
    check: Callable[[Ctx], None]


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
]


# ---------------------------------------------------------------------------------------
# Running one case


def run_driver(client: ClientKind, cfg: dict, up: Dualera, snaps: dict, stderr_path: Path) -> dict:
    with open(stderr_path, "w") as err:
        proc = subprocess.Popen(
            [*client.peer.command, str(client.peer.script), json.dumps(cfg)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True, cwd=client.peer.script.parent,
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


def run_case(binary: Path, client: ClientKind, sc: Scenario, keep: bool, direct: bool) -> tuple[bool, str, str]:
    """(passed, one-line detail, failure report)."""
    if client.peer.error:
        return False, "peer missing", f"peer {client.name} ({client.label}) is not available:\n{client.peer.error}"
    workdir = Path(tempfile.mkdtemp(prefix=f"dualera-interop-{client.name.replace('/', '-')}-{sc.name}-"))
    up = None
    tap = None
    tap_hop = "client <-> gateway transcript (hop 1"
    stdio_log = workdir / "gateway-stdio.log"
    cx = None
    try:
        up = Replicas(binary, workdir) if client.backend == "replicas" else Dualera(binary, workdir)
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
        else:
            target = up.url if client.wire == HTTP else urlunsplit(urlsplit(up.url)._replace(path="/sse"))
            wire["url"] = target
            if not direct:
                tap = Wiretap(target)
                wire["url"] = tap.url
        cfg = {"scenario": sc.name, **wire, "workspace": up.workspace, "repo": up.repo, **sc.make_cfg(up)}
        cx = Ctx(client=client, up=up, cfg=cfg)
        if sc.name == "discover":
            cx.reference = up.upstream_call("tools/list")["result"]
        cx.snaps["start"] = up.notes()
        cx.obs = run_driver(client, cfg, up, cx.snaps, workdir / "client.stderr")
        cx.snaps["end"] = up.notes()
        want = MODERN_VERSION if client.era == "modern" else LEGACY_VERSION
        seen = cx.obs.get("protocol_versions") or []
        expect(seen and all(v == want for v in seen),
               f"sessions negotiated {seen}; a {client.era} client must negotiate {want} through the gateway")
        sc.check(cx)
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
        if up is not None:
            up.stop()
        if tap is not None:
            (workdir / "transcript.txt").write_text(tap.transcript() + "\n")
            tap.close()
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--client", action="append", choices=[c.name for c in CLIENTS])
    ap.add_argument("--scenario", action="append", choices=[s.name for s in SCENARIOS])
    ap.add_argument("--keep", action="store_true", help="keep every case's temporary directory")
    ap.add_argument("--direct", action="store_true", help="no recording tap between client and gateway")
    ap.add_argument("--all-scenarios", action="store_true",
                    help="run every scenario on every column (the sse and stdio columns run 2-4 by default)")
    args = ap.parse_args()
    clients = [c for c in CLIENTS if not args.client or c.name in args.client]
    scenarios = [s for s in SCENARIOS if not args.scenario or s.name in args.scenario]

    print("interop: preparing peers (pinned; cached under .cache/interop and tests/interop/ts/node_modules)")
    CACHE.mkdir(parents=True, exist_ok=True)
    for c in clients:
        if not c.peer.tried:
            c.peer.ensure()
            if c.peer.error:
                print(f"  {c.peer.label}: NOT AVAILABLE: {c.peer.error}", flush=True)
    binary = build_binary()
    print(f"interop: dualera binary {binary}")

    results: dict[tuple[str, str], tuple[bool, str]] = {}
    reports = []
    t_all = time.monotonic()
    for c in clients:
        for sc in scenarios:
            if not (args.all_scenarios or c.runs(sc.name)):
                continue
            t0 = time.monotonic()
            passed, detail, report = run_case(binary, c, sc, args.keep, args.direct)
            results[(c.name, sc.name)] = (passed, detail)
            print(f"  {'PASS' if passed else 'FAIL'}  {c.name:<23} {sc.name:<22} {time.monotonic() - t0:5.1f}s  {detail}",
                  flush=True)
            if report:
                reports.append(report)
                print(report, flush=True)

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
    print(f"\ninterop: {len(results)} cases in {time.monotonic() - t_all:.0f}s")
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
