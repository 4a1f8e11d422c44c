// The legacy reference server of the `legacy-2026` conformance run: a session-based
// (2025-11-25 Streamable HTTP, `Mcp-Session-Id`) server on the official TypeScript SDK
// 1.32.2, serving the names the conformance suite's server scenarios call.
//
// Why it exists: the suite's own reference server ("everything server") is not part of the
// published `@modelcontextprotocol/conformance` package, and it answers 2026-07-28 traffic
// on a separate stateless path. This server is only the stateful half: every feature is
// what a legacy server can say (capabilities in `initialize`, live `elicitation/create`,
// `sampling/createMessage` and `roots/list` on the request's stream, notifications), so
// the run measures what the gateway makes of a legacy server, not a modern one behind it.
//
// The tools the suite's `input-required-result-*` scenarios call are here too, written the
// only way a legacy server can: a live request during the call. Their keys, their
// `requestState` and anything the server would decide from an `inputResponses` it sees are
// the gateway's (RESULTS.md says which checks that decides).
//
// Usage: node legacy_server.mjs [--listen 127.0.0.1:0]; prints
// "legacy reference server listening on http://ADDR/mcp" on stderr. Loopback only.
import http from "node:http";
import { randomUUID } from "node:crypto";
import { McpServer, ResourceTemplate } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import { completable } from "@modelcontextprotocol/sdk/server/completable.js";
import {
  CreateMessageResultSchema,
  ElicitResultSchema,
  isInitializeRequest,
  ListRootsResultSchema,
} from "@modelcontextprotocol/sdk/types.js";
import { z } from "zod";

// A 1x1 PNG and a WAV header: content for the image, audio and binary-resource checks.
const PNG =
  "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==";
const WAV = "UklGRiYAAABXQVZFZm10IBAAAAABAAEAQB8AAAB9AAACABAAZGF0YQIAAAA=";
// Bounds: sessions and request bodies (the suite opens one session per scenario).
const MAX_SESSIONS = 256;
const MAX_BODY = 1 << 20;

const text = (t) => ({ content: [{ type: "text", text: t }] });
const nameSchema = {
  type: "object",
  properties: { name: { type: "string" } },
  required: ["name"],
};

