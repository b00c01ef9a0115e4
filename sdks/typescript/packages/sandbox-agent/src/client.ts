/**
 * `SandboxAgentClient`: one agent connection over `acp-http-client` for
 * sessions and prompt turns, plus the server's plain HTTP routes (health,
 * agents, the session inventory, files, processes). What it sends:
 * `research/contract.md`, "The TypeScript packages".
 *
 * Rules (seed 001): the connection opens at construction unless
 * `autoConnect: false`; session calls fail with kind `not-connected` before
 * `connect()` and after `disconnect()`; one connection per instance
 * (`connect()` again while connected is the same connection).
 */
import type {
  AnyNotification,
  AnyRequest,
  CancelNotification,
  ContentBlock,
  InitializeRequest,
  PromptRequest,
  PromptResponse,
  RequestPermissionRequest,
  RequestPermissionResponse,
  SessionNotification,
} from "@agentclientprotocol/sdk";
import { type AcpConnection, AcpHttpConnection, AcpHttpError, AcpWebSocketConnection } from "acp-http-client";
import { type Spec, check, checkCallOptions, checkFields, isObject } from "./check.js";
import { SandboxAgentError } from "./error.js";
import {
  CLIENT_OPTIONS,
  EMBEDDED_SERVER_OPTIONS,
  FS_FIELDS,
  type FsCall,
  LIST_PROCESSES_QUERY,
  LIST_SESSIONS_QUERY,
  MOVE_FIELDS,
  PROCESS_FIELDS,
  type Query,
  fsArgs,
  isPositional,
  pick,
  turnArgs,
} from "./forms.js";
import {
  METHODS,
  META_NAMESPACE,
  NOTIFICATIONS,
  isRecord,
  namespaceOf,
  toDetails,
  toSummary,
  toTurnInterrupted,
} from "./meta.js";
import {
  type HttpCall,
  ProcessHandle,
  type SocketOpener,
  type ProcessInfo,
  type RunProcessRequest,
  type RunResult,
  type StartProcessRequest,
} from "./process.js";
import { checkAnswer } from "./question.js";
import { PromptTurn } from "./turn.js";
import type {
  AgentInfo,
  AgentInstallResult,
  EmbeddedServerOptions,
  FsArchive,
  FsBody,
  FsDeleteRequest,
  FsEntry,
  FsEntryList,
  FsFileStream,
  FsListRequest,
  FsMoveRequest,
  FsOptions,
  FsPathRequest,
  FsReadStreamRequest,
  FsUploadQuery,
  Health,
  ListSessionsQuery,
  LoadSessionRequest,
  ModelList,
  NewSessionOptions,
  PermissionDecision,
  PermissionHandler,
  PromptResult,
  QuestionRequest,
  SandboxAgentClientOptions,
  SandboxAgentStartOptions,
  SessionDetails,
  SessionEventPage,
  SessionPage,
  SessionSummary,
} from "./types.js";

/** This package's version, sent as `clientInfo.version`. */
export const CLIENT_VERSION = "0.1.0";

/** ACP protocol version this client speaks. */
const PROTOCOL_VERSION = 1;

/** Per-call options. */
export interface CallOptions {
  /** Aborting it rejects the call with kind `aborted`. */
  signal?: AbortSignal;
}

/** Per-turn options of `prompt` and `promptStream`. */
export interface PromptOptions {
  /** Aborting it cancels the turn (as {@link SandboxAgentClient.cancel}): it then ends with stop reason `cancelled`. */
  signal?: AbortSignal;
}

/** A client of one sandbox-agent server, bound to one agent. */
export class SandboxAgentClient {
  readonly #options: SandboxAgentClientOptions;
  readonly #baseUrl: string;
  readonly #headers: Record<string, string>;
  readonly #fetch: typeof fetch;
  /** The open connection, if any; replaced by each `connect()` after a disconnect. */
  #connection: AcpConnection | undefined;
  /** The `connect()` in progress, which session calls wait for. */
  #connecting: Promise<void> | undefined;
  /** Why the last connection ended, when it was lost rather than closed. */
  #lost: SandboxAgentError | undefined;
  #disposed = false;
  /** The turn stream of each session with a `promptStream` running. */
  readonly #turns = new Map<string, PromptTurn>();

  /** Stops the private server `start()` started with this client; `undefined` otherwise. */
  #stopServer: (() => Promise<void>) | undefined;

  /**
   * @param options - see {@link SandboxAgentClientOptions}. With
   *   `autoConnect` (the default) the connection starts opening at once; a
   *   failure there is thrown by the first call that needs it (and by
   *   `connect()`).
   * @throws {TypeError} an option of the wrong type (`baseUrl` and `agent` are required strings).
   */
  constructor(options: SandboxAgentClientOptions) {
    checkFields(`new ${new.target.name}`, "options", options, CLIENT_OPTIONS);
    this.#options = options;
    this.#baseUrl = options.baseUrl.replace(/\/+$/, "");
    this.#headers = { ...options.headers };
    if (options.token !== undefined) this.#headers["authorization"] = `Bearer ${options.token}`;
    const f = options.fetch ?? globalThis.fetch;
    this.#fetch = (input, init) => f(input, init);
    if (options.autoConnect ?? true) void this.connect().catch(() => undefined);
  }

  /**
   * Seed 001's way in: a client of the server at `options.baseUrl`, its
   * connection open (unless `autoConnect: false`). On `SandboxAgent` it
   * returns a `SandboxAgent`.
   *
   * @throws {TypeError} an option of the wrong type.
   * @throws {SandboxAgentError} as {@link connect} (the client is disposed then).
   */
  static async connect<T extends SandboxAgentClient>(
    this: (new (options: SandboxAgentClientOptions) => T) & { name: string },
    options: SandboxAgentClientOptions,
  ): Promise<T> {
    checkFields(`${this.name}.connect`, "options", options, CLIENT_OPTIONS);
    const client = new this(options);
    if (options.autoConnect ?? true) await connectOrDispose(client);
    return client;
  }

