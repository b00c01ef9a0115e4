// SandboxAgentClient against the real server (mock agent): every public method.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync, mkdirSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { PromptTurn, SandboxAgentClient, SandboxAgentError, checkAnswer } from "sandbox-agent";
import { startServer, textOf, unusedUrl } from "./server.mjs";

const SAY = "Hello from the mock agent. You said: ";

async function collect(turn) {
  const updates = [];
  for await (const update of turn) updates.push(update);
  return updates;
}

/** A fetch whose first event stream breaks once `marker` went through. */
function cuttingFetch(marker) {
  let gets = 0;
  return async (input, init) => {
    if (init?.method !== "GET" || !String(input).endsWith("/v2/rpc")) return fetch(input, init);
    gets++;
    const response = await fetch(input, init);
    if (gets !== 1) return response;
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let seen = "";
    const body = new ReadableStream({
      async pull(controller) {
        const { value, done } = await reader.read();
        if (done) return controller.close();
        controller.enqueue(value);
        seen += decoder.decode(value, { stream: true });
        if (seen.includes(marker) && seen.endsWith("\n\n")) {
          await reader.cancel();
          controller.error(new TypeError("network cut by the test"));
        }
      },
    });
    return new Response(body, { status: response.status, headers: response.headers });
  };
}

