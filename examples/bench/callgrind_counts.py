#!/usr/bin/env python3
"""Gateway instructions per legacy request kind, counted by callgrind.

Timings on a shared two-core machine move with its load; instruction counts do not.
This starts `dualera serve` (a throw-away workspace) and `dualera gateway` in front of
it with the response cache off, the gateway under `valgrind --tool=callgrind
--dump-instr=no`, warms every path up, then runs each phase on its own and dumps the
counters after it (`callgrind_control --dump`, which zeroes them), so each figure is
the gateway's instructions for that phase alone, divided by its request count:

- `initialize`: a legacy session opened (`initialize`, then `notifications/initialized`),
  all on one keep-alive connection;
- `legacy call`: a plain `tools/call notes_list` on an already initialized session,
  answered with JSON;
- `elicitation flow`: `notes_create`, then `notes_delete` with its one elicitation
  accepted on a second connection while the call's SSE stream stays open;
- `pass-through`: the same `tools/call notes_list` from a modern (2026-07-28) client.

With `--session-store redis://HOST:PORT/DB` the gateway keeps its legacy sessions in
that Redis (a throw-away one: the bench's replicas scenario starts its own, this script
does not), as one replica: every request on the replica that holds the stream, the
"one replica" column of the bench's per-step table. Its background (lease and holder
renewals, the sweeper) runs during each phase too and is counted with it; the phases
last seconds under callgrind, so that is a few hundred instructions per request.

Usage (a profiling build: release with debug info, so the dumps name functions):

    cargo build --profile profiling --all-features --locked --bin dualera
    python3 examples/bench/callgrind_counts.py --dualera target/profiling/dualera \\
        --out /tmp/cg-after [--calls 200] [--flows 50] [--sessions 50] [--port 47100]

It prints one line per phase and leaves the dumps in `--out` for
`callgrind_annotate --inclusive=yes FILE`. Loopback only; the two processes are
stopped at the end. Standard library only.
"""

import argparse
import glob
import http.client
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time

LEGACY = "2025-11-25"
MODERN = "2026-07-28"
ACCEPT = "application/json, text/event-stream"


def spawn(cmd, log, env=None):
    """Starts a process whose stderr goes to `log`; returns it and its address."""
    logf = open(log, "w")
    p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=logf, env=env)
    deadline = time.time() + 180
    while time.time() < deadline:
        if p.poll() is not None:
            sys.exit(f"{cmd[0]} exited; see {log}")
        with open(log) as f:
            m = re.search(r"listening on https?://([0-9.]+:[0-9]+)", f.read())
        if m:
            host, port = m.group(1).rsplit(":", 1)
            return p, host, int(port)
        time.sleep(0.2)
    p.kill()
    sys.exit(f"{cmd[0]} did not report its address; see {log}")


class Conn:
    """One keep-alive HTTP/1.1 connection to the gateway's /mcp."""

    def __init__(self, host, port):
        self.c = http.client.HTTPConnection(host, port, timeout=120)

    def post(self, headers, body):
        h = {"Content-Type": "application/json", "Accept": ACCEPT}
        h.update(headers)
        self.c.request("POST", "/mcp", body=json.dumps(body).encode(), headers=h)
        return self.c.getresponse()

    def exchange(self, headers, body):
        """POSTs; returns (status, headers, the messages of a JSON or SSE answer)."""
        r = self.post(headers, body)
        data = r.read()
        ctype = r.getheader("Content-Type") or ""
        if ctype.startswith("text/event-stream"):
            msgs = [json.loads(line[5:]) for line in data.decode().splitlines()
                    if line.startswith("data:") and line[5:].strip()]
        else:
            msgs = [json.loads(data)] if data else []
        return r.status, r, msgs


def result(status, msgs):
    for m in reversed(msgs):
        if "result" in m:
            return m["result"]
        if "error" in m:
            sys.exit(f"JSON-RPC error: {m['error']}")
    sys.exit(f"HTTP {status} without a JSON-RPC response")


