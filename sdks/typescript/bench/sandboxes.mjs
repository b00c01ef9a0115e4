// Sandbox start-up, measured (research/benchmarks.md, "Sandbox providers"):
// per sandbox, SandboxAgent.start({ sandbox: docker({ image }) }) to
// healthy and to the first streamed update (createSession + promptStream
// of the mock agent), for 1 and for N concurrent sandboxes; the runtime's
// own share (the container's State.StartedAt to the server's "listening"
// log line, against the client's create → healthy); the idle server's RSS
// inside the container (/proc/PID/status of the sandbox-agent process, a
// child of the container's tini).
//
//   DOCKER_HOST=unix:///PATH node bench/sandboxes.mjs [IMAGE] [ROUNDS] [N]
import { readFileSync } from "node:fs";
import { request } from "node:http";
import { SandboxAgent } from "sandbox-agent";
import { docker, socketPath } from "sandbox-agent/docker";

const [image = "localhost/sandbox-agent:test", roundsArg = "5", nArg = "8"] = process.argv.slice(2);
const rounds = Number(roundsArg);
const socket = socketPath();

function get(path) {
  return new Promise((resolve, reject) => {
    const req = request({ socketPath: socket, path: `/v1.41${path}` }, (res) => {
      const chunks = [];
      res.on("data", (c) => chunks.push(c));
      res.on("end", () => resolve(Buffer.concat(chunks)));
    });
    req.on("error", reject);
    req.end();
  });
}

function demux(raw) {
  const parts = [];
  let offset = 0;
  while (offset + 8 <= raw.length) {
    const length = raw.readUInt32BE(offset + 4);
    parts.push(raw.subarray(offset + 8, offset + 8 + length));
    offset += 8 + length;
  }
  return Buffer.concat(parts).toString("utf8");
}

function rssKiB(pid) {
  const match = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, "utf8"));
  return Number(match[1]);
}

/** The host pid of the container's sandbox-agent (tini's child). */
function serverPid(initPid) {
  for (const task of [String(initPid)]) {
    const children = readFileSync(`/proc/${initPid}/task/${task}/children`, "utf8").trim().split(/\s+/).filter(Boolean);
    for (const child of children) {
      if (readFileSync(`/proc/${child}/comm`, "utf8").trim() === "sandbox-agent") return Number(child);
    }
  }
  throw new Error(`no sandbox-agent under pid ${initPid}`);
}

async function one(fleet) {
  const t0 = performance.now();
  const sdk = await SandboxAgent.start({ sandbox: docker({ image, fleet }) });
  const healthy = performance.now() - t0;
  const info = JSON.parse((await get(`/containers/${sdk.sandbox.id}/json`)).toString("utf8"));
  // The log reaches the engine a little after the server answers.
  let logs = "";
  let listening = null;
  for (let i = 0; i < 100 && listening === null; i++) {
    if (i > 0) await new Promise((resolve) => setTimeout(resolve, 20));
    logs = demux(await get(`/containers/${sdk.sandbox.id}/logs?stdout=true&stderr=true`));
    listening = /^(\S+Z)\s+INFO\s+acp_runtime::server: listening/m.exec(logs);
  }
  const first = /^(\S+Z)\s/m.exec(logs);
  const startedAt = Date.parse(info.State.StartedAt);
  const rss = rssKiB(serverPid(info.State.Pid));
  const session = await sdk.createSession({ agent: "mock" });
  let firstUpdate;
  const turn = session.promptStream("bench");
  for await (const _ of turn) firstUpdate ??= performance.now() - t0;
  await turn.result;
  await sdk.destroySandbox();
  return {
    healthy,
    firstUpdate,
    create: sdk.sandbox.timings.createMs,
    start: sdk.sandbox.timings.startMs,
    health: sdk.sandbox.timings.healthMs,
    // The runtime's share: the container's process start → the server listening.
    runtime: Date.parse(listening[1]) - startedAt,
    // The server's own start-up: its first log line → listening.
    serverInit: Date.parse(listening[1]) - Date.parse(first[1]),
    rss,
  };
}

const median = (values) => {
  const sorted = [...values].sort((a, b) => a - b);
  const mid = Math.floor(sorted.length / 2);
  return sorted.length % 2 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2;
};

for (const n of [1, Number(nArg)]) {
  const all = [];
  for (let round = 0; round < rounds; round++) {
    const fleet = `bench-${n}-${round}-${process.pid}`;
    all.push(...(await Promise.all(Array.from({ length: n }, () => one(fleet)))));
  }
  const row = (key) => `${Math.round(median(all.map((r) => r[key])))}`;
  const max = (key) => `${Math.round(Math.max(...all.map((r) => r[key])))}`;
  console.log(
    `concurrent=${n} sandboxes=${all.length} (median / max, ms): start→healthy ${row("healthy")} / ${max("healthy")}; ` +
      `start→first update ${row("firstUpdate")} / ${max("firstUpdate")}; create ${row("create")}, start ${row("start")}, health wait ${row("health")}; ` +
      `runtime (container process start → listening) ${row("runtime")} / ${max("runtime")}; server init (first log line → listening) ${row("serverInit")}; ` +
      `runtime share of start→healthy ${((100 * median(all.map((r) => r.runtime / r.healthy)))).toFixed(1)} %; idle server RSS ${row("rss")} KiB`,
  );
}
