"""A legacy host on the official Python SDK (mcp 1.30.0) that authorizes itself:
`ClientCredentialsOAuthProvider` does the whole discovery from the gateway's first 401
(challenge -> Protected Resource Metadata through the gateway -> authorization server
metadata -> token for resource = the gateway's URL).

argv[1]: JSON config {url, issuer, client_id, client_secret, workspace, title, expiry}.
Runs scenario 2 (notes_delete with a live elicitation) around two token expiries: one
between two calls, one between the elicitation and its answer (the callback waits past
the token's lifetime before answering). Prints one JSON object: the session ids seen
after every step, the tool results, the elicitation received.
"""

from __future__ import annotations

import asyncio
import json
import sys

from mcp import ClientSession, types
from mcp.client.auth import TokenStorage
from mcp.client.auth.extensions.client_credentials import ClientCredentialsOAuthProvider
from mcp.client.streamable_http import streamablehttp_client
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken


class Memory(TokenStorage):
    def __init__(self) -> None:
        self.tokens: OAuthToken | None = None
        self.client: OAuthClientInformationFull | None = None

    async def get_tokens(self):
        return self.tokens

    async def set_tokens(self, tokens):
        self.tokens = tokens

    async def get_client_info(self):
        return self.client

    async def set_client_info(self, client_info):
        self.client = client_info


def dump(model) -> dict:
    return model.model_dump(by_alias=True, exclude_none=True, mode="json")


async def main(cfg: dict) -> dict:
    out: dict = {"session_ids": [], "elicitations": []}
    auth = ClientCredentialsOAuthProvider(
        server_url=cfg["url"],
        storage=Memory(),
        client_id=cfg["client_id"],
        client_secret=cfg["client_secret"],
        issuer=cfg["issuer"],
    )

    async def elicit(ctx, params: types.ElicitRequestParams):
        p = dump(params)
        out["elicitations"].append(p)
        # The token expires before the answer goes back.
        await asyncio.sleep(cfg["expiry"])
        ids = p["requestedSchema"]["properties"]["note_id"]["enum"]
        return types.ElicitResult(action="accept", content={"note_id": ids[0], "confirm": True})

    async with streamablehttp_client(cfg["url"], auth=auth, timeout=30) as (read, write, session_id):
        async with ClientSession(
            read,
            write,
            elicitation_callback=elicit,
            client_info=types.Implementation(name="auth-python-legacy", version="1.30.0"),
        ) as session:
            init = await session.initialize()
            out["protocolVersion"] = init.protocolVersion
            out["session_ids"].append(session_id())
            ws, title = cfg["workspace"], cfg["title"]
            for body in ("first", "second"):
                r = await session.call_tool("notes_create", {"workspaceUri": ws, "title": title, "body": body})
                out.setdefault("created", []).append(dump(r))
            out["session_ids"].append(session_id())
            # The access token expires between two calls.
            await asyncio.sleep(cfg["expiry"])
            listed = await session.call_tool("notes_list", {"workspaceUri": ws})
            out["listed"] = dump(listed)
            out["session_ids"].append(session_id())
            deleted = await session.call_tool("notes_delete", {"workspaceUri": ws, "title": title})
            out["deleted"] = dump(deleted)
            out["session_ids"].append(session_id())
    return out


if __name__ == "__main__":
    result = asyncio.run(main(json.loads(sys.argv[1])))
    print(json.dumps(result))
