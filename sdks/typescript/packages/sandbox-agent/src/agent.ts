/**
 * `SandboxAgent`: seed 001's entry class, and the sandbox shape
 * (`research/contract.md`, "Sandbox providers"): `SandboxAgent.start({
 * sandbox })` makes a sandbox with a provider, starts the runtime in it and
 * returns a connected client; `createSession`, `session.prompt` and
 * `destroySandbox()` do the rest. Browser-safe: providers come from their
 * own entries and are only called here.
 */
import type { SessionUpdate } from "@agentclientprotocol/sdk";
import { check, checkFields } from "./check.js";
import { type PromptOptions, SandboxAgentClient } from "./client.js";
import { CLIENT_OPTIONS } from "./forms.js";
import {
  type SandboxInstance,
  type SandboxProvider,
  type SandboxTimings,
  SandboxStartError,
  generateToken,
  waitHealthy,
} from "./sandbox.js";
import type { PromptTurn } from "./turn.js";
import type { ContentBlock, PromptResult, SandboxAgentClientOptions, SandboxAgentStartOptions } from "./types.js";

/** Options of `SandboxAgent.start({ sandbox })`: the client's options without `baseUrl`/`token` (they come from the sandbox). */
export interface SandboxStartOptions extends Omit<SandboxAgentClientOptions, "baseUrl" | "token" | "agent"> {
  /** The provider that makes the sandbox: `docker({ image })`, `local()`, or your own {@link SandboxProvider}. */
  sandbox: SandboxProvider;
  /**
   * The agent of this client's own connection and the default of
   * `createSession`. Without it the client opens no connection of its own
   * and each `createSession` must name its agent.
   */
  agent?: string;
  /** How long the sandbox's server may take to answer `/v2/health` after its start, in ms; default 60,000. */
  startupTimeoutMs?: number;
}

/** Options of `SandboxAgent.connect()`: as the client's, with `agent` optional (as in {@link SandboxStartOptions}). */
export interface SandboxConnectOptions extends Omit<SandboxAgentClientOptions, "agent"> {
  /** The default agent; without it each `createSession` names its agent. */
  agent?: string;
}

/** Options of {@link SandboxAgent.createSession}. */
export interface CreateSessionOptions {
  /** The agent the session runs on; default the client's agent (required when it has none). */
  agent?: string;
  /** The session's working directory in the sandbox (absolute); default the sandbox's (the image's `WORKDIR`, the local process's cwd). */
  cwd?: string;
  /** Metadata stored with the session (a JSON object of at most 64 KiB). */
  metadata?: Record<string, unknown>;
}

/** What a sandbox's start took, in ms (provider steps plus the health wait). */
export interface SandboxInfo {
  /** The provider's name (`docker`, `local`, …). */
  readonly provider: string;
  /** The provider's id of the sandbox (a container id, a process id). */
  readonly id: string;
  /** The fleet it belongs to (`docker`'s label), if the provider has fleets. */
  readonly fleet: string | undefined;
  /** The time each step took. */
  readonly timings: SandboxTimings;
}

/**
 * One session made by {@link SandboxAgent.createSession}, bound to its
 * client: `prompt`, `promptStream` and `cancel` need no session id.
 */
export class Session {
  /** The session id. */
  readonly id: string;
  /** The agent it runs on. */
  readonly agent: string;
  /** Its working directory. */
  readonly cwd: string;
  readonly #client: SandboxAgentClient;

  /** @internal Made by `createSession`. */
  constructor(client: SandboxAgentClient, id: string, agent: string, cwd: string) {
    this.#client = client;
    this.id = id;
    this.agent = agent;
    this.cwd = cwd;
  }

  /**
   * Sends a prompt (text or ACP content blocks) and waits for the end of the turn.
   *
   * @returns `{ stopReason }` (`end_turn`, `cancelled`, …).
   * @throws {TypeError} `content` neither text nor an array of content blocks.
   * @throws {SandboxAgentError} the agent refused, the connection was lost.
   */
  prompt(content: string | ContentBlock[], options?: PromptOptions): Promise<PromptResult> {
    return this.#client.prompt(this.id, content, options);
  }

  /**
   * Sends a prompt and returns the running turn: an async iterator of its
   * session updates (text chunks, tool calls, …) that ends with the turn;
   * `turn.result` resolves with `{ stopReason }`.
   *
   * @throws {TypeError} as {@link prompt} (at once).
   */
  promptStream(content: string | ContentBlock[], options?: PromptOptions): PromptTurn & AsyncIterable<SessionUpdate> {
    return this.#client.promptStream(this.id, content, options);
  }

