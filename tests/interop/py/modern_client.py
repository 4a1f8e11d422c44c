"""Interop peer: the official Python SDK, mcp 2.3.0, as a modern (2026-07-28) host.

`mcp.Client` in its default `mode="auto"`: it probes `server/discover` (which reaches the
gateway as a modern request and is passed through), then calls with per-request `_meta`.
When a call answers `resultType: "input_required"`, the SDK's own driver
(`mcp.client._input_required`) runs the embedded requests through the callbacks below,
concurrently, and retries with `inputResponses` + the echoed `requestState`.
Run by tests/interop/run.py inside its own venv; argv[1] is the scenario config (JSON).
"""

from __future__ import annotations

import contextlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import mcp_types as types  # noqa: E402
import scenarios  # noqa: E402
from mcp import Client  # noqa: E402
from mcp.shared.exceptions import MCPError  # noqa: E402


def dump(model) -> dict:
    return model.model_dump(by_alias=True, exclude_none=True, mode="json")


class Conn:
    def __init__(self, client: Client):
        self.client = client

    async def info(self) -> dict:
        return {
            "protocolVersion": self.client.protocol_version,
            "serverInfo": dump(self.client.server_info) if self.client.server_info else None,
            "capabilities": dump(self.client.server_capabilities),
        }

    async def list_tools(self) -> list[dict]:
        return [dump(t) for t in (await self.client.list_tools()).tools]

    async def call(self, name: str, arguments: dict) -> dict:
        try:
            return {"result": dump(await self.client.call_tool(name, arguments))}
        except MCPError as e:
            return {"error": {"code": e.code, "message": e.message, "data": e.data}}


class Peer:
    @contextlib.asynccontextmanager
    async def session(self, cfg, *, elicit, sample, roots):
        async def elicitation_callback(ctx, params):
            return types.ElicitResult(**(await elicit(dump(params))))

        async def sampling_callback(ctx, params):
            text = await sample(dump(params))
            return types.CreateMessageResult(
                role="assistant",
                content=types.TextContent(type="text", text=text),
                model="interop-scripted-model",
                stop_reason="endTurn",
            )

        async def list_roots_callback(ctx):
            return types.ListRootsResult(roots=[types.Root(uri=u) for u in await roots()])

        client = Client(
            cfg["url"],
            read_timeout_seconds=45,
            elicitation_callback=elicitation_callback if elicit else None,
            sampling_callback=sampling_callback if sample else None,
            list_roots_callback=list_roots_callback if roots else None,
            client_info=types.Implementation(name="interop-python-modern", version="2.3.0"),
        )
        async with client:
            scenarios.SEEN_VERSIONS.append(client.protocol_version)
            yield Conn(client)


if __name__ == "__main__":
    scenarios.main(Peer())
