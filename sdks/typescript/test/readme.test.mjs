// README.md's "Use it from TypeScript", as a new user follows it: install
// the two package folders into a fresh project, save the example as
// written (only the port changed) and run it against a real server.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import { startServer } from "./server.mjs";
import { blocksAfter } from "./readme-blocks.mjs";

const sdk = resolve(dirname(fileURLToPath(import.meta.url)), "..");

/** The README's example and the output it shows. */
function readmeExample() {
  const blocks = blocksAfter("## Use it from TypeScript");
  const jsAt = blocks.findIndex((b) => b.lang === "js");
  // The bare block right after the example is its output.
  assert.equal(blocks[jsAt + 1].lang, "");
  return { blocks, example: blocks[jsAt].text, expected: blocks[jsAt + 1].text };
}

/**
 * In a fresh project: `npm install` of `packages` (folders or tarballs),
 * then the README's example (its port changed) against a real server.
 */
async function runExampleInFreshProject(packages) {
  const { example, expected } = readmeExample();
  const project = mkdtempSync(join(tmpdir(), "sa-ts-readme-"));
  const server = await startServer();
  try {
    writeFileSync(join(project, "package.json"), JSON.stringify({ name: "readme-example", private: true, type: "module" }));
    execFileSync("npm", ["install", "--no-audit", "--no-fund", "--prefer-offline", ...packages], { cwd: project, stdio: "pipe" });
    assert.ok(example.includes('"http://127.0.0.1:2468"'));
    writeFileSync(join(project, "turn.mjs"), example.replace("http://127.0.0.1:2468", server.url));
    const stdout = execFileSync(process.execPath, ["turn.mjs"], { cwd: project, encoding: "utf8", timeout: 60_000 });
    assert.equal(stdout, expected);
  } finally {
    await server.stop();
    rmSync(project, { recursive: true, force: true });
  }
}

test("the README's TypeScript example runs as written, the package folders installed as it says", async () => {
  const install = readmeExample().blocks.find((b) => b.lang === "sh").text;
  assert.match(install, /npm install "\$SDK\/packages\/acp-http-client" "\$SDK\/packages\/sandbox-agent" "\$SDK\/packages\/cli-linux-x64"\n/);
  // The packages were built by `npm test`.
  await runExampleInFreshProject(["acp-http-client", "sandbox-agent", "cli-linux-x64"].map((name) => join(sdk, "packages", name)));
});

test("npm pack makes installable tarballs: the example runs from them", async () => {
  const packs = mkdtempSync(join(tmpdir(), "sa-ts-packs-"));
  try {
    // `prepack` builds each package with tsc.
    execFileSync("npm", ["pack", "--workspaces", "--pack-destination", packs], { cwd: sdk, stdio: "pipe" });
    // All three: without the platform package's tarball, npm would look
    // for sandbox-agent's optional dependency on the registry.
    const tarballs = ["acp-http-client-0.1.0.tgz", "sandbox-agent-0.1.0.tgz", "sandbox-agent-cli-linux-x64-0.1.0.tgz"].map((name) =>
      join(packs, name),
    );
    const listing = execFileSync("tar", ["tzf", tarballs[1]], { encoding: "utf8" });
    assert.match(listing, /package\/dist\/index\.js/);
    assert.match(listing, /package\/dist\/index\.d\.ts/);
    assert.doesNotMatch(listing, /node_modules|tsbuildinfo/);
    await runExampleInFreshProject(tarballs);
  } finally {
    rmSync(packs, { recursive: true, force: true });
  }
});
