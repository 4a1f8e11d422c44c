// A legacy host on the official TypeScript SDK (@modelcontextprotocol/sdk 1.32.2) that
// authorizes itself: `ClientCredentialsProvider` and the transport's 401 handling do the
// whole discovery from the gateway's first 401 (challenge -> Protected Resource Metadata
// through the gateway -> authorization server metadata -> token for resource = the
// gateway's URL). Run by tests/auth/run.py.
//
// argv[2]: JSON config {url, issuer, client_id, client_secret, workspace, title, expiry}.
// Scenario 2 (notes_delete with a live elicitation) around two token expiries: one
// between two calls, one between the elicitation and its answer (the handler waits past
// the token's lifetime; this SDK then sends the expired token, and the gateway's 401 on
// the answer's POST makes it authorize again and re-send). Prints one JSON object.

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { ClientCredentialsProvider } from '@modelcontextprotocol/sdk/client/auth-extensions.js';
import { ElicitRequestSchema } from '@modelcontextprotocol/sdk/types.js';

const cfg = JSON.parse(process.argv[2]);
const sleep = (s) => new Promise((r) => setTimeout(r, s * 1000));
const out = { session_ids: [], elicitations: [] };

// This SDK's client-credentials token request asks for the provider's configured
// `scope` (not the scope a challenge names), so the host states what it needs.
const authProvider = new ClientCredentialsProvider({
  clientId: cfg.client_id,
  clientSecret: cfg.client_secret,
  expectedIssuer: cfg.issuer,
  scope: 'notes:read notes:write',
});
const transport = new StreamableHTTPClientTransport(new URL(cfg.url), { authProvider });
const client = new Client(
  { name: 'auth-typescript-legacy', version: '1.32.2' },
  { capabilities: { elicitation: { form: {} } } },
);
client.setRequestHandler(ElicitRequestSchema, async (request) => {
  out.elicitations.push(request.params);
  await sleep(cfg.expiry);
  const ids = request.params.requestedSchema.properties.note_id.enum;
  return { action: 'accept', content: { note_id: ids[0], confirm: true } };
});

const timeout = { timeout: 60000 };
try {
  await client.connect(transport);
  out.protocolVersion = transport.protocolVersion ?? null;
  out.session_ids.push(transport.sessionId);
  out.created = [];
  for (const body of ['first', 'second']) {
    out.created.push(await client.callTool(
      { name: 'notes_create', arguments: { workspaceUri: cfg.workspace, title: cfg.title, body } },
      undefined, timeout));
  }
  out.session_ids.push(transport.sessionId);
  await sleep(cfg.expiry);
  out.listed = await client.callTool(
    { name: 'notes_list', arguments: { workspaceUri: cfg.workspace } }, undefined, timeout);
  out.session_ids.push(transport.sessionId);
  out.deleted = await client.callTool(
    { name: 'notes_delete', arguments: { workspaceUri: cfg.workspace, title: cfg.title } },
    undefined, timeout);
  out.session_ids.push(transport.sessionId);
  await transport.terminateSession();
  await client.close();
  process.stdout.write(`${JSON.stringify(out)}\n`);
} catch (e) {
  process.stdout.write(`${JSON.stringify({ ...out, error: String(e?.stack ?? e) })}\n`);
  process.exit(1);
}
