/**
 * `sandbox-agent/node`: the Node-only part of the package (the default entry
 * stays browser-safe). Starts a private sandbox-agent server from its binary,
 * as the Rust SDK's embedded mode does (`research/contract.md`, "Embedded
 * mode"):
 *
 * - `server --host 127.0.0.1 --port 0 --exit-on-stdin-eof`, a random token
 *   in the environment (never on the command line, which `/proc` shows to
 *   every user);
 * - ready when the stdout line `sandbox-agent listening on http://HOST:PORT`
 *   came and `GET /v2/health` answered 200;
 * - stopped by {@link EmbeddedServer.stop} (SIGTERM, then SIGKILL after the
 *   grace period), or when this process exits however it exits: the server's
 *   stdin is a pipe only this process holds, and its end of file stops the
 *   server and its agents.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { existsSync } from "node:fs";

/** Prefix of the server's one stdout line ("Server start-up"). */
const LISTENING_PREFIX = "sandbox-agent listening on ";
/** Lines of the server's stderr kept for start-up errors. */
const KEPT_LOG_LINES = 200;

/** Options of {@link startEmbeddedServer}. */
export interface EmbeddedServerOptions {
  /**
   * The `sandbox-agent` binary: default `$SANDBOX_AGENT_BIN` (which must
   * exist when set), else `sandbox-agent` on the `PATH`.
   */
  binary?: string;
  /** Extra `sandbox-agent server` arguments (`--data-dir DIR`, `--fs-root DIR`, …). */
  args?: string[];
  /** How long start-up may take, in milliseconds; default 15,000. */
  startupTimeoutMs?: number;
  /** How long `stop()` waits after SIGTERM before SIGKILL, in milliseconds; default 5,000. */
  shutdownGraceMs?: number;
  /**
   * The server's logs (stderr): `"keep"` (default) keeps the last 200
   * lines for {@link EmbeddedServer.logs} and start-up errors; `"inherit"`
   * writes them to this process's stderr.
   */
  logs?: "keep" | "inherit";
}

/** A running private server. */
export interface EmbeddedServer {
  /** `http://127.0.0.1:PORT`. */
  readonly baseUrl: string;
  /** The random bearer token the server requires. */
  readonly token: string;
  /** `{baseUrl, token}`, to spread into `new SandboxAgentClient({...})`. */
  readonly connection: { baseUrl: string; token: string };
  /** The server process id. */
  readonly pid: number;
  /** The last lines of the server's stderr (with `logs: "keep"`). */
  logs(): string;
  /** Stops the server (SIGTERM, SIGKILL after the grace period) and waits for it to exit. */
  stop(): Promise<void>;
}

/**
 * Starts a private server and waits until it serves.
 *
 * @throws {Error} when the binary is missing, the server exits first, or it
 *   is not ready within `startupTimeoutMs` (the message carries its stderr).
 */
