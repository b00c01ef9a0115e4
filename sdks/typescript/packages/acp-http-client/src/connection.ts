/**
 * One ACP connection over `/v2/rpc` (`research/contract.md`, "Transport:
 * /v2/rpc"): `initialize` opens it, POSTs carry requests and answers, one
 * GET event stream carries everything the agent sends, DELETE closes it.
 *
 * Invariant: the stream's resume point (`lastEventId`) only grows. Every GET
 * sends it as `Last-Event-ID`, and an event whose id is at or below it is
 * dropped, so events reach the handlers once each and in order across any
 * number of reconnects.
 */
import type {
  AnyMessage,
  AnyNotification,
  AnyRequest,
  AnyResponse,
  InitializeRequest,
  InitializeResponse,
} from "@agentclientprotocol/sdk";
import { DEFAULT_RECONNECT_POLICY, type ReconnectPolicy, reconnectDelayMs } from "./backoff.js";
import { answerRequest } from "./answer.js";
import { AcpHttpError, rpcError, unreachable } from "./error.js";
import {
  CONNECTION_ID_HEADER,
  LAST_EVENT_ID_ANSWER_HEADER,
  LAST_EVENT_ID_HEADER,
  RPC_PATH,
  isNotification,
  isObject,
  isRequest,
  isResponse,
  joinUrl,
} from "./protocol.js";
import { parseSse } from "./sse.js";

/** Options of {@link AcpHttpConnection.open}. */
export interface AcpHttpConnectionOptions {
  /** The server's root URL, e.g. `http://127.0.0.1:2468`. */
  baseUrl: string;
  /** The endpoint path; default `/v2/rpc`. */
  path?: string;
  /** Bearer token, sent as `Authorization: Bearer <token>` on every request. */
  token?: string;
  /** Extra headers for every request (a proxy's own credentials, for instance). */
  headers?: Record<string, string>;
  /** The `fetch` to use; default the global one. */
  fetch?: typeof fetch;
  /**
   * Time limit of every request, in milliseconds, from the POST until its
   * answer (a whole prompt turn included); none by default. Past it the call
   * rejects with kind `timeout` (the agent is not told: send its cancel
   * notification if it has one).
   */
  requestTimeoutMs?: number;
  /** How the event stream is reopened after it drops (see {@link ReconnectPolicy}). */
  reconnect?: Partial<ReconnectPolicy>;
  /**
   * Called, in stream order, with every notification the agent (or the
   * server) sends. Runs synchronously on the stream; an exception it throws
   * is ignored.
   */
  onNotification?: (notification: AnyNotification) => void;
  /**
   * Answers requests the agent sends the client (`session/request_permission`,
   * `fs/read_text_file`, …): its value is the JSON-RPC `result`; a thrown
   * error becomes a JSON-RPC error (its `code`, `message`, `data` when it
   * has a numeric `code`, else `-32603`). Without it every such request is
   * answered `-32601` (method not found). Runs apart from the stream, so it
   * may call this connection.
   */
  onRequest?: (request: AnyRequest) => unknown;
  /**
   * Called once when the connection ends: `undefined` after {@link
   * AcpHttpConnection.close}, else the error (kind `connection-lost` or
   * `http`, e.g. a 404 once the server forgot the connection).
   */
  onClose?: (error: AcpHttpError | undefined) => void;
}

/** Per-call options of {@link AcpHttpConnection.request}. */
export interface RequestOptions {
  /** Aborting it rejects the call with kind `aborted` (the agent is not told). */
  signal?: AbortSignal;
  /** Overrides the connection's `requestTimeoutMs` for this call; `null`: no limit. */
  timeoutMs?: number | null;
}

/** Counters of one connection's event stream. */
export interface StreamStats {
  /** GET requests made after the first one. */
  reconnects: number;
  /** Events dropped because their id was at or below the resume point. */
  duplicateEvents: number;
}

interface Pending {
  settle(response: AnyResponse): void;
  fail(error: AcpHttpError): void;
}

interface Waiter {
  eventId: number;
  resolve(): void;
  reject(error: AcpHttpError): void;
}

