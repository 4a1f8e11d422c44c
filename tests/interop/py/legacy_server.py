"""A legacy (2025-11-25) MCP server built on the official Python SDK, mcp 1.30.0 FastMCP:
the upstream of tests/legacy_upstream.rs (the gateway's era probe, its legacy upstream
sessions and the legacy pass-through).

    legacy_server.py streamable-http   Streamable HTTP at /mcp (stateful sessions)
    legacy_server.py sse               the 2024-11-05 HTTP+SSE transport at /sse
    legacy_server.py stdio             newline-delimited JSON-RPC on stdin/stdout
    legacy_server.py streamable-http-notify
                                       Streamable HTTP as above, declaring
                                       `listChanged` for tools, prompts and resources
                                       and `resources.subscribe` (with handlers)
    legacy_server.py streamable-http-slow-get
                                       Streamable HTTP as above, answering each `GET`
                                       (the standalone stream) half a second late: a
                                       client that sends its first call before the
                                       stream's head came back loses the server's
                                       requests that belong to no request (`sample`,
                                       `roots`), which this SDK sends on that stream
    legacy_server.py streamable-http-auth
                                       Streamable HTTP as above behind bearer tokens:
                                       without `good` or `admin` a 401 with a
                                       `WWW-Authenticate` challenge; `add` needs
                                       `admin` (else a 403 `insufficient_scope`)

Over HTTP it binds 127.0.0.1 on a free port and prints `PORT <n>` on stdout. Every HTTP
request is counted by (method, path, JSON-RPC method) and the counts are served at
`GET /stats` (not an MCP endpoint), so a test can tell how many requests reached it.

Tools: `add(a, b)`; `session_id()`, the `Mcp-Session-Id` this server sees on the request
(its own id for the session; over HTTP+SSE the endpoint's `session_id`); `authorization()`, the `Authorization` header it
received; `ask(question)`, which elicits an answer from the client
(a server-to-client request inside the call) and returns it; `chatter(n, pad=0)`, n log
notifications on the request's stream before its result (each padded with pad dots); `big(n)`, n bytes of text;
`sample(prompt)`, which asks the client's model (sampling) and returns its text;
`roots()`, which lists the client's roots and returns their URIs; `wait(seconds)`,
which sleeps (a call to cancel); `journey(topic)`, which elicits a form, then samples,
then lists the roots, one after the other, and returns all three answers; `ask_url(url)`,
a URL-mode elicitation; `ask_then_log(question, n)`, which elicits an answer, then sends
n log notifications on the request's stream before returning it.

With `LEGACY_SERVER_LOG=path` in its environment it appends one JSON object per line
to that file for what it saw: every tool call (`call`: the tool, the session id it is
served on, the `Authorization` header), every answer to its own requests (`elicit`
with the action, `sampled`, `roots`) and every call cancelled under it (`cancelled`:
the client's `notifications/cancelled` ended the call). tests/interop/reverse.py
checks the reverse bridge from that record. `ts/legacy_server.mjs` is a port of this
server onto the TypeScript SDK 1.32.2 with the same tools and the same record.

Tools for the bridge's own tests (not ported): `steps(tag, n)`, n steps of a log line `tag i` and a
progress notification each, on the request's stream, then `tag`; `header(name)`, the
named HTTP header of this request; `touch(uri)`, `notifications/resources/updated` for
uri; `grow(name)`, a new tool `name` and `notifications/tools/list_changed`;
`subscribed()`, the resource URIs subscribed on this server, comma-separated.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from collections import Counter
from contextlib import contextmanager

import anyio
import uvicorn
from pydantic import BaseModel

from mcp.server.fastmcp import Context, FastMCP
from mcp.types import SamplingMessage, TextContent

mcp = FastMCP("legacy-fixture", instructions="A legacy fixture server.")

STATS: Counter[str] = Counter()
LOG = os.environ.get("LEGACY_SERVER_LOG")


def record(event: str, **fields) -> None:
    """One line of the server's own record (only with LEGACY_SERVER_LOG set)."""
    if LOG:
        with open(LOG, "a") as f:
            f.write(json.dumps({"event": event, **fields}) + "\n")


def session_of(ctx: Context) -> str:
    """The session this request is served on: its Mcp-Session-Id (Streamable HTTP),
    its `session_id` query parameter (HTTP+SSE), or the process (stdio)."""
    request = ctx.request_context.request
    if request is None:
        return f"stdio-{os.getpid()}"
    return request.headers.get("mcp-session-id") or request.query_params.get("session_id", "")


def authorization_of(ctx: Context) -> str:
    request = ctx.request_context.request
    return "" if request is None else request.headers.get("authorization", "")


@contextmanager
def recorded(tool: str, ctx: Context):
    """Records the call, and its cancellation if the client cancels it."""
    record("call", tool=tool, session=session_of(ctx), auth=authorization_of(ctx))
    try:
        yield
    except anyio.get_cancelled_exc_class():
        record("cancelled", tool=tool, session=session_of(ctx))
        raise


@mcp.tool()
def add(a: int, b: int) -> int:
    """Adds two integers."""
    return a + b


