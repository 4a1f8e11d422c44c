// Interop peer of the reverse bridge: the official TypeScript SDK 2.4.0
// (`@modelcontextprotocol/client`) as a modern-only host, in front of `dualera gateway`
// whose upstream is a legacy server (tests/interop/reverse.py). The port of
// tests/interop/py/reverse_host.py: same config, same observations.
//
// The client is pinned to 2026-07-28 (`versionNegotiation: { mode: { pin } }`: the
// connect-time `server/discover` must offer it, no fallback to `initialize`) and its
// `input_required` auto-fulfilment runs every round through the request handlers
// below, retrying with `inputResponses` and the echoed `requestState`.
// argv[2] is the config (JSON); the last line on stdout is {"event": "done", "obs": ...}.

import { Client, StreamableHTTPClientTransport } from "@modelcontextprotocol/client";

const VERSION = "2026-07-28";
const cfg = JSON.parse(process.argv[2]);
let sc = {};
let obs = {};

function push(key, value) {
  (obs[key] ??= []).push(value);
}

const client = new Client(
  { name: "interop-typescript-modern", version: "2.4.0" },
  {
    capabilities: { elicitation: { form: {}, url: {} }, sampling: {}, roots: {} },
    versionNegotiation: { mode: { pin: VERSION } },
  },
);
client.setRequestHandler("elicitation/create", async (request) => {
  push("order", "elicitation");
  push("elicitations", request.params);
  if (sc.elicit_sleep) await new Promise((r) => setTimeout(r, sc.elicit_sleep * 1000));
  return sc.elicit;
});
client.setRequestHandler("sampling/createMessage", async (request) => {
  push("order", "sampling");
  push("samplings", request.params);
  return {
    role: "assistant",
    content: { type: "text", text: "model: " + request.params.messages[0].content.text },
    model: "interop-scripted-model",
    stopReason: "endTurn",
  };
});
client.setRequestHandler("roots/list", async () => {
  push("order", "roots");
  obs.roots_calls = (obs.roots_calls ?? 0) + 1;
  return { roots: cfg.roots.map((uri) => ({ uri })) };
});

async function call(name, args) {
  let out;
  try {
    out = { result: await client.callTool({ name, arguments: args }) };
  } catch (e) {
    out = { error: { code: e.code ?? null, message: e.message, data: e.data ?? null } };
  }
  push("calls", { tool: name, arguments: args, ...out });
}

// Records every tools/call the host puts on the wire: the original call and each retry
// (with the keys of its inputResponses), i.e. the rounds.
async function recorded(url, init) {
  if (init?.method === "POST" && typeof init.body === "string") {
    let body;
    try {
      body = JSON.parse(init.body);
    } catch {
      body = undefined;
    }
    if (body?.method === "tools/call") {
      const params = body.params ?? {};
      push("wire", {
        tool: params.name,
        inputResponses: Object.keys(params.inputResponses ?? {}).sort(),
        requestState: "requestState" in params,
      });
    }
  }
  return fetch(url, init);
}

async function main() {
  const headers = cfg.token ? { Authorization: `Bearer ${cfg.token}` } : {};
  const transport = new StreamableHTTPClientTransport(new URL(cfg.url), { requestInit: { headers }, fetch: recorded });
  await client.connect(transport);
  const results = {};
  for (const s of cfg.scenarios) {
    sc = s;
    obs = { protocol_version: client.getNegotiatedProtocolVersion() };
    try {
      if (s.discover) {
        // What the connect-time server/discover brought.
        obs.discover = {
          serverInfo: client.getServerVersion(),
          capabilities: client.getServerCapabilities(),
          instructions: client.getInstructions(),
        };
        obs.tools = (await client.listTools()).tools.map((t) => t.name);
      }
      for (const [name, args] of s.calls) await call(name, args);
    } catch (e) {
      obs.exception = String(e?.stack ?? e);
    }
    results[s.name] = obs;
  }
  await client.close();
  return results;
}

try {
  const results = await main();
  console.log(JSON.stringify({ event: "done", obs: results }));
} catch (e) {
  console.log(JSON.stringify({ event: "error", error: String(e?.stack ?? e) }));
}