class Legacy:
    """One 2025-11-25 session: requests on `a`, answers to the gateway's requests on `b`."""

    def __init__(self, host, port):
        self.a = Conn(host, port)
        self.b = Conn(host, port)
        self.next = 0
        self.sid = open_session(self.a)
        self.h = {"Mcp-Session-Id": self.sid, "Mcp-Protocol-Version": LEGACY}

    def call(self, name, args):
        self.next += 1
        body = {"jsonrpc": "2.0", "id": self.next, "method": "tools/call",
                "params": {"name": name, "arguments": args}}
        r = self.a.post(self.h, body)
        if not (r.getheader("Content-Type") or "").startswith("text/event-stream"):
            return result(r.status, [json.loads(r.read())])
        # An SSE stream: answer the elicitation on `b` while this stream stays open.
        response = None
        while True:
            line = r.readline()
            if not line:
                break
            line = line.decode().rstrip("\r\n")
            if not line.startswith("data:") or not line[5:].strip():
                continue
            m = json.loads(line[5:])
            if "method" in m and "id" in m:
                note = m["params"]["requestedSchema"]["properties"]["note_id"]["enum"][0]
                reply = {"jsonrpc": "2.0", "id": m["id"],
                         "result": {"action": "accept",
                                    "content": {"note_id": note, "confirm": True}}}
                ans = self.b.post(self.h, reply)
                ans.read()
                if ans.status != 202:
                    sys.exit(f"the elicitation's answer: HTTP {ans.status}")
            elif "result" in m or "error" in m:
                response = m
        return result(r.status, [response] if response else [])


def open_session(conn):
    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": LEGACY, "capabilities": {"elicitation": {"form": {}}},
                       "clientInfo": {"name": "dualera-callgrind", "version": "0"}}}
    status, r, msgs = conn.exchange({}, init)
    sid = r.getheader("Mcp-Session-Id")
    if not sid:
        sys.exit(f"initialize: HTTP {status} without a session: {msgs}")
    result(status, msgs)
    st, _, _ = conn.exchange({"Mcp-Session-Id": sid, "Mcp-Protocol-Version": LEGACY},
                             {"jsonrpc": "2.0", "method": "notifications/initialized"})
    if st != 202:
        sys.exit(f"notifications/initialized: HTTP {st}")
    return sid


def modern_call(conn, ws):
    h = {"Mcp-Protocol-Version": MODERN, "Mcp-Method": "tools/call", "Mcp-Name": "notes_list"}
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "notes_list", "arguments": {"workspaceUri": ws},
                       "_meta": {"io.modelcontextprotocol/protocolVersion": MODERN,
                                 "io.modelcontextprotocol/clientCapabilities": {},
                                 "io.modelcontextprotocol/clientInfo":
                                     {"name": "dualera-callgrind", "version": "0"}}}}
    status, _, msgs = conn.exchange(h, body)
    return result(status, msgs)


def flow(legacy, ws, n):
    title = f"callgrind-{n}"
    legacy.call("notes_create", {"workspaceUri": ws, "title": title, "body": "bench"})
    r = legacy.call("notes_delete", {"workspaceUri": ws, "title": title})
    if not isinstance(r.get("structuredContent", {}).get("deleted"), str):
        sys.exit(f"notes_delete did not delete: {r}")


