// sandbox-agent/node: a private server started from the binary.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { SandboxAgentClient } from "sandbox-agent";
import { startEmbeddedServer } from "sandbox-agent/node";
import { binaryPath } from "./server.mjs";

async function healthOf(baseUrl) {
  try {
    return (await fetch(`${baseUrl}/v2/health`)).status;
  } catch {
    return "unreachable";
  }
}

test("startEmbeddedServer: a private server with a random token, stopped by stop()", async () => {
  const dataDir = mkdtempSync(join(tmpdir(), "sa-ts-embedded-"));
  const server = await startEmbeddedServer({ binary: binaryPath(), args: ["--data-dir", dataDir] });
  try {
    assert.match(server.baseUrl, /^http:\/\/127\.0\.0\.1:\d+$/);
    assert.match(server.token, /^[0-9a-f]{48}$/);
    assert.equal(server.binary.source, "option");
    const anonymous = new SandboxAgentClient({ baseUrl: server.baseUrl, agent: "mock", autoConnect: false });
    await assert.rejects(anonymous.listAgents(), (e) => e.isUnauthorized());
    const client = new SandboxAgentClient({ ...server.connection, agent: "mock" });
    const { sessionId } = await client.newSession({ cwd: "/tmp" });
    assert.equal((await client.prompt(sessionId, "hello")).stopReason, "end_turn");
    await client.dispose();
  } finally {
    await server.stop();
    rmSync(dataDir, { recursive: true, force: true });
  }
  assert.equal(await healthOf(server.baseUrl), "unreachable");
  await server.stop(); // again: nothing to do
});

test("the server stops when the process that started it exits without stop()", async () => {
  const dataDir = mkdtempSync(join(tmpdir(), "sa-ts-embedded-"));
  try {
    // A child Node process starts a server, prints its address and returns:
    // nothing keeps it alive, and it never calls stop().
    const script = `
      import { startEmbeddedServer } from "sandbox-agent/node";
      const server = await startEmbeddedServer({ binary: ${JSON.stringify(binaryPath())}, args: ["--data-dir", ${JSON.stringify(dataDir)}] });
      console.log(server.baseUrl);
    `;
    const baseUrl = execFileSync(process.execPath, ["--input-type=module", "-e", script], {
      encoding: "utf8",
      timeout: 30_000,
      cwd: new URL("..", import.meta.url),
    }).trim();
    assert.match(baseUrl, /^http:\/\/127\.0\.0\.1:\d+$/);
    let status;
    for (let i = 0; i < 100; i++) {
      status = await healthOf(baseUrl);
      if (status === "unreachable") break;
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    assert.equal(status, "unreachable", "the server outlived its parent");
  } finally {
    rmSync(dataDir, { recursive: true, force: true });
  }
});

test("start-up errors name the cause", async () => {
  await assert.rejects(startEmbeddedServer({ binary: "/nonexistent/sandbox-agent" }), /not found at \/nonexistent/);
  await assert.rejects(
    startEmbeddedServer({ binary: binaryPath(), args: ["--no-such-flag"] }),
    (e) => /exited .* before listening/.test(e.message) && /no-such-flag/.test(e.message),
  );
});

test("the default entries import no Node built-in (only sandbox-agent/node, /local, /docker and the command do)", async () => {
  const { readdirSync, readFileSync } = await import("node:fs");
  const { builtinModules } = await import("node:module");
  const builtins = new Set(builtinModules);
  for (const pkg of ["acp-http-client", "sandbox-agent"]) {
    const dist = new URL(`../packages/${pkg}/dist/`, import.meta.url);
    for (const file of readdirSync(dist).filter((f) => f.endsWith(".js") && !["node.js", "cli.js", "local.js", "docker.js"].includes(f))) {
      const source = readFileSync(new URL(file, dist), "utf8");
      for (const [, specifier] of source.matchAll(/(?:from|import)\s*\(?\s*"([^"]+)"/g)) {
        assert.ok(
          !specifier.startsWith("node:") && !builtins.has(specifier),
          `${pkg}/dist/${file} imports ${specifier}`,
        );
      }
    }
  }
});