  /** Asks the agent to stop the running turn (it ends with stop reason `cancelled`). */
  cancel(): Promise<void> {
    return this.#client.cancel(this.id);
  }
}

/**
 * Seed 001's entry class, and the sandbox one:
 *
 * - `SandboxAgent.connect({ baseUrl, token?, agent? })`: a client of a
 *   running server;
 * - `SandboxAgent.start({ agent, server? })` (Node.js): seed 001's
 *   embedded server;
 * - `SandboxAgent.start({ sandbox, agent? })`: a sandbox from the provider
 *   (token generated here, passed by environment; health waited for), and
 *   a client of it.
 *
 * It is a {@link SandboxAgentClient} (every method of it) plus
 * {@link createSession} and {@link destroySandbox}.
 *
 * ```ts
 * import { SandboxAgent } from "sandbox-agent";
 * import { docker } from "sandbox-agent/docker";
 * const sdk = await SandboxAgent.start({ sandbox: docker({ image: "sandbox-agent" }) });
 * const session = await sdk.createSession({ agent: "mock" });
 * console.log((await session.prompt("hello")).stopReason);
 * await sdk.destroySandbox();
 * ```
 */
export class SandboxAgent extends SandboxAgentClient {
  /** The sandbox `start({ sandbox })` made, if any. */
  #sandbox: { instance: SandboxInstance; provider: string } | undefined;
  /** The options its clients for other agents are made with. */
  #clientOptions: SandboxAgentClientOptions | undefined;
  /** Clients of the same server for agents other than this one's, made by `createSession`. */
  readonly #others = new Map<string, SandboxAgentClient>();
  #destroying: Promise<void> | undefined;

  /**
   * A client of the server at `options.baseUrl`; `agent` may be left out
   * (then no connection of its own is opened, and `createSession` names
   * the agent).
   *
   * @throws {TypeError} an option of the wrong type.
   * @throws {SandboxAgentError} as `connect()` (the client is disposed then).
   */
  static override async connect<T extends SandboxAgentClient>(
    this: (new (options: SandboxAgentClientOptions) => T) & { name: string },
    options: SandboxConnectOptions,
  ): Promise<T> {
    if (options !== null && typeof options === "object" && options.agent === undefined) {
      const { agent: _agent, ...rest } = CLIENT_OPTIONS;
      checkFields(`${this.name}.connect`, "options", options, rest);
      const client = new this({ ...options, agent: "", autoConnect: false });
      if (client instanceof SandboxAgent) client.#clientOptions = { ...options, agent: "" };
      return client;
    }
    const client = (await SandboxAgentClient.connect.call(this, options as SandboxAgentClientOptions)) as T;
    if (client instanceof SandboxAgent) client.#clientOptions = options as SandboxAgentClientOptions;
    return client;
  }

  /**
   * With `sandbox`: makes a sandbox with the provider (steps `create`,
   * `start`), waits until its server answers `/v2/health` (step `health`,
   * within `startupTimeoutMs`) and returns a client of it, connected when
   * `agent` is given. Without `sandbox`: seed 001's embedded server
   * (`SandboxAgentClient.start`).
   *
   * @throws {TypeError} an option of the wrong type (`sandbox` without `create`).
   * @throws {SandboxStartError} a step failed (its `step`, the sandbox's
   *   logs; never the token); the sandbox is removed then.
   * @throws {SandboxAgentError} the connection failed (the sandbox is removed then).
   */
  static override async start<T extends SandboxAgentClient>(
    this: (new (options: SandboxAgentClientOptions) => T) & { name: string },
    options: SandboxAgentStartOptions | SandboxStartOptions,
  ): Promise<T> {
    if (options === null || typeof options !== "object" || !("sandbox" in options) || options.sandbox === undefined) {
      return (await SandboxAgentClient.start.call(this, options as SandboxAgentStartOptions)) as T;
    }
    const method = `${this.name}.start`;
    const { sandbox: provider, startupTimeoutMs, ...clientOptions } = options as SandboxStartOptions;
    const { baseUrl: _b, token: _t, agent: _a, ...rest } = CLIENT_OPTIONS;
    checkFields(method, "options", options, { ...rest, agent: "string?", startupTimeoutMs: "number?" });
    if (typeof provider !== "object" || provider === null || typeof provider.create !== "function") {
      throw new TypeError(`${method}: options.sandbox must be a sandbox provider (docker(), local(), or an object with create())`);
    }
    check(method, "options.sandbox.name", provider.name, "string");
    const timeoutMs = startupTimeoutMs ?? 60_000;
    const token = generateToken();
    const controller = new AbortController();
    const timer = setTimeout(() => controller.abort(), timeoutMs);
    let instance: SandboxInstance;
    try {
      instance = await provider.create({ token, signal: controller.signal });
    } catch (error) {
      if (error instanceof SandboxStartError) throw error;
      const message = error instanceof Error ? error.message : String(error);
      throw new SandboxStartError("create", provider.name, message, "", token);
    } finally {
      clearTimeout(timer);
    }
    let client: T;
    try {
      const healthStarted = Date.now();
      await waitHealthy(instance, provider.name, timeoutMs, token);
      (instance.timings as SandboxTimings).healthMs = Date.now() - healthStarted;
      const agent = clientOptions.agent ?? "";
      const full: SandboxAgentClientOptions = { ...clientOptions, agent, baseUrl: instance.baseUrl, token };
      client = new this({ ...full, autoConnect: false });
      if (client instanceof SandboxAgent) {
        client.#sandbox = { instance, provider: provider.name };
        client.#clientOptions = full;
      }
      if (agent !== "" && (clientOptions.autoConnect ?? true)) await client.connect();
    } catch (error) {
      await instance.destroy().catch(() => undefined);
      throw error;
    }
    return client;
  }

