// Interop peer: the official TypeScript SDK, @modelcontextprotocol/sdk 1.32.2, as a
// legacy (2025-11-25) host: `Client` declaring elicitation (form), sampling and roots,
// with request handlers for each, over the transport named by the config's `wire`:
// `streamable-http` (`StreamableHTTPClientTransport`), `sse` (the 2024-11-05 transport,
// `SSEClientTransport` on the gateway's `/sse`) or `stdio` (`StdioClientTransport`,
// spawning `dualera gateway --stdio ...` as described by `cfg.stdio`).
//
// A port of tests/interop/py/scenarios.py: the same scenarios, the same observations.
// Run by tests/interop/run.py; argv[2] is the scenario config (JSON). Protocol on stdout,
// one JSON object per line: {"event":"checkpoint","name":..} (then wait for one line on
// stdin), {"event":"done","obs":{..}}, {"event":"error","error":".."}.

import fs from 'node:fs';
import readline from 'node:readline';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { SSEClientTransport } from '@modelcontextprotocol/sdk/client/sse.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import {
  CallToolResultSchema,
  CreateMessageRequestSchema,
  ElicitRequestSchema,
  ListRootsRequestSchema,
  McpError,
} from '@modelcontextprotocol/sdk/types.js';

const BARRIER_MS = 20_000;
// The protocol version each opened session negotiated, reported as obs.protocol_versions.
const seenVersions = [];
const REQUEST_TIMEOUT_MS = 45_000;

function emit(obj) {
  process.stdout.write(JSON.stringify(obj) + '\n');
}

const stdinLines = readline.createInterface({ input: process.stdin })[Symbol.asyncIterator]();

async function checkpoint(name) {
  emit({ event: 'checkpoint', name });
  const r = await stdinLines.next();
  if (r.done) throw new Error('the orchestrator went away during a checkpoint');
}

function withTimeout(promise, ms, what) {
  let timer;
  const t = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out waiting for ${what}`)), ms);
  });
  return Promise.race([promise, t]).finally(() => clearTimeout(timer));
}

function deferred() {
  let resolve;
  const promise = new Promise((r) => (resolve = r));
  return { promise, resolve };
}

function answerFor(spec, params) {
  if (spec.action !== 'accept') return { action: spec.action };
  const ids = params?.requestedSchema?.properties?.note_id?.enum ?? [];
  const pick = spec.pick ?? 0;
  if (pick >= ids.length) throw new Error(`answer spec picks #${pick} but the form offered ${JSON.stringify(ids)}`);
  return { action: 'accept', content: { note_id: ids[pick], confirm: spec.confirm ?? true } };
}

class Recorder {
  constructor({ answers = [], samples = [], rootsAnswers = [] } = {}) {
    this.answers = [...answers];
    this.samples = [...samples];
    this.rootsAnswers = [...rootsAnswers];
    this.elicitations = [];
    this.samplings = [];
    this.rootsCalls = 0;
  }
  handlers() {
    return {
      elicit: async (params) => {
        this.elicitations.push(params);
        if (this.answers.length === 0) return { action: 'cancel' };
        return answerFor(this.answers.shift(), params);
      },
      sample: async (params) => {
        this.samplings.push(params);
        return this.samples.length ? this.samples.shift() : '(no more planned sampling replies)';
      },
      roots: async () => {
        this.rootsCalls += 1;
        return this.rootsAnswers.length ? this.rootsAnswers.shift() : [];
      },
    };
  }
  obs() {
    return { elicitations: this.elicitations, samplings: this.samplings, roots_calls: this.rootsCalls };
  }
}

// The transport of the configured wire.
function makeTransport(cfg) {
  const wire = cfg.wire ?? 'streamable-http';
  if (wire === 'streamable-http') return new StreamableHTTPClientTransport(new URL(cfg.url));
  if (wire === 'sse') return new SSEClientTransport(new URL(cfg.url));
  if (wire === 'stdio') {
    const { command, args, env, stderr } = cfg.stdio;
    const transport = new StdioClientTransport({ command, args, env, stderr: 'pipe' });
    transport.stderr.pipe(fs.createWriteStream(stderr, { flags: 'a' }));
    return transport;
  }
  throw new Error(`unknown wire ${wire}`);
}

