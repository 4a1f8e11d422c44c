// A legacy (2025-11-25) MCP server on the official TypeScript SDK 1.32.2 that makes
// its clients resume response streams (2025-11-25 transports, "Resumability and
// Redelivery"): Streamable HTTP at /mcp, stateful, with an event store, so every
// response stream opens with a priming event (an id and `retry`), and a tool that
// closes its own stream mid-call (`extra.closeSSEStream`).
//
//     node resumable_server.mjs [port]
//
// Binds 127.0.0.1 (a free port by default) and prints `PORT <n>` on stdout.
//
// Tools: add; `relay(n)`: one log notification, then its response stream closed, then
// after a pause n more and the result `relayed n`. `GET /stats` counts what reached
// the server: "POST /mcp", "GET /mcp", "GET /mcp Last-Event-ID" (resumptions), and
// "replayed" (events the store replayed).

import { randomUUID } from "node:crypto";
import { createServer } from "node:http";
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import { isInitializeRequest } from "@modelcontextprotocol/sdk/types.js";
import * as z from "zod";

const MAX_BODY = 1 << 20;
// Events kept in all (the store forgets the oldest beyond).
const MAX_EVENTS = 10_000;
// Longer than the relay's pause: what follows the close is replayed on resumption.
const RETRY_MS = 500;

const stats = {};
function count(key) {
  stats[key] = (stats[key] ?? 0) + 1;
}

// An event store whose ids sort in the order the events were stored
// (`<stream>_<sequence>`), bounded.
class OrderedEventStore {
  constructor() {
    this.events = new Map();
    this.next = 0;
  }
  async storeEvent(streamId, message) {
    const id = `${streamId}_${String(this.next++).padStart(12, "0")}`;
    this.events.set(id, { streamId, message });
    if (this.events.size > MAX_EVENTS) this.events.delete(this.events.keys().next().value);
    return id;
  }
  async getStreamIdForEventId(eventId) {
    return this.events.get(eventId)?.streamId;
  }
  async replayEventsAfter(lastEventId, { send }) {
    const last = this.events.get(lastEventId);
    if (!last) return "";
    for (const [id, { streamId, message }] of this.events) {
      if (streamId === last.streamId && id > lastEventId && message.jsonrpc) {
        count("replayed");
        await send(id, message);
      }
    }
    return last.streamId;
  }
}

function text(t) {
  return { content: [{ type: "text", text: String(t) }] };
}

function build() {
  const server = new McpServer(
    { name: "resumable-fixture-ts", version: "1.32.2" },
    { capabilities: { logging: {} } },
  );
  server.registerTool("add", { description: "Adds two integers.", inputSchema: { a: z.number().int(), b: z.number().int() } },
    async ({ a, b }) => text(a + b));
  server.registerTool("relay", {
    description: "One log line, then closes its response stream; after a pause n more lines and the result.",
    inputSchema: { n: z.number().int() },
  }, async ({ n }, extra) => {
    const line = (data) => extra.sendNotification({ method: "notifications/message", params: { level: "info", data } });
    await line("before");
    if (typeof extra.closeSSEStream !== "function") throw new Error("no event store: the stream cannot be closed");
    extra.closeSSEStream();
    await new Promise((resolve) => setTimeout(resolve, 100));
    for (let i = 0; i < n; i++) await line(`after ${i}`);
    return text(`relayed ${n}`);
  });
  return server;
}

async function readJson(req) {
  const chunks = [];
  let size = 0;
  for await (const chunk of req) {
    size += chunk.length;
    if (size > MAX_BODY) throw new Error("body too large");
    chunks.push(chunk);
  }
  return chunks.length ? JSON.parse(Buffer.concat(chunks).toString("utf8")) : undefined;
}

const transports = new Map();
const http = createServer(async (req, res) => {
  try {
    const path = new URL(req.url, "http://localhost").pathname;
    if (path === "/stats") {
      res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify(stats));
      return;
    }
    if (path !== "/mcp") {
      res.writeHead(404).end();
      return;
    }
    count(`${req.method} /mcp`);
    if (req.method === "GET" && req.headers["last-event-id"]) count("GET /mcp Last-Event-ID");
    const body = req.method === "POST" ? await readJson(req) : undefined;
    const sid = req.headers["mcp-session-id"];
    let transport = typeof sid === "string" ? transports.get(sid) : undefined;
    if (!transport) {
      if (sid !== undefined || req.method !== "POST" || !isInitializeRequest(body)) {
        res.writeHead(sid === undefined ? 400 : 404, { "content-type": "application/json" }).end(JSON.stringify({
          jsonrpc: "2.0", id: null, error: { code: -32000, message: sid === undefined ? "Missing session ID" : "Session not found" },
        }));
        return;
      }
      transport = new StreamableHTTPServerTransport({
        sessionIdGenerator: () => randomUUID(),
        onsessioninitialized: (id) => transports.set(id, transport),
        eventStore: new OrderedEventStore(),
        retryInterval: RETRY_MS,
      });
      transport.onclose = () => {
        if (transport.sessionId) transports.delete(transport.sessionId);
      };
      await build().connect(transport);
    }
    await transport.handleRequest(req, res, body);
  } catch (e) {
    if (!res.headersSent) res.writeHead(400).end(String(e));
  }
});
await new Promise((resolve) => http.listen(Number(process.argv[2] ?? 0), "127.0.0.1", resolve));
console.log(`PORT ${http.address().port}`);
