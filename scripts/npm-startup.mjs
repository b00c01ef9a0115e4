#!/usr/bin/env node
// scripts/npm-startup.mjs NPM_DIST [ROUNDS]: what the npm tarballs of
// scripts/npm-pack cost a user, in research/benchmarks.md's form. Each
// round, in a fresh project: `npm install` of the three tarballs (offline,
// a private empty cache; the ACP SDK and zod packed from
// sdks/typescript/node_modules first, as the test does), then
// `startEmbeddedServer()` until healthy, then `--version` of the binary
// directly and through the package's command (node_modules/.bin), the two
// interleaved. Prints one line per round and the medians (milliseconds).
import { execFileSync, spawnSync } from "node:child_process";
import { mkdirSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const [distArg, roundsArg] = process.argv.slice(2);
if (distArg === undefined) {
  console.error("usage: scripts/npm-startup.mjs NPM_DIST [ROUNDS]   (NPM_DIST: scripts/npm-pack's output, e.g. dist/npm)");
  process.exit(2);
}
const dist = resolve(distArg);
const rounds = Number(roundsArg ?? 5);
const repo = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const modules = join(repo, "sdks", "typescript", "node_modules");
const ours = readdirSync(dist).filter((f) => f.endsWith(".tgz")).map((f) => join(dist, f));

const median = (values) => {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.floor(sorted.length / 2)];
};
const ms = (start) => Number(process.hrtime.bigint() - start) / 1e6;
/** Median wall time of `n` runs of `file --version`. */
const versionTime = (file, env, n = 10) => {
  const times = [];
  for (let i = 0; i < n; i++) {
    const start = process.hrtime.bigint();
    const run = spawnSync(file, ["--version"], { env, encoding: "utf8" });
    times.push(ms(start));
    if (run.status !== 0) throw new Error(`${file} --version: ${run.stderr}`);
  }
  return median(times);
};

const rows = [];
for (let round = 1; round <= rounds; round++) {
  const work = mkdtempSync(join(tmpdir(), "sa-npm-startup-"));
  try {
    const project = join(work, "project");
    const deps = join(work, "deps");
    mkdirSync(project);
    mkdirSync(deps);
    writeFileSync(join(project, "package.json"), JSON.stringify({ name: "fresh", private: true, type: "module" }));
    execFileSync("npm", ["pack", "--loglevel", "warn", join(modules, "@agentclientprotocol", "sdk"), join(modules, "zod")], { cwd: deps, stdio: "ignore" });
    const env = { ...process.env, npm_config_registry: "http://127.0.0.1:9/", npm_config_offline: "true", npm_config_cache: join(work, "cache") };
    delete env.SANDBOX_AGENT_BIN;
    execFileSync("npm", ["install", "--no-audit", "--no-fund", ...readdirSync(deps).map((f) => join(deps, f))], { cwd: project, env, stdio: "ignore" });
    let start = process.hrtime.bigint();
    execFileSync("npm", ["install", "--no-audit", "--no-fund", ...ours], { cwd: project, env, stdio: "ignore" });
    const install = ms(start);
    const script = `
      import { startEmbeddedServer } from "sandbox-agent/node";
      const start = process.hrtime.bigint();
      const server = await startEmbeddedServer({ args: ["--data-dir", ${JSON.stringify(join(work, "data"))}] });
      const healthy = Number(process.hrtime.bigint() - start) / 1e6;
      await server.stop();
      console.log(JSON.stringify({ healthy, source: server.binary.source }));
    `;
    const embedded = JSON.parse(execFileSync(process.execPath, ["--input-type=module", "-e", script], { cwd: project, env, encoding: "utf8" }));
    if (embedded.source !== "platform package") throw new Error(`the binary came from the ${embedded.source}`);
    const binary = join(project, "node_modules", "@sandbox-agent", "cli-linux-x64", "bin", "sandbox-agent");
    const launcher = join(project, "node_modules", ".bin", "sandbox-agent");
    const direct = [];
    const launched = [];
    for (let i = 0; i < 3; i++) {
      direct.push(versionTime(binary, env));
      launched.push(versionTime(launcher, env));
    }
    const row = { install, healthy: embedded.healthy, direct: median(direct), launched: median(launched) };
    rows.push(row);
    console.log(
      `round ${round}: npm install ${row.install.toFixed(0)} ms, embedded start to healthy ${row.healthy.toFixed(0)} ms, ` +
        `--version direct ${row.direct.toFixed(1)} ms, through the command ${row.launched.toFixed(1)} ms`,
    );
  } finally {
    rmSync(work, { recursive: true, force: true });
  }
}
const m = (key) => median(rows.map((r) => r[key]));
console.log(
  `median of ${rounds}: npm install ${m("install").toFixed(0)} ms, embedded start to healthy ${m("healthy").toFixed(0)} ms, ` +
    `--version direct ${m("direct").toFixed(1)} ms, through the command ${m("launched").toFixed(1)} ms`,
);