function build() {
  const server = new McpServer(
    { name: "dualera-legacy-reference", version: "1.0.0" },
    {
      capabilities: {
        tools: { listChanged: true },
        resources: { subscribe: true, listChanged: true },
        prompts: { listChanged: true },
        logging: {},
        completions: {},
      },
    },
  );
  const low = server.server;
  // Live requests go out with the call's `extra.sendRequest`, so they travel on the
  // call's own SSE stream (2025-11-25 `basic/transports`: messages the server sends
  // before the response SHOULD relate to the originating request).
  const elicit = (extra, message, requestedSchema) =>
    extra.sendRequest(
      { method: "elicitation/create", params: { mode: "form", message, requestedSchema } },
      ElicitResultSchema,
    );
  const sample = (extra, prompt) =>
    extra.sendRequest(
      {
        method: "sampling/createMessage",
        params: { messages: [{ role: "user", content: { type: "text", text: prompt } }], maxTokens: 100 },
      },
      CreateMessageResultSchema,
    );
  const listRoots = (extra) => extra.sendRequest({ method: "roots/list" }, ListRootsResultSchema);
  const sampledText = (r) => r?.content?.text ?? "no text";

  server.registerTool("test_simple_text", { description: "Simple text" }, async () =>
    text("This is a simple text response for testing."),
  );
  server.registerTool("test_image_content", { description: "Image content" }, async () => ({
    content: [{ type: "image", data: PNG, mimeType: "image/png" }],
  }));
  server.registerTool("test_audio_content", { description: "Audio content" }, async () => ({
    content: [{ type: "audio", data: WAV, mimeType: "audio/wav" }],
  }));
  server.registerTool("test_embedded_resource", { description: "Embedded resource" }, async () => ({
    content: [
      {
        type: "resource",
        resource: {
          uri: "test://embedded-resource",
          mimeType: "text/plain",
          text: "This is an embedded resource content.",
        },
      },
    ],
  }));
  server.registerTool("test_multiple_content_types", { description: "Mixed content" }, async () => ({
    content: [
      { type: "text", text: "Multiple content types test:" },
      { type: "image", data: PNG, mimeType: "image/png" },
      {
        type: "resource",
        resource: {
          uri: "test://mixed-content-resource",
          mimeType: "application/json",
          text: JSON.stringify({ test: "data", value: 123 }),
        },
      },
    ],
  }));
  server.registerTool(
    "test_tool_with_logging",
    { description: "Logs while it runs", inputSchema: {} },
    async (_args, extra) => {
      for (const data of ["Tool execution started", "Tool processing data", "Tool execution completed"]) {
        await extra.sendNotification({ method: "notifications/message", params: { level: "info", data } });
      }
      return text("Tool with logging executed successfully");
    },
  );
  server.registerTool(
    "test_tool_with_progress",
    { description: "Reports progress", inputSchema: {} },
    async (_args, extra) => {
      const progressToken = extra._meta?.progressToken ?? 0;
      for (const progress of [0, 50, 100]) {
        await extra.sendNotification({
          method: "notifications/progress",
          params: { progressToken, progress, total: 100, message: `Completed step ${progress} of 100` },
        });
      }
      return text(String(progressToken));
    },
  );
  server.registerTool("test_error_handling", { description: "Fails" }, async () => {
    throw new Error("This tool intentionally returns an error for testing");
  });
  server.registerTool(
    "test_sampling",
    { description: "Samples", inputSchema: { prompt: z.string() } },
    async ({ prompt }, extra) => text(`LLM response: ${sampledText(await sample(extra, prompt))}`),
  );
  server.registerTool(
    "test_elicitation",
    { description: "Elicits", inputSchema: { message: z.string() } },
    async ({ message }, extra) => {
      const r = await elicit(extra, message, {
        type: "object",
        properties: { response: { type: "string" } },
        required: ["response"],
      });
      return text(`User response: action=${r.action}, content=${JSON.stringify(r.content ?? {})}`);
    },
  );

  // The tools of the input-required-result scenarios, as live requests.
  const hello = async (extra) => {
    const r = await elicit(extra, "What is your name?", nameSchema);
    return text(`Hello, ${r.content?.name ?? "unknown"}!`);
  };
  server.registerTool("test_input_required_result_elicitation", { description: "One elicitation" }, hello);
  server.registerTool("test_input_required_result_tampered_state", { description: "One elicitation" }, hello);
  server.registerTool("test_input_required_result_sampling", { description: "One sampling" }, async (extra) =>
    text(`Capital: ${sampledText(await sample(extra, "What is the capital of France?"))}`),
  );
  server.registerTool("test_input_required_result_list_roots", { description: "Roots" }, async (extra) => {
    const r = await listRoots(extra);
    return text(`Roots: ${(r.roots ?? []).map((x) => x.uri).join(", ")}`);
  });
  server.registerTool("test_input_required_result_request_state", { description: "Confirm" }, async (extra) => {
    const r = await elicit(extra, "Please confirm", {
      type: "object",
      properties: { ok: { type: "boolean" } },
      required: ["ok"],
    });
    return text(`Confirmed: ${r.content?.ok === true}`);
  });
  server.registerTool(
    "test_input_required_result_multiple_inputs",
    { description: "Three requests at once" },
    async (extra) => {
      const [e, s, roots] = await Promise.all([
        elicit(extra, "What is your name?", nameSchema),
        sample(extra, "Generate a greeting"),
        listRoots(extra),
      ]);
      return text(`${sampledText(s)}, ${e.content?.name ?? "unknown"} (${(roots.roots ?? []).length} roots)`);
    },
  );
  server.registerTool("test_input_required_result_multi_round", { description: "Two rounds" }, async (extra) => {
    const a = await elicit(extra, "Step 1: What is your name?", nameSchema);
    const b = await elicit(extra, "Step 2: What is your favorite color?", {
      type: "object",
      properties: { color: { type: "string" } },
      required: ["color"],
    });
    return text(`${a.content?.name ?? "unknown"} likes ${b.content?.color ?? "unknown"}`);
  });
  server.registerTool(
    "test_input_required_result_capabilities",
    { description: "Asks only what the client declared" },
    async (extra) => {
      const caps = low.getClientCapabilities() ?? {};
      const parts = [];
      if (caps.sampling) parts.push(`sampled: ${sampledText(await sample(extra, "Say hi"))}`);
      if (caps.elicitation) parts.push(`elicited: ${(await elicit(extra, "Name?", nameSchema)).action}`);
      return text(parts.join("; ") || "nothing to ask");
    },
  );
  // Needs sampling: a legacy server learns whether the client has it from
  // `initialize`, and can only ask (the gateway refuses the request for a host
  // that did not declare it).
  server.registerTool("test_missing_capability", { description: "Needs sampling" }, async (extra) =>
    text(`Sampled: ${sampledText(await sample(extra, "Say hi"))}`),
  );
  server.registerPrompt(
    "test_input_required_result_prompt",
    { description: "Elicits its context" },
    async (extra) => {
      const r = await elicit(extra, "What context should the prompt use?", {
        type: "object",
        properties: { context: { type: "string" } },
        required: ["context"],
      });
      return {
        messages: [{ role: "user", content: { type: "text", text: `Context: ${r.content?.context ?? ""}` } }],
      };
    },
  );

  server.registerResource(
    "static-text",
    "test://static-text",
    { mimeType: "text/plain", description: "Static text" },
    async (uri) => ({
      contents: [{ uri: uri.href, mimeType: "text/plain", text: "This is the content of the static text resource." }],
    }),
  );
  server.registerResource(
    "static-binary",
    "test://static-binary",
    { mimeType: "image/png", description: "Static binary" },
    async (uri) => ({ contents: [{ uri: uri.href, mimeType: "image/png", blob: PNG }] }),
  );
  server.registerResource(
    "template",
    new ResourceTemplate("test://template/{id}/data", { list: undefined }),
    { mimeType: "application/json", description: "Template" },
    async (uri, { id }) => ({
      contents: [
        {
          uri: uri.href,
          mimeType: "application/json",
          text: JSON.stringify({ id, templateTest: true, data: `Data for ID: ${id}` }),
        },
      ],
    }),
  );
  server.registerResource(
    "watched-resource",
    "test://watched-resource",
    { mimeType: "text/plain", description: "Subscribable" },
    async (uri) => ({ contents: [{ uri: uri.href, mimeType: "text/plain", text: "Watched resource content" }] }),
  );

  server.registerPrompt("test_simple_prompt", { description: "Simple" }, async () => ({
    messages: [{ role: "user", content: { type: "text", text: "This is a simple prompt for testing." } }],
  }));
  server.registerPrompt(
    "test_prompt_with_arguments",
    {
      description: "With arguments",
      argsSchema: {
        arg1: completable(z.string(), (v) => ["paris", "park", "party"].filter((x) => x.startsWith(v))),
        arg2: z.string(),
      },
    },
    async ({ arg1, arg2 }) => ({
      messages: [
        { role: "user", content: { type: "text", text: `Prompt with arguments: arg1='${arg1}', arg2='${arg2}'` } },
      ],
    }),
  );
  server.registerPrompt(
    "test_prompt_with_embedded_resource",
    { description: "Embedded resource", argsSchema: { resourceUri: z.string() } },
    async ({ resourceUri }) => ({
      messages: [
        {
          role: "user",
          content: {
            type: "resource",
            resource: { uri: resourceUri, mimeType: "text/plain", text: "Embedded resource content for testing." },
          },
        },
        { role: "user", content: { type: "text", text: "Please process the embedded resource above." } },
      ],
    }),
  );
  server.registerPrompt("test_prompt_with_image", { description: "Image" }, async () => ({
    messages: [
      { role: "user", content: { type: "image", data: PNG, mimeType: "image/png" } },
      { role: "user", content: { type: "text", text: "Please analyze the image above." } },
    ],
  }));

  // resources/subscribe and resources/unsubscribe: accepted (the resource never changes).
  low.setRequestHandler(
    z.object({ method: z.literal("resources/subscribe"), params: z.object({ uri: z.string() }) }),
    async () => ({}),
  );
  low.setRequestHandler(
    z.object({ method: z.literal("resources/unsubscribe"), params: z.object({ uri: z.string() }) }),
    async () => ({}),
  );
  return server;
}

