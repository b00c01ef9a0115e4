// Code written for seed 001's client runs unchanged: its call shapes (ACP's
// request objects, the file calls' request objects, SandboxAgent.connect and
// start) against the real server and mock agent; and every public method
// checks its arguments at run time (a TypeError naming the call and the
// parameter, before any request is sent).
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { after, before, describe, test } from "node:test";
import { fileURLToPath } from "node:url";
import { SandboxAgent, SandboxAgentClient } from "sandbox-agent";
import { blocksAfter } from "./readme-blocks.mjs";
import { binaryPath, startServer, textOf } from "./server.mjs";

const sdkDir = resolve(dirname(fileURLToPath(import.meta.url)), "..");

const SAY = "Hello from the mock agent. You said: ";
const OBJECT_OBJECT = "[object Object]";

describe("seed 001's call shapes", () => {
  let server;
  let dir;
  const clients = [];
  before(async () => {
    server = await startServer();
    dir = mkdtempSync(join(tmpdir(), "sa-ts-seed-"));
  });
  after(async () => {
    await Promise.all(clients.map((c) => c.dispose().catch(() => undefined)));
    await server?.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  test("SandboxAgent.connect, newSession(request), prompt(PromptRequest), listModels, cancel(notification), loadSession(request)", async () => {
    const updates = [];
    const sdk = await SandboxAgent.connect({
      baseUrl: server.url,
      agent: "mock",
      onSessionUpdate: (event) => updates.push(event),
    });
    clients.push(sdk);
    assert.ok(sdk instanceof SandboxAgent);
    assert.ok(sdk instanceof SandboxAgentClient);
    assert.equal(sdk.connected, true, "connect() resolves with the connection open");

    const session = await sdk.newSession({ cwd: dir, mcpServers: [], _meta: { "sandboxagent.dev": { ticket: "ENG-1" } } });
    assert.match(session.sessionId, /^mock-/);
    assert.deepEqual(session.metadata, { ticket: "ENG-1" });

    const response = await sdk.prompt({ sessionId: session.sessionId, prompt: [{ type: "text", text: "hello" }] });
    assert.equal(response.stopReason, "end_turn");
    const mine = updates.filter((e) => e.sessionId === session.sessionId).map((e) => e.update);
    assert.equal(textOf(mine), `${SAY}hello`);

    const models = await sdk.listModels({ sessionId: session.sessionId });
    assert.deepEqual(models.availableModels.map((m) => m.modelId), ["mock-fast", "mock-smart"]);
    assert.equal(models.currentModelId, "mock-fast");

    const stalled = sdk.prompt({ sessionId: session.sessionId, prompt: [{ type: "text", text: "!stall" }] });
    setTimeout(() => void sdk.cancel({ sessionId: session.sessionId }), 100);
    assert.equal((await stalled).stopReason, "cancelled");

    // Another client takes the session up with ACP's LoadSessionRequest; its history is replayed.
    const replayed = [];
    const other = await SandboxAgentClient.connect({
      baseUrl: server.url,
      agent: "mock",
      onSessionUpdate: (event) => replayed.push(event.update),
    });
    clients.push(other);
    assert.ok(!(other instanceof SandboxAgent));
    const loaded = await other.loadSession({ sessionId: session.sessionId, cwd: dir, mcpServers: [] });
    assert.equal(loaded.sessionId, session.sessionId);
    assert.equal(textOf(replayed), `${SAY}hello`);
    const again = await other.prompt({ sessionId: session.sessionId, prompt: [{ type: "text", text: "again" }] });
    assert.equal(again.stopReason, "end_turn");
  });

  test("the session inventory calls of seed 001", async () => {
    const sdk = await SandboxAgent.connect({ baseUrl: server.url, agent: "mock" });
    clients.push(sdk);
    const cwd = join(dir, "inventory");
    mkdirSync(cwd);
    const { sessionId } = await sdk.newSession({ cwd, mcpServers: [] });
    assert.equal((await sdk.setMetadata(sessionId, { title: "seed shapes" })).title, "seed shapes");
    assert.equal((await sdk.getSession(sessionId)).title, "seed shapes");
    const page = await sdk.listSessions({ agent: "mock", q: "seed shapes" });
    assert.deepEqual(page.sessions.map((s) => s.sessionId), [sessionId]);
    const acp = await sdk.unstableListSessions({});
    assert.ok(acp.sessions.some((s) => s.sessionId === sessionId && s.cwd === cwd));
    assert.deepEqual(await sdk.terminateSession(sessionId), { sessionId, alreadyEnded: false });
    assert.equal((await sdk.getSession(sessionId)).ended, true);
  });

  test("every file call in its request-object form, bytes checked on disk and through the API", async () => {
    const sdk = await SandboxAgent.connect({ baseUrl: server.url, agent: "mock" });
    clients.push(sdk);
    const cwd = join(dir, "files");
    mkdirSync(cwd);
    const { sessionId } = await sdk.newSession({ cwd, mcpServers: [] });

    assert.deepEqual(await sdk.mkdirFs({ path: "a/b", sessionId }), { path: join(cwd, "a", "b") });
    const written = await sdk.writeFsFile({ path: "a/b/hello.txt", sessionId }, "hello, seed");
    assert.deepEqual(written, { path: join(cwd, "a", "b", "hello.txt"), bytesWritten: 11 });
    assert.equal(readFileSync(join(cwd, "a", "b", "hello.txt"), "utf8"), "hello, seed");
    const bytes = new Uint8Array([0, 1, 2, 254, 255]);
    await sdk.writeFsFile({ path: join(cwd, "bin") }, bytes);
    assert.deepEqual(new Uint8Array(readFileSync(join(cwd, "bin"))), bytes);
    assert.deepEqual(await sdk.readFsFile({ path: "bin", sessionId }), bytes);
    assert.equal(new TextDecoder().decode(await sdk.readFsFile({ path: join(cwd, "a", "b", "hello.txt") })), "hello, seed");

    const stat = await sdk.statFs({ path: "a/b/hello.txt", sessionId });
    assert.equal(stat.entryType, "file");
    assert.equal(stat.size, 11);
    assert.equal(stat.path, join(cwd, "a", "b", "hello.txt"));

    const entries = await sdk.listFsEntries({ path: "a/b", sessionId });
    assert.ok(Array.isArray(entries), "seed 001's listFsEntries answers an array");
    assert.deepEqual(entries.map((e) => [e.name, e.entryType, e.size]), [["hello.txt", "file", 11]]);
    assert.equal(entries.truncated, false);
    assert.deepEqual((await sdk.listFsEntries({ sessionId })).map((e) => e.name), ["a", "bin"]);

    const moved = await sdk.moveFs({ from: "a/b/hello.txt", to: "moved.txt", overwrite: false }, { sessionId });
    assert.deepEqual(moved, { from: join(cwd, "a", "b", "hello.txt"), to: join(cwd, "moved.txt") });
    assert.equal(readFileSync(join(cwd, "moved.txt"), "utf8"), "hello, seed");
    await assert.rejects(sdk.moveFs({ from: join(cwd, "bin"), to: join(cwd, "moved.txt"), overwrite: false }), (e) => e.status === 409);
    await sdk.moveFs({ from: join(cwd, "bin"), to: join(cwd, "moved.txt"), overwrite: true });
    assert.deepEqual(new Uint8Array(readFileSync(join(cwd, "moved.txt"))), bytes);

    await assert.rejects(sdk.deleteFsEntry({ path: join(cwd, "a"), recursive: false }), (e) => e.status === 409);
    assert.deepEqual(await sdk.deleteFsEntry({ path: join(cwd, "a"), recursive: true }), { path: join(cwd, "a") });
    assert.equal(existsSync(join(cwd, "a")), false);

    const src = join(dir, "tar-src");
    mkdirSync(join(src, "sub"), { recursive: true });
    writeFileSync(join(src, "sub", "two.txt"), "22");
    const tar = execFileSync("tar", ["-c", "-C", src, "sub"]);
    const uploaded = await sdk.uploadFsBatch(tar, { path: join(cwd, "up") });
    assert.equal(uploaded.truncated, false);
    assert.ok(uploaded.paths.includes(join(cwd, "up", "sub", "two.txt")));
    assert.equal(readFileSync(join(cwd, "up", "sub", "two.txt"), "utf8"), "22");
    const tgz = execFileSync("tar", ["-cz", "-C", src, "sub"]);
    await sdk.uploadFsBatch(new Uint8Array(tgz), { path: "upgz", sessionId });
    assert.equal(new TextDecoder().decode(await sdk.readFsFile({ path: "upgz/sub/two.txt", sessionId })), "22");
  });

  test("listFsEntries({path}) keeps truncated reachable: true past the server's 10,000 entries", async () => {
    const sdk = new SandboxAgentClient({ baseUrl: server.url, agent: "mock", autoConnect: false });
    clients.push(sdk);
    const many = join(dir, "many");
    mkdirSync(many);
    for (let i = 0; i <= 10_000; i++) writeFileSync(join(many, `f${String(i).padStart(5, "0")}`), "");
    const entries = await sdk.listFsEntries({ path: many });
    assert.equal(entries.length, 10_000);
    assert.equal(entries.truncated, true);
    assert.equal(entries[0].name, "f00000");
  });

  test('mkdirFs({path}) makes that directory, and nothing named "[object Object]" appears', async () => {
    const sdk = new SandboxAgentClient({ baseUrl: server.url, agent: "mock" });
    clients.push(sdk);
    const cwd = join(dir, "object-object");
    mkdirSync(cwd);
    const { sessionId } = await sdk.newSession({ cwd });
    const target = join(cwd, "made", "here");
    assert.deepEqual(await sdk.mkdirFs({ path: target }), { path: target });
    const stat = await sdk.statFs({ path: target });
    assert.equal(stat.entryType, "directory");
    assert.equal(stat.path, target);
    assert.deepEqual(await sdk.mkdirFs({ path: "relative", sessionId }), { path: join(cwd, "relative") });
    assert.deepEqual(readdirSync(cwd).sort(), ["made", "relative"]);
    // The server runs in this process's working directory (relative paths
    // without a session start there), where the bug made its directory.
    await assert.rejects(sdk.statFs({ path: OBJECT_OBJECT }), (e) => e.isNotFound());
    assert.equal(existsSync(join(process.cwd(), OBJECT_OBJECT)), false);
    assert.equal(existsSync(join(cwd, OBJECT_OBJECT)), false);
  });
});

test("README's seed 001 example runs as written (its port and /tmp changed) and prints what README shows", async () => {
  const blocks = blocksAfter("## Use it from TypeScript");
  const at = blocks.findIndex((b) => b.lang === "js" && b.text.includes("seed 001"));
  assert.ok(at >= 0, "README has the seed 001 example");
  assert.equal(blocks[at + 1].lang, "", "its output follows it");
  const server = await startServer();
  const project = mkdtempSync(join(tmpdir(), "sa-ts-seed-readme-"));
  try {
    // The workspace's node_modules holds the built packages.
    symlinkSync(join(sdkDir, "node_modules"), join(project, "node_modules"));
    const example = blocks[at].text;
    assert.ok(example.includes('"http://127.0.0.1:2468"'));
    const script = example.replace("http://127.0.0.1:2468", server.url).replaceAll('"/tmp', `"${project}`);
    writeFileSync(join(project, "seed.mjs"), script);
    const stdout = execFileSync(process.execPath, ["seed.mjs"], { cwd: project, encoding: "utf8", timeout: 60_000 });
    assert.equal(stdout, blocks[at + 1].text);
    assert.equal(readFileSync(join(project, "seed-demo", "hello.txt"), "utf8"), "hi");
  } finally {
    await server.stop();
    rmSync(project, { recursive: true, force: true });
  }
});

describe("SandboxAgent.start and SandboxAgentClient.start: seed 001's embedded mode", () => {
  for (const Class of [SandboxAgent, SandboxAgentClient]) {
    test(`${Class.name}.start() starts a private server, dispose() stops it`, async () => {
      const dataDir = mkdtempSync(join(tmpdir(), "sa-ts-seed-start-"));
      try {
        const sdk = await Class.start({ agent: "mock", server: { binary: binaryPath(), args: ["--data-dir", dataDir] } });
        assert.ok(sdk instanceof Class);
        assert.match(sdk.baseUrl, /^http:\/\/127\.0\.0\.1:\d+$/);
        assert.equal(sdk.connected, true);
        // The server wants the token start() gave the client.
        assert.equal((await fetch(`${sdk.baseUrl}/v2/agents`)).status, 401);
        const { sessionId } = await sdk.newSession({ cwd: dataDir, mcpServers: [] });
        assert.equal((await sdk.prompt({ sessionId, prompt: [{ type: "text", text: "hi" }] })).stopReason, "end_turn");
        await sdk.dispose();
        await assert.rejects(fetch(`${sdk.baseUrl}/v2/health`), TypeError, "the server is gone");
      } finally {
        rmSync(dataDir, { recursive: true, force: true });
      }
    });
  }
});

describe("a wrong argument type is a TypeError naming the call and the parameter, and sends nothing", () => {
  const requests = [];
  const counting = (input, init) => {
    requests.push(`${init?.method ?? "GET"} ${input}`);
    return fetch(input, init);
  };
  // No server is needed: the check comes before any request.
  const client = new SandboxAgentClient({ baseUrl: "http://127.0.0.1:9", agent: "mock", autoConnect: false, fetch: counting });
  const tar = new Uint8Array(1024);
  const blocks = [{ type: "text", text: "hi" }];

  // [method, arguments, message]: every public method with an argument.
  const cases = [
    ["getHealth", [{ signal: "soon" }], /^getHealth: options\.signal must be an AbortSignal \(got a string\)$/],
    ["listAgents", [5], /^listAgents: options must be an object \(got a number\)$/],
    ["installAgent", [{ agent: "mock" }], /^installAgent: agent must be a string \(got an object\)$/],
    ["installAgent", ["mock", { reinstall: "yes" }], /^installAgent: install\.reinstall must be a boolean/],
    ["newSession", ["/tmp"], /^newSession: request must be an object \(got a string\)$/],
    ["newSession", [{ cwd: { path: "/tmp" } }], /^newSession: request\.cwd must be a string \(got an object\)$/],
    ["newSession", [{ cwd: "/tmp", mcpServers: {} }], /^newSession: request\.mcpServers must be an array/],
    ["newSession", [{ cwd: "/tmp", metadata: "x" }], /^newSession: request\.metadata must be an object/],
    ["newSession", [{ cwd: "/tmp", _meta: [] }], /^newSession: request\._meta must be an object/],
    ["loadSession", [5], /^loadSession: sessionId must be a string, or a request \{sessionId, cwd, mcpServers\?\} \(got a number\)$/],
    ["loadSession", [{ sessionId: 1, cwd: "/tmp" }], /^loadSession: request\.sessionId must be a string/],
    ["loadSession", ["s", { cwd: 1 }], /^loadSession: params\.cwd must be a string/],
    ["loadSession", ["s"], /^loadSession: params must be an object \(got undefined\)$/],
    ["prompt", [42, "hi"], /^prompt: sessionId must be a string, or a request \{sessionId, prompt\}/],
    ["prompt", ["s", 5], /^prompt: prompt must be text or an array of content blocks \(got a number\)$/],
    ["prompt", ["s", ["hi"]], /^prompt: prompt\[0\] must be a content block/],
    ["prompt", [{ prompt: blocks }], /^prompt: request\.sessionId must be a string \(got undefined\)$/],
    ["prompt", [{ sessionId: "s", prompt: "hi" }], /^prompt: request\.prompt must be an array of content blocks \(got a string\)$/],
    ["prompt", [{ sessionId: "s", prompt: blocks }, { signal: true }], /^prompt: options\.signal must be an AbortSignal/],
    ["cancel", [5], /^cancel: sessionId must be a string, or a request \{sessionId\}/],
    ["cancel", [{}], /^cancel: notification\.sessionId must be a string/],
    ["listModels", [5], /^listModels: sessionId must be a string, or a request \{sessionId\?\}/],
    ["listModels", [{ sessionId: 5 }], /^listModels: request\.sessionId must be a string/],
    ["setMetadata", [{ sessionId: "s" }, {}], /^setMetadata: sessionId must be a string \(got an object\)$/],
    ["setMetadata", ["s", "title"], /^setMetadata: metadata must be an object \(got a string\)$/],
    ["getSession", [{ sessionId: "s" }], /^getSession: sessionId must be a string \(got an object\)$/],
    ["listSessions", ["mock"], /^listSessions: query must be an object/],
    ["listSessions", [{ limit: "10" }], /^listSessions: query\.limit must be a finite number \(got a string\)$/],
    ["unstableListSessions", [{ cwd: 5 }], /^unstableListSessions: params\.cwd must be a string/],
    ["detachSession", [5], /^detachSession: sessionId must be a string/],
    ["terminateSession", [{ sessionId: "s" }], /^terminateSession: sessionId must be a string \(got an object\)$/],
    ["getSessionEvents", [5], /^getSessionEvents: sessionId must be a string/],
    ["getSessionEvents", ["s", { offset: "0" }], /^getSessionEvents: page\.offset must be a finite number/],
    ["listFsEntries", [5], /^listFsEntries: path must be a string, or a request \{path, sessionId\?\} \(got a number\)$/],
    ["listFsEntries", [{ path: 5 }], /^listFsEntries: request\.path must be a string/],
    ["listFsEntries", [".", { sessionId: 5 }], /^listFsEntries: fs\.sessionId must be a string/],
    ["statFs", [null], /^statFs: path must be a string, or a request \{path, sessionId\?\} \(got null\)$/],
    ["statFs", [{}], /^statFs: request\.path must be a string \(got undefined\)$/],
    ["mkdirFs", [5], /^mkdirFs: path must be a string, or a request \{path, sessionId\?\} \(got a number\)$/],
    ["mkdirFs", [{ path: { path: "/tmp/x" } }], /^mkdirFs: request\.path must be a string \(got an object\)$/],
    ["mkdirFs", [{ path: "/tmp/x", sessionId: 7 }], /^mkdirFs: request\.sessionId must be a string/],
    ["moveFs", [5, "b"], /^moveFs: from must be a string, or a request \{from, to, overwrite\?\}/],
    ["moveFs", ["a", { to: "b" }], /^moveFs: to must be a string \(got an object\)$/],
    ["moveFs", [{ from: "a" }], /^moveFs: request\.to must be a string \(got undefined\)$/],
    ["moveFs", [{ from: "a", to: "b", overwrite: "yes" }], /^moveFs: request\.overwrite must be a boolean/],
    ["moveFs", [{ from: "a", to: "b" }, { sessionId: 1 }], /^moveFs: query\.sessionId must be a string/],
    ["moveFs", ["a", "b", { overwrite: 1 }], /^moveFs: move\.overwrite must be a boolean/],
    ["deleteFsEntry", [5], /^deleteFsEntry: path must be a string, or a request \{path, sessionId\?, recursive\?\}/],
    ["deleteFsEntry", [{ path: "x", recursive: "yes" }], /^deleteFsEntry: request\.recursive must be a boolean/],
    ["readFsFile", [["a"]], /^readFsFile: path must be a string, or a request \{path, sessionId\?\} \(got an array\)$/],
    ["readFsFile", [{ path: 5 }], /^readFsFile: request\.path must be a string/],
    ["readFsFileStream", [{ path: "x", from: "10" }], /^readFsFileStream: request\.from must be a finite number/],
    ["readFsFileStream", ["x", { etag: 5 }], /^readFsFileStream: fs\.etag must be a string/],
    ["writeFsFile", [{ path: 5 }, "x"], /^writeFsFile: request\.path must be a string/],
    ["writeFsFile", [{ path: "x" }, { text: "x" }], /^writeFsFile: content must be a string, Uint8Array, ArrayBuffer, Blob or ReadableStream \(got an object\)$/],
    ["writeFsFile", ["x", 5], /^writeFsFile: content must be a string/],
    ["uploadFsBatch", [tar, {}], /^uploadFsBatch: query\.path must be a string \(got undefined\)$/],
    ["uploadFsBatch", [tar, { path: "d", gzip: "yes" }], /^uploadFsBatch: query\.gzip must be a boolean/],
    ["uploadFsBatch", [{ path: "d" }, tar], /^uploadFsBatch: archive must be a Uint8Array, ArrayBuffer, Blob or ReadableStream \(got an object\)$/],
    ["uploadFsBatch", ["d", "not bytes"], /^uploadFsBatch: archive must be a Uint8Array/],
    ["runProcess", ["ls"], /^runProcess: request must be an object/],
    ["runProcess", [{ command: ["ls"] }], /^runProcess: request\.command must be a string \(got an array\)$/],
    ["runProcess", [{ command: "ls", timeoutMs: "5" }], /^runProcess: request\.timeoutMs must be a finite number/],
    ["startProcess", [{ command: "sh", tty: "yes" }], /^startProcess: request\.tty must be a boolean/],
    ["listProcesses", [{ limit: "5" }], /^listProcesses: query\.limit must be a finite number/],
    ["getProcess", [5], /^getProcess: id must be a string \(got a number\)$/],
    ["processHandle", [{ id: "x" }], /^processHandle: id must be a string \(got an object\)$/],
  ];

  test("the table covers every public method that takes arguments", () => {
    const noArguments = new Set(["constructor", "connect", "disconnect", "dispose"]);
    const methods = Object.getOwnPropertyNames(SandboxAgentClient.prototype).filter((name) => {
      const descriptor = Object.getOwnPropertyDescriptor(SandboxAgentClient.prototype, name);
      return typeof descriptor.value === "function" && !noArguments.has(name);
    });
    const covered = new Set(cases.map(([method]) => method).concat("promptStream"));
    assert.deepEqual(methods.filter((name) => !covered.has(name)), []);
  });

  for (const [method, args, message] of cases) {
    const shown = args.map((a) => (a instanceof Uint8Array ? `Uint8Array(${a.length})` : (JSON.stringify(a) ?? String(a))));
    test(`${method}(${shown.join(", ")})`, async () => {
      const before = requests.length;
      await assert.rejects(() => client[method](...args), (error) => {
        assert.equal(error.constructor, TypeError);
        assert.match(error.message, message);
        return true;
      });
      assert.deepEqual(requests.slice(before), [], "no request was sent");
    });
  }

  test("promptStream throws at once (it returns the turn synchronously)", () => {
    assert.throws(() => client.promptStream({ sessionId: "s", prompt: "hi" }), {
      name: "TypeError",
      message: /^promptStream: request\.prompt must be an array of content blocks/,
    });
    assert.throws(() => client.promptStream(5, "hi"), { name: "TypeError", message: /^promptStream: sessionId must be a string/ });
    assert.deepEqual(requests, []);
  });

  test("the constructor, connect() and start() check their options", async () => {
    assert.throws(() => new SandboxAgentClient({ baseUrl: 2468, agent: "mock" }), {
      name: "TypeError",
      message: "new SandboxAgentClient: options.baseUrl must be a string (got a number)",
    });
    assert.throws(() => new SandboxAgent({ baseUrl: "http://127.0.0.1:9" }), {
      name: "TypeError",
      message: "new SandboxAgent: options.agent must be a string (got undefined)",
    });
    assert.throws(() => new SandboxAgentClient("http://127.0.0.1:9"), { name: "TypeError", message: /options must be an object/ });
    await assert.rejects(SandboxAgent.connect({ baseUrl: "http://127.0.0.1:9", agent: "mock", onPermissionRequest: "allow" }), {
      name: "TypeError",
      message: "SandboxAgent.connect: options.onPermissionRequest must be a function (got a string)",
    });
    await assert.rejects(SandboxAgentClient.start({ agent: 1 }), {
      name: "TypeError",
      message: "SandboxAgentClient.start: options.agent must be a string (got a number)",
    });
    await assert.rejects(SandboxAgent.start({ agent: "mock", server: { args: "--data-dir /tmp" } }), {
      name: "TypeError",
      message: "SandboxAgent.start: options.server.args must be an array (got a string)",
    });
    assert.deepEqual(requests, []);
  });
});
