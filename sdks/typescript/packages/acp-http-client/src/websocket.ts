/**
 * ACP over one WebSocket on `/acp` (`research/contract.md`, "The /acp
 * profile", "WebSocket"): each text frame is one JSON-RPC message, both ways.
 *
 * Unlike `/v2/rpc` there is no resume: the server closes the connection with
 * the socket, so a dropped socket ends the connection (kind
 * `connection-lost`); sessions live on and a new connection loads them.
 * Browsers cannot set headers on a WebSocket, so the token goes in
 * `?access_token=` (the server accepts it on the upgrade only).
 */
import type { AnyMessage, AnyNotification, AnyRequest, AnyResponse, InitializeRequest, InitializeResponse } from "@agentclientprotocol/sdk";
import { answerRequest } from "./answer.js";
import type { RequestOptions } from "./connection.js";
import { AcpHttpError, rpcError, unreachable } from "./error.js";
import { isNotification, isObject, isRequest, isResponse, joinUrl } from "./protocol.js";

/** The default path of the WebSocket endpoint. */
export const ACP_PATH = "/acp";

/** Options of {@link AcpWebSocketConnection.open}. */
export interface AcpWebSocketConnectionOptions {
  /** The server's root URL, `http://…` or `https://…` (made `ws://`, `wss://`). */
  baseUrl: string;
  /** The endpoint path; default `/acp`. */
  path?: string;
  /** Bearer token, sent as `?access_token=` on the upgrade. */
  token?: string;
  /**
   * The `WebSocket` constructor; default the global one (browsers, Bun,
   * Node 22+; Node 20 needs `--experimental-websocket`).
   */
  WebSocket?: typeof WebSocket;
  /** The `fetch` used to ask why a handshake was refused (401, 404, …); default the global one. */
  fetch?: typeof fetch;
  /** Time limit of every request in milliseconds; none by default. */
  requestTimeoutMs?: number;
  /** As for `AcpHttpConnection`: every notification, in order. */
  onNotification?: (notification: AnyNotification) => void;
  /** As for `AcpHttpConnection`: answers agent requests (`-32601` without it). */
  onRequest?: (request: AnyRequest) => unknown;
  /** Called once when the connection ends: `undefined` after `close()`, else the error. */
  onClose?: (error: AcpHttpError | undefined) => void;
}

interface Pending {
  settle(response: AnyResponse): void;
  fail(error: AcpHttpError): void;
}

/** An open ACP connection over a WebSocket. Create it with {@link AcpWebSocketConnection.open}. */
export class AcpWebSocketConnection {
  readonly #options: AcpWebSocketConnectionOptions;
  readonly #pending = new Map<number, Pending>();
  #socket: WebSocket | undefined;
  #initializeResult: InitializeResponse | undefined;
  #nextId = 1;
  #closed: AcpHttpError | "closed" | undefined;
  #socketClosed: Promise<void> = Promise.resolve();

  private constructor(options: AcpWebSocketConnectionOptions) {
    this.#options = options;
  }

  /**
   * Opens the socket and sends `initialize` as its first frame.
   *
   * @throws {AcpHttpError} `http` when the handshake was refused with a
   *   status (401 wrong token, 404, …), `connection-lost` when the server
   *   could not be reached, `rpc`, `timeout`, `aborted`.
   */
  static async open(
    params: InitializeRequest,
    options: AcpWebSocketConnectionOptions,
    requestOptions: RequestOptions = {},
  ): Promise<AcpWebSocketConnection> {
    const connection = new AcpWebSocketConnection(options);
    await connection.#connect();
    try {
      const response = await connection.#exchange({ jsonrpc: "2.0", id: 0, method: "initialize", params }, requestOptions);
      if ("error" in response) throw rpcError("initialize", response.error);
      connection.#initializeResult = response.result as InitializeResponse;
      return connection;
    } catch (error) {
      await connection.close();
      throw error;
    }
  }

  /** Not known over a WebSocket (a browser cannot read the 101's headers): `undefined`. */
  get connectionId(): string | undefined {
    return undefined;
  }

  /** The agent's `initialize` result. */
  get initializeResult(): InitializeResponse {
    return this.#initializeResult as InitializeResponse;
  }

  /** `true` once the connection was closed or lost. */
  get closed(): boolean {
    return this.#closed !== undefined;
  }

