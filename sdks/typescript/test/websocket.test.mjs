// The /acp WebSocket transport: acp-http-client's AcpWebSocketConnection and
// SandboxAgentClient with transport "websocket", against the real server.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { AcpHttpError, AcpWebSocketConnection } from "acp-http-client";
import { SandboxAgentClient } from "sandbox-agent";
import { startServer, textOf, unusedUrl } from "./server.mjs";

const INIT = { protocolVersion: 1, clientCapabilities: {}, _meta: { "sandboxagent.dev": { agent: "mock" } } };

describe("over a WebSocket on /acp", () => {
  let server;
  before(async () => {
    server = await startServer(["--token", "s3cret"]);
  });
  after(async () => {
    await server?.stop();
  });

  test("AcpWebSocketConnection: requests in flight, updates before the answer, agent requests, close", async () => {
    const updates = [];
    const asked = [];
    const connection = await AcpWebSocketConnection.open(INIT, {
      baseUrl: server.url,
      token: "s3cret",
      onNotification: (n) => n.method === "session/update" && updates.push(n.params.update),
      onRequest: (request) => {
        asked.push(request.method);
        return { outcome: { outcome: "selected", optionId: "allow-once" } };
      },
    });
    assert.equal(connection.initializeResult.agentInfo.name, "sandbox-agent-mock");
    const { sessionId } = await connection.request("session/new", { cwd: "/tmp", mcpServers: [] });
    const echoes = await Promise.all(Array.from({ length: 10 }, (_, i) => connection.request("_mock/echo", { i })));
    assert.deepEqual(echoes.map((e) => e.i), [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
    const result = await connection.request("session/prompt", { sessionId, prompt: [{ type: "text", text: "!emit 50 8" }] });
    assert.equal(result.stopReason, "end_turn");
    assert.equal(updates.length, 50);
    updates.length = 0;
    await connection.request("session/prompt", { sessionId, prompt: [{ type: "text", text: "ask permission" }] });
    assert.deepEqual(asked, ["session/request_permission"]);
    assert.equal(textOf(updates), "Permission granted.");
    await assert.rejects(
      connection.request("session/prompt", { sessionId, prompt: [{ type: "text", text: "!stall" }] }, { timeoutMs: 100 }),
      (e) => e.kind === "timeout",
    );
    await connection.notify("session/cancel", { sessionId });
    await connection.close();
    assert.equal(connection.closed, true);
    await assert.rejects(connection.request("_mock/echo", {}), (e) => e.kind === "closed");
  });

  test("a refused handshake says why: a wrong token is 401; no server is connection-lost", async () => {
    await assert.rejects(
      AcpWebSocketConnection.open(INIT, { baseUrl: server.url, token: "nope" }),
      (e) => e instanceof AcpHttpError && e.kind === "http" && e.status === 401,
    );
    await assert.rejects(AcpWebSocketConnection.open(INIT, { baseUrl: await unusedUrl() }), (e) => e.kind === "connection-lost");
  });

  test("SandboxAgentClient with transport websocket: a streamed turn, a permission answered, the inventory", async () => {
    const client = new SandboxAgentClient({
      baseUrl: server.url,
      token: "s3cret",
      agent: "mock",
      transport: "websocket",
      onPermissionRequest: () => "reject",
    });
    const session = await client.newSession({ cwd: "/tmp", metadata: { via: "websocket" } });
    assert.deepEqual(session.metadata, { via: "websocket" });
    const updates = [];
    const turn = client.promptStream(session.sessionId, "ask permission");
    for await (const update of turn) updates.push(update);
    assert.equal(textOf(updates), "Permission denied.");
    assert.equal((await turn.result).stopReason, "end_turn");
    assert.equal(client.connectionId, undefined);
    assert.equal((await client.getSession(session.sessionId)).metadata.via, "websocket");
    await client.disconnect();
    await assert.rejects(client.prompt(session.sessionId, "hi"), (e) => e.isNotConnected());
    const wrong = new SandboxAgentClient({ baseUrl: server.url, token: "nope", agent: "mock", transport: "websocket" });
    await assert.rejects(wrong.newSession({ cwd: "/tmp" }), (e) => e.isUnauthorized());
    await client.dispose();
  });
});
