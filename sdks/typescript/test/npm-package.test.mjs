// The npm packages as a user gets them (research/contract.md, "The npm
// packages"): the resolver of sandbox-agent/node, then the three tarballs
// scripts/npm-pack makes from the release tarball, installed offline into a
// fresh project whose PATH has no sandbox-agent.
import assert from "node:assert/strict";
import { execFile, spawn } from "node:child_process";
import { accessSync, chmodSync, constants, existsSync, mkdtempSync, readdirSync, readFileSync, renameSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { delimiter, dirname, join, resolve } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import { resolveBinary, packageVersion } from "sandbox-agent/node";
import { binaryPath } from "./server.mjs";
import { blocksAfter } from "./readme-blocks.mjs";

const repo = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..", "..");
const VERSION = packageVersion();
const TARGET = "x86_64-unknown-linux-gnu";

/** The release tarball: $SANDBOX_AGENT_DIST_TARBALL, else scripts/dist's output for the workspace version. */
function releaseTarball() {
  const cargoVersion = /\[workspace\.package\][^[]*?\nversion\s*=\s*"([^"]+)"/.exec(readFileSync(join(repo, "Cargo.toml"), "utf8"))?.[1];
  assert.equal(cargoVersion, VERSION, "the workspace version and the npm packages' version are released together");
  const path = process.env.SANDBOX_AGENT_DIST_TARBALL || join(repo, "dist", `sandbox-agent-${VERSION}-${TARGET}.tar.gz`);
  assert.ok(existsSync(path), `no release tarball at ${path}: run scripts/dist first (scripts/test does)`);
  return path;
}

/** The address of a starting server's listening line on `child`'s stdout. */
function listeningUrl(child, exited) {
  return new Promise((resolve, reject) => {
    let stdout = "";
    child.stdout.setEncoding("utf8");
    child.stdout.on("data", (chunk) => {
      stdout += chunk;
      const line = /^sandbox-agent listening on (\S+)\n/.exec(stdout);
      if (line) resolve(line[1]);
    });
    exited.then((status) => reject(new Error(`exited first: ${JSON.stringify(status)}`)));
  });
}

/** The processes whose command line holds `text`: `["PID ARGS", …]`. */
function processesNaming(text) {
  const found = [];
  for (const pid of readdirSync("/proc").filter((name) => /^\d+$/.test(name))) {
    try {
      const args = readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0").join(" ");
      if (args.includes(text)) found.push(`${pid} ${args}`);
    } catch {
      // Gone meanwhile.
    }
  }
  return found;
}

/** Runs a command to its end: `{code, signal, stdout, stderr}`. */
function run(file, args, options = {}) {
  return new Promise((resolve) => {
    execFile(file, args, { encoding: "utf8", timeout: 120_000, maxBuffer: 16 << 20, ...options }, (error, stdout, stderr) => {
      resolve({ code: error ? (typeof error.code === "number" ? error.code : null) : 0, signal: error?.signal ?? null, stdout, stderr });
    });
  });
}

function ok(result, what) {
  assert.equal(result.code, 0, `${what} failed (${result.code ?? result.signal}):\n${result.stdout}\n${result.stderr}`);
  return result;
}

/** `dir` holds an executable `sandbox-agent`. */
function holdsBinary(dir) {
  try {
    accessSync(join(dir, "sandbox-agent"), constants.X_OK);
    return true;
  } catch {
    return false;
  }
}

/** A script that answers `--version` with `line`. */
function fakeBinary(dir, line) {
  const path = join(dir, "sandbox-agent");
  writeFileSync(path, `#!/bin/sh\necho ${JSON.stringify(line)}\n`);
  chmodSync(path, 0o755);
  return path;
}

