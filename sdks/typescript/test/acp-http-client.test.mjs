// acp-http-client against the real server (mock agent), plus its pure parts.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { AcpHttpConnection, AcpHttpError, DEFAULT_RECONNECT_POLICY, parseSse, reconnectDelayMs } from "acp-http-client";
import { startServer, textOf, unusedUrl } from "./server.mjs";

const INIT = {
  protocolVersion: 1,
  clientCapabilities: {},
  _meta: { "sandboxagent.dev": { agent: "mock" } },
};

function bodyOf(chunks) {
  const encoder = new TextEncoder();
  return new ReadableStream({
    start(controller) {
      for (const chunk of chunks) controller.enqueue(encoder.encode(chunk));
      controller.close();
    },
  });
}

async function collect(generator) {
  const out = [];
  for await (const item of generator) out.push(item);
  return out;
}

describe("parseSse", () => {
  test("fields, comments, multi-line data, CRLF and chunk boundaries", async () => {
    const events = await collect(
      parseSse(bodyOf([": stream open\n\n", "event: message\nid: 1\nda", "ta: {\"a\":1}\n\n", "data: x\r\ndata: y\r\n\r", "\nid: 7\n: heartbeat\ndata:z\n\n"])),
    );
    assert.deepEqual(events, [
      { id: "1", event: "message", data: '{"a":1}' },
      { id: undefined, event: "message", data: "x\ny" },
      { id: "7", event: "message", data: "z" },
    ]);
  });

  test("an event without data is not dispatched; an unfinished one at the end is dropped", async () => {
    const events = await collect(parseSse(bodyOf(["id: 3\n\n", "data: last"])));
    assert.deepEqual(events, []);
  });
});

test("reconnect delays double, cap and jitter into [delay/2, delay]", () => {
  const p = DEFAULT_RECONNECT_POLICY;
  assert.equal(reconnectDelayMs(p, 0, 1), 250);
  assert.equal(reconnectDelayMs(p, 0, 0), 125);
  assert.equal(reconnectDelayMs(p, 2, 1), 1000);
  assert.equal(reconnectDelayMs(p, 30, 1), 10_000);
  assert.equal(reconnectDelayMs(p, 1000, 0), 5_000);
});

