/**
 * `sandbox-agent/local`: the `local()` sandbox provider, the runtime as a
 * child process of this one (seed 001's embedded mode, `startEmbeddedServer`
 * of `sandbox-agent/node`, behind the provider interface;
 * `research/contract.md`, "Sandbox providers"). No isolation: it is for
 * development and tests, with the same code as a container.
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { SandboxStartError, type SandboxCreateRequest, type SandboxInstance, type SandboxProvider } from "./sandbox.js";
import { startServerWithToken } from "./node.js";

/** Options of {@link local}. */
export interface LocalOptions {
  /** The `sandbox-agent` binary; default as `sandbox-agent/node` finds it (`$SANDBOX_AGENT_BIN`, the platform package, the `PATH`). */
  binary?: string;
  /** The server's data dir; default a fresh temporary directory, removed by `destroySandbox()`. */
  dataDir?: string;
  /** The default `cwd` of `createSession`; default this process's working directory. */
  cwd?: string;
  /** Extra `sandbox-agent server` arguments. */
  args?: string[];
  /** How long the process may take to listen, in ms; default 15,000. */
  startupTimeoutMs?: number;
}

/**
 * A provider that starts `sandbox-agent server` as a child process on
 * 127.0.0.1 (a random port), with the token in its environment; the child
 * also stops when this process exits however it exits (its stdin closes).
 *
 * @throws {TypeError} an option of the wrong type.
 */
export function local(options: LocalOptions = {}): SandboxProvider {
  if (typeof options !== "object" || options === null) throw new TypeError("local: options must be an object");
  for (const key of ["binary", "dataDir", "cwd"] as const) {
    if (options[key] !== undefined && typeof options[key] !== "string") throw new TypeError(`local: options.${key} must be a string`);
  }
  if (options.args !== undefined && !Array.isArray(options.args)) throw new TypeError("local: options.args must be an array of strings");
  return {
    name: "local",
    async create(request: SandboxCreateRequest): Promise<SandboxInstance> {
      const started = Date.now();
      const dataDir = options.dataDir ?? mkdtempSync(join(tmpdir(), "sandbox-agent-local-"));
      const removeDataDir = (): void => {
        if (options.dataDir === undefined) rmSync(dataDir, { recursive: true, force: true });
      };
      let server;
      try {
        server = await startServerWithToken(
          {
            ...(options.binary === undefined ? {} : { binary: options.binary }),
            ...(options.startupTimeoutMs === undefined ? {} : { startupTimeoutMs: options.startupTimeoutMs }),
            args: ["--data-dir", dataDir, ...(options.args ?? [])],
          },
          request.token,
        );
      } catch (error) {
        removeDataDir();
        throw new SandboxStartError("start", "local", error instanceof Error ? error.message : String(error), "", request.token);
      }
      let destroying: Promise<void> | undefined;
      return {
        id: String(server.pid),
        baseUrl: server.baseUrl,
        defaultCwd: options.cwd ?? process.cwd(),
        // No container to create: the whole start counts as `start`.
        timings: { createMs: 0, startMs: Date.now() - started },
        logs: async () => server.logs().split("\n").slice(-50).join("\n"),
        destroy() {
          destroying ??= server.stop().finally(removeDataDir);
          return destroying;
        },
      };
    },
  };
}