// Opens a legacy session; `elicit`, `sample`, `roots` may be null (capability not declared).
async function withSession(cfg, { elicit, sample, roots, tasks }, body) {
  const capabilities = {};
  // The 2025-11-25 tasks capability (the host runs no tasks of its own): what makes the
  // gateway offer tasks to this session.
  if (tasks) capabilities.tasks = {};
  if (elicit) capabilities.elicitation = { form: {} };
  if (sample) capabilities.sampling = {};
  if (roots) capabilities.roots = { listChanged: true };
  const client = new Client({ name: 'interop-typescript-legacy', version: '1.32.2' }, { capabilities });
  if (elicit) {
    client.setRequestHandler(ElicitRequestSchema, async (req) => elicit(req.params));
  }
  if (sample) {
    client.setRequestHandler(CreateMessageRequestSchema, async (req) => ({
      role: 'assistant',
      content: { type: 'text', text: await sample(req.params) },
      model: 'interop-scripted-model',
      stopReason: 'endTurn',
    }));
  }
  if (roots) {
    client.setRequestHandler(ListRootsRequestSchema, async () => ({
      roots: (await roots()).map((uri) => ({ uri })),
    }));
  }
  const transport = makeTransport(cfg);
  // `Client` has no getter for the negotiated version; it hands it to the transport's
  // `setProtocolVersion` (HTTP transports only), so observe that on every wire.
  let negotiated;
  const setProtocolVersion = transport.setProtocolVersion?.bind(transport);
  transport.setProtocolVersion = (v) => {
    negotiated = v;
    setProtocolVersion?.(v);
  };
  await client.connect(transport);
  seenVersions.push(negotiated);
  const conn = {
    info: async () => ({
      protocolVersion: negotiated,
      serverInfo: client.getServerVersion(),
      capabilities: client.getServerCapabilities(),
    }),
    listTools: async () => (await client.listTools(undefined, { timeout: REQUEST_TIMEOUT_MS })).tools,
    call: async (name, args) =>
      outcome(client.callTool({ name, arguments: args }, undefined, { timeout: REQUEST_TIMEOUT_MS })),
    // The SDK's experimental task API (2025-11-25 tasks), the same calls as the Python peer's.
    callAsTask: async (name, args) => {
      const options = { timeout: REQUEST_TIMEOUT_MS, task: { ttl: 120000 } };
      for await (const m of client.experimental.tasks.callToolStream({ name, arguments: args }, undefined, options)) {
        // The first message is the CreateTaskResult's task; leaving the loop stops the
        // stream's own polling, which the scenario does step by step.
        if (m.type === 'taskCreated') return { result: { task: m.task } };
        if (m.type === 'error') return { error: { code: m.error.code, message: m.error.message, data: m.error.data ?? null } };
        return { unexpected: m };
      }
      return { unexpected: 'the stream ended' };
    },
    getTask: async (id) => outcome(client.experimental.tasks.getTask(id, { timeout: REQUEST_TIMEOUT_MS })),
    taskResult: async (id) =>
      outcome(client.experimental.tasks.getTaskResult(id, CallToolResultSchema, { timeout: REQUEST_TIMEOUT_MS })),
    listTasks: async () => outcome(client.experimental.tasks.listTasks(undefined, { timeout: REQUEST_TIMEOUT_MS })),
    cancelTask: async (id) => outcome(client.experimental.tasks.cancelTask(id, { timeout: REQUEST_TIMEOUT_MS })),
  };
  try {
    return await body(conn);
  } finally {
    if (transport instanceof StreamableHTTPClientTransport) {
      try {
        await transport.terminateSession();
      } catch {
        // best effort: the session is gone with the gateway anyway
      }
    }
    // SSE: closes the stream, which ends the session; stdio: closes the child's stdin.
    await client.close();
  }
}

// {result} or {error: {code, message, data}} of one request.
async function outcome(promise) {
  try {
    return { result: await promise };
  } catch (e) {
    if (e instanceof McpError) return { error: { code: e.code, message: e.message, data: e.data ?? null } };
    throw e;
  }
}

const TERMINAL = ['completed', 'failed', 'cancelled'];

// tasks/get until the task is in `status` or terminal (bounded).
async function pollUntil(c, id, status, polls) {
  for (let i = 0; i < 200; i++) {
    const got = await c.getTask(id);
    polls.push(got);
    const now = got.result?.status;
    if (now === status || TERMINAL.includes(now) || got.error) return;
    await new Promise((r) => setTimeout(r, Math.min(got.result?.pollInterval ?? 100, 500)));
  }
}