describe("against the server", () => {
  let server;
  before(async () => {
    server = await startServer();
  });
  after(async () => {
    await server?.stop();
  });

  async function openWithUpdates(extra = {}) {
    const updates = [];
    const connection = await AcpHttpConnection.open(INIT, {
      baseUrl: server.url,
      onNotification: (n) => {
        if (n.method === "session/update") updates.push(n.params.update);
      },
      ...extra,
    });
    const { sessionId } = await connection.request("session/new", {
      cwd: "/tmp",
      mcpServers: [],
      _meta: { "sandboxagent.dev": { agent: "mock" } },
    });
    return { connection, updates, sessionId };
  }

  test("open, several requests in flight, close", async () => {
    const { connection, updates, sessionId } = await openWithUpdates();
    assert.match(connection.connectionId, /^[0-9a-f-]{36}$/);
    assert.equal(connection.initializeResult.agentInfo.name, "sandbox-agent-mock");
    const echoes = await Promise.all(
      Array.from({ length: 20 }, (_, i) => connection.request("_mock/echo", { n: i })),
    );
    assert.deepEqual(echoes, Array.from({ length: 20 }, (_, i) => ({ n: i })));
    const [a, b] = await Promise.all([
      connection.request("session/prompt", { sessionId, prompt: [{ type: "text", text: "!slow 3 30" }] }),
      connection.request("_mock/echo", { during: "turn" }),
    ]);
    assert.equal(a.stopReason, "end_turn");
    assert.deepEqual(b, { during: "turn" });
    assert.equal(textOf(updates), "chunk-1 chunk-2 chunk-3 ");
    await connection.close();
    assert.equal(connection.closed, true);
    await assert.rejects(connection.request("_mock/echo", {}), (e) => e instanceof AcpHttpError && e.kind === "closed");
  });

  test("an answer is released only after the turn's updates were delivered", async () => {
    const { connection, updates, sessionId } = await openWithUpdates();
    const result = await connection.request("session/prompt", { sessionId, prompt: [{ type: "text", text: "!emit 300 10" }] });
    assert.equal(result.stopReason, "end_turn");
    assert.equal(updates.length, 300, "every update arrived before the answer");
    await connection.close();
  });

  test("a stream cut mid-turn resumes with nothing lost or repeated (replayed events dropped)", async () => {
    const gets = [];
    // The first GET's body breaks right after `chunk-3`; the second asks the
    // server to replay from event 1, so events the client already has come
    // again and must be dropped by id.
    const cuttingFetch = async (input, init) => {
      if (init?.method !== "GET") return fetch(input, init);
      gets.push(init.headers["last-event-id"]);
      if (gets.length === 2) init = { ...init, headers: { ...init.headers, "last-event-id": "1" } };
      const response = await fetch(input, init);
      if (gets.length !== 1) return response;
      const reader = response.body.getReader();
      const decoder = new TextDecoder();
      let seen = "";
      const cut = new ReadableStream({
        async pull(controller) {
          const { value, done } = await reader.read();
          if (done) return controller.close();
          controller.enqueue(value);
          seen += decoder.decode(value, { stream: true });
          if (seen.includes("chunk-3 ") && /\n\n$/.test(seen)) {
            await reader.cancel();
            controller.error(new TypeError("network cut by the test"));
          }
        },
      });
      return new Response(cut, { status: response.status, headers: response.headers });
    };
    const { connection, updates, sessionId } = await openWithUpdates({ fetch: cuttingFetch, reconnect: { initialDelayMs: 20 } });
    const result = await connection.request("session/prompt", { sessionId, prompt: [{ type: "text", text: "!slow 10 40" }] });
    assert.equal(result.stopReason, "end_turn");
    assert.equal(textOf(updates), Array.from({ length: 10 }, (_, i) => `chunk-${i + 1} `).join(""));
    assert.equal(gets[0], "0");
    assert.ok(Number(gets[1]) >= 3, `the resume sent Last-Event-ID ${gets[1]}`);
    assert.ok(connection.stats.reconnects >= 1);
    assert.ok(connection.stats.duplicateEvents >= 2, `duplicates dropped: ${connection.stats.duplicateEvents}`);
    await connection.close();
  });

  test("agent requests are answered through onRequest (permission round trip)", async () => {
    const asked = [];
    const { connection, updates, sessionId } = await openWithUpdates({
      onRequest: async (request) => {
        asked.push(request);
        return { outcome: { outcome: "selected", optionId: "allow-once" } };
      },
    });
    const result = await connection.request("session/prompt", { sessionId, prompt: [{ type: "text", text: "ask permission" }] });
    assert.equal(result.stopReason, "end_turn");
    assert.equal(asked.length, 1);
    assert.equal(asked[0].method, "session/request_permission");
    assert.deepEqual(asked[0].params.options.map((o) => o.optionId), ["allow-once", "reject-once"]);
    assert.equal(textOf(updates), "Permission granted.");
    await connection.close();
  });

  test("without onRequest an agent request is answered method-not-found", async () => {
    const { connection, sessionId } = await openWithUpdates();
    // The mock passes the client's error on as the prompt's error.
    await assert.rejects(
      connection.request("session/prompt", { sessionId, prompt: [{ type: "text", text: "ask permission" }] }),
      (e) => e.kind === "rpc" && /method not found: session\/request_permission/.test(e.message),
    );
    await connection.close();
  });

  test("per-request timeout and cancellation by AbortSignal", async () => {
    const { connection, sessionId } = await openWithUpdates();
    const stall = { sessionId, prompt: [{ type: "text", text: "!stall" }] };
    await assert.rejects(
      connection.request("session/prompt", stall, { timeoutMs: 200 }),
      (e) => e instanceof AcpHttpError && e.kind === "timeout",
    );
    await connection.notify("session/cancel", { sessionId });
    // Another session: the first one's turn may still be winding down.
    const other = await connection.request("session/new", {
      cwd: "/tmp",
      mcpServers: [],
      _meta: { "sandboxagent.dev": { agent: "mock" } },
    });
    const abort = new AbortController();
    const pending = connection.request(
      "session/prompt",
      { sessionId: other.sessionId, prompt: [{ type: "text", text: "!stall" }] },
      { signal: abort.signal },
    );
    setTimeout(() => abort.abort(), 100);
    await assert.rejects(pending, (e) => e instanceof AcpHttpError && e.kind === "aborted");
    await connection.notify("session/cancel", { sessionId: other.sessionId });
    // The connection is still usable.
    assert.deepEqual(await connection.request("_mock/echo", { ok: true }), { ok: true });
    await connection.close();
  });

  test("a JSON-RPC error answer rejects with kind rpc", async () => {
    const { connection } = await openWithUpdates();
    await assert.rejects(
      connection.request("_sandboxagent/session/get", { sessionId: "nope" }),
      (e) => e.kind === "rpc" && e.rpcError.code === -32002,
    );
    await connection.close();
  });

  test("a connection the server forgot ends with its 404", async () => {
    let closedWith;
    const { connection } = await openWithUpdates({ onClose: (e) => (closedWith = e) });
    await fetch(`${server.url}/v2/rpc`, { method: "DELETE", headers: { "x-acp-connection-id": connection.connectionId } });
    await assert.rejects(connection.request("_mock/echo", {}), (e) => e.kind === "http" && e.status === 404);
    for (let i = 0; i < 100 && closedWith === undefined; i++) await new Promise((r) => setTimeout(r, 20));
    assert.equal(closedWith?.status, 404);
    assert.equal(closedWith?.problem?.type, "urn:sandbox-agent:error:unknown-connection");
    assert.equal(connection.closed, true);
  });

  test("an unknown agent is the server's 404 problem", async () => {
    await assert.rejects(
      AcpHttpConnection.open({ ...INIT, _meta: { "sandboxagent.dev": { agent: "nope" } } }, { baseUrl: server.url }),
      (e) => e.kind === "http" && e.status === 404 && e.problem.type === "urn:sandbox-agent:error:unknown-agent",
    );
  });
});