const transports = new Map();

function readBody(req) {
  return new Promise((resolve, reject) => {
    const chunks = [];
    let size = 0;
    req.on("data", (c) => {
      size += c.length;
      if (size > MAX_BODY) {
        reject(new Error("body too large"));
        req.destroy();
      } else chunks.push(c);
    });
    req.on("end", () => resolve(Buffer.concat(chunks).toString("utf8")));
    req.on("error", reject);
  });
}

function jsonError(res, status, message) {
  res.writeHead(status, { "content-type": "application/json" });
  res.end(JSON.stringify({ jsonrpc: "2.0", id: null, error: { code: -32000, message } }));
}

async function handle(req, res) {
  if (new URL(req.url, "http://x").pathname !== "/mcp") return jsonError(res, 404, "Not found");
  const sid = req.headers["mcp-session-id"];
  if (req.method !== "POST") {
    const t = sid && transports.get(sid);
    if (!t) return jsonError(res, sid ? 404 : 400, "Invalid or missing session ID");
    return t.handleRequest(req, res);
  }
  let body;
  try {
    body = JSON.parse(await readBody(req));
  } catch {
    return jsonError(res, 400, "Parse error");
  }
  if (sid) {
    const t = transports.get(sid);
    if (!t) return jsonError(res, 404, "Session not found");
    return t.handleRequest(req, res, body);
  }
  if (!isInitializeRequest(body)) return jsonError(res, 400, "Bad Request: Missing session ID");
  if (transports.size >= MAX_SESSIONS) return jsonError(res, 503, "Too many sessions");
  const transport = new StreamableHTTPServerTransport({
    sessionIdGenerator: () => randomUUID(),
    onsessioninitialized: (id) => transports.set(id, transport),
  });
  transport.onclose = () => transport.sessionId && transports.delete(transport.sessionId);
  await build().connect(transport);
  return transport.handleRequest(req, res, body);
}

const listen = (() => {
  const i = process.argv.indexOf("--listen");
  return i > 0 ? process.argv[i + 1] : "127.0.0.1:0";
})();
const [host, port] = [listen.slice(0, listen.lastIndexOf(":")), Number(listen.slice(listen.lastIndexOf(":") + 1))];
const httpServer = http.createServer((req, res) =>
  handle(req, res).catch((e) => {
    if (!res.headersSent) jsonError(res, 500, String(e?.message ?? e));
  }),
);
httpServer.listen(port, host, () => {
  const a = httpServer.address();
  process.stderr.write(`legacy reference server listening on http://${a.address}:${a.port}/mcp\n`);
});
