// Sandbox providers (research/contract.md, "Sandbox providers"):
// SandboxAgent.start({ sandbox }) → createSession → prompt → destroySandbox
// with local() (a child process) and docker() (real containers from
// localhost/sandbox-agent:test through podman's Docker-compatible
// service, test/podman.mjs), the token kept out of command lines, logs and
// errors, a sandbox that never gets healthy, 8 at once, and a killed
// client's containers found and removed by fleet without touching
// another fleet's.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { after, before, describe, test } from "node:test";
import { fileURLToPath } from "node:url";
import { SandboxAgent, SandboxStartError, randomId } from "sandbox-agent";
import { cleanup, docker } from "sandbox-agent/docker";
import { local } from "sandbox-agent/local";
import { IMAGE, engineGet, podmanService } from "./podman.mjs";
import { blocksAfter } from "./readme-blocks.mjs";
import { binaryPath, textOf } from "./server.mjs";

const here = dirname(fileURLToPath(import.meta.url));

/** A fetch that records the bearer token the client sends (the test's only way to know it). */
function recordingFetch() {
  const seen = { token: undefined };
  const f = (input, init) => {
    const header = new Headers(init?.headers).get("authorization");
    if (header?.startsWith("Bearer ")) seen.token = header.slice("Bearer ".length);
    return fetch(input, init);
  };
  return { seen, fetch: f };
}

async function healthOf(baseUrl) {
  try {
    return (await fetch(`${baseUrl}/v2/health`)).status;
  } catch {
    return "unreachable";
  }
}

/** A round trip on a started sdk: a session, a streamed turn, a plain prompt. */
async function roundTrip(sdk) {
  const session = await sdk.createSession({ agent: "mock", metadata: { run: "round-trip" } });
  assert.match(session.id, /^mock-/);
  const updates = [];
  const turn = session.promptStream("hello sandbox");
  for await (const update of turn) updates.push(update);
  assert.equal((await turn.result).stopReason, "end_turn");
  assert.ok(updates.length > 0, "the turn streamed updates");
  assert.match(textOf(updates), /hello sandbox/);
  assert.deepEqual(await session.prompt([{ type: "text", text: "again" }]), { stopReason: "end_turn" });
  const summary = await sdk.getSession(session.id);
  assert.equal(summary.metadata?.run ?? summary.metadata?.["run"], "round-trip");
  return session;
}

describe("local(): the runtime as a child process", () => {
  test("start → createSession → prompt → destroySandbox; the token only in the environment", async () => {
    const recorder = recordingFetch();
    const sdk = await SandboxAgent.start({ sandbox: local({ binary: binaryPath() }), agent: "mock", fetch: recorder.fetch });
    assert.ok(sdk instanceof SandboxAgent);
    assert.equal(sdk.sandbox.provider, "local");
    assert.match(sdk.baseUrl, /^http:\/\/127\.0\.0\.1:\d+$/);
    assert.equal(sdk.connected, true);
    await roundTrip(sdk);
    const token = recorder.seen.token;
    assert.match(token, /^[0-9a-f]{64}$/);
    // The server wants it, and it is on no command line.
    assert.equal((await fetch(`${sdk.baseUrl}/v2/agents`)).status, 401);
    const cmdline = readFileSync(`/proc/${sdk.sandbox.id}/cmdline`, "utf8");
    assert.ok(!cmdline.includes(token), "the token is not on the server's command line");
    assert.ok(readFileSync(`/proc/${sdk.sandbox.id}/environ`, "utf8").includes(`SANDBOX_AGENT_TOKEN=${token}`));
    const baseUrl = sdk.baseUrl;
    await sdk.destroySandbox();
    await sdk.destroySandbox(); // idempotent
    assert.equal(await healthOf(baseUrl), "unreachable");
    await assert.rejects(sdk.createSession({ agent: "mock" }), (e) => e.kind === "disposed");
  });

  test("a server that cannot start: SandboxStartError at step start, with what it printed", async () => {
    await assert.rejects(
      SandboxAgent.start({ sandbox: local({ binary: binaryPath(), args: ["--no-such-flag"] }), agent: "mock" }),
      (error) => {
        assert.ok(error instanceof SandboxStartError);
        assert.equal(error.step, "start");
        assert.match(error.message, /^local sandbox failed at step "start": .*--no-such-flag/s);
        return true;
      },
    );
  });
});