  /**
   * Seed 001's embedded mode, in Node.js: starts a private server from the
   * `sandbox-agent` binary (`startEmbeddedServer` of `sandbox-agent/node`,
   * with `options.server`; loopback, a random token) and returns a client
   * of it, connected unless `autoConnect: false`. `dispose()` then stops
   * the server too. On `SandboxAgent` it returns a `SandboxAgent`.
   *
   * @throws {TypeError} an option of the wrong type.
   * @throws {Error} not in Node.js, or the server did not start (binary
   *   missing or of another version, start-up timeout; the message says which).
   * @throws {SandboxAgentError} as {@link connect} (the server is stopped then).
   */
  static async start<T extends SandboxAgentClient>(
    this: (new (options: SandboxAgentClientOptions) => T) & { name: string },
    options: SandboxAgentStartOptions,
  ): Promise<T> {
    const method = `${this.name}.start`;
    const { baseUrl: _baseUrl, token: _token, ...startOptions } = CLIENT_OPTIONS;
    checkFields(method, "options", options, startOptions);
    checkFields(method, "options.server", options.server, EMBEDDED_SERVER_OPTIONS, true);
    const runtime = (globalThis as { process?: { versions?: { node?: string } } }).process;
    if (runtime?.versions?.node === undefined) {
      throw new Error(`${method}: starting a server needs Node.js (it runs the sandbox-agent binary); elsewhere use connect({baseUrl})`);
    }
    // Loaded only here, so this entry stays browser-safe (no Node built-in in its imports).
    const node = (await import(NODE_ENTRY)) as {
      startEmbeddedServer(options: EmbeddedServerOptions): Promise<{ baseUrl: string; token: string; stop(): Promise<void> }>;
    };
    const { server: serverOptions, ...clientOptions } = options;
    const server = await node.startEmbeddedServer(serverOptions ?? {});
    let client: T;
    try {
      client = new this({ ...clientOptions, baseUrl: server.baseUrl, token: server.token });
    } catch (error) {
      await server.stop();
      throw error;
    }
    client.#stopServer = () => server.stop();
    if (options.autoConnect ?? true) await connectOrDispose(client);
    return client;
  }

  /** The agent id this client's sessions run on. */
  get agent(): string {
    return this.#options.agent;
  }

  /** The server's root URL (the private server's, after `start()`). */
  get baseUrl(): string {
    return this.#baseUrl;
  }

  /** `true` while a connection is open. */
  get connected(): boolean {
    return this.#connection !== undefined && !this.#connection.closed;
  }

  /** The server's id of the open connection (`x-acp-connection-id`), if any (not over a WebSocket). */
  get connectionId(): string | undefined {
    return this.connected ? this.#connection?.connectionId : undefined;
  }

