"""Interop peer: the official Python SDK, mcp 1.30.0, as a legacy (2025-11-25) host.

`ClientSession` with elicitation, sampling and roots callbacks, over the transport named
by the config's `wire`: `streamable-http` (`streamablehttp_client(url)`), `sse` (the
2024-11-05 transport, `sse_client(url)` on the gateway's `/sse`) or `stdio`
(`stdio_client`, spawning `dualera gateway --stdio ...` as described by `cfg["stdio"]`).
Run by tests/interop/run.py inside its own venv; argv[1] is the scenario config (JSON).
See scenarios.py for the protocol.
"""

from __future__ import annotations

import contextlib
import os
import ssl
import sys
from datetime import timedelta

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import scenarios  # noqa: E402
import httpx  # noqa: E402
from mcp import ClientSession, types  # noqa: E402
from mcp.client.experimental.task_handlers import ExperimentalTaskHandlers  # noqa: E402
from mcp.client.sse import sse_client  # noqa: E402
from mcp.client.stdio import StdioServerParameters, stdio_client  # noqa: E402
from mcp.client.streamable_http import streamablehttp_client  # noqa: E402
from mcp.shared.exceptions import McpError  # noqa: E402


def dump(model) -> dict:
    return model.model_dump(by_alias=True, exclude_none=True, mode="json")


class Conn:
    def __init__(self, session: ClientSession, init: types.InitializeResult):
        self.session = session
        self.init = init

    async def info(self) -> dict:
        return {
            "protocolVersion": self.init.protocolVersion,
            "serverInfo": dump(self.init.serverInfo),
            "capabilities": dump(self.init.capabilities),
        }

    async def list_tools(self) -> list[dict]:
        return [dump(t) for t in (await self.session.list_tools()).tools]

    async def call(self, name: str, arguments: dict) -> dict:
        return await outcome(self.session.call_tool(name, arguments))

    # The SDK's experimental task API (2025-11-25 tasks).
    async def call_as_task(self, name: str, arguments: dict) -> dict:
        return await outcome(self.session.experimental.call_tool_as_task(name, arguments, ttl=120000))

    async def get_task(self, task_id: str) -> dict:
        return await outcome(self.session.experimental.get_task(task_id))

    async def task_result(self, task_id: str) -> dict:
        return await outcome(self.session.experimental.get_task_result(task_id, types.CallToolResult))

    async def list_tasks(self) -> dict:
        return await outcome(self.session.experimental.list_tasks())

    async def cancel_task(self, task_id: str) -> dict:
        return await outcome(self.session.experimental.cancel_task(task_id))


async def outcome(request) -> dict:
    """{"result": ...} or {"error": {code, message, data}} of one request."""
    try:
        return {"result": dump(await request)}
    except McpError as e:
        return {"error": {"code": e.error.code, "message": e.error.message, "data": e.error.data}}


async def no_tasks_here(ctx, params):
    """The host runs no tasks of its own; having a handler makes it declare `tasks`."""
    return types.ListTasksResult(tasks=[])


@contextlib.asynccontextmanager
async def transport(cfg):
    """(read, write) streams of the configured wire."""
    wire = cfg.get("wire", "streamable-http")
    if wire == "streamable-http":
        extra = {}
        if cfg.get("ca"):
            # https:// to the gateway, verified against the CA `dualera up --tls` printed.
            context = ssl.create_default_context(cafile=cfg["ca"])

            def factory(headers=None, timeout=None, auth=None):
                return httpx.AsyncClient(headers=headers, timeout=timeout, auth=auth,
                                         follow_redirects=True, verify=context)

            extra["httpx_client_factory"] = factory
        async with streamablehttp_client(cfg["url"], timeout=30, **extra) as (read, write, _session_id):
            yield read, write
    elif wire == "sse":
        async with sse_client(cfg["url"], timeout=30) as (read, write):
            yield read, write
    elif wire == "stdio":
        spec = cfg["stdio"]
        params = StdioServerParameters(command=spec["command"], args=spec["args"], env=spec["env"])
        with open(spec["stderr"], "a") as errlog:
            async with stdio_client(params, errlog=errlog) as (read, write):
                yield read, write
    else:
        raise ValueError(f"unknown wire {wire!r}")


class Peer:
    @contextlib.asynccontextmanager
    async def session(self, cfg, *, elicit, sample, roots, tasks=False):
        async def elicitation_callback(ctx, params: types.ElicitRequestParams):
            return types.ElicitResult(**(await elicit(dump(params))))

        async def sampling_callback(ctx, params: types.CreateMessageRequestParams):
            try:
                text = await sample(dump(params))
            except scenarios.HostRefusal as e:  # the host answers with a JSON-RPC error
                return types.ErrorData(code=e.code, message=e.message)
            return types.CreateMessageResult(
                role="assistant",
                content=types.TextContent(type="text", text=text),
                model="interop-scripted-model",
                stopReason="endTurn",
            )

        async def list_roots_callback(ctx):
            return types.ListRootsResult(roots=[types.Root(uri=u) for u in await roots()])

        async with transport(cfg) as (read, write):
            async with ClientSession(
                read,
                write,
                read_timeout_seconds=timedelta(seconds=45),
                elicitation_callback=elicitation_callback if elicit else None,
                sampling_callback=sampling_callback if sample else None,
                list_roots_callback=list_roots_callback if roots else None,
                client_info=types.Implementation(name="interop-python-legacy", version="1.30.0"),
                experimental_task_handlers=ExperimentalTaskHandlers(list_tasks=no_tasks_here) if tasks else None,
            ) as session:
                init = await session.initialize()
                scenarios.SEEN_VERSIONS.append(init.protocolVersion)
                yield Conn(session, init)


if __name__ == "__main__":
    scenarios.main(Peer())