/** An open ACP connection over HTTP. Create it with {@link AcpHttpConnection.open}. */
export class AcpHttpConnection {
  readonly #url: string;
  readonly #headers: Record<string, string>;
  readonly #fetch: typeof fetch;
  readonly #requestTimeoutMs: number | undefined;
  readonly #policy: ReconnectPolicy;
  readonly #onNotification: ((notification: AnyNotification) => void) | undefined;
  readonly #onRequest: ((request: AnyRequest) => unknown) | undefined;
  readonly #onClose: ((error: AcpHttpError | undefined) => void) | undefined;
  /** Requests of this client waiting for their answer, by JSON-RPC id. */
  readonly #pending = new Map<number, Pending>();
  /** Answers held until the stream delivered the events before them. */
  #waiters: Waiter[] = [];
  /** Aborts the live GET when the connection closes. */
  readonly #streamAbort = new AbortController();
  #connectionId = "";
  #initializeResult: InitializeResponse | undefined;
  #nextId = 1;
  #lastEventId = 0;
  #closed: AcpHttpError | "closed" | undefined;
  readonly #stats: StreamStats = { reconnects: 0, duplicateEvents: 0 };

  private constructor(options: AcpHttpConnectionOptions) {
    this.#url = joinUrl(options.baseUrl, options.path ?? RPC_PATH);
    this.#headers = { ...options.headers };
    if (options.token !== undefined) this.#headers["authorization"] = `Bearer ${options.token}`;
    const f = options.fetch ?? globalThis.fetch;
    // Called as a plain function: a browser's fetch throws when `this` is not the window.
    this.#fetch = (input, init) => f(input, init);
    this.#requestTimeoutMs = options.requestTimeoutMs;
    this.#policy = { ...DEFAULT_RECONNECT_POLICY, ...options.reconnect };
    this.#onNotification = options.onNotification;
    this.#onRequest = options.onRequest;
    this.#onClose = options.onClose;
  }