@mcp.tool()
def session_id(ctx: Context) -> str:
    """The session of this request as this server sees it: its Mcp-Session-Id, or over
    HTTP+SSE the `session_id` of the endpoint it posts to."""
    if ctx.request_context.request is None:
        return "stdio"
    return session_of(ctx)


@mcp.tool()
def authorization(ctx: Context) -> str:
    """The Authorization header of this request, as this server received it."""
    request = ctx.request_context.request
    return "" if request is None else request.headers.get("authorization", "")


@mcp.tool()
async def chatter(n: int, ctx: Context, pad: int = 0) -> int:
    """Sends n log notifications on the request's stream ("line i", then pad dots),
    then returns n."""
    for i in range(n):
        await ctx.info(f"line {i}" + "." * pad)
    return n


@mcp.tool()
async def ask_then_log(question: str, n: int, ctx: Context) -> str:
    """Elicits an answer, then sends n log notifications, then returns the answer."""
    with recorded("ask_then_log", ctx):
        result = await ctx.elicit(message=question, schema=Answer)
        record("elicit", tool="ask_then_log", mode="form", action=result.action)
        for i in range(n):
            await ctx.info(f"after {i}")
    if result.action == "accept" and result.data is not None:
        return f"answered: {result.data.answer}"
    return f"not answered: {result.action}"


@mcp.tool()
def big(n: int) -> str:
    """Returns n bytes of text."""
    return "x" * n


class Answer(BaseModel):
    answer: str


@mcp.tool()
async def ask(question: str, ctx: Context) -> str:
    """Asks the client (elicitation) and returns what it answered."""
    with recorded("ask", ctx):
        result = await ctx.elicit(message=question, schema=Answer)
        record("elicit", tool="ask", mode="form", action=result.action)
    if result.action == "accept" and result.data is not None:
        return f"answered: {result.data.answer}"
    return f"not answered: {result.action}"


@mcp.tool()
async def wait(seconds: float, ctx: Context) -> str:
    """Sleeps, then returns (a call a client can cancel meanwhile)."""
    with recorded("wait", ctx):
        await anyio.sleep(seconds)
    return "waited"


@mcp.tool()
async def sample(prompt: str, ctx: Context) -> str:
    """Asks the client's model (sampling) and returns its text."""
    with recorded("sample", ctx):
        text = await sampled(prompt, ctx)
    record("sampled", tool="sample", text=text)
    return f"sampled: {text}"


async def sampled(prompt: str, ctx: Context) -> str:
    result = await ctx.session.create_message(
        messages=[SamplingMessage(role="user", content=TextContent(type="text", text=prompt))],
        max_tokens=64,
    )
    return result.content.text if isinstance(result.content, TextContent) else "?"


@mcp.tool()
async def roots(ctx: Context) -> str:
    """Lists the client's roots and returns their URIs."""
    with recorded("roots", ctx):
        uris = await root_uris(ctx)
    record("roots", tool="roots", uris=uris)
    return "roots: " + ",".join(uris)


async def root_uris(ctx: Context) -> list[str]:
    result = await ctx.session.list_roots()
    return [str(r.uri) for r in result.roots]


@mcp.tool()
async def journey(topic: str, ctx: Context) -> str:
    """Elicits a form, then samples, then lists the roots; returns the three answers."""
    with recorded("journey", ctx):
        asked = await ctx.elicit(message=f"Where to, for {topic}?", schema=Answer)
        record("elicit", tool="journey", mode="form", action=asked.action)
        if asked.action != "accept" or asked.data is None:
            return f"journey stopped: {asked.action}"
        text = await sampled(f"{topic}: {asked.data.answer}", ctx)
        record("sampled", tool="journey", text=text)
        uris = await root_uris(ctx)
        record("roots", tool="journey", uris=uris)
    return f"journey: answer={asked.data.answer}; sampled={text}; roots={','.join(uris)}"


@mcp.tool()
async def ask_url(url: str, ctx: Context) -> str:
    """Asks the client to open a URL (URL-mode elicitation); returns its action."""
    with recorded("ask_url", ctx):
        result = await ctx.elicit_url(message="Open this page to go on.", url=url,
                                      elicitation_id="interop-url-1")
        record("elicit", tool="ask_url", mode="url", action=result.action)
    return f"url: {result.action}"


@mcp.tool()
async def steps(tag: str, n: int, ctx: Context) -> str:
    """n steps, each a log line and a progress notification on the request's stream."""
    for i in range(n):
        await ctx.info(f"{tag} {i}")
        await ctx.report_progress(i + 1, n)
        await anyio.sleep(0.05)
    return tag


@mcp.tool()
def header(name: str, ctx: Context) -> str:
    """The named HTTP header of this request, as this server received it."""
    request = ctx.request_context.request
    return "" if request is None else request.headers.get(name, "")


@mcp.tool()
async def touch(uri: str, ctx: Context) -> str:
    """Says resource uri changed (notifications/resources/updated)."""
    await ctx.session.send_resource_updated(uri)
    return "touched"