describe("argument checks", () => {
  test("bad providers and options are TypeErrors naming the parameter", async () => {
    assert.throws(() => docker({}), { name: "TypeError", message: "docker: options.image must be a non-empty string" });
    assert.throws(() => docker({ image: "x", env: { A: 1 } }), { name: "TypeError", message: "docker: options.env.A must be a string" });
    assert.throws(() => docker({ image: "x", volumes: "a:/b" }), { name: "TypeError", message: "docker: options.volumes must be an array of strings" });
    assert.throws(() => docker({ image: "x", host: "tcp://127.0.0.1:2375" }), /options\.host=tcp:\/\/127\.0\.0\.1:2375 is not supported: only a unix socket/);
    const saved = process.env.DOCKER_HOST;
    process.env.DOCKER_HOST = "tcp://10.0.0.1:2376";
    try {
      assert.throws(() => docker({ image: "x" }), /^Error: docker: DOCKER_HOST=tcp:\/\/10\.0\.0\.1:2376 is not supported/);
    } finally {
      if (saved === undefined) delete process.env.DOCKER_HOST;
      else process.env.DOCKER_HOST = saved;
    }
    await assert.rejects(SandboxAgent.start({ sandbox: {} }), {
      name: "TypeError",
      message: "SandboxAgent.start: options.sandbox must be a sandbox provider (docker(), local(), or an object with create())",
    });
    await assert.rejects(SandboxAgent.start({ sandbox: local(), startupTimeoutMs: "soon" }), /options\.startupTimeoutMs must be a finite number/);
    await assert.rejects(cleanup({}), { name: "TypeError", message: "cleanup: options.fleet must be a non-empty string" });
    const unbound = await SandboxAgent.connect({ baseUrl: "http://127.0.0.1:9" });
    await assert.rejects(unbound.createSession({}), { name: "TypeError", message: /createSession: options\.agent must be a string/ });
    await assert.rejects(unbound.createSession({ agent: 5 }), { name: "TypeError", message: "createSession: options.agent must be a string (got a number)" });
  });
});

