/** What both transports' connections offer. */
import type { InitializeResponse } from "@agentclientprotocol/sdk";
import type { RequestOptions } from "./connection.js";

/**
 * An open ACP connection, over `/v2/rpc` ({@link AcpHttpConnection}) or a
 * WebSocket ({@link AcpWebSocketConnection}).
 */
export interface AcpConnection {
  /** The server's connection id, when the transport can read it. */
  readonly connectionId: string | undefined;
  /** The agent's `initialize` result. */
  readonly initializeResult: InitializeResponse;
  /** `true` once the connection was closed or lost. */
  readonly closed: boolean;
  /** Sends a request and resolves with its `result`. */
  request<T = unknown>(method: string, params?: unknown, options?: RequestOptions): Promise<T>;
  /** Sends a notification. */
  notify(method: string, params?: unknown, options?: RequestOptions): Promise<void>;
  /** Closes the connection. */
  close(): Promise<void>;
}
