// Starts the real `sandbox-agent server` for a test, as the Rust harness
// does (tests/v2_api/src/server.rs): `--host 127.0.0.1 --port 0`, a private
// `--data-dir`, the address read from the one stdout line
// `sandbox-agent listening on http://HOST:PORT` (research/contract.md,
// "Server start-up"). The binary is $SANDBOX_AGENT_BIN, else
// <repo>/target/debug/sandbox-agent (built by `cargo build --workspace`).
import { spawn } from "node:child_process";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const LISTENING_PREFIX = "sandbox-agent listening on ";
const STARTUP_TIMEOUT_MS = 60_000;

/** The binary under test, checked to exist. */
export function binaryPath() {
  const repo = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..", "..");
  const bin = process.env.SANDBOX_AGENT_BIN ?? join(repo, "target", "debug", "sandbox-agent");
  if (!existsSync(bin)) {
    throw new Error(`sandbox-agent binary not found at ${bin}: build it first (cargo build --workspace) or set SANDBOX_AGENT_BIN`);
  }
  return bin;
}

/**
 * Starts a server; `args` are extra flags (`--token T` replaces
 * `--no-token`), `reuse.dataDir` the data dir of an earlier one (a
 * restart). Returns `{url, dataDir, stop(), kill(), stderr()}`; `stop()`
 * sends SIGTERM, waits for the exit and removes the data dir; `kill()`
 * sends SIGKILL and keeps it.
 */
export async function startServer(args = [], reuse = {}) {
  const bin = binaryPath();
  const dataDir = reuse.dataDir ?? mkdtempSync(join(tmpdir(), "sa-ts-test-"));
  const env = {};
  for (const [key, value] of Object.entries(process.env)) {
    // A developer's own token or timeouts must not change what the tests see.
    if (!key.startsWith("SANDBOX_AGENT_")) env[key] = value;
  }
  const auth = args.includes("--token") ? [] : ["--no-token"];
  const child = spawn(
    bin,
    ["server", "--host", "127.0.0.1", "--port", "0", "--data-dir", dataDir, ...auth, ...args],
    { env, stdio: ["ignore", "pipe", "pipe"] },
  );
  let stderr = "";
  child.stderr.setEncoding("utf8");
  child.stderr.on("data", (chunk) => {
    stderr += chunk;
  });
  const exited = new Promise((resolve) => child.once("exit", (code, signal) => resolve({ code, signal })));
  const listening = new Promise((resolve, reject) => {
    let stdout = "";
    const timer = setTimeout(() => reject(new Error(`server did not start within ${STARTUP_TIMEOUT_MS} ms:\n${stderr}`)), STARTUP_TIMEOUT_MS);
    child.stdout.setEncoding("utf8");
    child.stdout.on("data", (chunk) => {
      stdout += chunk;
      const line = stdout.split("\n").find((l) => l.startsWith(LISTENING_PREFIX));
      if (line !== undefined && stdout.includes("\n")) {
        clearTimeout(timer);
        resolve(line.slice(LISTENING_PREFIX.length).trim());
      }
    });
    exited.then(({ code, signal }) => {
      clearTimeout(timer);
      reject(new Error(`server exited (${code ?? signal}) before listening:\n${stderr}`));
    });
  });
  let url;
  try {
    url = await listening;
  } catch (error) {
    child.kill("SIGKILL");
    await exited;
    rmSync(dataDir, { recursive: true, force: true });
    throw error;
  }
  return {
    url,
    dataDir,
    stderr: () => stderr,
    async kill() {
      if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
      await exited;
    },
    async stop() {
      if (child.exitCode === null && child.signalCode === null) child.kill("SIGTERM");
      // The server drains idle keep-alive HTTP connections (fetch's pool
      // keeps some) for up to 5 s; the tests need not wait for that.
      const killer = setTimeout(() => child.kill("SIGKILL"), 1_000);
      await exited;
      clearTimeout(killer);
      rmSync(dataDir, { recursive: true, force: true });
    },
  };
}

/** A loopback URL nothing listens on (a port bound then released). */
export async function unusedUrl() {
  const net = await import("node:net");
  const server = net.createServer();
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address();
  await new Promise((resolve) => server.close(resolve));
  return `http://127.0.0.1:${port}`;
}

/** The text of a turn's `agent_message_chunk` updates, joined. */
export function textOf(updates) {
  return updates
    .filter((u) => u.sessionUpdate === "agent_message_chunk" && u.content.type === "text")
    .map((u) => u.content.text)
    .join("");
}