describe("docker(): containers through the Engine API", async () => {
  const service = await podmanService();
  if (service.skip) {
    console.log(service.skip);
    test("docker provider", { skip: service.skip }, () => {});
    return;
  }
  after(() => service.stop());
  const provider = (options = {}) => docker({ image: IMAGE, host: service.host, ...options });
  const fleetOf = async (fleet) => {
    const { json } = await engineGet(service.socket, `/containers/json?all=true&filters=${encodeURIComponent(JSON.stringify({ label: [`dev.sandboxagent.fleet=${fleet}`] }))}`);
    return json.map((c) => c.Names[0].replace(/^\//, ""));
  };

  test("start → createSession → prompt → destroySandbox; the token in no command line, log or error", async () => {
    const recorder = recordingFetch();
    const fleet = `rt-${randomId()}`;
    const sdk = await SandboxAgent.start({ sandbox: provider({ fleet, env: { MY_API_KEY: "k-123" }, labels: { purpose: "test" } }), fetch: recorder.fetch });
    try {
      assert.equal(sdk.sandbox.provider, "docker");
      assert.equal(sdk.sandbox.fleet, fleet);
      assert.match(sdk.baseUrl, /^http:\/\/127\.0\.0\.1:\d+$/);
      for (const key of ["createMs", "startMs", "healthMs"]) assert.equal(typeof sdk.sandbox.timings[key], "number", key);
      // No agent given: no connection until createSession names one.
      assert.equal(sdk.connected, false);
      const session = await roundTrip(sdk);
      assert.equal(session.cwd, "/home/agent", "the image's WORKDIR");
      const token = recorder.seen.token;
      assert.match(token, /^[0-9a-f]{64}$/);
      const { status, json: info } = await engineGet(service.socket, `/containers/${sdk.sandbox.id}/json`);
      assert.equal(status, 200);
      assert.equal(info.Config.Labels["dev.sandboxagent.fleet"], fleet);
      assert.equal(info.Config.Labels.purpose, "test");
      assert.ok(info.Config.Env.includes("MY_API_KEY=k-123"));
      assert.ok(info.Config.Env.includes(`SANDBOX_AGENT_TOKEN=${token}`), "the environment holds it");
      const commandLine = JSON.stringify([info.Path, info.Args, info.Config.Cmd, info.Config.Entrypoint]);
      assert.ok(!commandLine.includes(token), `the token is on no command line: ${commandLine}`);
      const binding = info.HostConfig.PortBindings["2468/tcp"][0];
      assert.equal(binding.HostIp, "127.0.0.1", "published on loopback");
      const logs = service.podman(["logs", sdk.sandbox.id]);
      assert.match(logs, /listening address=0\.0\.0\.0:2468 auth=true/);
      assert.ok(!logs.includes(token), "the token is not in the container's logs");
      assert.equal((await fetch(`${sdk.baseUrl}/v2/agents`)).status, 401);
      const volumes = info.Mounts.filter((m) => m.Type === "volume").map((m) => m.Name);
      const baseUrl = sdk.baseUrl;
      await sdk.destroySandbox();
      assert.equal((await engineGet(service.socket, `/containers/${sdk.sandbox.id}/json`)).status, 404, "the container is removed");
      for (const volume of volumes) assert.equal((await engineGet(service.socket, `/volumes/${volume}`)).status, 404, `its volume ${volume} too`);
      assert.equal(await healthOf(baseUrl), "unreachable");
      assert.deepEqual(await fleetOf(fleet), []);
    } finally {
      await sdk.destroySandbox();
    }
  });

  test("README's \"Start sandboxes from code\" example runs as written", async () => {
    const blocks = blocksAfter("## Start sandboxes from code");
    const at = blocks.findIndex((b) => b.lang === "js");
    assert.equal(blocks[at + 1].lang, "", "its output follows it");
    const project = mkdtempSync(join(tmpdir(), "sa-ts-readme-sandbox-"));
    try {
      // The package as an installed dependency (a link to the workspace's, as `npm install FOLDER` makes).
      mkdirSync(join(project, "node_modules"));
      symlinkSync(join(here, "..", "packages", "sandbox-agent"), join(project, "node_modules", "sandbox-agent"), "dir");
      writeFileSync(join(project, "sandbox.mjs"), blocks[at].text);
      const child = spawn(process.execPath, ["sandbox.mjs"], {
        cwd: project,
        env: { ...process.env, SANDBOX_AGENT_IMAGE: IMAGE, DOCKER_HOST: service.host },
        stdio: ["ignore", "pipe", "pipe"],
      });
      let stdout = "";
      let stderr = "";
      child.stdout.on("data", (chunk) => (stdout += chunk));
      child.stderr.on("data", (chunk) => (stderr += chunk));
      const code = await new Promise((resolve) => child.once("exit", resolve));
      assert.equal(code, 0, stderr);
      assert.equal(stdout, blocks[at + 1].text);
    } finally {
      rmSync(project, { recursive: true, force: true });
    }
  });

  test("a fleet id is generated per start when none is given", async () => {
    const sdk = await SandboxAgent.start({ sandbox: provider(), agent: "mock" });
    try {
      assert.match(sdk.sandbox.fleet, /^[0-9a-f]{12}$/);
      assert.deepEqual((await fleetOf(sdk.sandbox.fleet)).length, 1);
      assert.equal(sdk.connected, true);
    } finally {
      await sdk.destroySandbox();
    }
    assert.deepEqual(await fleetOf(sdk.sandbox.fleet), []);
  });

  test("a container that exits at once: step start, its output, no container left", async () => {
    const fleet = `exit-${randomId()}`;
    const started = Date.now();
    await assert.rejects(
      SandboxAgent.start({ sandbox: provider({ fleet, cmd: ["server", "--no-such-flag"] }), agent: "mock", startupTimeoutMs: 20_000 }),
      (error) => {
        assert.ok(error instanceof SandboxStartError, String(error));
        assert.equal(error.step, "start");
        assert.match(error.message, /^docker sandbox failed at step "start": /);
        assert.match(error.logs, /--no-such-flag/, "what the sandbox printed");
        return true;
      },
    );
    assert.ok(Date.now() - started < 20_000, "well before the timeout");
    assert.deepEqual(await fleetOf(fleet), []);
  });

  test("a server that never answers on the published port: step health within the timeout, no container left", async () => {
    const fleet = `sleepy-${randomId()}`;
    const started = Date.now();
    let token;
    await assert.rejects(
      SandboxAgent.start({ sandbox: provider({ fleet, cmd: ["server", "--port", "2999"] }), agent: "mock", startupTimeoutMs: 3_000 }),
      (error) => {
        assert.ok(error instanceof SandboxStartError, String(error));
        assert.equal(error.step, "health");
        assert.match(error.message, /^docker sandbox failed at step "health": http:\/\/127\.0\.0\.1:\d+\/v2\/health did not answer 200 within 3000 ms/);
        assert.match(error.logs, /listening on http:\/\/0\.0\.0\.0:2999/, "what the sandbox printed");
        assert.ok(!/[0-9a-f]{64}/.test(error.message), "no token-like string in the error");
        token = error.message;
        return true;
      },
    );
    const elapsed = Date.now() - started;
    assert.ok(elapsed < 3_000 + 5_000, `failed within the timeout (${elapsed} ms)`);
    assert.ok(token);
    assert.deepEqual(await fleetOf(fleet), []);
  });

  test("8 sandboxes started at once all answer and are all removed", async () => {
    const fleet = `eight-${randomId()}`;
    const results = await Promise.allSettled(
      Array.from({ length: 8 }, () => SandboxAgent.start({ sandbox: provider({ fleet }), agent: "mock" })),
    );
    const sdks = results.filter((r) => r.status === "fulfilled").map((r) => r.value);
    try {
      assert.deepEqual(results.filter((r) => r.status === "rejected").map((r) => String(r.reason)), []);
      assert.equal(new Set(sdks.map((sdk) => sdk.baseUrl)).size, 8);
      assert.equal((await fleetOf(fleet)).length, 8);
      const answers = await Promise.all(
        sdks.map(async (sdk, i) => {
          const session = await sdk.createSession();
          const updates = [];
          const turn = session.promptStream(`sandbox ${i}`);
          for await (const update of turn) updates.push(update);
          return { stopReason: (await turn.result).stopReason, text: textOf(updates) };
        }),
      );
      answers.forEach((answer, i) => {
        assert.equal(answer.stopReason, "end_turn");
        assert.match(answer.text, new RegExp(`sandbox ${i}\\b`));
      });
    } finally {
      await Promise.all(sdks.map((sdk) => sdk.destroySandbox()));
    }
    assert.deepEqual(await fleetOf(fleet), []);
  });

  test("a client killed mid-run leaves containers cleanup({ fleet }) removes; another fleet is untouched", async () => {
    const killed = `killed-${randomId()}`;
    const other = `other-${randomId()}`;
    const neighbour = await SandboxAgent.start({ sandbox: provider({ fleet: other }), agent: "mock" });
    try {
      const child = spawn(process.execPath, [join(here, "sandbox-child.mjs"), killed, "2", service.host, IMAGE], { stdio: ["ignore", "pipe", "pipe"] });
      let out = "";
      let err = "";
      child.stdout.on("data", (chunk) => (out += chunk));
      child.stderr.on("data", (chunk) => (err += chunk));
      const exited = new Promise((resolve) => child.once("exit", (code, signal) => resolve(signal ?? code)));
      const deadline = Date.now() + 60_000;
      while (!out.includes("ready")) {
        assert.equal(child.exitCode, null, `the child exited early: ${err}`);
        assert.ok(Date.now() < deadline, `the child was not ready in 60 s: ${err}`);
        await new Promise((resolve) => setTimeout(resolve, 50));
      }
      child.kill("SIGKILL");
      assert.equal(await exited, "SIGKILL");
      const left = await fleetOf(killed);
      assert.equal(left.length, 2, "the killed client's containers are still there");
      // Cleaning the other fleet first must not touch the killed one's, nor the reverse.
      const removed = await docker.cleanup({ fleet: killed, host: service.host });
      assert.deepEqual(removed.removed.sort(), left.sort());
      assert.deepEqual(await fleetOf(killed), []);
      assert.equal((await fleetOf(other)).length, 1, "the neighbour fleet's container is untouched");
      const session = await neighbour.createSession();
      assert.equal((await session.prompt("still here?")).stopReason, "end_turn");
      assert.deepEqual(await cleanup({ fleet: killed, host: service.host }), { removed: [] });
    } finally {
      await neighbour.destroySandbox();
    }
    assert.deepEqual(await fleetOf(other), []);
  });
});
