// A legacy (2025-11-25) MCP server built on the official TypeScript SDK 1.32.2
// (`McpServer`): the port of tests/interop/py/legacy_server.py, the TypeScript column
// of the reverse bridge's interop part (tests/interop/reverse.py).
//
//     node legacy_server.mjs streamable-http   Streamable HTTP at /mcp, stateful (one
//                                              transport and server per Mcp-Session-Id)
//     node legacy_server.mjs stdio             newline-delimited JSON-RPC on stdin/stdout
//
// Over HTTP it binds 127.0.0.1 on a free port and prints `PORT <n>` on stdout.
//
// The same tools as the Python server: add, session_id, authorization, chatter, big,
// ask (form elicitation), wait, sample (sampling), roots (roots/list), journey (form
// elicitation, then sampling, then roots/list), ask_url (URL-mode elicitation); and the
// same record: with LEGACY_SERVER_LOG=path, one JSON object per line for every tool
// call (with the session it is served on and the Authorization header), every answer
// to its own requests, and every call the client cancelled (`notifications/cancelled`
// aborts the handler's signal).

import { randomUUID } from "node:crypto";
import { appendFileSync } from "node:fs";
import { createServer } from "node:http";
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import { isInitializeRequest } from "@modelcontextprotocol/sdk/types.js";
import * as z from "zod";

const LOG = process.env.LEGACY_SERVER_LOG;
const MAX_BODY = 1 << 20;

function record(event, fields) {
  if (LOG) appendFileSync(LOG, JSON.stringify({ event, ...fields }) + "\n");
}

function sessionOf(extra) {
  return extra.sessionId ?? `stdio-${process.pid}`;
}

function authorizationOf(extra) {
  const value = extra.requestInfo?.headers?.authorization;
  return Array.isArray(value) ? value.join(",") : (value ?? "");
}

function text(t) {
  return { content: [{ type: "text", text: String(t) }] };
}

// Records the call, and its cancellation if the client cancels it meanwhile.
async function recorded(tool, extra, body) {
  const session = sessionOf(extra);
  record("call", { tool, session, auth: authorizationOf(extra) });
  const onAbort = () => record("cancelled", { tool, session });
  extra.signal.addEventListener("abort", onAbort, { once: true });
  try {
    return await body();
  } finally {
    extra.signal.removeEventListener("abort", onAbort);
  }
}

// The live requests of a call travel on that call's stream (relatedRequestId).
function options(extra) {
  return { relatedRequestId: extra.requestId, signal: extra.signal };
}

const ANSWER_SCHEMA = {
  type: "object",
  properties: { answer: { type: "string" } },
  required: ["answer"],
};

async function elicitForm(server, message, extra) {
  return server.server.elicitInput({ mode: "form", message, requestedSchema: ANSWER_SCHEMA }, options(extra));
}

async function sampled(server, prompt, extra) {
  const result = await server.server.createMessage(
    { messages: [{ role: "user", content: { type: "text", text: prompt } }], maxTokens: 64 },
    options(extra),
  );
  return result.content?.type === "text" ? result.content.text : "?";
}

async function rootUris(server, extra) {
  const result = await server.server.listRoots(undefined, options(extra));
  return result.roots.map((r) => r.uri);
}

