// examples/fleet (README.md, "Start sandboxes from code"): compiled with the
// workspace's tsc and run with N=8 against real containers (podman's
// Docker-compatible service, test/podman.mjs): a table of 8 rows, each
// ending its turn, and no container of its fleet left; with one sandbox
// failing after its start, the others still answer and nothing is left.
import assert from "node:assert/strict";
import { execFileSync, spawn } from "node:child_process";
import { existsSync, mkdirSync, symlinkSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { after, describe, test } from "node:test";
import { fileURLToPath } from "node:url";
import { randomId } from "sandbox-agent";
import { IMAGE, engineGet, podmanService } from "./podman.mjs";

const workspace = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const example = resolve(workspace, "..", "..", "examples", "fleet");

/** Builds the example as README says (its `sandbox-agent` dependency: this workspace's package). */
function buildExample() {
  const link = join(example, "node_modules", "sandbox-agent");
  if (!existsSync(link)) {
    mkdirSync(dirname(link), { recursive: true });
    symlinkSync(join(workspace, "packages", "sandbox-agent"), link, "dir");
  }
  execFileSync(join(workspace, "node_modules", ".bin", "tsc"), ["-p", join(example, "tsconfig.json")], { stdio: "inherit" });
}

function run(args, env) {
  return new Promise((resolvePromise) => {
    const child = spawn(process.execPath, [join(example, "dist", "fleet.js"), ...args], { env: { ...process.env, ...env }, stdio: ["ignore", "pipe", "pipe"] });
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (chunk) => (stdout += chunk));
    child.stderr.on("data", (chunk) => (stderr += chunk));
    child.once("exit", (code) => resolvePromise({ code, stdout, stderr }));
  });
}

/** The table's rows: `{ index, create, healthy, first, end, updates, result }`. */
function rowsOf(stdout) {
  const lines = stdout.split("\n");
  const header = lines.findIndex((line) => /^#\s+create\s+healthy\s+first\s+end\s+updates\s+result$/.test(line));
  assert.ok(header >= 0, `a table header in:\n${stdout}`);
  const rows = [];
  for (const line of lines.slice(header + 1)) {
    const match = /^\s*(\d+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\d+)\s+(.+)$/.exec(line);
    if (!match) break;
    const num = (v) => (v === "-" ? undefined : Number(v));
    rows.push({ index: Number(match[1]), create: num(match[2]), healthy: num(match[3]), first: num(match[4]), end: num(match[5]), updates: Number(match[6]), result: match[7] });
  }
  return rows;
}

describe("examples/fleet", async () => {
  const service = await podmanService();
  if (service.skip) {
    console.log(service.skip);
    test("fleet example", { skip: service.skip }, () => {});
    return;
  }
  after(() => service.stop());
  const fleetOf = async (fleet) => {
    const filters = encodeURIComponent(JSON.stringify({ label: [`dev.sandboxagent.fleet=${fleet}`] }));
    return (await engineGet(service.socket, `/containers/json?all=true&filters=${filters}`)).json;
  };
  buildExample();

  test("8 sandboxes, one prompt each, streamed at once: a table of 8 and nothing left", async () => {
    const fleet = `example-${randomId()}`;
    const { code, stdout, stderr } = await run(["8", "--image", IMAGE, "--fleet", fleet], { DOCKER_HOST: service.host });
    console.log(stdout);
    assert.equal(code, 0, stderr);
    const rows = rowsOf(stdout);
    assert.deepEqual(rows.map((r) => r.index), [0, 1, 2, 3, 4, 5, 6, 7]);
    for (const row of rows) {
      assert.equal(row.result, "end_turn");
      assert.ok(row.updates > 0);
      assert.ok(row.create >= 0 && row.create <= row.healthy && row.healthy <= row.first && row.first <= row.end, JSON.stringify(row));
    }
    assert.match(stdout, /8\/8 sandboxes answered in \d+ ms; all 8 started were destroyed/);
    assert.deepEqual(await fleetOf(fleet), []);
  });

  test("one sandbox failing after its start: the others answer, all are destroyed, exit status 1", async () => {
    const fleet = `example-fail-${randomId()}`;
    const { code, stdout } = await run(["3", "--image", IMAGE, "--fleet", fleet, "--fail", "1"], { DOCKER_HOST: service.host });
    assert.equal(code, 1, stdout);
    const rows = rowsOf(stdout);
    assert.deepEqual(rows.map((r) => r.result.startsWith("FAILED") ? "failed" : r.result), ["end_turn", "failed", "end_turn"]);
    assert.match(rows[1].result, /unknown agent "no-such-agent"/);
    assert.match(stdout, /2\/3 sandboxes answered .* all 3 started were destroyed/);
    assert.deepEqual(await fleetOf(fleet), []);
  });
});