  /**
   * Opens the connection to the agent (`initialize`), starting the agent
   * process at the server if needed (installing it first if it is not).
   * Resolves at once when already connected; waits for a connect in
   * progress.
   *
   * @throws {SandboxAgentError} `http` (401 wrong token, 404 unknown agent,
   *   502 agent failed to start), `connection-lost` (no server), `disposed`.
   */
  connect(): Promise<void> {
    if (this.#disposed) return Promise.reject(disposedError());
    if (this.#connecting !== undefined) return this.#connecting;
    if (this.connected) return Promise.resolve();
    this.#connecting = this.#open().finally(() => (this.#connecting = undefined));
    return this.#connecting;
  }

  async #open(): Promise<void> {
    const params: InitializeRequest = {
      protocolVersion: PROTOCOL_VERSION,
      // Questions reach only connections that declare their modes ("Agent questions").
      clientCapabilities: this.#options.onQuestion === undefined ? {} : { elicitation: { form: {}, url: {} } },
      clientInfo: { name: "sandbox-agent (TypeScript)", version: CLIENT_VERSION },
      _meta: { [META_NAMESPACE]: { agent: this.#options.agent } },
    };
    const handlers = {
      fetch: this.#fetch,
      ...(this.#options.requestTimeoutMs === undefined ? {} : { requestTimeoutMs: this.#options.requestTimeoutMs }),
      onNotification: (notification: AnyNotification) => this.#onNotification(notification),
      onRequest: (request: AnyRequest) => this.#onRequest(request),
      onClose: (error: AcpHttpError | undefined) => {
        if (error !== undefined) this.#lost = SandboxAgentError.from(error);
      },
    };
    try {
      const connection: AcpConnection =
        this.#options.transport === "websocket"
          ? await AcpWebSocketConnection.open(params, {
              baseUrl: this.#baseUrl,
              ...(this.#options.token === undefined ? {} : { token: this.#options.token }),
              ...(this.#options.WebSocket === undefined ? {} : { WebSocket: this.#options.WebSocket }),
              ...handlers,
            })
          : await AcpHttpConnection.open(params, { baseUrl: this.#baseUrl, headers: this.#headers, ...handlers });
      this.#lost = undefined;
      this.#connection = connection;
      if (this.#disposed) await connection.close();
    } catch (error) {
      // Kept for the calls that follow (an auto-connect nobody awaited), until a connect() succeeds.
      this.#lost = SandboxAgentError.from(error);
      throw this.#lost;
    }
  }

  /**
   * Closes the connection (DELETE). Sessions live on at the server; session
   * calls fail with `not-connected` until `connect()` again. Turns still
   * running reject with kind `closed`.
   */
  async disconnect(): Promise<void> {
    await this.#connecting?.catch(() => undefined);
    const connection = this.#connection;
    this.#connection = undefined;
    this.#lost = undefined;
    await connection?.close();
  }

  /** Disconnects for good: every later call fails with kind `disposed`; stops the server `start()` started. */
  async dispose(): Promise<void> {
    this.#disposed = true;
    try {
      await this.disconnect();
    } finally {
      const stop = this.#stopServer;
      this.#stopServer = undefined;
      await stop?.();
    }
  }

  // ---- server ----

  /** `GET /v2/health`: the server's status (needs no token). */
  async getHealth(options: CallOptions = {}): Promise<Health> {
    checkCallOptions("getHealth", options);
    return this.#json<Health>("GET", "/v2/health", options);
  }

  /** `GET /v2/agents`: every configured agent, installed or not. */
  async listAgents(options: CallOptions = {}): Promise<{ agents: AgentInfo[] }> {
    checkCallOptions("listAgents", options);
    return this.#json("GET", "/v2/agents", options);
  }

  /**
   * `POST /v2/agents/{agent}/install`: installs an agent (default: this
   * client's). `version` is an npm version, dist-tag or range.
   *
   * @throws {SandboxAgentError} 404 unknown agent, 409 not installable, 502 install failed.
   */
  async installAgent(
    agent: string = this.#options.agent,
    install: { version?: string; reinstall?: boolean } = {},
    options: CallOptions = {},
  ): Promise<AgentInstallResult> {
    check("installAgent", "agent", agent, "string");
    checkFields("installAgent", "install", install, { version: "string?", reinstall: "boolean?" });
    checkCallOptions("installAgent", options);
    return this.#json("POST", `/v2/agents/${encodeURIComponent(agent)}/install`, options, { json: install });
  }

  // ---- sessions ----

  /**
   * Creates a session on this client's agent. `request` is ACP's
   * `NewSessionRequest` (`{cwd, mcpServers, _meta?, …}`, as seed 001's
   * client sent it; `mcpServers` may be left out) plus `metadata`, stored
   * with the session.
   *
   * @returns the session (`sessionId`, its metadata, modes and options).
   * @throws {TypeError} `cwd` not a string, `mcpServers` not an array, `metadata` or `_meta` not an object.
   * @throws {SandboxAgentError} `not-connected`, `rpc` (the agent refused).
   */
  async newSession(request: NewSessionOptions, options: CallOptions = {}): Promise<SessionDetails> {
    checkFields("newSession", "request", request, { cwd: "string", mcpServers: "array?", metadata: "object?" });
    if (request._meta !== null) check("newSession", "request._meta", request._meta, "object?");
    checkCallOptions("newSession", options);
    const { metadata, _meta, mcpServers, ...rest } = request;
    const result = await this.#call<Record<string, unknown>>(
      "session/new",
      {
        ...rest,
        mcpServers: mcpServers ?? [],
        _meta: { ..._meta, [META_NAMESPACE]: { ...namespaceOf(_meta), ...metadata, agent: this.#options.agent } },
      },
      options,
    );
    return toDetails(String(result["sessionId"]), request.cwd, result);
  }

  /**
   * Takes up an existing session on this connection (after a `disconnect()`,
   * from another client, or one the server restored); its history is
   * replayed to `onSessionUpdate` before this resolves. Two forms: ACP's
   * `LoadSessionRequest` (`{sessionId, cwd, mcpServers?}`, seed 001's), or
   * `(sessionId, {cwd, mcpServers?})`.
   *
   * @throws {TypeError} `sessionId` or `cwd` not a string.
   * @throws {SandboxAgentError} `rpc` with {@link SandboxAgentError.isNotFound} for an unknown session.
   */
  loadSession(request: LoadSessionRequest, options?: CallOptions): Promise<SessionDetails>;
  loadSession(
    sessionId: string,
    params: { cwd: string; mcpServers?: NewSessionOptions["mcpServers"] },
    options?: CallOptions,
  ): Promise<SessionDetails>;
  async loadSession(
    first: string | LoadSessionRequest,
    second?: { cwd: string; mcpServers?: NewSessionOptions["mcpServers"] } | CallOptions,
    third?: CallOptions,
  ): Promise<SessionDetails> {
    const method = "loadSession";
    let request: LoadSessionRequest;
    let options: unknown;
    if (isPositional(method, "sessionId", first, "{sessionId, cwd, mcpServers?}")) {
      checkFields(method, "params", second, { cwd: "string", mcpServers: "array?" });
      const params = second as { cwd: string; mcpServers?: NewSessionOptions["mcpServers"] };
      request = { sessionId: first, cwd: params.cwd, mcpServers: params.mcpServers };
      options = third;
    } else {
      checkFields(method, "request", first, { sessionId: "string", cwd: "string", mcpServers: "array?" });
      request = first;
      options = second;
    }
    checkCallOptions(method, options);
    const { mcpServers, ...rest } = request;
    const result = await this.#call<Record<string, unknown> | null>(
      "session/load",
      { ...rest, mcpServers: mcpServers ?? [] },
      (options ?? {}) as CallOptions,
    );
    return toDetails(request.sessionId, request.cwd, result ?? {});
  }

  /**
   * Sends a prompt and resolves when the turn ends. The turn's updates go to
   * `onSessionUpdate`; see {@link promptStream} to read them as an iterator.
   * Two forms: ACP's `PromptRequest` (`{sessionId, prompt: ContentBlock[]}`,
   * seed 001's), answered with ACP's `PromptResponse` (`{stopReason,
   * _meta?}`, as the agent sent it); or `(sessionId, text | ContentBlock[])`,
   * answered `{stopReason}`.
   *
   * @throws {TypeError} `sessionId` not a string, `prompt` not text or an array of content blocks.
   * @throws {SandboxAgentError} `not-connected`, `rpc` (the agent refused, an unknown session).
   */
  prompt(request: PromptRequest, options?: PromptOptions): Promise<PromptResponse>;
  prompt(sessionId: string, prompt: string | ContentBlock[], options?: PromptOptions): Promise<PromptResult>;
  async prompt(
    first: string | PromptRequest,
    second?: string | ContentBlock[] | PromptOptions,
    third?: PromptOptions,
  ): Promise<PromptResponse | PromptResult> {
    const turn = turnArgs("prompt", first, second, third);
    const response = await this.#runTurn(turn.request, turn.options, undefined);
    return turn.positional ? { stopReason: response.stopReason } : response;
  }

  /**
   * Sends a prompt and returns the running turn: iterate it for the turn's
   * updates (they also go to `onSessionUpdate`), await `turn.result` for
   * the stop reason. One turn stream per session at a time (a newer one
   * takes the updates over). The same two forms as {@link prompt}.
   *
   * ```ts
   * const turn = client.promptStream(session.sessionId, "hello");
   * for await (const update of turn) {
   *   if (update.sessionUpdate === "agent_message_chunk" && update.content.type === "text") {
   *     process.stdout.write(update.content.text);
   *   }
   * }
   * console.log((await turn.result).stopReason);
   * ```
   *
   * @throws {TypeError} (at once, not from the turn) as {@link prompt}.
   */
  promptStream(request: PromptRequest, options?: PromptOptions): PromptTurn;
  promptStream(sessionId: string, prompt: string | ContentBlock[], options?: PromptOptions): PromptTurn;
  promptStream(first: string | PromptRequest, second?: string | ContentBlock[] | PromptOptions, third?: PromptOptions): PromptTurn {
    const { request, options } = turnArgs("promptStream", first, second, third);
    return new PromptTurn(
      request.sessionId,
      async (turn) => ({ stopReason: (await this.#runTurn(request, options, turn)).stopReason }),
      () => this.cancel(request.sessionId),
    );
  }

  async #runTurn(request: PromptRequest, options: PromptOptions, turn: PromptTurn | undefined): Promise<PromptResponse> {
    const { sessionId } = request;
    const onAbort = (): void => void this.cancel(sessionId).catch(() => undefined);
    if (turn !== undefined) this.#turns.set(sessionId, turn);
    options.signal?.addEventListener("abort", onAbort, { once: true });
    try {
      if (options.signal?.aborted) onAbort();
      // Turns take as long as the agent needs: no client-side limit.
      return await this.#call<PromptResponse>("session/prompt", { ...request }, {}, { noTimeout: true });
    } finally {
      options.signal?.removeEventListener("abort", onAbort);
      if (turn !== undefined && this.#turns.get(sessionId) === turn) this.#turns.delete(sessionId);
    }
  }

  /**
   * Asks the agent to stop the session's running turn (it ends with stop
   * reason `cancelled`). Takes ACP's `CancelNotification` (`{sessionId}`,
   * seed 001's) or the session id.
   *
   * @throws {TypeError} `sessionId` not a string.
   */
  cancel(notification: CancelNotification): Promise<void>;
  cancel(sessionId: string): Promise<void>;
  async cancel(first: string | CancelNotification): Promise<void> {
    let params: CancelNotification;
    if (isPositional("cancel", "sessionId", first, "{sessionId}")) {
      params = { sessionId: first };
    } else {
      checkFields("cancel", "notification", first, { sessionId: "string" });
      params = first;
    }
    const connection = await this.#connectionForCall("session/cancel");
    try {
      await connection.notify("session/cancel", { ...params });
    } catch (error) {
      throw SandboxAgentError.from(error);
    }
  }

  /**
   * The models of a session (with the current one), or of this client's
   * agent when no `sessionId` is given: `listModels({sessionId})` (seed
   * 001's) or `listModels(sessionId?)`.
   *
   * @throws {TypeError} `sessionId` not a string.
   */
  listModels(request: { sessionId?: string }, options?: CallOptions): Promise<ModelList>;
  listModels(sessionId?: string, options?: CallOptions): Promise<ModelList>;
  async listModels(first?: string | { sessionId?: string }, options: CallOptions = {}): Promise<ModelList> {
    let sessionId: string | undefined;
    if (first === undefined || isPositional("listModels", "sessionId", first, "{sessionId?}")) {
      sessionId = first;
    } else {
      checkFields("listModels", "request", first, { sessionId: "string?" });
      sessionId = first.sessionId;
    }
    checkCallOptions("listModels", options);
    const params = sessionId === undefined ? { agent: this.#options.agent } : { sessionId };
    return this.#call(METHODS.listModels, params, options);
  }

  /**
   * Merges `metadata` into the session's stored metadata (JSON Merge Patch:
   * `null` removes a key). A string `title`, `model` or `mode` also sets
   * those fields. Nothing is sent to the agent.
   *
   * @throws {TypeError} `sessionId` not a string, `metadata` not an object.
   */
  async setMetadata(sessionId: string, metadata: Record<string, unknown>, options: CallOptions = {}): Promise<SessionSummary> {
    check("setMetadata", "sessionId", sessionId, "string");
    check("setMetadata", "metadata", metadata, "object");
    checkCallOptions("setMetadata", options);
    return toSummary(await this.#call<Record<string, unknown>>(METHODS.setMetadata, { sessionId, metadata }, options));
  }

  /**
   * One session from the server's inventory (`GET /v2/sessions/{id}`, of
   * this client's agent, or of any agent on a `SandboxAgent` made without
   * one). Needs no connection.
   *
   * @throws {TypeError} `sessionId` not a string.
   * @throws {SandboxAgentError} {@link SandboxAgentError.isNotFound} for an unknown session.
   */
  async getSession(sessionId: string, options: CallOptions = {}): Promise<SessionSummary> {
    check("getSession", "sessionId", sessionId, "string");
    checkCallOptions("getSession", options);
    const entry = await this.#json<Record<string, unknown>>(
      "GET",
      `/v2/sessions/${encodeURIComponent(sessionId)}`,
      options,
      { query: { agent: this.#options.agent || undefined } },
    );
    return toSummary(entry);
  }

  /**
   * One page of the server's session inventory (`GET /v2/sessions`), newest
   * first, every agent unless `query.agent`. Needs no connection.
   *
   * @throws {TypeError} a `query` field of the wrong type.
   */
  async listSessions(query: ListSessionsQuery = {}, options: CallOptions = {}): Promise<SessionPage> {
    checkFields("listSessions", "query", query, LIST_SESSIONS_QUERY);
    checkCallOptions("listSessions", options);
    const page = await this.#json<{ sessions: Record<string, unknown>[]; nextCursor?: string }>(
      "GET",
      "/v2/sessions",
      options,
      { query: pick(query, LIST_SESSIONS_QUERY) },
    );
    return pageOf(page);
  }

  /**
   * The same inventory through the agent connection (ACP `session/list`,
   * 50 a page, optional `cwd` filter). Named "unstable" as in seed 001: the
   * method is not in every ACP version.
   *
   * @throws {TypeError} `cwd` or `cursor` not a string.
   */
  async unstableListSessions(params: { cwd?: string; cursor?: string } = {}, options: CallOptions = {}): Promise<SessionPage> {
    checkFields("unstableListSessions", "params", params, { cwd: "string?", cursor: "string?" });
    checkCallOptions("unstableListSessions", options);
    return pageOf(await this.#call("session/list", params, options));
  }

  /**
   * This connection stops receiving the session's updates; the session and its turn go on.
   *
   * @throws {TypeError} `sessionId` not a string.
   */
  async detachSession(sessionId: string, options: CallOptions = {}): Promise<void> {
    check("detachSession", "sessionId", sessionId, "string");
    checkCallOptions("detachSession", options);
    await this.#call(METHODS.detach, { sessionId }, options);
  }

  /**
   * Ends the session for good (its running turn is cancelled).
   *
   * @throws {TypeError} `sessionId` not a string.
   */
  async terminateSession(sessionId: string, options: CallOptions = {}): Promise<{ sessionId: string; alreadyEnded: boolean }> {
    check("terminateSession", "sessionId", sessionId, "string");
    checkCallOptions("terminateSession", options);
    return this.#call(METHODS.terminate, { sessionId }, options);
  }

  /**
   * One page of the session's event log (`GET /v2/sessions/{id}/events`):
   * every message of the session in order, from `offset` (default 0), at
   * most `limit` (1 to 1000, default 100). Needs no connection.
   *
   * @throws {TypeError} `sessionId` not a string, `offset` or `limit` not a number.
   */
  async getSessionEvents(
    sessionId: string,
    page: { offset?: number; limit?: number } = {},
    options: CallOptions = {},
  ): Promise<SessionEventPage> {
    check("getSessionEvents", "sessionId", sessionId, "string");
    checkFields("getSessionEvents", "page", page, { offset: "number?", limit: "number?" });
    checkCallOptions("getSessionEvents", options);
    return this.#json("GET", `/v2/sessions/${encodeURIComponent(sessionId)}/events`, options, {
      query: { offset: page.offset, limit: page.limit, agent: this.#options.agent || undefined },
    });
  }

  // ---- files (the sandbox's file system, "Host file system") ----
  //
  // Each call takes seed 001's request object (`mkdirFs({path, sessionId?})`)
  // or today's positional form (`mkdirFs(path, {sessionId?})`).

  /**
   * The entries of a directory (default: the session's `cwd`, else the
   * server's), sorted by name. `listFsEntries({path?, sessionId?})` (seed
   * 001's) answers the entries as an array with a `truncated` property;
   * `listFsEntries(path?, {sessionId?})` answers `{entries, truncated}`.
   *
   * @throws {TypeError} `path` or `sessionId` not a string.
   * @throws {SandboxAgentError} 404 nothing there, 409 not a directory.
   */
  listFsEntries(request: FsListRequest, options?: CallOptions): Promise<FsEntryList>;
  listFsEntries(path?: string, fs?: FsOptions, options?: CallOptions): Promise<{ entries: FsEntry[]; truncated?: boolean }>;
  async listFsEntries(
    first: string | FsListRequest = ".",
    second?: FsOptions | CallOptions,
    third?: CallOptions,
  ): Promise<FsEntryList | { entries: FsEntry[]; truncated?: boolean }> {
    const call = fsArgs("listFsEntries", isObject(first) ? { path: ".", ...first } : first, second, third);
    const page = await this.#json<{ entries: FsEntry[]; truncated?: boolean }>("GET", "/v2/fs/entries", call.options, {
      query: call.query,
    });
    if (call.positional) return page;
    return Object.assign([...page.entries], { truncated: page.truncated === true });
  }

  /**
   * One entry: `statFs({path, sessionId?})` or `statFs(path, {sessionId?})`.
   *
   * @throws {TypeError} `path` or `sessionId` not a string.
   * @throws {SandboxAgentError} {@link SandboxAgentError.isNotFound} when nothing is there.
   */
  statFs(request: FsPathRequest, options?: CallOptions): Promise<FsEntry>;
  statFs(path: string, fs?: FsOptions, options?: CallOptions): Promise<FsEntry>;
  async statFs(first: string | FsPathRequest, second?: FsOptions | CallOptions, third?: CallOptions): Promise<FsEntry> {
    const call = fsArgs("statFs", first, second, third);
    return this.#json("GET", "/v2/fs/stat", call.options, { query: call.query });
  }

  /**
   * Creates a directory and its parents (an existing one is fine):
   * `mkdirFs({path, sessionId?})` or `mkdirFs(path, {sessionId?})`.
   *
   * @returns its absolute path.
   * @throws {TypeError} `path` or `sessionId` not a string.
   */
  mkdirFs(request: FsPathRequest, options?: CallOptions): Promise<{ path: string }>;
  mkdirFs(path: string, fs?: FsOptions, options?: CallOptions): Promise<{ path: string }>;
  async mkdirFs(first: string | FsPathRequest, second?: FsOptions | CallOptions, third?: CallOptions): Promise<{ path: string }> {
    const call = fsArgs("mkdirFs", first, second, third);
    return this.#json("POST", "/v2/fs/mkdir", call.options, { query: call.query });
  }

  /**
   * Moves `from` to `to` (the parent of `to` must exist; `overwrite`
   * replaces an entry there): `moveFs({from, to, overwrite?}, {sessionId?})`
   * (seed 001's) or `moveFs(from, to, {overwrite?, sessionId?})`.
   *
   * @throws {TypeError} `from`, `to` or `sessionId` not a string, `overwrite` not a boolean.
   * @throws {SandboxAgentError} 404 no `from`, 409 `to` exists (without `overwrite`).
   */
  moveFs(request: FsMoveRequest, query?: FsOptions, options?: CallOptions): Promise<{ from: string; to: string }>;
  moveFs(from: string, to: string, move?: FsOptions & { overwrite?: boolean }, options?: CallOptions): Promise<{ from: string; to: string }>;
  async moveFs(
    first: string | FsMoveRequest,
    second?: string | FsOptions,
    third?: (FsOptions & { overwrite?: boolean }) | CallOptions,
    fourth?: CallOptions,
  ): Promise<{ from: string; to: string }> {
    const method = "moveFs";
    let body: Record<string, unknown>;
    let options: unknown;
    if (isPositional(method, "from", first, "{from, to, overwrite?}")) {
      check(method, "to", second, "string");
      checkFields(method, "move", third, MOVE_FIELDS, true);
      body = { from: first, to: second, ...pick(third ?? {}, MOVE_FIELDS) };
      options = fourth;
    } else {
      checkFields(method, "request", first, { from: "string", to: "string", ...MOVE_FIELDS });
      checkFields(method, "query", second, FS_FIELDS, true);
      body = { from: first.from, to: first.to, ...pick(first, MOVE_FIELDS), ...pick((second ?? {}) as FsOptions, FS_FIELDS) };
      options = third;
    }
    checkCallOptions(method, options);
    return this.#json("POST", "/v2/fs/move", (options ?? {}) as CallOptions, { json: body });
  }

  /**
   * Deletes a file, or a directory (`recursive` for a non-empty one):
   * `deleteFsEntry({path, recursive?, sessionId?})` or
   * `deleteFsEntry(path, {recursive?, sessionId?})`.
   *
   * @throws {TypeError} `path` or `sessionId` not a string, `recursive` not a boolean.
   * @throws {SandboxAgentError} 404 nothing there, 409 a non-empty directory without `recursive`.
   */
  deleteFsEntry(request: FsDeleteRequest, options?: CallOptions): Promise<{ path: string }>;
  deleteFsEntry(path: string, fs?: FsOptions & { recursive?: boolean }, options?: CallOptions): Promise<{ path: string }>;
  async deleteFsEntry(
    first: string | FsDeleteRequest,
    second?: (FsOptions & { recursive?: boolean }) | CallOptions,
    third?: CallOptions,
  ): Promise<{ path: string }> {
    const call = fsArgs("deleteFsEntry", first, second, third, { recursive: "boolean?" });
    return this.#json("DELETE", "/v2/fs/entry", call.options, { query: call.query });
  }

  /**
   * The bytes of a file: `readFsFile({path, sessionId?})` or
   * `readFsFile(path, {sessionId?})`.
   *
   * @throws {TypeError} `path` or `sessionId` not a string.
   * @throws {SandboxAgentError} 404 nothing there, 409 a directory.
   */
  readFsFile(request: FsPathRequest, options?: CallOptions): Promise<Uint8Array>;
  readFsFile(path: string, fs?: FsOptions, options?: CallOptions): Promise<Uint8Array>;
  async readFsFile(first: string | FsPathRequest, second?: FsOptions | CallOptions, third?: CallOptions): Promise<Uint8Array> {
    const call = fsArgs("readFsFile", first, second, third);
    const response = await this.#http("GET", "/v2/fs/file", call.options, { query: call.query });
    return new Uint8Array(await response.arrayBuffer());
  }

  /**
   * A file as a stream, for files too large to hold in memory:
   * `readFsFileStream({path, sessionId?, from?, etag?})` or
   * `readFsFileStream(path, {sessionId?, from?, etag?})`. With `from`
   * (a byte offset) and the `etag` of an earlier download, asks for the
   * rest only (`Range` with `If-Range`): `offset` is then `from` when the
   * file is unchanged, or 0 when it changed and the whole new file comes
   * (start over, never append).
   *
   * @returns the body stream, where its first byte belongs (`offset`), the
   *   file's `size` (bytes) and `etag` (for a later resume).
   * @throws {TypeError} `path`, `sessionId` or `etag` not a string, `from` not a number.
   */
  readFsFileStream(request: FsReadStreamRequest, options?: CallOptions): Promise<FsFileStream>;
  readFsFileStream(path: string, fs?: FsOptions & { from?: number; etag?: string }, options?: CallOptions): Promise<FsFileStream>;
  async readFsFileStream(
    first: string | FsReadStreamRequest,
    second?: (FsOptions & { from?: number; etag?: string }) | CallOptions,
    third?: CallOptions,
  ): Promise<FsFileStream> {
    const call = fsArgs("readFsFileStream", first, second, third, { from: "number?", etag: "string?" });
    const { from, etag, ...query } = call.query;
    const headers: Record<string, string> = {};
    if (typeof from === "number" && from > 0) {
      headers["range"] = `bytes=${from}-`;
      if (typeof etag === "string") headers["if-range"] = etag;
    }
    const response = await this.#http("GET", "/v2/fs/file", call.options, { query, headers });
    const partial = response.status === 206;
    // `Content-Range: bytes a-b/size` on a 206; `Content-Length` is the size on a 200.
    const range = /\/(\d+)$/.exec(response.headers.get("content-range") ?? "");
    const length = response.headers.get("content-length");
    const size = range?.[1] !== undefined ? Number(range[1]) : length !== null && !partial ? Number(length) : undefined;
    const body = response.body ?? new ReadableStream<Uint8Array>({ start: (c) => c.close() });
    return {
      stream: body,
      offset: partial && typeof from === "number" ? from : 0,
      size,
      etag: response.headers.get("etag") ?? undefined,
    };
  }

  /**
   * Writes a file whole (atomically: readers never see half of it), creating
   * its parent directories: `writeFsFile({path, sessionId?}, body)` (seed
   * 001's) or `writeFsFile(path, body, {sessionId?})`. A `ReadableStream`
   * body is streamed; a string is sent as UTF-8.
   *
   * @returns the absolute path and the bytes written.
   * @throws {TypeError} `path` or `sessionId` not a string, `content` not a
   *   string, `Uint8Array`, `ArrayBuffer`, `Blob` or `ReadableStream`.
   */
  writeFsFile(request: FsPathRequest, content: FsBody, options?: CallOptions): Promise<{ path: string; bytesWritten: number }>;
  writeFsFile(path: string, content: FsBody, fs?: FsOptions, options?: CallOptions): Promise<{ path: string; bytesWritten: number }>;
  async writeFsFile(
    first: string | FsPathRequest,
    content: FsBody,
    third?: FsOptions | CallOptions,
    fourth?: CallOptions,
  ): Promise<{ path: string; bytesWritten: number }> {
    const call = fsArgs("writeFsFile", first, third, fourth);
    check("writeFsFile", "content", content, "body");
    const result = await this.#json<{ path: string; bytesWritten: number }>("PUT", "/v2/fs/file", call.options, {
      query: call.query,
      body: content,
      contentType: "application/octet-stream",
    });
    return { path: result.path, bytesWritten: result.bytesWritten };
  }

  /**
   * Unpacks a tar archive (gzip-compressed or not) into directory `path`,
   * creating it: `uploadFsBatch(archive, {path, sessionId?, gzip?})` (seed
   * 001's) or `uploadFsBatch(path, archive, {sessionId?, gzip?})`. Unsafe
   * entries fail the archive (`invalid-archive`).
   *
   * @returns the paths written and whether that list was cut short.
   * @throws {TypeError} `path` or `sessionId` not a string, `archive` not
   *   a `Uint8Array`, `ArrayBuffer`, `Blob` or `ReadableStream`, `gzip` not a boolean.
   */
  uploadFsBatch(archive: FsArchive, query: FsUploadQuery, options?: CallOptions): Promise<{ paths: string[]; truncated: boolean }>;
  uploadFsBatch(
    path: string,
    archive: FsArchive,
    fs?: FsOptions & { gzip?: boolean },
    options?: CallOptions,
  ): Promise<{ paths: string[]; truncated: boolean }>;
  async uploadFsBatch(
    first: string | FsArchive,
    second: FsArchive | FsUploadQuery,
    third?: (FsOptions & { gzip?: boolean }) | CallOptions,
    fourth?: CallOptions,
  ): Promise<{ paths: string[]; truncated: boolean }> {
    const method = "uploadFsBatch";
    const fields: Record<string, Spec> = { ...FS_FIELDS, gzip: "boolean?" };
    let archive: unknown;
    let call: FsCall;
    if (typeof first === "string") {
      archive = second;
      call = fsArgs(method, first, third, fourth, { gzip: "boolean?" });
    } else {
      archive = first;
      // The archive first: `uploadFsBatch({path}, bytes)` has the arguments swapped.
      check(method, "archive", archive, "bytes");
      checkFields(method, "query", second, { path: "string", ...fields });
      checkCallOptions(method, third);
      call = { query: pick(second as FsUploadQuery, { path: "string", ...fields }), options: (third ?? {}) as CallOptions, positional: false };
    }
    check(method, "archive", archive, "bytes");
    const { gzip, ...query } = call.query;
    const head = archive instanceof ArrayBuffer ? new Uint8Array(archive) : archive instanceof Uint8Array ? archive : undefined;
    const gz = typeof gzip === "boolean" ? gzip : head?.[0] === 0x1f && head[1] === 0x8b;
    return this.#json("POST", "/v2/fs/upload-batch", call.options, {
      query,
      body: archive as FsArchive,
      contentType: gz ? "application/gzip" : "application/x-tar",
    });
  }

  // ---- processes ("Processes and terminals"; plain HTTP, no connection needed) ----

  /**
   * Runs a program to completion and returns its exit and output. No
   * client-side time limit: bound it with `timeoutMs` (the server kills the
   * process then).
   *
   * @throws {TypeError} `command` not a string, another field of the wrong type.
   * @throws {SandboxAgentError} 400 `program-not-found`, 429 `too-many-processes`, 404 `processes-disabled`.
   */
  async runProcess(request: RunProcessRequest, options: CallOptions = {}): Promise<RunResult> {
    checkFields("runProcess", "request", request, { ...PROCESS_FIELDS, timeoutMs: "number?", maxOutputBytes: "number?" });
    checkCallOptions("runProcess", options);
    return this.#json("POST", "/v2/processes/run", options, { json: request, noTimeout: true });
  }

  /**
   * Starts a program and returns its handle (output, stdin, signals, wait); the process runs on after the handle is dropped.
   *
   * @throws {TypeError} `command` not a string, another field of the wrong type.
   */
  async startProcess(request: StartProcessRequest, options: CallOptions = {}): Promise<ProcessHandle> {
    checkFields("startProcess", "request", request, {
      ...PROCESS_FIELDS,
      tty: "boolean?",
      cols: "number?",
      rows: "number?",
      title: "string?",
    });
    checkCallOptions("startProcess", options);
    const info = await this.#json<ProcessInfo>("POST", "/v2/processes", options, { json: request });
    return new ProcessHandle(info, this.#processHttp, this.#openSocket);
  }

  /**
   * One page of processes, newest first (`limit` 1 to 1000, default 100).
   *
   * @throws {TypeError} a `query` field of the wrong type.
   */
  async listProcesses(
    query: { limit?: number; cursor?: string; sessionId?: string; state?: "running" | "exited" } = {},
    options: CallOptions = {},
  ): Promise<{ processes: ProcessInfo[]; nextCursor?: string }> {
    checkFields("listProcesses", "query", query, LIST_PROCESSES_QUERY);
    checkCallOptions("listProcesses", options);
    return this.#json("GET", "/v2/processes", options, { query: pick(query, LIST_PROCESSES_QUERY) });
  }

  /**
   * One process.
   *
   * @throws {TypeError} `id` not a string.
   * @throws {SandboxAgentError} {@link SandboxAgentError.isNotFound} for an unknown (or forgotten) id.
   */
  async getProcess(id: string, options: CallOptions = {}): Promise<ProcessInfo> {
    check("getProcess", "id", id, "string");
    checkCallOptions("getProcess", options);
    return this.#json("GET", `/v2/processes/${encodeURIComponent(id)}`, options);
  }

  /**
   * A handle for an existing process (one `listProcesses` showed, say).
   *
   * @throws {TypeError} `id` not a string.
   */
  async processHandle(id: string, options: CallOptions = {}): Promise<ProcessHandle> {
    check("processHandle", "id", id, "string");
    return new ProcessHandle(await this.getProcess(id, options), this.#processHttp, this.#openSocket);
  }

  /** The plain HTTP helper, as process handles call it. */
  readonly #processHttp: HttpCall = (method, path, request = {}) =>
    this.#http(method, path, request.signal === undefined ? {} : { signal: request.signal }, request);

  /** WebSockets on the server (a process's terminal): the token as `?access_token=`, which browsers need. */
  readonly #openSocket: SocketOpener = (path, query) => {
    const Socket = this.#options.WebSocket ?? globalThis.WebSocket;
    if (Socket === undefined) {
      throw new TypeError("no WebSocket in this runtime: pass options.WebSocket (Node 20: run node with --experimental-websocket)");
    }
    const url = new URL(this.#baseUrl.replace(/^http/, "ws") + path);
    for (const [key, value] of Object.entries(query)) url.searchParams.set(key, value);
    if (this.#options.token !== undefined) url.searchParams.set("access_token", this.#options.token);
    return new Socket(url.toString());
  };

  // ---- plumbing ----

  /** The open connection, waiting for a connect in progress. */
  async #connectionForCall(what: string): Promise<AcpConnection> {
    if (this.#disposed) throw disposedError();
    if (this.#connecting !== undefined) await this.#connecting;
    const connection = this.#connection;
    if (connection === undefined || connection.closed) {
      if (this.#lost !== undefined) throw this.#lost;
      throw new SandboxAgentError("not-connected", `${what}: not connected; call connect() first`);
    }
    return connection;
  }

  async #call<T>(method: string, params: unknown, options: CallOptions, extra: { noTimeout?: boolean } = {}): Promise<T> {
    const connection = await this.#connectionForCall(method);
    try {
      return await connection.request<T>(method, params, {
        ...(options.signal === undefined ? {} : { signal: options.signal }),
        ...(extra.noTimeout ? { timeoutMs: null } : {}),
      });
    } catch (error) {
      throw SandboxAgentError.from(error);
    }
  }

  #onNotification(notification: AnyNotification): void {
    if (notification.method === NOTIFICATIONS.turnInterrupted) {
      const interrupted = toTurnInterrupted(notification.params);
      if (interrupted !== undefined) this.#options.onTurnInterrupted?.(interrupted);
      return;
    }
    if (notification.method !== "session/update" || !isRecord(notification.params)) return;
    const event = notification.params as SessionNotification;
    this.#turns.get(event.sessionId)?.push(event.update);
    this.#options.onSessionUpdate?.(event);
  }

  async #onRequest(request: AnyRequest): Promise<unknown> {
    if (request.method === "session/request_permission") {
      return answerPermission(request.params as RequestPermissionRequest, this.#options.onPermissionRequest);
    }
    if (request.method === "elicitation/create" && this.#options.onQuestion !== undefined) {
      const question = request.params as QuestionRequest;
      try {
        const answer = await this.#options.onQuestion(question);
        // Content that does not fit the form is never sent (check it first with checkAnswer).
        return checkAnswer(question, answer) === undefined ? answer : { action: "cancel" };
      } catch {
        return { action: "cancel" };
      }
    }
    throw { code: -32601, message: `method not found: ${request.method} (this client does not serve it)` };
  }

  /** One plain HTTP route; non-2xx answers become `SandboxAgentError`. */
  async #http(
    method: string,
    path: string,
    options: CallOptions,
    request: HttpRequest = {},
  ): Promise<Response> {
    if (this.#disposed) throw disposedError();
    let url = this.#baseUrl + path;
    const query = new URLSearchParams();
    for (const [key, value] of Object.entries(request.query ?? {})) {
      if (value !== undefined) query.set(key, String(value));
    }
    if ([...query.keys()].length > 0) url += `?${query.toString()}`;
    const headers: Record<string, string> = { ...this.#headers, ...request.headers };
    const init: RequestInit & { duplex?: "half" } = { method, headers };
    if (request.json !== undefined) {
      headers["content-type"] = "application/json";
      init.body = JSON.stringify(request.json);
    } else if (request.body !== undefined) {
      headers["content-type"] = request.contentType ?? "application/octet-stream";
      init.body = request.body as BodyInit;
      // Streaming request bodies need it (Fetch standard; Node and Chromium ask for it).
      if (typeof ReadableStream !== "undefined" && request.body instanceof ReadableStream) init.duplex = "half";
    }
    // The time limit covers the answer's head: a download's body may take longer.
    const limit = new AbortController();
    const onAbort = (): void => limit.abort();
    options.signal?.addEventListener("abort", onAbort, { once: true });
    if (options.signal?.aborted) limit.abort();
    const timeoutMs = request.noTimeout ? undefined : this.#options.requestTimeoutMs;
    let timedOut = false;
    const timer =
      timeoutMs === undefined
        ? undefined
        : setTimeout(() => {
            timedOut = true;
            limit.abort();
          }, timeoutMs);
    init.signal = limit.signal;
    let response: Response;
    try {
      response = await this.#fetch(url, init);
    } catch (error) {
      if (timedOut) {
        throw new SandboxAgentError("timeout", `${method} ${path}: no answer within ${timeoutMs} ms`, { cause: error });
      }
      if (options.signal?.aborted) {
        throw new SandboxAgentError("aborted", `${method} ${path}: aborted`, { cause: options.signal.reason });
      }
      const reason = error instanceof Error ? error.message : String(error);
      throw new SandboxAgentError("connection-lost", `${method} ${path}: the server could not be reached (${reason})`, {
        cause: error,
      });
    } finally {
      if (timer !== undefined) clearTimeout(timer);
      options.signal?.removeEventListener("abort", onAbort);
    }
    if (!response.ok) throw SandboxAgentError.from(await AcpHttpError.fromResponse(response, `${method} ${path}`));
    return response;
  }

  async #json<T>(method: string, path: string, options: CallOptions, request: HttpRequest = {}): Promise<T> {
    const response = await this.#http(method, path, options, request);
    try {
      return (await response.json()) as T;
    } catch (error) {
      throw new SandboxAgentError("invalid-response", `${method} ${path}: the answer is not JSON`, { cause: error });
    }
  }
}

/** What a plain HTTP call sends besides its method and path. */
interface HttpRequest {
  query?: Query;
  json?: unknown;
  body?: FsBody;
  contentType?: string;
  /** Added to (and over) the client's headers. */
  headers?: Record<string, string>;
  /** No `requestTimeoutMs` (a followed output, a run bounded by its own `timeoutMs`). */
  noTimeout?: boolean;
}

/** Answers a permission request through the handler (cancelled without one, or when it throws). */
async function answerPermission(
  request: RequestPermissionRequest,
  handler: PermissionHandler | undefined,
): Promise<RequestPermissionResponse> {
  let decision: PermissionDecision = "cancel";
  if (handler !== undefined) {
    try {
      decision = await handler(request);
    } catch {
      decision = "cancel";
    }
  }
  const optionId = pickOption(request, decision);
  return optionId === undefined ? { outcome: { outcome: "cancelled" } } : { outcome: { outcome: "selected", optionId } };
}

/** The option a decision names, by the rules of {@link PermissionDecision}. */
function pickOption(request: RequestPermissionRequest, decision: PermissionDecision): string | undefined {
  if (typeof decision === "object") {
    return request.options.some((o) => o.optionId === decision.optionId) ? decision.optionId : undefined;
  }
  const kinds: Record<Exclude<PermissionDecision, object>, string[]> = {
    allow: ["allow_once", "allow_always"],
    "allow-always": ["allow_always"],
    reject: ["reject_once", "reject_always"],
    "reject-always": ["reject_always"],
    cancel: [],
  };
  for (const kind of kinds[decision] ?? []) {
    const option = request.options.find((o) => o.kind === kind);
    if (option !== undefined) return option.optionId;
  }
  return undefined;
}

function pageOf(page: { sessions?: Record<string, unknown>[]; nextCursor?: string | null }): SessionPage {
  const sessions = (page.sessions ?? []).map(toSummary);
  return typeof page.nextCursor === "string" ? { sessions, nextCursor: page.nextCursor } : { sessions };
}

function disposedError(): SandboxAgentError {
  return new SandboxAgentError("disposed", "this client was disposed");
}

/** The `sandbox-agent/node` entry beside this file, loaded by `start()` only (a variable, so neither tsc nor a bundler pulls it in). */
const NODE_ENTRY: string = "./node.js";

/** `connect()`, disposing of the client (and a server `start()` started) when it fails. */
async function connectOrDispose(client: SandboxAgentClient): Promise<void> {
  try {
    await client.connect();
  } catch (error) {
    await client.dispose().catch(() => undefined);
    throw error;
  }
}