function build() {
  const server = new McpServer(
    { name: "legacy-fixture-ts", version: "1.32.2" },
    { instructions: "A legacy fixture server.", capabilities: { logging: {} } },
  );
  server.registerTool("add", { description: "Adds two integers.", inputSchema: { a: z.number().int(), b: z.number().int() } },
    async ({ a, b }) => text(a + b));
  server.registerTool("session_id", { description: "The Mcp-Session-Id of this request, as this server sees it." },
    async (extra) => text(extra.sessionId ?? "stdio"));
  server.registerTool("authorization", { description: "The Authorization header of this request, as this server received it." },
    async (extra) => text(authorizationOf(extra)));
  server.registerTool("chatter", { description: "Sends n log notifications on the request's stream, then returns n.", inputSchema: { n: z.number().int() } },
    async ({ n }, extra) => {
      for (let i = 0; i < n; i++) {
        await extra.sendNotification({ method: "notifications/message", params: { level: "info", data: `line ${i}` } });
      }
      return text(n);
    });
  server.registerTool("big", { description: "Returns n bytes of text.", inputSchema: { n: z.number().int() } },
    async ({ n }) => text("x".repeat(n)));
  server.registerTool("ask", { description: "Asks the client (elicitation) and returns what it answered.", inputSchema: { question: z.string() } },
    async ({ question }, extra) => recorded("ask", extra, async () => {
      const result = await elicitForm(server, question, extra);
      record("elicit", { tool: "ask", mode: "form", action: result.action });
      if (result.action === "accept" && result.content) return text(`answered: ${result.content.answer}`);
      return text(`not answered: ${result.action}`);
    }));
  server.registerTool("wait", { description: "Sleeps, then returns (a call a client can cancel meanwhile).", inputSchema: { seconds: z.number() } },
    async ({ seconds }, extra) => recorded("wait", extra, async () => {
      await new Promise((resolve) => {
        const timer = setTimeout(resolve, seconds * 1000);
        extra.signal.addEventListener("abort", () => { clearTimeout(timer); resolve(); }, { once: true });
      });
      return text("waited");
    }));
  server.registerTool("sample", { description: "Asks the client's model (sampling) and returns its text.", inputSchema: { prompt: z.string() } },
    async ({ prompt }, extra) => recorded("sample", extra, async () => {
      const t = await sampled(server, prompt, extra);
      record("sampled", { tool: "sample", text: t });
      return text(`sampled: ${t}`);
    }));
  server.registerTool("roots", { description: "Lists the client's roots and returns their URIs." },
    async (extra) => recorded("roots", extra, async () => {
      const uris = await rootUris(server, extra);
      record("roots", { tool: "roots", uris });
      return text(`roots: ${uris.join(",")}`);
    }));
  server.registerTool("journey", { description: "Elicits a form, then samples, then lists the roots; returns the three answers.", inputSchema: { topic: z.string() } },
    async ({ topic }, extra) => recorded("journey", extra, async () => {
      const asked = await elicitForm(server, `Where to, for ${topic}?`, extra);
      record("elicit", { tool: "journey", mode: "form", action: asked.action });
      if (asked.action !== "accept" || !asked.content) return text(`journey stopped: ${asked.action}`);
      const t = await sampled(server, `${topic}: ${asked.content.answer}`, extra);
      record("sampled", { tool: "journey", text: t });
      const uris = await rootUris(server, extra);
      record("roots", { tool: "journey", uris });
      return text(`journey: answer=${asked.content.answer}; sampled=${t}; roots=${uris.join(",")}`);
    }));
  server.registerTool("ask_url", { description: "Asks the client to open a URL (URL-mode elicitation); returns its action.", inputSchema: { url: z.string() } },
    async ({ url }, extra) => recorded("ask_url", extra, async () => {
      const result = await server.server.elicitInput(
        { mode: "url", message: "Open this page to go on.", url, elicitationId: "interop-url-1" }, options(extra));
      record("elicit", { tool: "ask_url", mode: "url", action: result.action });
      return text(`url: ${result.action}`);
    }));
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

async function serveHttp(port) {
  const transports = new Map();
  const http = createServer(async (req, res) => {
    try {
      const path = new URL(req.url, "http://localhost").pathname;
      if (path !== "/mcp") {
        res.writeHead(404).end();
        return;
      }
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
  await new Promise((resolve) => http.listen(port, "127.0.0.1", resolve));
  console.log(`PORT ${http.address().port}`);
}

const mode = process.argv[2] ?? "streamable-http";
if (mode === "stdio") {
  await build().connect(new StdioServerTransport());
} else if (mode === "streamable-http") {
  await serveHttp(Number(process.argv[3] ?? 0));
} else {
  console.error(`unknown transport ${mode}`);
  process.exit(2);
}