  /**
   * Sends a request frame and resolves with its `result`; several may be in
   * flight. Frames arrive in order on one socket, so a prompt's answer
   * follows its updates.
   *
   * @throws {AcpHttpError} `rpc`, `connection-lost`, `timeout`, `aborted`, `closed`.
   */
  async request<T = unknown>(method: string, params?: unknown, options: RequestOptions = {}): Promise<T> {
    this.#ensureOpen(method);
    const message: AnyRequest = { jsonrpc: "2.0", id: this.#nextId++, method, ...(params === undefined ? {} : { params }) };
    const response = await this.#exchange(message, options);
    if ("error" in response) throw rpcError(method, response.error);
    return response.result as T;
  }

  /** Sends a notification frame. @throws {AcpHttpError} `closed`, `connection-lost`. */
  async notify(method: string, params?: unknown): Promise<void> {
    this.#ensureOpen(method);
    this.#send({ jsonrpc: "2.0", method, ...(params === undefined ? {} : { params }) }, method);
  }

  /** Closes the socket (close frame 1000; the server closes the connection). Safe to call more than once. */
  async close(): Promise<void> {
    if (this.#closed === undefined) {
      this.#end("closed");
      this.#socket?.close(1000);
    }
    await Promise.race([this.#socketClosed, new Promise((resolve) => setTimeout(resolve, 3_000))]);
  }

  async #connect(): Promise<void> {
    const Socket = this.#options.WebSocket ?? globalThis.WebSocket;
    if (Socket === undefined) {
      throw new TypeError("no WebSocket in this runtime: pass options.WebSocket (Node 20: run node with --experimental-websocket)");
    }
    const httpUrl = joinUrl(this.#options.baseUrl, this.#options.path ?? ACP_PATH);
    const url = new URL(httpUrl.replace(/^http/, "ws"));
    if (this.#options.token !== undefined) url.searchParams.set("access_token", this.#options.token);
    const socket = new Socket(url.toString());
    this.#socket = socket;
    let markClosed: () => void = () => undefined;
    this.#socketClosed = new Promise((resolve) => (markClosed = resolve));
    const opened = await new Promise<boolean>((resolve) => {
      socket.onopen = () => resolve(true);
      socket.onerror = () => resolve(false);
      socket.onclose = () => {
        markClosed();
        resolve(false);
      };
    });
    if (!opened) throw await this.#whyRefused(httpUrl);
    socket.onerror = null;
    socket.onmessage = (event: MessageEvent) => {
      if (typeof event.data === "string") this.#receive(event.data);
    };
    socket.onclose = (event: CloseEvent) => {
      markClosed();
      this.#end(
        new AcpHttpError(
          "connection-lost",
          `the server closed the WebSocket (${event.code}${event.reason ? `: ${event.reason}` : ""}); a WebSocket cannot resume: open a new connection and load the sessions`,
        ),
      );
    };
  }

  /**
   * A WebSocket error says nothing about the handshake's status, so a plain
   * GET of the same path asks: the token is checked before routing, so a 401
   * (or 403, 404) there is the reason.
   */
  async #whyRefused(httpUrl: string): Promise<AcpHttpError> {
    const f = this.#options.fetch ?? globalThis.fetch;
    const headers: Record<string, string> = {};
    if (this.#options.token !== undefined) headers["authorization"] = `Bearer ${this.#options.token}`;
    try {
      const response = await f(httpUrl, { method: "GET", headers });
      if ([401, 403, 404].includes(response.status)) return AcpHttpError.fromResponse(response, "WebSocket handshake");
      await response.body?.cancel();
      return new AcpHttpError("connection-lost", `WebSocket handshake to ${httpUrl} failed`);
    } catch (error) {
      return unreachable("WebSocket handshake", error);
    }
  }

  #ensureOpen(what: string): void {
    if (this.#closed === "closed") throw new AcpHttpError("closed", `${what}: the connection is closed`);
    if (this.#closed !== undefined) throw this.#closed;
  }

  #send(message: AnyMessage, what: string): void {
    try {
      this.#socket?.send(JSON.stringify(message));
    } catch (error) {
      throw unreachable(what, error);
    }
  }

  #exchange(message: AnyRequest, options: RequestOptions): Promise<AnyResponse> {
    return new Promise<AnyResponse>((resolve, reject) => {
      const id = message.id as number;
      let timer: ReturnType<typeof setTimeout> | undefined;
      const cleanup = (): void => {
        if (timer !== undefined) clearTimeout(timer);
        options.signal?.removeEventListener("abort", onAbort);
        this.#pending.delete(id);
      };
      const pending: Pending = {
        settle: (response) => {
          cleanup();
          resolve(response);
        },
        fail: (error) => {
          cleanup();
          reject(error);
        },
      };
      const onAbort = (): void =>
        pending.fail(new AcpHttpError("aborted", `${message.method}: aborted`, { cause: options.signal?.reason }));
      if (options.signal?.aborted) return onAbort();
      options.signal?.addEventListener("abort", onAbort, { once: true });
      const timeoutMs = options.timeoutMs === null ? undefined : (options.timeoutMs ?? this.#options.requestTimeoutMs);
      if (timeoutMs !== undefined) {
        timer = setTimeout(
          () => pending.fail(new AcpHttpError("timeout", `${message.method}: no answer within ${timeoutMs} ms`)),
          timeoutMs,
        );
      }
      this.#pending.set(id, pending);
      try {
        this.#send(message, message.method);
      } catch (error) {
        pending.fail(error as AcpHttpError);
      }
    });
  }

  #receive(data: string): void {
    let message: unknown;
    try {
      message = JSON.parse(data);
    } catch {
      return;
    }
    if (!isObject(message)) return;
    const msg = message as AnyMessage;
    if (isRequest(msg)) {
      void answerRequest(msg, this.#options.onRequest).then((answer) => {
        if (this.#closed === undefined) this.#socket?.send(JSON.stringify(answer));
      });
    } else if (isNotification(msg)) {
      try {
        this.#options.onNotification?.(msg);
      } catch {
        // A handler's bug must not stop the socket.
      }
    } else if (isResponse(msg) && typeof msg.id === "number") {
      this.#pending.get(msg.id)?.settle(msg);
    }
  }

  #end(reason: AcpHttpError | "closed"): void {
    if (this.#closed !== undefined) return;
    this.#closed = reason;
    const error = reason === "closed" ? new AcpHttpError("closed", "the connection is closed") : reason;
    for (const pending of [...this.#pending.values()]) pending.fail(error);
    try {
      this.#options.onClose?.(reason === "closed" ? undefined : reason);
    } catch {
      // Ignored, as for onNotification.
    }
  }
}