  /**
   * Sends `initialize` (without a connection id, which is what opens a
   * connection), keeps the id the server answers in `x-acp-connection-id`
   * and opens the event stream.
   *
   * @param params - the `initialize` params as sent; a sandbox-agent server
   *   needs the agent id in `params._meta["sandboxagent.dev"].agent`.
   * @throws {AcpHttpError} `http` (with the problem document), `rpc` (the
   *   agent refused), `connection-lost` (no server), `timeout`, `aborted`.
   */
  static async open(
    params: InitializeRequest,
    options: AcpHttpConnectionOptions,
    requestOptions: RequestOptions = {},
  ): Promise<AcpHttpConnection> {
    const connection = new AcpHttpConnection(options);
    const message: AnyRequest = { jsonrpc: "2.0", id: 0, method: "initialize", params };
    const response = await connection.#exchange(message, "initialize", requestOptions, (response) => {
      const id = response.headers.get(CONNECTION_ID_HEADER);
      if (id) connection.#connectionId = id;
    });
    if ("error" in response) throw rpcError("initialize", response.error);
    if (!connection.#connectionId) {
      throw new AcpHttpError("invalid-response", `initialize: the answer has no ${CONNECTION_ID_HEADER} header`);
    }
    connection.#initializeResult = response.result as InitializeResponse;
    void connection.#runStream();
    return connection;
  }

  /** The id the server gave this connection (`x-acp-connection-id`). */
  get connectionId(): string {
    return this.#connectionId;
  }

  /** The agent's `initialize` result. */
  get initializeResult(): InitializeResponse {
    return this.#initializeResult as InitializeResponse;
  }

  /** The id of the newest event the stream delivered (0 before the first). */
  get lastEventId(): number {
    return this.#lastEventId;
  }

  /** Reconnect and de-duplication counters of the event stream. */
  get stats(): Readonly<StreamStats> {
    return { ...this.#stats };
  }

  /** `true` once the connection was closed or lost. */
  get closed(): boolean {
    return this.#closed !== undefined;
  }

  /**
   * Sends a JSON-RPC request and resolves with its `result`. Several may be
   * in flight. The answer is released only after the event stream delivered
   * every event the agent sent before it ("Answer ordering header"), so a
   * prompt's answer never overtakes the turn's updates. An answer the server
   * moved to the stream (the POST timed out at the server, 504) is taken
   * from there.
   *
   * @throws {AcpHttpError} `rpc` (the JSON-RPC error answer), `http`,
   *   `connection-lost`, `timeout`, `aborted`, `closed`.
   */
  async request<T = unknown>(method: string, params?: unknown, options: RequestOptions = {}): Promise<T> {
    this.#ensureOpen(method);
    const id = this.#nextId++;
    const message: AnyRequest = { jsonrpc: "2.0", id, method, ...(params === undefined ? {} : { params }) };
    const response = await this.#exchange(message, method, options);
    if ("error" in response) throw rpcError(method, response.error);
    return response.result as T;
  }

  /**
   * Sends a JSON-RPC notification (`202`, no answer).
   *
   * @throws {AcpHttpError} `http`, `connection-lost`, `aborted`, `closed`.
   */
  async notify(method: string, params?: unknown, options: RequestOptions = {}): Promise<void> {
    this.#ensureOpen(method);
    const message = { jsonrpc: "2.0", method, ...(params === undefined ? {} : { params }) };
    await this.#postExpecting202(message, method, options.signal);
  }

  /**
   * Closes the connection: stops the stream, rejects calls still waiting
   * (kind `closed`) and sends DELETE. Sessions live on at the server. Safe to
   * call more than once.
   */
  async close(): Promise<void> {
    if (this.#closed !== undefined) return;
    this.#end("closed");
    try {
      const response = await this.#fetch(this.#url, {
        method: "DELETE",
        headers: { ...this.#headers, [CONNECTION_ID_HEADER]: this.#connectionId },
      });
      await response.body?.cancel();
    } catch {
      // The server is gone: the connection is gone with it.
    }
  }

  #ensureOpen(what: string): void {
    if (this.#closed === "closed") throw new AcpHttpError("closed", `${what}: the connection is closed`);
    if (this.#closed !== undefined) throw this.#closed;
  }

  /**
   * POSTs one request and waits for its answer (from the POST, or from the
   * stream after a 504), within the caller's signal and timeout.
   */
  #exchange(
    message: AnyRequest,
    method: string,
    options: RequestOptions,
    onHeaders?: (response: Response) => void,
  ): Promise<AnyResponse> {
    return new Promise<AnyResponse>((resolve, reject) => {
      const abort = new AbortController();
      const id = message.id as number;
      let timer: ReturnType<typeof setTimeout> | undefined;
      let done = false;
      const cleanup = (): void => {
        done = true;
        if (timer !== undefined) clearTimeout(timer);
        options.signal?.removeEventListener("abort", onAbort);
        this.#pending.delete(id);
      };
      const settle = (response: AnyResponse): void => {
        if (done) return;
        cleanup();
        resolve(response);
      };
      const fail = (error: AcpHttpError): void => {
        if (done) return;
        cleanup();
        abort.abort();
        reject(error);
      };
      const onAbort = (): void =>
        fail(new AcpHttpError("aborted", `${method}: aborted`, { cause: options.signal?.reason }));
      if (options.signal?.aborted) return onAbort();
      options.signal?.addEventListener("abort", onAbort, { once: true });
      const timeoutMs = options.timeoutMs === null ? undefined : (options.timeoutMs ?? this.#requestTimeoutMs);
      if (timeoutMs !== undefined) {
        timer = setTimeout(
          () => fail(new AcpHttpError("timeout", `${method}: no answer within ${timeoutMs} ms`)),
          timeoutMs,
        );
      }
      if (method !== "initialize") this.#pending.set(id, { settle, fail });

      const run = async (): Promise<void> => {
        const response = await this.#post(message, abort.signal);
        onHeaders?.(response);
        if (response.status === 504 && method !== "initialize") {
          // The server stopped waiting; the agent's answer will come on the stream.
          await response.body?.cancel();
          return;
        }
        if (response.status !== 200) return fail(await AcpHttpError.fromResponse(response, method));
        const body: unknown = await response.json().catch(() => undefined);
        if (!isObject(body) || !isResponse(body as AnyMessage) || body["id"] !== message.id) {
          return fail(new AcpHttpError("invalid-response", `${method}: the answer is not its JSON-RPC response`));
        }
        const eventId = Number(response.headers.get(LAST_EVENT_ID_ANSWER_HEADER) ?? 0);
        if (Number.isSafeInteger(eventId) && eventId > this.#lastEventId) await this.#delivered(eventId);
        settle(body as AnyResponse);
      };
      run().catch((error: unknown) => {
        if (done) return;
        fail(error instanceof AcpHttpError ? error : unreachable(method, error));
      });
    });
  }

  #post(message: unknown, signal: AbortSignal | undefined): Promise<Response> {
    const headers: Record<string, string> = {
      ...this.#headers,
      "content-type": "application/json",
      accept: "application/json",
    };
    if (this.#connectionId) headers[CONNECTION_ID_HEADER] = this.#connectionId;
    return this.#fetch(this.#url, { method: "POST", headers, body: JSON.stringify(message), signal: signal ?? null });
  }

  async #postExpecting202(message: unknown, what: string, signal?: AbortSignal): Promise<void> {
    let response: Response;
    try {
      response = await this.#post(message, signal);
    } catch (error) {
      if (signal?.aborted) throw new AcpHttpError("aborted", `${what}: aborted`, { cause: signal.reason });
      throw unreachable(what, error);
    }
    if (!response.ok) throw await AcpHttpError.fromResponse(response, what);
    await response.body?.cancel();
  }

  /** Resolves once the stream delivered event `eventId` (rejects if the connection ends first). */
  #delivered(eventId: number): Promise<void> {
    if (this.#lastEventId >= eventId) return Promise.resolve();
    if (this.#closed !== undefined) {
      return Promise.reject(
        this.#closed === "closed" ? new AcpHttpError("closed", "the connection is closed") : this.#closed,
      );
    }
    return new Promise((resolve, reject) => this.#waiters.push({ eventId, resolve, reject }));
  }

  /** The event stream: GET, read, and on a break GET again from the resume point. */
  async #runStream(): Promise<void> {
    let failures = 0;
    let first = true;
    while (this.#closed === undefined) {
      if (!first) this.#stats.reconnects++;
      first = false;
      let response: Response | undefined;
      try {
        response = await this.#fetch(this.#url, {
          method: "GET",
          headers: {
            ...this.#headers,
            accept: "text/event-stream",
            [CONNECTION_ID_HEADER]: this.#connectionId,
            // Always sent (0 included): a GET with it takes over a stream the
            // server still thinks is live (a half-open TCP connection).
            [LAST_EVENT_ID_HEADER]: String(this.#lastEventId),
          },
          signal: this.#streamAbort.signal,
        });
      } catch {
        // Unreachable: counted as a failure below.
      }
      if (this.#closed !== undefined) {
        await response?.body?.cancel().catch(() => undefined);
        return;
      }
      if (response?.ok && response.body) {
        failures = 0;
        try {
          for await (const event of parseSse(response.body)) {
            this.#handleEvent(event.id, event.data);
          }
        } catch {
          // Cut mid-stream: resume below.
        }
        await response.body.cancel().catch(() => undefined);
        if (this.#closed !== undefined) return;
      } else if (response !== undefined && isFatalStatus(response.status)) {
        this.#end(await AcpHttpError.fromResponse(response, "event stream"));
        return;
      } else {
        await response?.body?.cancel().catch(() => undefined);
        if (failures >= this.#policy.maxAttempts) {
          this.#end(
            new AcpHttpError(
              "connection-lost",
              `event stream: the server could not be reached again after ${failures + 1} attempts`,
            ),
          );
          return;
        }
      }
      await sleep(reconnectDelayMs(this.#policy, failures, Math.random()));
      failures++;
    }
  }

  #handleEvent(idField: string | undefined, data: string): void {
    if (idField !== undefined) {
      const id = Number(idField);
      if (Number.isSafeInteger(id)) {
        if (id <= this.#lastEventId) {
          this.#stats.duplicateEvents++;
          return;
        }
        this.#lastEventId = id;
      }
    }
    let message: unknown;
    try {
      message = JSON.parse(data);
    } catch {
      message = undefined;
    }
    if (isObject(message)) this.#dispatch(message as AnyMessage);
    if (this.#waiters.length > 0) {
      const ready = this.#waiters.filter((w) => w.eventId <= this.#lastEventId);
      this.#waiters = this.#waiters.filter((w) => w.eventId > this.#lastEventId);
      for (const waiter of ready) waiter.resolve();
    }
  }

  #dispatch(message: AnyMessage): void {
    if (isRequest(message)) {
      void this.#answer(message);
    } else if (isNotification(message)) {
      try {
        this.#onNotification?.(message);
      } catch {
        // A handler's bug must not stop the stream.
      }
    } else if (isResponse(message) && typeof message.id === "number") {
      this.#pending.get(message.id)?.settle(message);
    }
  }

  /** Answers one agent request through `onRequest`. */
  async #answer(request: AnyRequest): Promise<void> {
    const answer = await answerRequest(request, this.#onRequest);
    if (this.#closed !== undefined) return;
    try {
      await this.#postExpecting202(answer, `answer to ${request.method}`);
    } catch {
      // The connection broke: the stream notices and reports it.
    }
  }

  /** Ends the connection once: fails what waits and tells `onClose`. */
  #end(reason: AcpHttpError | "closed"): void {
    if (this.#closed !== undefined) return;
    this.#closed = reason;
    this.#streamAbort.abort();
    const error = reason === "closed" ? new AcpHttpError("closed", "the connection is closed") : reason;
    for (const pending of [...this.#pending.values()]) pending.fail(error);
    for (const waiter of this.#waiters) waiter.reject(error);
    this.#waiters = [];
    try {
      this.#onClose?.(reason === "closed" ? undefined : reason);
    } catch {
      // Ignored, as for onNotification.
    }
  }
}

/**
 * Statuses after which reconnecting cannot help: the connection is unknown
 * (404), the token is refused (401, 403) or the request is wrong (400).
 */
function isFatalStatus(status: number): boolean {
  return status === 400 || status === 401 || status === 403 || status === 404 || status === 410;
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