def dump(pid, out, label):
    """Dumps (and zeroes) the gateway's counters; returns the instructions since the last."""
    before = set(glob.glob(os.path.join(out, "callgrind.out.*")))
    subprocess.run(["callgrind_control", "--dump=" + label, str(pid)], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline:
        new = set(glob.glob(os.path.join(out, "callgrind.out.*"))) - before
        for path in new:
            with open(path) as f:
                text = f.read()
            m = re.search(r"^(?:summary|totals): (\d+)", text, re.M)
            if m:
                final = os.path.join(out, f"{label}.callgrind")
                shutil.move(path, final)
                return int(m.group(1)), final
        time.sleep(0.2)
    sys.exit(f"no callgrind dump for {label}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dualera", required=True, help="the dualera binary (profiling build)")
    ap.add_argument("--out", required=True, help="where the callgrind dumps are left")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--flows", type=int, default=50)
    ap.add_argument("--sessions", type=int, default=50)
    ap.add_argument("--session-store", default=None,
                    help="redis://… : legacy sessions in that Redis (one replica)")
    ap.add_argument("--port", type=int, default=0,
                    help="the server listens on PORT, the gateway on PORT+1 (0: any)")
    o = ap.parse_args()
    os.makedirs(o.out, exist_ok=True)
    for old in glob.glob(os.path.join(o.out, "*callgrind*")):
        os.remove(old)
    work = tempfile.mkdtemp(prefix="dualera-callgrind-")
    procs = []
    try:
        notes = os.path.join(work, "notes")
        repo = os.path.join(work, "repo")
        os.makedirs(notes)
        os.makedirs(repo)
        ws = "file://" + notes
        server_cfg = os.path.join(work, "server.toml")
        with open(server_cfg, "w") as f:
            f.write(f'[store]\npath = "{work}/dualera.db"\n\n[state]\nttl_ms = 3600000\n\n'
                    f'[[state.keys]]\nid = "bench"\nsecret = "{secrets.token_hex(32)}"\n\n'
                    f'[[grants]]\nprincipal = "local"\nworkspaces = ["{ws}"]\n'
                    f'repositories = ["{repo}"]\n')
        gw_cfg = os.path.join(work, "gateway.toml")
        with open(gw_cfg, "w") as f:
            f.write("[gateway]\nmax_sessions = 10000\nmax_sessions_per_caller = 10000\n"
                    "session_idle_ttl_secs = 7200\nlive_request_timeout_secs = 3600\n"
                    "max_in_flight = 64\n")
            if o.session_store:
                f.write(f'session_store = "{o.session_store}"\n'
                        f'session_key_prefix = "callgrind-{secrets.token_hex(4)}:"\n')
            f.write("\n[cache]\nenabled = false\n")
        env = dict(os.environ, DUALERA_LOG="warn")
        listen = lambda k: f"127.0.0.1:{o.port + k if o.port else 0}"
        server, host, sport = spawn([o.dualera, "serve", "--listen", listen(0),
                                     "--config", server_cfg],
                                    os.path.join(o.out, "server.log"), env)
        procs.append(server)
        gateway, host, gport = spawn(
            ["valgrind", "--tool=callgrind", "--dump-instr=no",
             f"--callgrind-out-file={o.out}/callgrind.out.%p",
             o.dualera, "gateway", "--listen", listen(1),
             "--upstream", f"http://{host}:{sport}/mcp", "--config", gw_cfg],
            os.path.join(o.out, "gateway.log"), env)
        procs.append(gateway)

        # Warm-up: every path once or more, its lazy state built.
        legacy = Legacy(host, gport)
        modern = Conn(host, gport)
        for n in range(20):
            legacy.call("notes_list", {"workspaceUri": ws})
            modern_call(modern, ws)
        for n in range(5):
            flow(legacy, ws, n)
        for _ in range(5):
            open_session(Conn(host, gport))
        dump(gateway.pid, o.out, "warmup")

        rows = []
        conn = Conn(host, gport)
        for _ in range(o.sessions):
            open_session(conn)
        rows.append(("initialize (+ notifications/initialized)", o.sessions,
                     dump(gateway.pid, o.out, "initialize")))
        for _ in range(o.calls):
            legacy.call("notes_list", {"workspaceUri": ws})
        rows.append(("plain legacy tools/call, initialized session", o.calls,
                     dump(gateway.pid, o.out, "legacy-call")))
        for n in range(o.flows):
            flow(legacy, ws, 100 + n)
        rows.append(("legacy elicitation flow", o.flows,
                     dump(gateway.pid, o.out, "flow")))
        for _ in range(o.calls):
            modern_call(modern, ws)
        rows.append(("pass-through tools/call", o.calls,
                     dump(gateway.pid, o.out, "passthrough")))
        for label, n, (ir, path) in rows:
            print(f"{label:<46} {n:>5} × {ir / n / 1000:>8.1f}k instructions"
                  f"  ({ir} in {os.path.basename(path)})")
    finally:
        for p in reversed(procs):
            p.terminate()
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
