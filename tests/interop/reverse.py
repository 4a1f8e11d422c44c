"""The interop suite's reverse part: modern-only hosts built on the official SDKs in front
of `dualera gateway`, whose upstream is a legacy server built on the official SDKs (the
reverse bridge, issue 25). Run by run.py (see NOTES.md, "Reverse bridge").

Columns (the legacy server, one SDK over one transport; `dualera gateway` in front of it
with `--upstream URL` or, for stdio, `--upstream-cmd`, and the era left to `auto`, the
default: the gateway finds the legacy server (and its transport: Streamable HTTP, else
HTTP+SSE) from the host's first `server/discover`, as a new user's gateway would):
  ts-1.32.2/streamable-http   ts/legacy_server.mjs (McpServer, stateful StreamableHTTPServerTransport)
  ts-1.32.2/stdio             ts/legacy_server.mjs over StdioServerTransport
  py-1.30.0/streamable-http   py/legacy_server.py (FastMCP, streamable_http_app)
  py-1.30.0/stdio             py/legacy_server.py over stdio
  py-1.30.0/sse               py/legacy_server.py, the 2024-11-05 HTTP+SSE transport (sse_app at /sse)
Hosts, each one process running every scenario in turn on one connection:
  python-modern               mcp 2.3.0 `Client(mode="2026-07-28")` (py/reverse_host.py)
  typescript-modern           @modelcontextprotocol/client 2.4.0, `versionNegotiation: {mode: {pin}}`
                              (ts/reverse_host.mjs)

Scenarios: tools (server/discover from the legacy initialize, tools/list, every tool);
journey (elicitation, then sampling, then roots: one `input_required` round each);
url_elicitation (URL mode); cancel (the host cancels the elicitation: the server records
the `cancel` action); expired (the host answers after the round's expiry: the retry gets
-32602 `expiredState` and the server records the call cancelled under it, i.e.
`notifications/cancelled`; a fresh call then completes). And on every HTTP column:
principals (per host SDK, three hosts with tokens alpha, beta, alpha: from the server's own
record, alpha's and beta's calls never share an upstream session, and every call carries
its own host's token).

Every check is on what the host saw *and* on the legacy server's own record
(LEGACY_SERVER_LOG, one JSON object per line: calls with their session id and
Authorization header, answers, cancellations). Drivers only act and record.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from procs import wait_line

HERE = Path(__file__).resolve().parent
MODERN_VERSION = "2026-07-28"
# The round expiry the gateway runs with (its [state] ttl_ms) and how long the expired
# scenario's host takes to answer: well past it, well inside the host's timeouts.
ROUND_TTL_MS = 2500
LATE_ANSWER_S = 4.0
HOST_TIMEOUT = 90.0
ROOTS = ["file:///work/a", "file:///work/b"]
TOOLS = {"add", "session_id", "authorization", "chatter", "big", "ask", "wait", "sample", "roots", "journey",
         "ask_url"}
# The Python server's extra tools for the gateway's own Rust tests (tests/reverse_era.rs,
# tests/reverse_replicas.rs);
# not ported to the TypeScript server, listed here so tools/list is still checked exactly.
PY_ONLY_TOOLS = {"steps", "header", "touch", "grow", "subscribed", "ask_then_log"}
CONSENT_URL = "https://example.com/consent"
PRINCIPAL_TOKENS = ("alpha", "beta", "alpha")
SCENARIOS = ("tools", "journey", "url_elicitation", "cancel", "expired")


class Fail(AssertionError):
    pass


def expect(cond: bool, msg: str) -> None:
    if not cond:
        raise Fail(msg)


@dataclass
class Column:
    """One legacy server: an SDK over a transport."""
    name: str
    sdk: str  # "ts" or "py"
    transport: str  # "streamable-http", "stdio", "sse"
    server_name: str  # its serverInfo.name

    @property
    def http(self) -> bool:
        return self.transport != "stdio"


COLUMNS = [
    Column("ts-1.32.2/streamable-http", "ts", "streamable-http", "legacy-fixture-ts"),
    Column("ts-1.32.2/stdio", "ts", "stdio", "legacy-fixture-ts"),
    Column("py-1.30.0/streamable-http", "py", "streamable-http", "legacy-fixture"),
    Column("py-1.30.0/stdio", "py", "stdio", "legacy-fixture"),
    Column("py-1.30.0/sse", "py", "sse", "legacy-fixture"),
]


def plan() -> list[dict]:
    """What every host does, scenario by scenario (run.py's expectations below match it)."""
    accept = {"action": "accept", "content": {"answer": "dualera"}}
    return [
        {"name": "tools", "discover": True, "elicit": accept, "calls": [
            ["add", {"a": 2, "b": 3}], ["session_id", {}], ["authorization", {}], ["chatter", {"n": 2}],
            ["big", {"n": 10}], ["wait", {"seconds": 0.1}], ["ask", {"question": "Name?"}],
            ["sample", {"prompt": "hi"}], ["roots", {}]]},
        {"name": "journey", "elicit": {"action": "accept", "content": {"answer": "north"}},
         "calls": [["journey", {"topic": "trip"}]]},
        {"name": "url_elicitation", "elicit": {"action": "accept"}, "calls": [["ask_url", {"url": CONSENT_URL}]]},
        {"name": "cancel", "elicit": {"action": "cancel"}, "calls": [["ask", {"question": "Cancel me?"}]]},
        {"name": "expired", "elicit": {"action": "accept", "content": {"answer": "late"}},
         "elicit_sleep": LATE_ANSWER_S, "calls": [["ask", {"question": "Too slow?"}], ["add", {"a": 1, "b": 1}]]},
    ]


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Stack:
    """A legacy server and `dualera gateway` (era `auto`) in front of it."""

    def __init__(self, binary: Path, column: Column, commands: dict[str, list[str]], workdir: Path):
        self.workdir = workdir
        self.record_path = workdir / "server.jsonl"
        self.record_path.touch()
        self.procs: list[subprocess.Popen] = []
        env = dict(os.environ, LEGACY_SERVER_LOG=str(self.record_path), NO_COLOR="1")
        script = HERE / ("ts/legacy_server.mjs" if column.sdk == "ts" else "py/legacy_server.py")
        server_cmd = [*commands[column.sdk], str(script), column.transport]
        if column.http:
            self.server_log = workdir / "server.log"
            with open(self.server_log, "w") as out:
                server = subprocess.Popen(server_cmd, stdout=out, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, env=env, cwd=script.parent)
            self.procs.append(server)
            port = wait_line(self.server_log, "PORT ", server, 60).split()[-1]
            path = "/sse" if column.transport == "sse" else "/mcp"
            upstream = ["--upstream", f"http://127.0.0.1:{port}{path}"]
        else:
            # `--upstream-cmd` splits on whitespace: the paths have none.
            upstream = ["--upstream-cmd", " ".join(server_cmd)]
        config = workdir / "gateway.toml"
        config.write_text(f"[state]\nttl_ms = {ROUND_TTL_MS}\n\n[[state.keys]]\nid = \"interop\"\n"
                          f"secret = \"{os.urandom(16).hex()}\"\n")
        self.log_path = workdir / "dualera.log"
        with open(self.log_path, "w") as log:
            gw = subprocess.Popen(
                [str(binary), "gateway", "--config", str(config), *upstream, "--listen", "127.0.0.1:0"],
                stdout=subprocess.DEVNULL, stderr=log, stdin=subprocess.DEVNULL,
                env=dict(env, DUALERA_LOG="debug,dualera::wire=trace"))
        self.procs.append(gw)
        self.url = wait_line(self.log_path, "gateway listening on", gw, 60).split()[-1]

    def records(self) -> list[dict]:
        out = []
        for line in self.record_path.read_text(errors="replace").splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                pass
        return out

    def log_tail(self, n: int = 60) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def stop(self) -> None:
        for p in reversed(self.procs):
            stop(p)


def run_host(command: list[str], script: Path, cfg: dict, stderr_path: Path) -> dict:
    with open(stderr_path, "a") as err:
        try:
            p = subprocess.run([*command, str(script), json.dumps(cfg)], stdout=subprocess.PIPE, stderr=err,
                               stdin=subprocess.DEVNULL, text=True, timeout=HOST_TIMEOUT, cwd=script.parent)
        except subprocess.TimeoutExpired:
            raise Fail(f"the host did not finish within {HOST_TIMEOUT:.0f}s")
    for line in reversed(p.stdout.splitlines()):
        try:
            msg = json.loads(line)
        except json.JSONDecodeError:
            continue
        if msg.get("event") == "done":
            return msg["obs"]
        if msg.get("event") == "error":
            raise Fail(f"the host raised:\n{msg['error']}")
    raise Fail(f"the host exited {p.returncode} without reporting:\n{p.stdout[-2000:]}")


# ---------------------------------------------------------------------------------------
# Expectations


def text_of(call: dict) -> str:
    res = call.get("result") or {}
    return "\n".join(b.get("text", "") for b in res.get("content", []) if b.get("type") == "text")


def result_text(obs: dict, i: int, tool: str) -> str:
    calls = obs.get("calls") or []
    expect(len(calls) > i, f"call #{i} ({tool}) never made; calls: {[c['tool'] for c in calls]}")
    call = calls[i]
    expect(call["tool"] == tool, f"call #{i} is {call['tool']}, expected {tool}")
    expect("result" in call, f"{tool}: error {call.get('error')}")
    expect(not call["result"].get("isError"), f"{tool}: isError result {text_of(call)!r}")
    return text_of(call)


def events(records: list[dict], event: str, tool: str) -> list[dict]:
    return [r for r in records if r["event"] == event and r.get("tool") == tool]


def check_common(obs: dict) -> None:
    expect("exception" not in obs, f"the host raised:\n{obs.get('exception')}")
    expect(obs.get("protocol_version") == MODERN_VERSION,
           f"the host negotiated {obs.get('protocol_version')!r}, not {MODERN_VERSION} (a fallback to initialize?)")


def check_tools(col: Column, obs: dict, records: list[dict], token: str) -> str:
    d = obs.get("discover") or {}
    info = (d.get("_meta") or {}).get("io.modelcontextprotocol/serverInfo") or d.get("serverInfo") or {}
    expect(info.get("name") == col.server_name, f"server/discover names {info!r}, expected {col.server_name}")
    expect(d.get("instructions") == "A legacy fixture server.", f"instructions {d.get('instructions')!r}")
    expect("tools" in (d.get("capabilities") or {}), f"capabilities {d.get('capabilities')}")
    listed = TOOLS | (PY_ONLY_TOOLS if col.sdk == "py" else set())
    expect(set(obs.get("tools") or []) == listed, f"tools/list {sorted(obs.get('tools') or [])}, expected {sorted(listed)}")
    expect(result_text(obs, 0, "add") == "5", "add(2, 3)")
    session = result_text(obs, 1, "session_id")
    expect(bool(session), "session_id is empty")
    seen_token = result_text(obs, 2, "authorization")
    want_token = f"Bearer {token}" if col.http else ""
    expect(seen_token == want_token, f"the server saw Authorization {seen_token!r}, expected {want_token!r}")
    expect(result_text(obs, 3, "chatter") == "2", "chatter(2)")
    expect(result_text(obs, 4, "big") == "x" * 10, "big(10)")
    expect(result_text(obs, 5, "wait") == "waited", "wait")
    expect(result_text(obs, 6, "ask") == "answered: dualera", "ask")
    expect(result_text(obs, 7, "sample") == "sampled: model: hi", "sample")
    expect(result_text(obs, 8, "roots") == "roots: " + ",".join(ROOTS), "roots")
    expect(obs.get("order") == ["elicitation", "sampling", "roots"], f"handlers ran {obs.get('order')}")
    expect([e["action"] for e in events(records, "elicit", "ask")][:1] == ["accept"], "the server saw no accepted ask")
    expect(any(e["text"] == "model: hi" for e in events(records, "sampled", "sample")), "the server saw no sampling answer")
    expect(any(e["uris"] == ROOTS for e in events(records, "roots", "roots")), "the server saw no roots answer")
    return f"{len(obs['tools'])} tools, serverInfo {info.get('name')} {info.get('version', '')}"


def check_journey(col: Column, obs: dict, records: list[dict], token: str) -> str:
    got = result_text(obs, 0, "journey")
    want = "journey: answer=north; sampled=model: trip: north; roots=" + ",".join(ROOTS)
    expect(got == want, f"journey answered {got!r}, expected {want!r}")
    expect(obs.get("order") == ["elicitation", "sampling", "roots"],
           f"the host's handlers ran {obs.get('order')}, expected one elicitation, one sampling, one roots round")
    el = (obs.get("elicitations") or [{}])[0]
    expect(el.get("message") == "Where to, for trip?" and el.get("mode", "form") == "form", f"elicitation {el}")
    s = (obs.get("samplings") or [{}])[0]
    expect(((s.get("messages") or [{}])[0].get("content") or {}).get("text") == "trip: north", f"sampling {s}")
    seq = [r["event"] for r in records if r.get("tool") == "journey"]
    expect(seq == ["call", "elicit", "sampled", "roots"], f"the server's record of journey: {seq}")
    # On the host's wire: the call, then one retry per round, each answering one request.
    wire = [w for w in obs.get("wire") or [] if w["tool"] == "journey"]
    expect(len(wire) == 4 and not wire[0]["requestState"] and not wire[0]["inputResponses"],
           f"the host sent {wire}: expected the call and three retries")
    expect(all(w["requestState"] and len(w["inputResponses"]) == 1 for w in wire[1:]),
           f"each retry must echo requestState and answer one input request: {wire[1:]}")
    return "elicitation, sampling, roots: three input_required rounds of one request each"


def check_url(col: Column, obs: dict, records: list[dict], token: str) -> str:
    expect(result_text(obs, 0, "ask_url") == "url: accept", "ask_url")
    el = (obs.get("elicitations") or [{}])[0]
    expect(el.get("mode") == "url" and el.get("url") == CONSENT_URL, f"the host got {el}")
    expect([(e["mode"], e["action"]) for e in events(records, "elicit", "ask_url")] == [("url", "accept")],
           f"the server's record: {events(records, 'elicit', 'ask_url')}")
    return f"mode url, {CONSENT_URL}"


def check_cancel(col: Column, obs: dict, records: list[dict], token: str) -> str:
    expect(result_text(obs, 0, "ask") == "not answered: cancel", "ask after cancel")
    actions = [e["action"] for e in events(records, "elicit", "ask")]
    expect("cancel" in actions, f"the server never saw the elicitation cancelled: {actions}")
    return "the server saw action cancel"


def check_expired(col: Column, obs: dict, records: list[dict], token: str) -> str:
    calls = obs.get("calls") or []
    expect(len(calls) == 2, f"calls {calls}")
    err = calls[0].get("error") or {}
    expect(err.get("code") == -32602 and (err.get("data") or {}).get("reason") == "expiredState",
           f"the late retry got {calls[0].get('result') or err}, expected -32602 expiredState")
    expect(result_text(obs, 1, "add") == "2", "a fresh call after the expired round")
    # The gateway cancelled the legacy call when the round lapsed (2025-11-25
    # basic/utilities/cancellation): the server's handler was cancelled under it.
    expect(events(records, "cancelled", "ask"), "the server never saw notifications/cancelled for the lapsed round")
    answered = [e["action"] for e in events(records, "elicit", "ask")]
    expect(answered == ["accept", "cancel"], f"the server saw answers {answered}: the late one must not reach it")
    return "-32602 expiredState; the server's call was cancelled"


CHECKS = {"tools": check_tools, "journey": check_journey, "url_elicitation": check_url,
          "cancel": check_cancel, "expired": check_expired}


def check_sessions(col: Column, records: list[dict], token: str) -> str:
    calls = [r for r in records if r["event"] == "call"]
    expect(bool(calls), "the server recorded no call")
    sessions = {r["session"] for r in calls}
    expect(len(sessions) == 1, f"one host, one partition: the server saw sessions {sessions}")
    if col.http:
        auths = {r["auth"] for r in calls}
        expect(auths == {f"Bearer {token}"}, f"the server saw Authorization {auths}")
    return next(iter(sessions))


# ---------------------------------------------------------------------------------------
# Running


def run(binary: Path, hosts: dict, commands: dict[str, list[str]], keep: bool,
        columns: list[str] | None = None) -> list[tuple[str, str, str, bool, str, str]]:
    """(column, host, scenario, passed, detail, report) for every case. `hosts`: name ->
    (Peer, script); `commands`: "py"/"ts" -> the interpreter of the legacy servers."""
    results = []
    for col in COLUMNS:
        if columns and col.name not in columns:
            continue
        workdir = Path(tempfile.mkdtemp(prefix=f"dualera-interop-reverse-{col.name.replace('/', '-')}-"))
        stack = None
        failed = False

        def report(what: str, reason: str, obs: dict | None = None) -> str:
            parts = [f"--- reverse {col.name} / {what}: FAILED", reason.rstrip()]
            if obs:
                parts.append("--- host observations:\n" + json.dumps(obs, indent=1)[:4000])
            if stack is not None:
                parts.append("--- the legacy server's record:\n" + stack.record_path.read_text(errors="replace")[-3000:])
                parts.append(f"--- dualera log (tail, full: {stack.log_path}):\n{stack.log_tail()}")
            parts.append(f"--- kept: {workdir}")
            return "\n".join(parts)

        try:
            stack = Stack(binary, col, commands, workdir)
        except Exception as e:  # noqa: BLE001
            for host in hosts:
                for sc in SCENARIOS:
                    results.append((col.name, host, sc, False, "stack did not start", report("start", str(e))))
            failed = True
            _cleanup(stack, workdir, keep or failed)
            continue
        try:
            for host, (peer, script) in hosts.items():
                t0 = time.monotonic()
                before = len(stack.records())
                obs_all: dict = {}
                error = ""
                if peer.error:
                    error = f"peer {host} is not available:\n{peer.error}"
                else:
                    try:
                        obs_all = run_host(peer.command, script, {"url": stack.url, "token": "alpha", "roots": ROOTS,
                                                                  "scenarios": plan()}, workdir / f"{host}.stderr")
                    except Exception as e:  # noqa: BLE001
                        error = str(e) if isinstance(e, Fail) else traceback.format_exc()
                # The lapsed round's cancellation may land just after the host is done.
                deadline = time.monotonic() + 10
                while not error and time.monotonic() < deadline and not events(stack.records()[before:], "cancelled", "ask"):
                    time.sleep(0.1)
                records = stack.records()[before:]
                elapsed = time.monotonic() - t0
                session = ""
                for sc in SCENARIOS:
                    obs = obs_all.get(sc) or {}
                    try:
                        expect(not error, error)
                        check_common(obs)
                        detail = CHECKS[sc](col, obs, records, "alpha")
                        if sc == "tools":
                            session = check_sessions(col, records, "alpha")
                            detail += f"; one upstream session {session[:12]}"
                        results.append((col.name, host, sc, True, detail + (f" ({elapsed:.1f}s for all)" if sc == "tools" else ""), ""))
                    except Exception as e:  # noqa: BLE001
                        reason = str(e) if isinstance(e, Fail) else traceback.format_exc()
                        failed = True
                        results.append((col.name, host, sc, False, reason.strip().splitlines()[0][:100],
                                        report(f"{host} / {sc}", reason, obs)))
            if col.http:
                for name, host in hosts.items():
                    results.append(principals(col, stack, name, host, workdir, report))
                    failed = failed or not results[-1][3]
        finally:
            _cleanup(stack, workdir, keep or failed)
    return results


def principals(col: Column, stack: Stack, name: str, host, workdir: Path, report) -> tuple:
    """Three hosts of one SDK, tokens alpha, beta, alpha: alpha's and beta's calls never
    share an upstream session, asserted from the server's own record of its session ids."""
    peer, script = host
    try:
        expect(not peer.error, f"peer not available: {peer.error}")
        seen: list[tuple[str, set[str]]] = []
        for token in PRINCIPAL_TOKENS:
            before = len(stack.records())
            obs = run_host(peer.command, script, {"url": stack.url, "token": token, "roots": ROOTS, "scenarios": [
                {"name": "whoami", "elicit": {"action": "decline"},
                 "calls": [["wait", {"seconds": 0}], ["authorization", {}], ["wait", {"seconds": 0}]]}]},
                workdir / f"principal-{name}-{token}.stderr")["whoami"]
            check_common(obs)
            expect(result_text(obs, 1, "authorization") == f"Bearer {token}", f"{token}: the server saw another token")
            calls = [r for r in stack.records()[before:] if r["event"] == "call"]
            expect(len(calls) == 2 and {r["auth"] for r in calls} == {f"Bearer {token}"},
                   f"{token}: the server recorded {calls}")
            seen.append((token, {r["session"] for r in calls}))
        by_token: dict[str, set[str]] = {}
        for token, sessions in seen:
            by_token.setdefault(token, set()).update(sessions)
        shared = by_token["alpha"] & by_token["beta"]
        expect(not shared, f"alpha and beta shared the upstream session(s) {shared}")
        reuse = "shared" if seen[0][1] & seen[2][1] else "did not share"
        return (col.name, name, "principals", True,
                f"alpha {sorted(s[:8] for s in by_token['alpha'])}, beta {sorted(s[:8] for s in by_token['beta'])}: "
                f"disjoint; alpha's two hosts {reuse} one", "")
    except Exception as e:  # noqa: BLE001
        reason = str(e) if isinstance(e, Fail) else traceback.format_exc()
        return (col.name, name, "principals", False, reason.strip().splitlines()[0][:100],
                report(f"{name} / principals", reason))


def _cleanup(stack: Stack | None, workdir: Path, keep: bool) -> None:
    if stack is not None:
        stack.stop()
    if keep:
        print(f"  reverse: kept {workdir}", flush=True)
    else:
        shutil.rmtree(workdir, ignore_errors=True)