test("resolveBinary: the option, then SANDBOX_AGENT_BIN; each must print this package's version", async () => {
  const dir = mkdtempSync(join(tmpdir(), "sa-ts-resolve-"));
  const saved = process.env.SANDBOX_AGENT_BIN;
  try {
    process.env.SANDBOX_AGENT_BIN = binaryPath();
    assert.deepEqual(await resolveBinary(), { path: binaryPath(), source: "SANDBOX_AGENT_BIN", version: VERSION });
    // scripts/dist's binary: the version on the first line, then commit, target and glibc lines.
    const release = join(dir, "release");
    writeFileSync(release, `#!/bin/sh\nprintf 'sandbox-agent ${VERSION}\\ncommit: 0123abc\\ntarget: ${TARGET}\\nglibc: 2.17 or newer\\n'\n`);
    chmodSync(release, 0o755);
    assert.deepEqual(await resolveBinary({ binary: release }), { path: release, source: "option", version: VERSION });
    const older = fakeBinary(dir, "sandbox-agent 0.0.1 (abc, x86_64-unknown-linux-gnu)");
    assert.deepEqual(await resolveBinary({ binary: binaryPath() }), { path: binaryPath(), source: "option", version: VERSION });
    await assert.rejects(
      resolveBinary({ binary: older }),
      (e) => e.message.includes(`${older} (from the binary option) is version 0.0.1, but this sandbox-agent package is ${VERSION}`),
    );
    process.env.SANDBOX_AGENT_BIN = older;
    await assert.rejects(resolveBinary(), /SANDBOX_AGENT_BIN variable\) is version 0\.0\.1/);
    process.env.SANDBOX_AGENT_BIN = fakeBinary(dir, "something else 0.1.0");
    await assert.rejects(resolveBinary(), /printed "something else 0\.1\.0" for --version, not "sandbox-agent VERSION"/);
    const failing = join(dir, "failing");
    writeFileSync(failing, "#!/bin/sh\necho 'no such thing' >&2\nexit 3\n");
    chmodSync(failing, 0o755);
    process.env.SANDBOX_AGENT_BIN = failing;
    await assert.rejects(resolveBinary(), /failing \(from the SANDBOX_AGENT_BIN variable\) did not answer --version: no such thing/);
    process.env.SANDBOX_AGENT_BIN = join(dir, "missing");
    await assert.rejects(resolveBinary(), /SANDBOX_AGENT_BIN names .*missing, which does not exist/);
  } finally {
    if (saved === undefined) delete process.env.SANDBOX_AGENT_BIN;
    else process.env.SANDBOX_AGENT_BIN = saved;
    rmSync(dir, { recursive: true, force: true });
  }
});