  /** The sandbox `start({ sandbox })` made (provider, id, step timings); `undefined` otherwise. */
  get sandbox(): SandboxInfo | undefined {
    const sandbox = this.#sandbox;
    if (sandbox === undefined) return undefined;
    return { provider: sandbox.provider, id: sandbox.instance.id, fleet: sandbox.instance.fleet, timings: { ...sandbox.instance.timings } };
  }

  /**
   * Creates a session on `options.agent` (default this client's agent):
   * on this client's own connection when it is this client's agent, else
   * on a connection of the same server for that agent (opened once, closed
   * by `dispose`/`destroySandbox`).
   *
   * @returns a {@link Session}: `id`, `prompt(content)`, `promptStream(content)`, `cancel()`.
   * @throws {TypeError} an option of the wrong type, or no agent (neither here nor on the client).
   * @throws {SandboxAgentError} the agent failed to start or refused.
   */
  async createSession(options: CreateSessionOptions = {}): Promise<Session> {
    checkFields("createSession", "options", options, { agent: "string?", cwd: "string?", metadata: "object?" });
    const agent = options.agent ?? this.agent;
    if (agent === "") {
      throw new TypeError("createSession: options.agent must be a string (this client was started without an agent)");
    }
    const cwd = options.cwd ?? this.#sandbox?.instance.defaultCwd;
    if (cwd === undefined) throw new TypeError("createSession: options.cwd must be a string (this client has no sandbox to take a default from)");
    const client = await this.#clientFor(agent);
    const details = await client.newSession({ cwd, ...(options.metadata === undefined ? {} : { metadata: options.metadata }) });
    return new Session(client, details.sessionId, agent, cwd);
  }

  async #clientFor(agent: string): Promise<SandboxAgentClient> {
    if (agent === this.agent) {
      await this.connect();
      return this;
    }
    let other = this.#others.get(agent);
    if (other === undefined) {
      const options = this.#clientOptions ?? { baseUrl: this.baseUrl, agent };
      other = new SandboxAgentClient({ ...options, agent, autoConnect: false });
      this.#others.set(agent, other);
    }
    await other.connect();
    return other;
  }

  /** Closes this client's connections (its own and those `createSession` opened) and, after `start({ sandbox })`, destroys the sandbox. */
  override async dispose(): Promise<void> {
    try {
      await Promise.allSettled([...this.#others.values()].map((other) => other.dispose()));
      this.#others.clear();
      await super.dispose();
    } finally {
      await this.#destroy();
    }
  }

  /**
   * Closes the connections and removes the sandbox `start({ sandbox })`
   * made (a container is removed with its volumes). Idempotent; a no-op
   * for the sandbox part after `connect()`. Every later call fails with
   * kind `disposed`.
   */
  async destroySandbox(): Promise<void> {
    await this.dispose();
  }

  #destroy(): Promise<void> {
    const sandbox = this.#sandbox;
    if (sandbox === undefined) return Promise.resolve();
    this.#destroying ??= sandbox.instance.destroy();
    return this.#destroying;
  }
}
