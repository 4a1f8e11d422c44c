"""A legacy (2025-11-25) MCP server on the official Python SDK, mcp 1.30.0 FastMCP, that
makes its clients resume response streams (2025-11-25 transports, "Resumability and
Redelivery"): Streamable HTTP at /mcp with an event store, so every response stream
opens with a priming event (an id and `retry`), and a tool that closes its own stream
mid-call (`Context.close_sse_stream`). The Python column of tests/reverse_resume.rs;
`ts/resumable_server.mjs` is the TypeScript one, with the same tools and counts.

    resumable_server.py [port]

Binds 127.0.0.1 (a free port by default) and prints `PORT <n>` on stdout.

Tools: `add(a, b)`; `relay(n)`: one log line, then its response stream closed, then
after a pause n more lines and the result `relayed n`. `GET /stats` counts what reached
the server: "POST /mcp", "GET /mcp", "GET /mcp Last-Event-ID" (resumptions), and
"replayed" (events the store replayed).
"""

from __future__ import annotations

import itertools
import json
import socket
import sys
from collections import Counter, OrderedDict

import anyio
import uvicorn

from mcp.server.fastmcp import Context, FastMCP
from mcp.server.streamable_http import EventMessage, EventStore

# Events kept in all (the store forgets the oldest beyond).
MAX_EVENTS = 10_000
# Longer than the relay's pause: what follows the close is replayed on resumption.
RETRY_MS = 500

STATS: Counter[str] = Counter()


class OrderedEventStore(EventStore):
    """Event ids that sort in the order the events were stored, bounded."""

    def __init__(self) -> None:
        self.events: OrderedDict[str, tuple[str, object]] = OrderedDict()
        self.next = itertools.count()

    async def store_event(self, stream_id, message):
        event_id = f"{stream_id}_{next(self.next):012d}"
        self.events[event_id] = (stream_id, message)
        if len(self.events) > MAX_EVENTS:
            self.events.popitem(last=False)
        return event_id

    async def replay_events_after(self, last_event_id, send_callback):
        last = self.events.get(last_event_id)
        if last is None:
            return None
        stream = last[0]
        for event_id, (stream_id, message) in list(self.events.items()):
            if stream_id == stream and event_id > last_event_id and message is not None:
                STATS["replayed"] += 1
                await send_callback(EventMessage(message, event_id))
        return stream


mcp = FastMCP("resumable-fixture", event_store=OrderedEventStore(), retry_interval=RETRY_MS)


@mcp.tool()
def add(a: int, b: int) -> int:
    """Adds two integers."""
    return a + b


@mcp.tool()
async def relay(n: int, ctx: Context) -> str:
    """One log line, then closes its response stream; after a pause n more lines and the result."""
    await ctx.info("before")
    await ctx.close_sse_stream()
    await anyio.sleep(0.1)
    for i in range(n):
        await ctx.info(f"after {i}")
    return f"relayed {n}"


def counting(app):
    """Wraps an ASGI app: counts requests and resumptions, serves the counts at /stats."""

    async def wrapped(scope, receive, send):
        if scope["type"] == "http" and scope["path"] == "/stats":
            body = json.dumps(STATS).encode()
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": body})
            return
        if scope["type"] == "http":
            STATS[f"{scope['method']} {scope['path']}"] += 1
            if scope["method"] == "GET" and dict(scope["headers"]).get(b"last-event-id"):
                STATS[f"GET {scope['path']} Last-Event-ID"] += 1
        return await app(scope, receive, send)

    return wrapped


def main() -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", int(sys.argv[1]) if len(sys.argv) > 1 else 0))
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    config = uvicorn.Config(counting(mcp.streamable_http_app()), log_level="warning", lifespan="on")
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
