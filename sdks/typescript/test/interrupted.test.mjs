// A turn its server died in (research/contract.md, "Notifications the
// runtime sends"): the real server SIGKILLed while a permission request
// waits, started again on the same data dir, and the session's log read
// with getSessionEvents and turnInterruptedOf.
import assert from "node:assert/strict";
import { test } from "node:test";
import { SandboxAgentClient, turnInterruptedOf } from "sandbox-agent";
import { startServer } from "./server.mjs";

/** Waits until `/v2/health` says every write is in the store. */
async function storeCaughtUp(url) {
  const deadline = Date.now() + 30_000;
  for (;;) {
    const health = await (await fetch(`${url}/v2/health`)).json();
    if (health.store === "ok" && health.storeWaiting === 0) return;
    assert.ok(Date.now() < deadline, `store did not catch up: ${JSON.stringify(health)}`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

test("a turn killed on a pending permission reads as interrupted after a restart", async () => {
  const first = await startServer();
  let asked;
  const permission = new Promise((resolve) => (asked = resolve));
  const c = new SandboxAgentClient({
    baseUrl: first.url,
    agent: "mock",
    // Never answered: the server dies while it waits.
    onPermissionRequest: (request) => {
      asked(request);
      return new Promise(() => {});
    },
  });
  const { sessionId } = await c.newSession({ cwd: "/tmp" });
  const turn = c.prompt(sessionId, "ask permission").catch(() => undefined);
  await permission;
  await storeCaughtUp(first.url);
  await first.kill();
  await c.dispose().catch(() => undefined);
  await turn;

  const second = await startServer([], { dataDir: first.dataDir });
  const reader = new SandboxAgentClient({ baseUrl: second.url, agent: "mock", autoConnect: false });
  try {
    const page = await reader.getSessionEvents(sessionId, { limit: 1000 });
    const interrupted = page.events.map(turnInterruptedOf).filter((t) => t !== undefined);
    assert.equal(interrupted.length, 1, JSON.stringify(page.events));
    assert.deepEqual(turnInterruptedOf(page.events.at(-1)), interrupted[0], "the last event");
    assert.equal(interrupted[0].sessionId, sessionId);
    assert.equal(interrupted[0].reason, "server-stopped");
    assert.equal(interrupted[0].stopReason, "cancelled");
    assert.equal(interrupted[0].requestIds.length, 1);
    assert.equal(turnInterruptedOf(page.events[0]), undefined);
  } finally {
    await reader.dispose().catch(() => undefined);
    await second.stop();
  }
});