const scenarios = {
  // summarize_repo as a 2025-11-25 task: poll to input_required, tasks/result (its two
  // sampling rounds arrive on it), then a second task cancelled while input_required.
  async tasks(cfg) {
    const rec = new Recorder({ samples: cfg.samples });
    const args = { directory: cfg.repo, audience: 'developer' };
    const r = await withSession(cfg, { ...rec.handlers(), tasks: true }, async (c) => {
      const o = { info: await c.info(), polls: [], polls2: [] };
      await c.listTools(); // the SDK validates structuredContent against outputSchema
      o.created = await c.callAsTask('summarize_repo', args);
      const task = o.created.result.task.taskId;
      await pollUntil(c, task, 'input_required', o.polls);
      o.result = await c.taskResult(task);
      o.done = await c.getTask(task);
      o.listed = await c.listTasks();
      await checkpoint('after_result');
      o.created2 = await c.callAsTask('summarize_repo', args);
      const task2 = o.created2.result.task.taskId;
      await pollUntil(c, task2, 'input_required', o.polls2);
      o.cancelled = await c.cancelTask(task2);
      o.after_cancel = await c.getTask(task2);
      o.cancel_again = await c.cancelTask(task2);
      o.listed2 = await c.listTasks();
      return o;
    });
    return { ...r, ...rec.obs() };
  },

  async discover(cfg) {
    const rec = new Recorder();
    return withSession(cfg, rec.handlers(), async (c) => ({
      info: await c.info(),
      tools: await c.listTools(),
      ...rec.obs(),
    }));
  },

  async delete_accept(cfg) {
    const rec = new Recorder({ answers: cfg.answers });
    const call = await withSession(cfg, rec.handlers(), (c) =>
      c.call('notes_delete', { workspaceUri: cfg.workspace, title: cfg.title }),
    );
    return { call, ...rec.obs() };
  },

  async delete_decline_cancel(cfg) {
    const rec = new Recorder({ answers: cfg.answers });
    const args = { workspaceUri: cfg.workspace, title: cfg.title };
    const calls = await withSession(cfg, rec.handlers(), async (c) => {
      const out = [await c.call('notes_delete', args)];
      await checkpoint('after_decline');
      out.push(await c.call('notes_delete', args));
      await checkpoint('after_cancel');
      out.push(await c.call('notes_delete', args));
      return out;
    });
    return { calls, ...rec.obs() };
  },

  async summarize(cfg) {
    const rec = new Recorder({ samples: cfg.samples });
    const r = await withSession(cfg, rec.handlers(), async (c) => {
      await c.listTools(); // the SDK validates structuredContent against outputSchema
      const call = await c.call('summarize_repo', { directory: cfg.repo, audience: 'developer' });
      const after = await c.call('notes_list', { workspaceUri: cfg.workspace });
      return { call, after };
    });
    return { ...r, ...rec.obs() };
  },

  async roots(cfg) {
    const rec = new Recorder({ rootsAnswers: cfg.roots_answers });
    const calls = await withSession(cfg, rec.handlers(), async (c) => {
      const out = [];
      for (let i = 0; i < cfg.roots_answers.length; i++) out.push(await c.call('notes_list', {}));
      return out;
    });
    return { calls, ...rec.obs() };
  },

  async no_elicitation(cfg) {
    const rec = new Recorder();
    const handlers = { ...rec.handlers(), elicit: null };
    const r = await withSession(cfg, handlers, async (c) => ({
      call: await c.call('notes_delete', { workspaceUri: cfg.workspace, title: cfg.title }),
      after: await c.call('notes_list', { workspaceUri: cfg.workspace }),
    }));
    return { ...r, ...rec.obs() };
  },

  // Two sessions, each in the middle of an elicitation round at the same time; B's
  // whole request completes while A's round is still open, then A answers.
  async interleave(cfg) {
    const gotForm = { A: deferred(), B: deferred() };
    const bDone = deferred();
    const out = {};
    const party = async (name) => {
      const { title, answer } = cfg.parties[name];
      const rec = new Recorder();
      const handlers = rec.handlers();
      handlers.elicit = async (params) => {
        rec.elicitations.push(params);
        gotForm[name].resolve();
        await withTimeout(Promise.all([gotForm.A.promise, gotForm.B.promise]), BARRIER_MS, 'both forms');
        if (name === 'A') await withTimeout(bDone.promise, BARRIER_MS, "B's result");
        return answerFor(answer, params);
      };
      try {
        const call = await withSession(cfg, handlers, async (c) => {
          const r = await c.call('notes_delete', { workspaceUri: cfg.workspace, title });
          if (name === 'B') bDone.resolve();
          return r;
        });
        out[name] = { call, ...rec.obs() };
      } finally {
        if (name === 'B') bDone.resolve();
        gotForm[name].resolve();
      }
    };
    await Promise.all([party('A'), party('B')]);
    return out;
  },
};

scenarios.summarize_bad_pick = scenarios.summarize;

const cfg = JSON.parse(process.argv[2]);
try {
  const obs = await scenarios[cfg.scenario](cfg);
  emit({ event: 'done', obs: { ...obs, protocol_versions: seenVersions } });
  process.exit(0);
} catch (e) {
  emit({ event: 'error', error: String(e?.stack ?? e) });
  process.exit(1);
}