describe("SandboxAgentClient", () => {
  let server;
  const clients = [];
  function client(options = {}) {
    const c = new SandboxAgentClient({ baseUrl: server.url, agent: "mock", ...options });
    clients.push(c);
    return c;
  }
  before(async () => {
    server = await startServer();
  });
  after(async () => {
    await Promise.all(clients.map((c) => c.dispose().catch(() => undefined)));
    await server?.stop();
  });

  test("getHealth, listAgents, installAgent need no connection", async () => {
    const c = client({ autoConnect: false });
    const health = await c.getHealth();
    assert.equal(health.status, "ok");
    const { agents } = await c.listAgents();
    const mock = agents.find((a) => a.id === "mock");
    assert.equal(mock.installed, true);
    assert.equal(mock.source, "builtin");
    const installed = await c.installAgent();
    assert.equal(installed.agent, "mock");
    assert.equal(installed.alreadyInstalled, true);
    await assert.rejects(c.installAgent("nope"), (e) => e instanceof SandboxAgentError && e.isNotFound() && e.status === 404);
    assert.equal(c.connected, false);
  });

  test("auto-connect by default: calls wait for the connection", async () => {
    const c = client();
    const session = await c.newSession({ cwd: "/tmp" });
    assert.match(session.sessionId, /^mock-/);
    assert.equal(c.connected, true);
    assert.ok(c.connectionId);
  });

  test("autoConnect false: session calls fail before connect() and after disconnect(); one connection per instance", async () => {
    const c = client({ autoConnect: false });
    await assert.rejects(c.newSession({ cwd: "/tmp" }), (e) => e instanceof SandboxAgentError && e.isNotConnected() && e.kind === "not-connected");
    await assert.rejects(c.prompt("mock-x", "hi"), (e) => e.kind === "not-connected");
    await c.connect();
    const first = c.connectionId;
    await c.connect();
    assert.equal(c.connectionId, first, "connect() again keeps the one connection");
    const session = await c.newSession({ cwd: "/tmp" });
    await c.disconnect();
    assert.equal(c.connected, false);
    await assert.rejects(c.prompt(session.sessionId, "hi"), (e) => e.kind === "not-connected");
    // Sessions live on: a new connection loads it and prompts it.
    await c.connect();
    assert.notEqual(c.connectionId, first);
    await c.loadSession(session.sessionId, { cwd: "/tmp" });
    assert.equal((await c.prompt(session.sessionId, "again")).stopReason, "end_turn");
    await c.dispose();
    await assert.rejects(c.connect(), (e) => e.kind === "disposed");
    await assert.rejects(c.getHealth(), (e) => e.kind === "disposed");
  });

  test("prompt: the turn's updates go to onSessionUpdate", async () => {
    const events = [];
    const c = client({ onSessionUpdate: (event) => events.push(event) });
    const { sessionId } = await c.newSession({ cwd: "/tmp" });
    const result = await c.prompt(sessionId, "hello there");
    assert.equal(result.stopReason, "end_turn");
    assert.equal(textOf(events.filter((e) => e.sessionId === sessionId).map((e) => e.update)), `${SAY}hello there`);
  });

  test("promptStream yields the turn's updates, then result has the stop reason", async () => {
    const c = client();
    const { sessionId } = await c.newSession({ cwd: "/tmp" });
    const turn = c.promptStream(sessionId, "please use a tool");
    assert.ok(turn instanceof PromptTurn);
    const updates = await collect(turn);
    assert.deepEqual(
      updates.filter((u) => u.sessionUpdate !== "agent_message_chunk").map((u) => u.sessionUpdate),
      ["tool_call", "tool_call_update"],
    );
    assert.equal(textOf(updates), `${SAY}please use a tool`);
    assert.equal((await turn.result).stopReason, "end_turn");
    // Content blocks work too.
    const blocks = await collect(c.promptStream(sessionId, [{ type: "text", text: "a" }, { type: "text", text: "b" }]));
    assert.equal(textOf(blocks), `${SAY}a b`);
  });

  test("permission round trip through onPermissionRequest: allow, reject, none", async () => {
    const asked = [];
    let decision = "allow";
    const c = client({
      onPermissionRequest: (request) => {
        asked.push(request);
        return decision;
      },
    });
    const { sessionId } = await c.newSession({ cwd: "/tmp" });
    assert.equal(textOf(await collect(c.promptStream(sessionId, "ask permission"))), "Permission granted.");
    assert.equal(asked[0].sessionId, sessionId);
    assert.equal(asked[0].toolCall.title, "Write to mock.txt");
    decision = "reject";
    assert.equal(textOf(await collect(c.promptStream(sessionId, "ask permission"))), "Permission denied.");
    decision = { optionId: "allow-once" };
    assert.equal(textOf(await collect(c.promptStream(sessionId, "ask permission"))), "Permission granted.");
    decision = "cancel";
    assert.equal((await c.prompt(sessionId, "ask permission")).stopReason, "cancelled");
    // Without a handler the request is answered cancelled.
    const plain = client();
    const other = await plain.newSession({ cwd: "/tmp" });
    assert.equal((await plain.prompt(other.sessionId, "ask permission")).stopReason, "cancelled");
  });

  test("cancel, turn.cancel() and an AbortSignal end a turn with stop reason cancelled", async () => {
    const c = client();
    const { sessionId } = await c.newSession({ cwd: "/tmp" });
    const stalled = c.prompt(sessionId, "!stall");
    setTimeout(() => void c.cancel(sessionId), 100);
    assert.equal((await stalled).stopReason, "cancelled");
    const turn = c.promptStream(sessionId, "!stall");
    setTimeout(() => void turn.cancel(), 100);
    assert.deepEqual(await collect(turn), []);
    assert.equal((await turn.result).stopReason, "cancelled");
    const abort = new AbortController();
    setTimeout(() => abort.abort(), 100);
    assert.equal((await c.prompt(sessionId, "!stall", { signal: abort.signal })).stopReason, "cancelled");
  });

  test("an agent that dies mid-turn: the turn's iterator and result throw the error", async () => {
    const c = client();
    const { sessionId } = await c.newSession({ cwd: "/tmp" });
    const turn = c.promptStream(sessionId, "!crash");
    const seen = [];
    await assert.rejects(
      (async () => {
        for await (const update of turn) seen.push(update);
      })(),
      (e) => e instanceof SandboxAgentError && e.kind === "rpc" && e.code === -32603,
    );
    assert.equal(textOf(seen), "Crashing...");
    await assert.rejects(turn.result, (e) => e.kind === "rpc");
    assert.equal((await c.getSession(sessionId)).ended, true);
    // The client goes on: the next session starts a new agent process.
    const next = await c.newSession({ cwd: "/tmp" });
    assert.equal((await c.prompt(next.sessionId, "still here")).stopReason, "end_turn");
  });

  test("a stream cut mid-turn is resumed: the turn yields every update once", async () => {
    const c = client({ fetch: cuttingFetch("chunk-3 ") });
    const { sessionId } = await c.newSession({ cwd: "/tmp" });
    const updates = await collect(c.promptStream(sessionId, "!slow 8 40"));
    assert.equal(textOf(updates), Array.from({ length: 8 }, (_, i) => `chunk-${i + 1} `).join(""));
    assert.equal(updates.length, 8);
  });

  test("session inventory: metadata, getSession, setMetadata, listSessions, unstableListSessions, events, models", async () => {
    const c = client();
    const session = await c.newSession({
      cwd: "/tmp/inventory",
      metadata: { variant: "fast", labels: { team: "infra" } },
    });
    assert.equal(session.agent, "mock");
    assert.equal(session.cwd, "/tmp/inventory");
    assert.equal(session.ended, false);
    assert.deepEqual(session.metadata, { variant: "fast", labels: { team: "infra" } });
    assert.equal(session.modes.currentModeId, "default");
    assert.equal(session.model, "mock-fast");

    await c.prompt(session.sessionId, "first words");
    const updated = await c.setMetadata(session.sessionId, { title: "Fix the login bug", labels: { priority: "high" } });
    assert.equal(updated.title, "Fix the login bug");
    assert.deepEqual(updated.metadata.labels, { team: "infra", priority: "high" });

    const got = await c.getSession(session.sessionId);
    assert.equal(got.title, "Fix the login bug");
    assert.equal(got.firstPrompt, "first words");
    assert.ok(got.eventCount >= 4);
    assert.ok(!("title" in got.metadata) && !("agent" in got.metadata));

    const page = await c.listSessions({ agent: "mock", q: "login bug" });
    assert.deepEqual(page.sessions.map((s) => s.sessionId), [session.sessionId]);
    assert.equal(page.nextCursor, undefined);
    const first = await c.listSessions({ limit: 1 });
    assert.equal(first.sessions.length, 1);
    assert.ok(first.nextCursor);
    const second = await c.listSessions({ limit: 1, cursor: first.nextCursor });
    assert.notEqual(second.sessions[0].sessionId, first.sessions[0].sessionId);

    const acp = await c.unstableListSessions({ cwd: "/tmp/inventory" });
    assert.deepEqual(acp.sessions.map((s) => s.sessionId), [session.sessionId]);

    const events = await c.getSessionEvents(session.sessionId, { limit: 2 });
    assert.equal(events.events.length, 2);
    assert.equal(events.events[0].offset, 0);
    assert.equal(events.events[0].direction, "client_to_agent");
    assert.equal(events.events[0].message.method, "session/new");
    assert.equal(events.nextOffset, 2);

    const models = await c.listModels(session.sessionId);
    assert.deepEqual(models.availableModels.map((m) => m.modelId), ["mock-fast", "mock-smart"]);
    assert.equal(models.currentModelId, "mock-fast");
    const agentModels = await c.listModels();
    assert.equal(agentModels.currentModelId, undefined);
  });

  test("detachSession and terminateSession", async () => {
    const events = [];
    const c = client({ onSessionUpdate: (e) => events.push(e) });
    const { sessionId } = await c.newSession({ cwd: "/tmp" });
    await c.detachSession(sessionId);
    // The turn still runs and answers; its updates no longer reach this connection.
    assert.equal((await c.prompt(sessionId, "quiet")).stopReason, "end_turn");
    assert.equal(events.filter((e) => e.sessionId === sessionId).length, 0);
    const ended = await c.terminateSession(sessionId);
    assert.deepEqual(ended, { sessionId, alreadyEnded: false });
    assert.equal((await c.getSession(sessionId)).ended, true);
    assert.equal((await c.terminateSession(sessionId)).alreadyEnded, true);
  });

  test("errors map to predicates: 404 and JSON-RPC not found", async () => {
    const c = client();
    await assert.rejects(c.getSession("nope"), (e) => {
      assert.ok(e instanceof SandboxAgentError);
      assert.equal(e.isNotFound(), true);
      assert.equal(e.status, 404);
      assert.equal(e.problem.type, "urn:sandbox-agent:error:unknown-session");
      assert.equal(e.isUnauthorized(), false);
      return true;
    });
    await assert.rejects(c.setMetadata("nope", { a: 1 }), (e) => e.isNotFound() && e.code === -32002 && e.kind === "rpc");
    await assert.rejects(c.loadSession("nope", { cwd: "/tmp" }), (e) => e.isNotFound());
    await assert.rejects(c.getSessionEvents("nope"), (e) => e.isNotFound());
  });

  describe("files", () => {
    let dir;
    before(() => {
      dir = mkdtempSync(join(tmpdir(), "sa-ts-fs-"));
    });
    after(() => rmSync(dir, { recursive: true, force: true }));

    test("write, read, stat, list, mkdir, move, delete", async () => {
      const c = client({ autoConnect: false });
      const path = join(dir, "a", "hello.txt");
      assert.deepEqual(await c.writeFsFile(path, "hello"), { path, bytesWritten: 5 });
      assert.equal(new TextDecoder().decode(await c.readFsFile(path)), "hello");
      const bytes = new Uint8Array(300_000).map((_, i) => i % 251);
      await c.writeFsFile(join(dir, "bin"), bytes);
      assert.deepEqual(await c.readFsFile(join(dir, "bin")), bytes);
      const streamed = new ReadableStream({
        start(controller) {
          controller.enqueue(new TextEncoder().encode("part one, "));
          controller.enqueue(new TextEncoder().encode("part two"));
          controller.close();
        },
      });
      assert.equal((await c.writeFsFile(join(dir, "streamed.txt"), streamed)).bytesWritten, 18);
      assert.equal(new TextDecoder().decode(await c.readFsFile(join(dir, "streamed.txt"))), "part one, part two");

      const stat = await c.statFs(path);
      assert.equal(stat.entryType, "file");
      assert.equal(stat.size, 5);
      assert.deepEqual(await c.mkdirFs(join(dir, "b", "c")), { path: join(dir, "b", "c") });
      const { entries } = await c.listFsEntries(dir);
      assert.deepEqual(entries.map((e) => [e.name, e.entryType]), [
        ["a", "directory"],
        ["b", "directory"],
        ["bin", "file"],
        ["streamed.txt", "file"],
      ]);
      const moved = join(dir, "b", "hello.txt");
      assert.deepEqual(await c.moveFs(path, moved), { from: path, to: moved });
      await assert.rejects(c.statFs(path), (e) => e.isNotFound() && e.problem.type === "urn:sandbox-agent:error:file-not-found");
      await assert.rejects(c.deleteFsEntry(join(dir, "b")), (e) => e.status === 409);
      assert.deepEqual(await c.deleteFsEntry(join(dir, "b"), { recursive: true }), { path: join(dir, "b") });
      await assert.rejects(c.readFsFile(moved), (e) => e.isNotFound());
    });

    test("readFsFileStream streams a file and resumes from an offset unless it changed", async () => {
      const c = client({ autoConnect: false });
      const path = join(dir, "big.bin");
      const bytes = new Uint8Array(1_000_000).map((_, i) => (i * 7) % 256);
      await c.writeFsFile(path, bytes);
      const whole = await c.readFsFileStream(path);
      assert.equal(whole.offset, 0);
      assert.equal(whole.size, bytes.length);
      assert.match(whole.etag, /^"/);
      assert.deepEqual(new Uint8Array(await new Response(whole.stream).arrayBuffer()), bytes);
      const rest = await c.readFsFileStream(path, { from: 600_000, etag: whole.etag });
      assert.equal(rest.offset, 600_000);
      assert.equal(rest.size, bytes.length);
      assert.deepEqual(new Uint8Array(await new Response(rest.stream).arrayBuffer()), bytes.subarray(600_000));
      await c.writeFsFile(path, "changed");
      const changed = await c.readFsFileStream(path, { from: 600_000, etag: whole.etag });
      assert.equal(changed.offset, 0, "a changed file comes whole");
      assert.equal(await new Response(changed.stream).text(), "changed");
    });

    test("relative paths start at the session's cwd", async () => {
      const c = client();
      const cwd = join(dir, "work");
      mkdirSync(cwd);
      const { sessionId } = await c.newSession({ cwd });
      await c.writeFsFile("notes.md", "# notes", { sessionId });
      assert.equal((await c.statFs(join(cwd, "notes.md"))).size, 7);
      assert.equal((await c.listFsEntries(".", { sessionId })).entries[0].name, "notes.md");
    });

    test("uploadFsBatch unpacks a tar and a tar.gz", async () => {
      const c = client({ autoConnect: false });
      const src = join(dir, "src");
      mkdirSync(join(src, "sub"), { recursive: true });
      writeFileSync(join(src, "one.txt"), "1");
      writeFileSync(join(src, "sub", "two.txt"), "22");
      const tar = execFileSync("tar", ["-c", "-C", src, "one.txt", "sub"]);
      const result = await c.uploadFsBatch(join(dir, "up"), new Uint8Array(tar));
      assert.equal(result.truncated, false);
      assert.ok(result.paths.includes(join(dir, "up", "sub", "two.txt")));
      assert.equal(new TextDecoder().decode(await c.readFsFile(join(dir, "up", "sub", "two.txt"))), "22");
      const tgz = execFileSync("tar", ["-cz", "-C", src, "one.txt"]);
      await c.uploadFsBatch(join(dir, "upgz"), new Uint8Array(tgz));
      assert.equal((await c.statFs(join(dir, "upgz", "one.txt"))).size, 1);
      await assert.rejects(c.uploadFsBatch(join(dir, "bad"), new TextEncoder().encode("not a tar")), (e) => e.status === 400);
    });
  });
});

test("a token: 401 maps to isUnauthorized, then the right token works", async () => {
  const server = await startServer(["--token", "s3cret"]);
  try {
    const anonymous = new SandboxAgentClient({ baseUrl: server.url, agent: "mock", autoConnect: false });
    assert.equal((await anonymous.getHealth()).status, "ok", "/v2/health needs no token");
    await assert.rejects(anonymous.listAgents(), (e) => e instanceof SandboxAgentError && e.isUnauthorized() && e.status === 401);
    await assert.rejects(anonymous.connect(), (e) => e.isUnauthorized());
    const wrong = new SandboxAgentClient({ baseUrl: server.url, agent: "mock", token: "nope" });
    await assert.rejects(wrong.newSession({ cwd: "/tmp" }), (e) => e.isUnauthorized());

    const authed = new SandboxAgentClient({ baseUrl: server.url, agent: "mock", token: "s3cret" });
    const { sessionId } = await authed.newSession({ cwd: "/tmp" });
    assert.equal(textOf(await collect(authed.promptStream(sessionId, "hi"))), `${SAY}hi`);
    assert.equal((await authed.listAgents()).agents.length > 0, true);
    await authed.dispose();
  } finally {
    await server.stop();
  }
});

test("an unreachable server maps to isUnreachable", async () => {
  const c = new SandboxAgentClient({ baseUrl: await unusedUrl(), agent: "mock" });
  await assert.rejects(c.getHealth(), (e) => e instanceof SandboxAgentError && e.isUnreachable() && e.kind === "connection-lost");
  await assert.rejects(c.newSession({ cwd: "/tmp" }), (e) => e.isUnreachable());
  // Later calls still say why the auto-connect failed (not "call connect() first").
  await assert.rejects(c.newSession({ cwd: "/tmp" }), (e) => e.isUnreachable());
  await assert.rejects(c.connect(), (e) => e.isUnreachable());
});

test("a request timeout maps to isTimeout", async () => {
  const server = await startServer();
  try {
    const c = new SandboxAgentClient({ baseUrl: server.url, agent: "mock", requestTimeoutMs: 5_000 });
    const { sessionId } = await c.newSession({ cwd: "/tmp" });
    // A server that never answers /v2/sessions/…: the client gives up.
    const hanging = (input, init) =>
      String(input).includes("/v2/sessions/")
        ? new Promise((_, reject) => init.signal.addEventListener("abort", () => reject(init.signal.reason)))
        : fetch(input, init);
    const slow = new SandboxAgentClient({ baseUrl: server.url, agent: "mock", requestTimeoutMs: 200, fetch: hanging, autoConnect: false });
    await assert.rejects(slow.getSession(sessionId), (e) => e instanceof SandboxAgentError && e.isTimeout() && e.kind === "timeout");
    // The caller's AbortSignal is kind aborted, not timeout.
    const never = new SandboxAgentClient({ baseUrl: server.url, agent: "mock", fetch: hanging, autoConnect: false });
    const abort = new AbortController();
    setTimeout(() => abort.abort(), 50);
    await assert.rejects(never.getSession(sessionId, { signal: abort.signal }), (e) => e.isAborted() && !e.isTimeout());
    // A turn has no client-side limit: it outlives requestTimeoutMs.
    const quick = new SandboxAgentClient({ baseUrl: server.url, agent: "mock", requestTimeoutMs: 2_000 });
    const s = await quick.newSession({ cwd: "/tmp" });
    assert.equal((await quick.prompt(s.sessionId, "!slow 3 1000")).stopReason, "end_turn");
    await Promise.all([c.dispose(), slow.dispose(), never.dispose(), quick.dispose()]);
  } finally {
    await server.stop();
  }
});

test("checkAnswer: the form's rules", () => {
  const question = {
    mode: "form",
    sessionId: "s",
    message: "m",
    requestedSchema: {
      type: "object",
      properties: {
        name: { type: "string", minLength: 1, maxLength: 3 },
        age: { type: "integer", minimum: 0, maximum: 150 },
        score: { type: "number", maximum: 1 },
        ok: { type: "boolean" },
        tags: { type: "array", items: { type: "string", enum: ["a", "b"] }, maxItems: 2 },
        pick: { type: "string", oneOf: [{ const: "x", title: "X" }] },
        many: { type: "array", items: { anyOf: [{ const: "p", title: "P" }] }, minItems: 1 },
      },
      required: ["name"],
    },
  };
  const check = (content) => checkAnswer(question, { action: "accept", content });
  assert.equal(check({ name: "Ada" }), undefined);
  assert.equal(check({ name: "Ada", age: 36, score: 0.5, ok: true, tags: ["a", "b"], pick: "x", many: ["p"], extra: null }), undefined);
  assert.equal(check({}), 'field "name" is required');
  assert.equal(check({ name: null }), 'field "name" is required');
  assert.equal(check({ name: "Adam" }), 'field "name" must be at most 3 characters long (is 4)');
  assert.equal(check({ name: "é🙂" }), undefined, "length in characters");
  assert.equal(check({ name: "A", nope: 1 }), 'field "nope" is not a field of the form');
  assert.equal(check({ name: "A", age: 1.5 }), 'field "age" must be an integer, not 1.5');
  assert.equal(check({ name: "A", age: -1 }), 'field "age" must be at least 0 (is -1)');
  assert.equal(check({ name: "A", score: 2 }), 'field "score" must be at most 1 (is 2)');
  assert.equal(check({ name: "A", ok: "yes" }), 'field "ok" must be true or false, not "yes"');
  assert.equal(check({ name: "A", tags: ["c"] }), 'field "tags" may only hold "a", "b", not "c"');
  assert.equal(check({ name: "A", tags: ["a", "b", "a"] }), 'field "tags" must hold at most 2 (holds 3)');
  assert.equal(check({ name: "A", pick: "y" }), 'field "pick" must be one of "x", not "y"');
  assert.equal(check({ name: "A", many: [] }), 'field "many" must hold at least 1 (holds 0)');
  assert.equal(checkAnswer(question, { action: "decline" }), undefined);
  const url = { mode: "url", sessionId: "s", message: "m", url: "https://example.invalid", elicitationId: "e" };
  assert.equal(checkAnswer(url, { action: "accept" }), undefined);
  assert.equal(checkAnswer(url, { action: "accept", content: { a: "b" } }), "a URL question takes no content");
});

test("questions (ACP elicitation) answered through onQuestion; without it they are cancelled", async () => {
  const server = await startServer();
  try {
    const asked = [];
    let answer = { action: "accept", content: { name: "Ada", color: "green", confirm: true } };
    const c = new SandboxAgentClient({
      baseUrl: server.url,
      agent: "mock",
      onQuestion: (question) => {
        asked.push(question);
        return answer;
      },
    });
    const { sessionId } = await c.newSession({ cwd: "/tmp" });
    assert.equal(textOf(await collect(c.promptStream(sessionId, "ask question"))), "You answered: name=Ada color=green confirm=true");
    assert.equal(asked[0].mode, "form");
    assert.equal(asked[0].sessionId, sessionId);
    assert.equal(asked[0].message, "The mock agent has a question");
    assert.deepEqual(Object.keys(asked[0].requestedSchema.properties).sort(), ["color", "confirm", "name"]);
    answer = { action: "decline" };
    assert.equal(textOf(await collect(c.promptStream(sessionId, "ask question"))), "You declined the question.");
    // Content that does not fit the form is never sent: the question is cancelled.
    const form = asked[0];
    assert.equal(checkAnswer(form, { action: "accept", content: { name: "", color: "red" } }), 'field "name" must be at least 1 character long (is 0)');
    answer = { action: "accept", content: { name: "Ada", color: "purple" } };
    assert.equal(checkAnswer(form, answer), 'field "color" must be one of "red", "green", "blue", not "purple"');
    assert.equal(textOf(await collect(c.promptStream(sessionId, "ask question"))), "You cancelled the question.");
    answer = { action: "accept" };
    assert.equal(textOf(await collect(c.promptStream(sessionId, "ask url"))), "You completed the sign-in.");
    assert.equal(asked.at(-1).mode, "url");

    const plain = new SandboxAgentClient({ baseUrl: server.url, agent: "mock" });
    const other = await plain.newSession({ cwd: "/tmp" });
    assert.equal(textOf(await collect(plain.promptStream(other.sessionId, "ask question"))), "You cancelled the question.");
    await Promise.all([c.dispose(), plain.dispose()]);
  } finally {
    await server.stop();
  }
});