test("bearer token: 401 without it, open with it", async () => {
  const server = await startServer(["--token", "s3cret"]);
  try {
    await assert.rejects(
      AcpHttpConnection.open(INIT, { baseUrl: server.url }),
      (e) => e.kind === "http" && e.status === 401 && e.problem.type === "urn:sandbox-agent:error:unauthorized",
    );
    const connection = await AcpHttpConnection.open(INIT, { baseUrl: server.url, token: "s3cret" });
    assert.deepEqual(await connection.request("_mock/echo", { t: 1 }), { t: 1 });
    await connection.close();
  } finally {
    await server.stop();
  }
});

test("an unreachable server is kind connection-lost", async () => {
  await assert.rejects(
    AcpHttpConnection.open(INIT, { baseUrl: await unusedUrl() }),
    (e) => e instanceof AcpHttpError && e.kind === "connection-lost",
  );
});

test("a stream that cannot come back gives up after maxAttempts", async () => {
  const server = await startServer();
  let closedWith;
  const connection = await AcpHttpConnection.open(INIT, {
    baseUrl: server.url,
    reconnect: { initialDelayMs: 10, maxDelayMs: 20, maxAttempts: 2 },
    onClose: (e) => (closedWith = e),
  });
  await server.stop();
  for (let i = 0; i < 200 && closedWith === undefined; i++) await new Promise((r) => setTimeout(r, 25));
  assert.equal(closedWith?.kind, "connection-lost");
  await assert.rejects(connection.request("_mock/echo", {}), (e) => e.kind === "connection-lost");
});
