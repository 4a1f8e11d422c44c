"""Interop peer of the reverse bridge: the official Python SDK, mcp 2.3.0, as a modern-only
host (`mcp.Client` pinned to 2026-07-28: no probe, no `initialize`, ever) in front of
`dualera gateway` whose upstream is a legacy server (tests/interop/reverse.py).

The SDK's own `input_required` driver runs every round through the callbacks below and
retries with `inputResponses` and the echoed `requestState`. The driver only acts and
records; reverse.py holds the plan and the expectations. argv[1] is the config (JSON):
  {"url", "token" (or null), "roots": [uri...],
   "scenarios": [{"name", "discover": bool, "calls": [[tool, arguments]...],
                  "elicit": ElicitResult to answer, "elicit_sleep": seconds before it}]}
a sampling request is answered with "model: " and the text of its first message; the last
line on stdout is {"event": "done", "obs": {scenario name: observations}}.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import mcp_types as types  # noqa: E402
from mcp import Client  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402
from mcp.shared._httpx_utils import create_mcp_http_client  # noqa: E402
from mcp.shared.exceptions import MCPError  # noqa: E402

VERSION = "2026-07-28"


def dump(model) -> dict:
    return model.model_dump(by_alias=True, exclude_none=True, mode="json")


class Host:
    """One modern host: its handlers answer from the scenario's plan and record."""

    def __init__(self, cfg: dict):
        self.cfg = cfg
        self.obs: dict = {}
        self.sc: dict = {}

    async def elicit(self, ctx, params) -> types.ElicitResult:
        p = dump(params)
        self.obs.setdefault("order", []).append("elicitation")
        self.obs.setdefault("elicitations", []).append(p)
        if self.sc.get("elicit_sleep"):
            await asyncio.sleep(self.sc["elicit_sleep"])
        return types.ElicitResult(**self.sc["elicit"])

    async def sample(self, ctx, params) -> types.CreateMessageResult:
        p = dump(params)
        self.obs.setdefault("order", []).append("sampling")
        self.obs.setdefault("samplings", []).append(p)
        return types.CreateMessageResult(
            role="assistant",
            content=types.TextContent(type="text", text="model: " + p["messages"][0]["content"]["text"]),
            model="interop-scripted-model",
            stop_reason="endTurn",
        )

    async def roots(self, ctx) -> types.ListRootsResult:
        self.obs.setdefault("order", []).append("roots")
        self.obs["roots_calls"] = self.obs.get("roots_calls", 0) + 1
        return types.ListRootsResult(roots=[types.Root(uri=u) for u in self.cfg["roots"]])

    async def sent(self, request) -> None:
        """Records every `tools/call` the host puts on the wire: the original call and
        each retry (with the keys of its `inputResponses`), i.e. the rounds."""
        if request.method != "POST":
            return
        try:
            body = json.loads(request.content)
        except (ValueError, UnicodeDecodeError):
            return
        if isinstance(body, dict) and body.get("method") == "tools/call":
            params = body.get("params") or {}
            self.obs.setdefault("wire", []).append(
                {"tool": params.get("name"), "inputResponses": sorted(params.get("inputResponses") or {}),
                 "requestState": "requestState" in params})

    async def call(self, client: Client, name: str, arguments: dict) -> dict:
        try:
            out = {"result": dump(await client.call_tool(name, arguments))}
        except MCPError as e:
            out = {"error": {"code": e.code, "message": e.message, "data": e.data}}
        self.obs.setdefault("calls", []).append({"tool": name, "arguments": arguments, **out})
        return out

    async def run(self) -> dict:
        headers = {"Authorization": f"Bearer {self.cfg['token']}"} if self.cfg.get("token") else None
        results: dict = {}
        async with create_mcp_http_client(headers=headers) as http:
            http.event_hooks = {"request": [self.sent]}
            client = Client(
                streamable_http_client(self.cfg["url"], http_client=http),
                mode=VERSION,
                read_timeout_seconds=45,
                elicitation_callback=self.elicit,
                sampling_callback=self.sample,
                list_roots_callback=self.roots,
                client_info=types.Implementation(name="interop-python-modern", version="2.3.0"),
            )
            async with client:
                for sc in self.cfg["scenarios"]:
                    self.sc = sc
                    self.obs = {"protocol_version": client.protocol_version}
                    try:
                        if sc.get("discover"):
                            # A real server/discover: the pinned client adopted a synthesized one.
                            raw = await client.session.send_discover(VERSION)
                            self.obs["discover"] = raw if isinstance(raw, dict) else dump(raw)
                            self.obs["tools"] = [t.name for t in (await client.list_tools()).tools]
                        for name, arguments in sc["calls"]:
                            await self.call(client, name, arguments)
                    except Exception:  # noqa: BLE001 - recorded; reverse.py fails the case
                        self.obs["exception"] = traceback.format_exc()
                    results[sc["name"]] = self.obs
        return results


async def main() -> None:
    cfg = json.loads(sys.argv[1])
    try:
        obs = await Host(cfg).run()
        print(json.dumps({"event": "done", "obs": obs}), flush=True)
    except Exception:  # noqa: BLE001
        print(json.dumps({"event": "error", "error": traceback.format_exc()}), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
