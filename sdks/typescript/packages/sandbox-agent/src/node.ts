/**
 * `sandbox-agent/node`: the Node-only part of the package (the default entry
 * stays browser-safe). Starts a private sandbox-agent server from its binary,
 * as the Rust SDK's embedded mode does (`research/contract.md`, "Embedded
 * mode", and "The npm packages" for the lookup below):
 *
 * - the binary: the `binary` option, else `$SANDBOX_AGENT_BIN`, else the
 *   platform package (`@sandbox-agent/cli-linux-x64`, an optional dependency
 *   of this package, resolved from this package's own location), else the
 *   first `sandbox-agent` on the `PATH`; the one chosen must answer
 *   `--version` with this package's version ({@link resolveBinary});
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
import { execFile, spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { accessSync, constants, existsSync, readFileSync, realpathSync, statSync } from "node:fs";
import { createRequire } from "node:module";
import { delimiter, dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import type { EmbeddedServerOptions } from "./types.js";

/** Prefix of the server's one stdout line ("Server start-up"). */
const LISTENING_PREFIX = "sandbox-agent listening on ";
/** Lines of the server's stderr kept for start-up errors. */
const KEPT_LOG_LINES = 200;

/** Options of {@link startEmbeddedServer} (defined beside the client's types: `SandboxAgentClient.start` takes them too). */
export type { EmbeddedServerOptions };

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
  /** The binary the server runs, and where it was found. */
  readonly binary: ResolvedBinary;
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
  return startServerWithToken(options, randomBytes(24).toString("hex"));
}

/**
 * @internal {@link startEmbeddedServer} with a token given by the caller
 * (`local()` gets it from `SandboxAgent.start`).
 */