test("the npm tarballs install offline into a fresh project and run the binary from the platform package", { timeout: 600_000 }, async () => {
  const tarball = releaseTarball();
  const work = mkdtempSync(join(tmpdir(), "sa-ts-npm-"));
  try {
    // 1. scripts/npm-pack: the three tarballs.
    const packed = join(work, "npm");
    ok(await run("bash", [join(repo, "scripts", "npm-pack"), tarball, packed], { cwd: repo, timeout: 300_000 }), "scripts/npm-pack");
    const ours = [`acp-http-client-${VERSION}.tgz`, `sandbox-agent-${VERSION}.tgz`, `sandbox-agent-cli-linux-x64-${VERSION}.tgz`];
    assert.deepEqual(readdirSync(packed).sort(), ["SHA256SUMS", ...ours].sort());
    const tarballSha = ok(await run("sha256sum", [tarball]), "sha256sum").stdout.split(" ")[0];
    const platformReadme = ok(await run("tar", ["-xzOf", join(packed, ours[2]), "package/README.md"]), "tar").stdout;
    assert.ok(platformReadme.includes(`${tarball.split("/").pop()}\`,\n  sha256 \`${tarballSha}\``), platformReadme);
    const manifest = JSON.parse(ok(await run("tar", ["-xzOf", join(packed, ours[1]), "package/package.json"]), "tar").stdout);
    assert.deepEqual(manifest.optionalDependencies, { "@sandbox-agent/cli-linux-x64": VERSION });
    assert.equal(manifest.dependencies["acp-http-client"], VERSION);

    // 2. A fresh project; npm may not reach any registry: an unreachable
    //    one, offline mode and an empty private cache. The ACP SDK and zod
    //    (not ours: a user's npm fetches them) come as tarballs packed from
    //    this workspace's node_modules.
    const project = join(work, "project");
    const deps = join(work, "deps");
    for (const dir of [project, deps]) ok(await run("mkdir", ["-p", dir]), "mkdir");
    writeFileSync(join(project, "package.json"), JSON.stringify({ name: "fresh", private: true, type: "module" }));
    const modules = join(repo, "sdks", "typescript", "node_modules");
    ok(await run("npm", ["pack", "--loglevel", "warn", join(modules, "@agentclientprotocol", "sdk"), join(modules, "zod")], { cwd: deps }), "npm pack (ACP SDK, zod)");
    const env = {};
    for (const [key, value] of Object.entries(process.env)) {
      if (!key.startsWith("SANDBOX_AGENT_") && !key.startsWith("npm_")) env[key] = value;
    }
    // The PATH without any directory that holds a sandbox-agent.
    env.PATH = (process.env.PATH ?? "").split(delimiter).filter((dir) => dir !== "" && !holdsBinary(dir)).join(delimiter);
    env.npm_config_registry = "http://127.0.0.1:9/";
    env.npm_config_offline = "true";
    env.npm_config_cache = join(work, "npm-cache");
    env.npm_config_audit = "false";
    env.npm_config_fund = "false";
    const inProject = { cwd: project, env };
    ok(await run("npm", ["install", ...readdirSync(deps).map((f) => join(deps, f))], inProject), "npm install --offline (ACP SDK, zod)");
    // README's commands as written, the tarballs' folder named.
    const readmeBlock = blocksAfter("### npm").filter((b) => b.lang === "sh")[1].text;
    const folder = /^NPM_DIST=\/path\/to\/dist\/npm {3}# the three tarballs\n/;
    assert.match(readmeBlock, folder);
    const readmeRun = ok(await run("sh", ["-ec", readmeBlock.replace(folder, `NPM_DIST='${packed}'\n`)], inProject), "README's npm install");
    const binary = join(project, "node_modules", "@sandbox-agent", "cli-linux-x64", "bin", "sandbox-agent");
    assert.ok(holdsBinary(dirname(binary)), "the platform package's binary is installed executable");
    const installed = JSON.parse(readFileSync(join(project, "package.json"), "utf8")).dependencies;
    assert.deepEqual(Object.keys(installed).sort(), ["@agentclientprotocol/sdk", "@sandbox-agent/cli-linux-x64", "acp-http-client", "sandbox-agent", "zod"]);

    // 3. `npx sandbox-agent --version`: ours, from the platform package.
    const unpackedVersion = ok(await run(binary, ["--version"]), "the binary's --version").stdout;
    assert.match(unpackedVersion, new RegExp(`^sandbox-agent ${VERSION.replaceAll(".", "\\.")}\\b`));
    assert.ok(readmeRun.stdout.endsWith(unpackedVersion), readmeRun.stdout);
    const npx = ok(await run("npx", ["sandbox-agent", "--version"], { ...inProject, env: { ...env, SANDBOX_AGENT_NPM_DEBUG: "1" } }), "npx sandbox-agent --version");
    assert.equal(npx.stdout, unpackedVersion);
    assert.equal(npx.stderr.trim(), `sandbox-agent (npm launcher): ${binary} (platform package), version ${VERSION}`);
    // Exit statuses pass through the launcher.
    const refused = await run("npx", ["sandbox-agent", "server", "--no-such-flag"], inProject);
    assert.equal(refused.code, 2, refused.stderr);
    assert.match(refused.stderr, /--no-such-flag/);

    // 4. The embedded server streams a mock turn; the resolver says where the binary came from.
    const script = `
      import { SandboxAgentClient } from "sandbox-agent";
      import { resolveBinary, startEmbeddedServer } from "sandbox-agent/node";
      const resolved = await resolveBinary();
      const server = await startEmbeddedServer({ args: ["--data-dir", ${JSON.stringify(join(work, "data"))}] });
      const client = new SandboxAgentClient({ ...server.connection, agent: "mock" });
      const { sessionId } = await client.newSession({ cwd: ${JSON.stringify(work)} });
      const turn = client.promptStream(sessionId, "hello");
      let text = "";
      for await (const update of turn) {
        if (update.sessionUpdate === "agent_message_chunk" && update.content.type === "text") text += update.content.text;
      }
      const { stopReason } = await turn.result;
      await client.dispose();
      await server.stop();
      console.log(JSON.stringify({ resolved, used: server.binary, text, stopReason }));
    `;
    const embedded = ok(await run(process.execPath, ["--input-type=module", "-e", script], inProject), "the embedded server");
    const seen = JSON.parse(embedded.stdout);
    const expected = { path: binary, source: "platform package", version: VERSION };
    assert.deepEqual(seen, { resolved: expected, used: expected, text: "Hello from the mock agent. You said: hello", stopReason: "end_turn" });

    // 4b. The provider entries are in the tarball: local() round trip on the platform package's binary; docker() loads.
    const providers = `
      import { SandboxAgent } from "sandbox-agent";
      import { local } from "sandbox-agent/local";
      import { docker, cleanup } from "sandbox-agent/docker";
      const sdk = await SandboxAgent.start({ sandbox: local() });
      const session = await sdk.createSession({ agent: "mock", cwd: ${JSON.stringify(work)} });
      const { stopReason } = await session.prompt("hi");
      await sdk.destroySandbox();
      console.log(JSON.stringify({ provider: sdk.sandbox.provider, stopReason, docker: typeof docker, cleanup: docker.cleanup === cleanup }));
    `;
    const viaProviders = ok(await run(process.execPath, ["--input-type=module", "-e", providers], inProject), "the providers");
    assert.deepEqual(JSON.parse(viaProviders.stdout), { provider: "local", stopReason: "end_turn", docker: "function", cleanup: true });

    // 5. `npx sandbox-agent server`: serves; SIGTERM to the launcher stops the server.
    const launcher = join(project, "node_modules", ".bin", "sandbox-agent");
    const server = spawn(launcher, ["server", "--host", "127.0.0.1", "--port", "0", "--no-token", "--data-dir", join(work, "data")], {
      ...inProject,
      stdio: ["ignore", "pipe", "pipe"],
    });
    const exited = new Promise((resolve) => server.once("exit", (code, signal) => resolve({ code, signal })));
    const url = await listeningUrl(server, exited);
    assert.equal((await fetch(`${url}/v2/health`)).status, 200);
    server.kill("SIGTERM");
    assert.deepEqual(await exited, { code: 0, signal: null });
    await assert.rejects(fetch(`${url}/v2/health`));

    // `npx` ends on SIGTERM without passing it on: the launcher, orphaned,
    // stops the server.
    const npxData = join(work, "data-npx");
    const viaNpx = spawn("npx", ["sandbox-agent", "server", "--host", "127.0.0.1", "--port", "0", "--no-token", "--data-dir", npxData], {
      ...inProject,
      stdio: ["ignore", "pipe", "pipe"],
    });
    const npxExited = new Promise((resolve) => viaNpx.once("exit", resolve));
    const npxUrl = await listeningUrl(viaNpx, npxExited);
    assert.equal((await fetch(`${npxUrl}/v2/health`)).status, 200);
    viaNpx.kill("SIGTERM");
    await npxExited;
    let left = [];
    for (let i = 0; i < 100; i++) {
      left = processesNaming(npxData);
      if (left.length === 0) break;
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    assert.deepEqual(left, [], "the launcher and the server outlived npx");

    // 6. Without the platform package: the PATH, else an error naming what was looked at.
    renameSync(join(project, "node_modules", "@sandbox-agent"), join(work, "moved"));
    const resolveScript = `import { resolveBinary } from "sandbox-agent/node"; console.log(JSON.stringify(await resolveBinary()));`;
    const missing = await run(process.execPath, ["--input-type=module", "-e", resolveScript], inProject);
    assert.notEqual(missing.code, 0);
    assert.match(missing.stderr, /sandbox-agent binary not found: SANDBOX_AGENT_BIN is not set; @sandbox-agent\/cli-linux-x64 is not installed beside this package; none on the PATH/);
    const onPath = join(work, "path");
    ok(await run("mkdir", ["-p", onPath]), "mkdir");
    symlinkSync(join(work, "moved", "cli-linux-x64", "bin", "sandbox-agent"), join(onPath, "sandbox-agent"));
    const fromPath = ok(
      await run(process.execPath, ["--input-type=module", "-e", resolveScript], { ...inProject, env: { ...env, PATH: `${onPath}${delimiter}${env.PATH}` } }),
      "resolveBinary from the PATH",
    );
    assert.deepEqual(JSON.parse(fromPath.stdout), { path: join(onPath, "sandbox-agent"), source: "PATH", version: VERSION });
    const launcherMissing = await run("npx", ["sandbox-agent", "--version"], inProject);
    assert.equal(launcherMissing.code, 1);
    assert.match(launcherMissing.stderr, /^sandbox-agent \(npm launcher\): sandbox-agent binary not found: /);
  } finally {
    // A failed run's leftovers (they would hold this process's pipes open).
    for (const entry of processesNaming(work)) {
      try {
        process.kill(Number(entry.split(" ")[0]), "SIGKILL");
      } catch {
        // Gone meanwhile.
      }
    }
    rmSync(work, { recursive: true, force: true });
  }
});