@mcp.tool()
async def grow(name: str, ctx: Context) -> str:
    """Adds a tool and says so (notifications/tools/list_changed)."""
    mcp.add_tool(lambda: name, name=name, description="A tool added at run time.")
    await ctx.session.send_tool_list_changed()
    return "grown"


SUBSCRIBED: set[str] = set()


@mcp.tool()
def subscribed() -> str:
    """The resource URIs subscribed on this server, comma-separated."""
    return ",".join(sorted(SUBSCRIBED))


def declare_notifications() -> None:
    """Declares listChanged for tools, prompts and resources and resources.subscribe,
    with subscribe handlers (FastMCP declares none of these by itself)."""
    from mcp.server.lowlevel.server import NotificationOptions

    server = mcp._mcp_server
    options = NotificationOptions(prompts_changed=True, resources_changed=True, tools_changed=True)
    create = server.create_initialization_options
    server.create_initialization_options = lambda *a, **k: create(options, *a[1:], **k)
    capabilities = server.get_capabilities

    def with_subscribe(*a, **k):
        caps = capabilities(*a, **k)
        if caps.resources is not None:
            caps.resources.subscribe = True
        return caps

    server.get_capabilities = with_subscribe

    @server.subscribe_resource()
    async def _subscribe(uri) -> None:
        SUBSCRIBED.add(str(uri))

    @server.unsubscribe_resource()
    async def _unsubscribe(uri) -> None:
        SUBSCRIBED.discard(str(uri))


def counting(app):
    """Wraps an ASGI app: counts every HTTP request, serves the counts at /stats."""

    async def wrapped(scope, receive, send):
        if scope["type"] != "http":
            return await app(scope, receive, send)
        if scope["path"] == "/stats":
            body = json.dumps(STATS).encode()
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": body})
            return
        method = scope["method"]
        key = f"{method} {scope['path']}"
        if method != "POST":
            STATS[key] += 1
            return await app(scope, receive, send)
        # Read the body to name the JSON-RPC method, then replay it to the app.
        chunks = []
        more = True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        try:
            rpc = json.loads(body).get("method", "-")
        except (ValueError, AttributeError):
            rpc = "-"
        STATS[f"{key} {rpc}"] += 1
        sent = False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return await app(scope, replay, send)

    return wrapped


def guarded(app):
    """Wraps an ASGI app behind bearer tokens (the streamable-http-auth mode)."""

    async def refuse(send, status, challenge, error):
        body = json.dumps({"error": error}).encode()
        await send({"type": "http.response.start", "status": status, "headers": [
            (b"content-type", b"application/json"),
            (b"www-authenticate", challenge.encode()),
        ]})
        await send({"type": "http.response.body", "body": body})

    async def wrapped(scope, receive, send):
        if scope["type"] != "http" or scope["path"] == "/stats":
            return await app(scope, receive, send)
        headers = dict(scope["headers"])
        token = headers.get(b"authorization", b"").decode()
        host = headers.get(b"host", b"").decode()
        if token not in ("Bearer good", "Bearer admin"):
            challenge = (f'Bearer error="invalid_token", '
                         f'resource_metadata="http://{host}/.well-known/oauth-protected-resource"')
            return await refuse(send, 401, challenge, "invalid_token")
        if scope["method"] != "POST" or token == "Bearer admin":
            return await app(scope, receive, send)
        chunks = []
        more = True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        try:
            rpc = json.loads(body)
            name = rpc.get("params", {}).get("name") if rpc.get("method") == "tools/call" else None
        except (ValueError, AttributeError):
            name = None
        if name == "add":
            challenge = 'Bearer error="insufficient_scope", scope="notes:admin"'
            return await refuse(send, 403, challenge, "insufficient_scope")
        sent = False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return await app(scope, replay, send)

    return wrapped


def slow_get(app, seconds: float):
    """Wraps an ASGI app so that each `GET` reaches it `seconds` late (the
    streamable-http-slow-get mode)."""

    async def wrapped(scope, receive, send):
        if scope["type"] == "http" and scope["method"] == "GET" and scope["path"] == "/mcp":
            await anyio.sleep(seconds)
        return await app(scope, receive, send)

    return wrapped


def serve_http(app) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    port = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    sock.bind(("127.0.0.1", port))
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    config = uvicorn.Config(counting(app), log_level="warning", lifespan="on")
    uvicorn.Server(config).run(sockets=[sock])


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "streamable-http"
    if mode == "stdio":
        mcp.run(transport="stdio")
    elif mode == "sse":
        serve_http(mcp.sse_app())
    elif mode == "streamable-http":
        serve_http(mcp.streamable_http_app())
    elif mode == "streamable-http-slow-get":
        serve_http(slow_get(mcp.streamable_http_app(), 0.5))
    elif mode == "streamable-http-auth":
        serve_http(guarded(mcp.streamable_http_app()))
    elif mode == "streamable-http-notify":
        declare_notifications()
        serve_http(mcp.streamable_http_app())
    else:
        sys.exit(f"unknown transport {mode!r}")


if __name__ == "__main__":
    main()