export async function startEmbeddedServer(options: EmbeddedServerOptions = {}): Promise<EmbeddedServer> {
  const binary = findBinary(options.binary);
  const token = randomBytes(24).toString("hex");
  const env: NodeJS.ProcessEnv = { ...process.env, SANDBOX_AGENT_TOKEN: token };
  // Inherited settings that would change what this server is.
  for (const key of ["SANDBOX_AGENT_NO_TOKEN", "SANDBOX_AGENT_HOST", "SANDBOX_AGENT_PORT"]) delete env[key];
  const graceMs = options.shutdownGraceMs ?? 5_000;
  const args = [
    "server",
    "--host",
    "127.0.0.1",
    "--port",
    "0",
    "--exit-on-stdin-eof",
    // The server's own agent grace fits inside ours (as in the Rust SDK).
    "--shutdown-grace-ms",
    String(Math.max(1, Math.floor(graceMs * 0.4))),
    ...(options.args ?? []),
  ];
  const child = spawn(binary, args, {
    env,
    stdio: ["pipe", "pipe", options.logs === "inherit" ? "inherit" : "pipe"],
  });
  const kept: string[] = [];
  child.stderr?.setEncoding("utf8");
  let partial = "";
  child.stderr?.on("data", (chunk: string) => {
    const lines = (partial + chunk).split("\n");
    partial = lines.pop() ?? "";
    kept.push(...lines);
    if (kept.length > KEPT_LOG_LINES) kept.splice(0, kept.length - KEPT_LOG_LINES);
  });
  const logs = (): string => [...kept, partial].join("\n").trim();
  const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));

  let baseUrl: string;
  try {
    baseUrl = await waitForListening(child, options.startupTimeoutMs ?? 15_000, logs);
    await waitForHealth(baseUrl, options.startupTimeoutMs ?? 15_000);
  } catch (error) {
    child.kill("SIGKILL");
    await exited;
    throw error;
  }
  // Nothing here keeps this process alive: when it ends, the kernel closes
  // the server's stdin and the server shuts down (--exit-on-stdin-eof).
  child.unref();
  for (const stream of [child.stdin, child.stdout, child.stderr]) {
    (stream as unknown as { unref?: () => void } | null)?.unref?.();
  }

  let stopping: Promise<void> | undefined;
  return {
    baseUrl,
    token,
    connection: { baseUrl, token },
    pid: child.pid ?? 0,
    logs,
    stop() {
      stopping ??= (async () => {
        if (child.exitCode === null && child.signalCode === null) {
          child.kill("SIGTERM");
          const killer = setTimeout(() => child.kill("SIGKILL"), graceMs);
          await exited;
          clearTimeout(killer);
        }
        child.stdin?.destroy();
      })();
      return stopping;
    },
  };
}

function findBinary(given: string | undefined): string {
  if (given !== undefined) {
    if (!existsSync(given)) throw new Error(`sandbox-agent binary not found at ${given}`);
    return given;
  }
  const fromEnv = process.env["SANDBOX_AGENT_BIN"];
  if (fromEnv !== undefined && fromEnv !== "") {
    if (!existsSync(fromEnv)) throw new Error(`SANDBOX_AGENT_BIN names ${fromEnv}, which does not exist`);
    return fromEnv;
  }
  // spawn searches the PATH; a missing one is reported as the child's error.
  return "sandbox-agent";
}

/** The address from the server's one stdout line. */
function waitForListening(child: ChildProcess, timeoutMs: number, logs: () => string): Promise<string> {
  return new Promise((resolve, reject) => {
    let stdout = "";
    const fail = (message: string): void => {
      clearTimeout(timer);
      const log = logs();
      reject(new Error(log ? `${message}; its stderr:\n${log}` : message));
    };
    const timer = setTimeout(() => fail(`sandbox-agent server did not start within ${timeoutMs} ms`), timeoutMs);
    child.once("error", (error) => fail(`sandbox-agent could not be started: ${error.message}`));
    child.once("exit", (code, signal) => fail(`sandbox-agent server exited (${code ?? signal}) before listening`));
    child.stdout?.setEncoding("utf8");
    child.stdout?.on("data", (chunk: string) => {
      stdout += chunk;
      const end = stdout.indexOf("\n");
      if (end < 0) return;
      const line = stdout.slice(0, end).trim();
      clearTimeout(timer);
      if (line.startsWith(LISTENING_PREFIX)) resolve(line.slice(LISTENING_PREFIX.length));
      else fail(`sandbox-agent server printed ${JSON.stringify(line)} instead of its listening line`);
    });
  });
}

/** Polls `GET /v2/health` until it answers 200. */
async function waitForHealth(baseUrl: string, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    try {
      const response = await fetch(`${baseUrl}/v2/health`);
      await response.body?.cancel();
      if (response.status === 200) return;
    } catch {
      // Not serving yet.
    }
    if (Date.now() > deadline) throw new Error(`sandbox-agent at ${baseUrl} did not answer /v2/health within ${timeoutMs} ms`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}
