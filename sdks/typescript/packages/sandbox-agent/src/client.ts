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
  ContentBlock,
  InitializeRequest,
  RequestPermissionRequest,
  RequestPermissionResponse,
  SessionNotification,
} from "@agentclientprotocol/sdk";
import { type AcpConnection, AcpHttpConnection, AcpHttpError, AcpWebSocketConnection } from "acp-http-client";
import { SandboxAgentError } from "./error.js";
import { METHODS, META_NAMESPACE, NOTIFICATIONS, isRecord, toDetails, toSummary, toTurnInterrupted } from "./meta.js";
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
  FsEntry,
  FsOptions,
  Health,
  ListSessionsQuery,
  ModelList,
  NewSessionOptions,
  PermissionDecision,
  PermissionHandler,
  PromptResult,
  QuestionRequest,
  SandboxAgentClientOptions,
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

  /**
   * @param options - see {@link SandboxAgentClientOptions}. With
   *   `autoConnect` (the default) the connection starts opening at once; a
   *   failure there is thrown by the first call that needs it (and by
   *   `connect()`).
   */
  constructor(options: SandboxAgentClientOptions) {
    this.#options = options;
    this.#baseUrl = options.baseUrl.replace(/\/+$/, "");
    this.#headers = { ...options.headers };
    if (options.token !== undefined) this.#headers["authorization"] = `Bearer ${options.token}`;
    const f = options.fetch ?? globalThis.fetch;
    this.#fetch = (input, init) => f(input, init);
    if (options.autoConnect ?? true) void this.connect().catch(() => undefined);
  }

  /** The agent id this client's sessions run on. */
  get agent(): string {
    return this.#options.agent;
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

  /** Disconnects for good: every later call fails with kind `disposed`. */
  async dispose(): Promise<void> {
    this.#disposed = true;
    await this.disconnect();
  }

  // ---- server ----

  /** `GET /v2/health`: the server's status (needs no token). */
  getHealth(options: CallOptions = {}): Promise<Health> {
    return this.#json<Health>("GET", "/v2/health", options);
  }

  /** `GET /v2/agents`: every configured agent, installed or not. */
  listAgents(options: CallOptions = {}): Promise<{ agents: AgentInfo[] }> {
    return this.#json("GET", "/v2/agents", options);
  }

  /**
   * `POST /v2/agents/{agent}/install`: installs an agent (default: this
   * client's). `version` is an npm version, dist-tag or range.
   *
   * @throws {SandboxAgentError} 404 unknown agent, 409 not installable, 502 install failed.
   */
  installAgent(
    agent: string = this.#options.agent,
    install: { version?: string; reinstall?: boolean } = {},
    options: CallOptions = {},
  ): Promise<AgentInstallResult> {
    return this.#json("POST", `/v2/agents/${encodeURIComponent(agent)}/install`, options, { json: install });
  }

  // ---- sessions ----

  /**
   * Creates a session on this client's agent.
   *
   * @returns the session (`sessionId`, its metadata, modes and options).
   * @throws {SandboxAgentError} `not-connected`, `rpc` (the agent refused).
   */
  async newSession(params: NewSessionOptions, options: CallOptions = {}): Promise<SessionDetails> {
    const result = await this.#call<Record<string, unknown>>(
      "session/new",
      {
        cwd: params.cwd,
        mcpServers: params.mcpServers ?? [],
        _meta: { [META_NAMESPACE]: { ...params.metadata, agent: this.#options.agent } },
      },
      options,
    );
    return toDetails(String(result["sessionId"]), params.cwd, result);
  }

  /**
   * Takes up an existing session on this connection (after a `disconnect()`,
   * from another client, or one the server restored); its history is
   * replayed to `onSessionUpdate` before this resolves.
   *
   * @throws {SandboxAgentError} `rpc` with {@link SandboxAgentError.isNotFound} for an unknown session.
   */
  async loadSession(
    sessionId: string,
    params: { cwd: string; mcpServers?: NewSessionOptions["mcpServers"] },
    options: CallOptions = {},
  ): Promise<SessionDetails> {
    const result = await this.#call<Record<string, unknown>>(
      "session/load",
      { sessionId, cwd: params.cwd, mcpServers: params.mcpServers ?? [] },
      options,
    );
    return toDetails(sessionId, params.cwd, result ?? {});
  }

  /**
   * Sends a prompt and resolves when the turn ends. The turn's updates go to
   * `onSessionUpdate`; see {@link promptStream} to read them as an iterator.
   *
   * @param prompt - text, or ACP content blocks.
   */
  prompt(sessionId: string, prompt: string | ContentBlock[], options: PromptOptions = {}): Promise<PromptResult> {
    return this.#runTurn(sessionId, prompt, options, undefined);
  }

  /**
   * Sends a prompt and returns the running turn: iterate it for the turn's
   * updates (they also go to `onSessionUpdate`), await `turn.result` for
   * the stop reason. One turn stream per session at a time (a newer one
   * takes the updates over).
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
   */
  promptStream(sessionId: string, prompt: string | ContentBlock[], options: PromptOptions = {}): PromptTurn {
    return new PromptTurn(
      sessionId,
      (turn) => this.#runTurn(sessionId, prompt, options, turn),
      () => this.cancel(sessionId),
    );
  }

  async #runTurn(
    sessionId: string,
    prompt: string | ContentBlock[],
    options: PromptOptions,
    turn: PromptTurn | undefined,
  ): Promise<PromptResult> {
    const blocks: ContentBlock[] = typeof prompt === "string" ? [{ type: "text", text: prompt }] : prompt;
    const onAbort = (): void => void this.cancel(sessionId).catch(() => undefined);
    if (turn !== undefined) this.#turns.set(sessionId, turn);
    options.signal?.addEventListener("abort", onAbort, { once: true });
    try {
      if (options.signal?.aborted) onAbort();
      const result = await this.#call<Record<string, unknown>>(
        "session/prompt",
        { sessionId, prompt: blocks },
        {},
        // Turns take as long as the agent needs: no client-side limit.
        { noTimeout: true },
      );
      return { stopReason: result["stopReason"] as PromptResult["stopReason"] };
    } finally {
      options.signal?.removeEventListener("abort", onAbort);
      if (turn !== undefined && this.#turns.get(sessionId) === turn) this.#turns.delete(sessionId);
    }
  }

  /** Asks the agent to stop the session's running turn (it ends with stop reason `cancelled`). */
  async cancel(sessionId: string): Promise<void> {
    const connection = await this.#connectionForCall("session/cancel");
    try {
      await connection.notify("session/cancel", { sessionId });
    } catch (error) {
      throw SandboxAgentError.from(error);
    }
  }

  /** The models of a session (with the current one), or of this client's agent when `sessionId` is omitted. */
  listModels(sessionId?: string, options: CallOptions = {}): Promise<ModelList> {
    const params = sessionId === undefined ? { agent: this.#options.agent } : { sessionId };
    return this.#call(METHODS.listModels, params, options);
  }

  /**
   * Merges `metadata` into the session's stored metadata (JSON Merge Patch:
   * `null` removes a key). A string `title`, `model` or `mode` also sets
   * those fields. Nothing is sent to the agent.
   */
  async setMetadata(sessionId: string, metadata: Record<string, unknown>, options: CallOptions = {}): Promise<SessionSummary> {
    return toSummary(await this.#call<Record<string, unknown>>(METHODS.setMetadata, { sessionId, metadata }, options));
  }

  /**
   * One session from the server's inventory (`GET /v2/sessions/{id}`, of
   * this client's agent). Needs no connection.
   *
   * @throws {SandboxAgentError} {@link SandboxAgentError.isNotFound} for an unknown session.
   */
  async getSession(sessionId: string, options: CallOptions = {}): Promise<SessionSummary> {
    const entry = await this.#json<Record<string, unknown>>(
      "GET",
      `/v2/sessions/${encodeURIComponent(sessionId)}`,
      options,
      { query: { agent: this.#options.agent } },
    );
    return toSummary(entry);
  }

  /**
   * One page of the server's session inventory (`GET /v2/sessions`), newest
   * first, every agent unless `query.agent`. Needs no connection.
   */
  async listSessions(query: ListSessionsQuery = {}, options: CallOptions = {}): Promise<SessionPage> {
    const page = await this.#json<{ sessions: Record<string, unknown>[]; nextCursor?: string }>(
      "GET",
      "/v2/sessions",
      options,
      { query: { ...query } },
    );
    return pageOf(page);
  }

  /**
   * The same inventory through the agent connection (ACP `session/list`,
   * 50 a page, optional `cwd` filter). Named "unstable" as in seed 001: the
   * method is not in every ACP version.
   */
  async unstableListSessions(params: { cwd?: string; cursor?: string } = {}, options: CallOptions = {}): Promise<SessionPage> {
    return pageOf(await this.#call("session/list", params, options));
  }

  /** This connection stops receiving the session's updates; the session and its turn go on. */
  async detachSession(sessionId: string, options: CallOptions = {}): Promise<void> {
    await this.#call(METHODS.detach, { sessionId }, options);
  }

  /** Ends the session for good (its running turn is cancelled). */
  terminateSession(sessionId: string, options: CallOptions = {}): Promise<{ sessionId: string; alreadyEnded: boolean }> {
    return this.#call(METHODS.terminate, { sessionId }, options);
  }

  /**
   * One page of the session's event log (`GET /v2/sessions/{id}/events`):
   * every message of the session in order, from `offset` (default 0), at
   * most `limit` (1 to 1000, default 100). Needs no connection.
   */
  getSessionEvents(
    sessionId: string,
    page: { offset?: number; limit?: number } = {},
    options: CallOptions = {},
  ): Promise<SessionEventPage> {
    return this.#json("GET", `/v2/sessions/${encodeURIComponent(sessionId)}/events`, options, {
      query: { ...page, agent: this.#options.agent },
    });
  }

  // ---- files (the sandbox's file system, "Host file system") ----

  /** The entries of a directory (default: the session's `cwd`, else the server's), sorted by name. */
  listFsEntries(path = ".", fs: FsOptions = {}, options: CallOptions = {}): Promise<{ entries: FsEntry[]; truncated?: boolean }> {
    return this.#json("GET", "/v2/fs/entries", options, { query: { path, ...fs } });
  }

  /** One entry. @throws {SandboxAgentError} {@link SandboxAgentError.isNotFound} when nothing is there. */
  statFs(path: string, fs: FsOptions = {}, options: CallOptions = {}): Promise<FsEntry> {
    return this.#json("GET", "/v2/fs/stat", options, { query: { path, ...fs } });
  }

  /** Creates a directory and its parents (an existing one is fine). */
  mkdirFs(path: string, fs: FsOptions = {}, options: CallOptions = {}): Promise<{ path: string }> {
    return this.#json("POST", "/v2/fs/mkdir", options, { query: { path, ...fs } });
  }

  /** Moves `from` to `to` (the parent of `to` must exist; `overwrite` replaces an entry there). */
  moveFs(from: string, to: string, move: FsOptions & { overwrite?: boolean } = {}, options: CallOptions = {}): Promise<{ from: string; to: string }> {
    return this.#json("POST", "/v2/fs/move", options, { json: { from, to, ...move } });
  }

  /** Deletes a file, or a directory (`recursive` for a non-empty one). */
  deleteFsEntry(path: string, del: FsOptions & { recursive?: boolean } = {}, options: CallOptions = {}): Promise<{ path: string }> {
    return this.#json("DELETE", "/v2/fs/entry", options, { query: { path, ...del } });
  }

  /** The bytes of a file. */
  async readFsFile(path: string, fs: FsOptions = {}, options: CallOptions = {}): Promise<Uint8Array> {
    const response = await this.#http("GET", "/v2/fs/file", options, { query: { path, ...fs } });
    return new Uint8Array(await response.arrayBuffer());
  }

  /**
   * A file as a stream, for files too large to hold in memory. With `from`
   * (a byte offset) and the `etag` of an earlier download, asks for the
   * rest only (`Range` with `If-Range`): `offset` is then `from` when the
   * file is unchanged, or 0 when it changed and the whole new file comes
   * (start over, never append).
   *
   * @returns the body stream, where its first byte belongs (`offset`), the
   *   file's `size` (bytes) and `etag` (for a later resume).
   */
  async readFsFileStream(
    path: string,
    read: FsOptions & { from?: number; etag?: string } = {},
    options: CallOptions = {},
  ): Promise<{ stream: ReadableStream<Uint8Array>; offset: number; size: number | undefined; etag: string | undefined }> {
    const { from, etag, ...fs } = read;
    const headers: Record<string, string> = {};
    if (from !== undefined && from > 0) {
      headers["range"] = `bytes=${from}-`;
      if (etag !== undefined) headers["if-range"] = etag;
    }
    const response = await this.#http("GET", "/v2/fs/file", options, { query: { path, ...fs }, headers });
    const partial = response.status === 206;
    // `Content-Range: bytes a-b/size` on a 206; `Content-Length` is the size on a 200.
    const range = /\/(\d+)$/.exec(response.headers.get("content-range") ?? "");
    const length = response.headers.get("content-length");
    const size = range?.[1] !== undefined ? Number(range[1]) : length !== null && !partial ? Number(length) : undefined;
    const body = response.body ?? new ReadableStream<Uint8Array>({ start: (c) => c.close() });
    return { stream: body, offset: partial ? (from ?? 0) : 0, size, etag: response.headers.get("etag") ?? undefined };
  }

  /**
   * Writes a file whole (atomically: readers never see half of it), creating
   * its parent directories. A `ReadableStream` body is streamed.
   *
   * @returns the absolute path and the bytes written.
   */
  async writeFsFile(
    path: string,
    content: string | Uint8Array | Blob | ReadableStream<Uint8Array>,
    fs: FsOptions = {},
    options: CallOptions = {},
  ): Promise<{ path: string; bytesWritten: number }> {
    const result = await this.#json<{ path: string; bytesWritten: number }>("PUT", "/v2/fs/file", options, {
      query: { path, ...fs },
      body: content,
      contentType: "application/octet-stream",
    });
    return { path: result.path, bytesWritten: result.bytesWritten };
  }

  /**
   * Unpacks a tar archive (gzip-compressed or not) into directory `path`,
   * creating it. Unsafe entries fail the archive (`invalid-archive`).
   */
  uploadFsBatch(
    path: string,
    archive: Uint8Array | Blob | ReadableStream<Uint8Array>,
    fs: FsOptions & { gzip?: boolean } = {},
    options: CallOptions = {},
  ): Promise<{ paths: string[]; truncated: boolean }> {
    const { gzip, ...rest } = fs;
    const gz = gzip ?? (archive instanceof Uint8Array && archive[0] === 0x1f && archive[1] === 0x8b);
    return this.#json("POST", "/v2/fs/upload-batch", options, {
      query: { path, ...rest },
      body: archive,
      contentType: gz ? "application/gzip" : "application/x-tar",
    });
  }

  // ---- processes ("Processes and terminals"; plain HTTP, no connection needed) ----

  /**
   * Runs a program to completion and returns its exit and output. No
   * client-side time limit: bound it with `timeoutMs` (the server kills the
   * process then).
   *
   * @throws {SandboxAgentError} 400 `program-not-found`, 429 `too-many-processes`, 404 `processes-disabled`.
   */
  runProcess(request: RunProcessRequest, options: CallOptions = {}): Promise<RunResult> {
    return this.#json("POST", "/v2/processes/run", options, { json: request, noTimeout: true });
  }

  /** Starts a program and returns its handle (output, stdin, signals, wait); the process runs on after the handle is dropped. */
  async startProcess(request: StartProcessRequest, options: CallOptions = {}): Promise<ProcessHandle> {
    const info = await this.#json<ProcessInfo>("POST", "/v2/processes", options, { json: request });
    return new ProcessHandle(info, this.#processHttp, this.#openSocket);
  }

  /** One page of processes, newest first (`limit` 1 to 1000, default 100). */
  listProcesses(
    query: { limit?: number; cursor?: string; sessionId?: string; state?: "running" | "exited" } = {},
    options: CallOptions = {},
  ): Promise<{ processes: ProcessInfo[]; nextCursor?: string }> {
    return this.#json("GET", "/v2/processes", options, { query: { ...query } });
  }

  /** One process. @throws {SandboxAgentError} {@link SandboxAgentError.isNotFound} for an unknown (or forgotten) id. */
  getProcess(id: string, options: CallOptions = {}): Promise<ProcessInfo> {
    return this.#json("GET", `/v2/processes/${encodeURIComponent(id)}`, options);
  }

  /** A handle for an existing process (one `listProcesses` showed, say). */
  async processHandle(id: string, options: CallOptions = {}): Promise<ProcessHandle> {
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
  query?: Record<string, string | number | boolean | undefined>;
  json?: unknown;
  body?: string | Uint8Array | Blob | ReadableStream<Uint8Array>;
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