export async function startServerWithToken(options: EmbeddedServerOptions, token: string): Promise<EmbeddedServer> {
  const binary = await resolveBinary({ binary: options.binary });
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
  const child = spawn(binary.path, args, {
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
    binary,
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

/**
 * Where {@link resolveBinary} found the binary: the `binary` option, the
 * `SANDBOX_AGENT_BIN` variable, the platform package, or the `PATH`.
 */
export type BinarySource = "option" | "SANDBOX_AGENT_BIN" | "platform package" | "PATH";

/** A binary {@link resolveBinary} found and ran `--version` on. */
export interface ResolvedBinary {
  /** Its path (absolute unless the option or `SANDBOX_AGENT_BIN` gave a relative one). */
  readonly path: string;
  /** Where it was found. */
  readonly source: BinarySource;
  /** The version its `--version` printed: this package's version. */
  readonly version: string;
}

/** Options of {@link resolveBinary}. */
export interface ResolveBinaryOptions {
  /** A binary to use instead of looking for one (checked like the others). */
  binary?: string | undefined;
}

/** The platform packages, by `${process.platform}-${process.arch}`. */
const PLATFORM_PACKAGES: Readonly<Record<string, string>> = {
  "linux-x64": "@sandbox-agent/cli-linux-x64",
};
/** The binary inside a platform package. */
const PLATFORM_BINARY = join("bin", "sandbox-agent");
/** How long `--version` may take, in milliseconds. */
const VERSION_TIMEOUT_MS = 10_000;
/**
 * Set in the environment of the `--version` run: the package's command
 * (`cli.ts`) started with it is being taken for a binary, and refuses.
 */
export const VERSION_PROBE_VARIABLE = "SANDBOX_AGENT_NPM_VERSION_PROBE";

/**
 * This package's version (its `package.json`): the version the binary must
 * print, since the packages and the binary are released together.
 */
export function packageVersion(): string {
  const manifest = JSON.parse(readFileSync(new URL("../package.json", import.meta.url), "utf8")) as { version: string };
  return manifest.version;
}

/**
 * Finds the `sandbox-agent` binary (`research/contract.md`, "The npm
 * packages"): `options.binary`, else `$SANDBOX_AGENT_BIN` (both must exist
 * when given), else the platform package for this machine (`@sandbox-agent/cli-linux-x64` on Linux x64,
 * resolved from this package's location, so the one installed beside it),
 * else the first executable `sandbox-agent` on the `PATH`. The first one
 * found is run with `--version`, which must print `sandbox-agent <this
 * package's version>`; it is not passed over for a later one.
 *
 * @returns its path, where it was found and its version.
 * @throws {Error} when none is found (the message lists what was looked
 *   at), the one found does not run, or it prints another version.
 */
export async function resolveBinary(options: ResolveBinaryOptions = {}): Promise<ResolvedBinary> {
  const { path, source, looked } = findBinary(options.binary);
  const expected = packageVersion();
  const version = await versionOf(path, source);
  if (version !== expected) {
    throw new Error(
      `sandbox-agent at ${path} (from the ${describe(source)}) is version ${version}, ` +
        `but this sandbox-agent package is ${expected}: install the matching binary ` +
        `(our npm tarballs carry it in @sandbox-agent/cli-linux-x64)` +
        (looked.length > 0 ? `; looked at: ${looked.join("; ")}` : ""),
    );
  }
  return { path, source, version };
}

function describe(source: BinarySource): string {
  switch (source) {
    case "option":
      return "binary option";
    case "SANDBOX_AGENT_BIN":
      return "SANDBOX_AGENT_BIN variable";
    case "platform package":
      return "platform package";
    case "PATH":
      return "PATH";
  }
}

/** The first candidate, and what was passed over before it. */
function findBinary(given: string | undefined): { path: string; source: BinarySource; looked: string[] } {
  if (given !== undefined) {
    if (!existsSync(given)) throw new Error(`sandbox-agent binary not found at ${given}`);
    return { path: given, source: "option", looked: [] };
  }
  const fromEnv = process.env["SANDBOX_AGENT_BIN"];
  if (fromEnv !== undefined && fromEnv !== "") {
    if (!existsSync(fromEnv)) throw new Error(`SANDBOX_AGENT_BIN names ${fromEnv}, which does not exist`);
    return { path: fromEnv, source: "SANDBOX_AGENT_BIN", looked: [] };
  }
  const looked = ["SANDBOX_AGENT_BIN is not set"];
  const platform = `${process.platform}-${process.arch}`;
  const packageName = PLATFORM_PACKAGES[platform];
  if (packageName === undefined) {
    looked.push(`no platform package is made for ${platform}`);
  } else {
    let packageDir: string | undefined;
    try {
      packageDir = dirname(createRequire(import.meta.url).resolve(`${packageName}/package.json`));
    } catch {
      looked.push(`${packageName} is not installed beside this package`);
    }
    if (packageDir !== undefined) {
      const path = join(packageDir, PLATFORM_BINARY);
      if (isExecutableFile(path)) return { path, source: "platform package", looked };
      looked.push(`${packageName} at ${packageDir} has no executable ${PLATFORM_BINARY}`);
    }
  }
  // `npx` and npm scripts put node_modules/.bin, where this package's own
  // command is, first on the PATH.
  const command = realpathOrSelf(fileURLToPath(new URL("./cli.js", import.meta.url)));
  const seen = new Set<string>();
  for (const dir of (process.env["PATH"] ?? "").split(delimiter)) {
    // npx puts node_modules/.bin on the PATH twice: each folder once.
    if (dir === "" || seen.has(dir)) continue;
    seen.add(dir);
    const path = join(dir, "sandbox-agent");
    if (!isExecutableFile(path)) continue;
    if (realpathOrSelf(path) === command) {
      looked.push(`${path} on the PATH is this package's command`);
      continue;
    }
    return { path, source: "PATH", looked };
  }
  looked.push("none on the PATH");
  throw new Error(`sandbox-agent binary not found: ${looked.join("; ")}`);
}

function realpathOrSelf(path: string): string {
  try {
    return realpathSync(path);
  } catch {
    return path;
  }
}

function isExecutableFile(path: string): boolean {
  try {
    if (!statSync(path).isFile()) return false;
    accessSync(path, constants.X_OK);
    return true;
  } catch {
    return false;
  }
}

/** The version `PATH --version` prints (`sandbox-agent X.Y.Z…` on its first line). */
function versionOf(path: string, source: BinarySource): Promise<string> {
  return new Promise((resolve, reject) => {
    // The variable makes another package's command (an npm launcher, not a
    // binary) refuse at once rather than look for a binary in turn.
    const env = { ...process.env, [VERSION_PROBE_VARIABLE]: "1" };
    execFile(path, ["--version"], { env, timeout: VERSION_TIMEOUT_MS, encoding: "utf8" }, (error, stdout, stderr) => {
      const where = `sandbox-agent at ${path} (from the ${describe(source)})`;
      if (error) {
        const detail = stderr.trim() || error.message;
        reject(new Error(`${where} did not answer --version: ${detail}`));
        return;
      }
      const match = /^sandbox-agent v?(\S+)/.exec(stdout);
      if (match?.[1] === undefined) {
        reject(new Error(`${where} printed ${JSON.stringify(stdout.split("\n")[0] ?? "")} for --version, not "sandbox-agent VERSION"`));
        return;
      }
      resolve(match[1]);
    });
  });
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
