/**
 * `acp-http-client`: ACP (Agent Client Protocol) over HTTP, protocol-pure.
 *
 * Layout:
 * - `connection.ts`: {@link AcpHttpConnection}, one connection over
 *   `/v2/rpc` (POST, the SSE stream with resume and de-duplication, DELETE);
 * - `websocket.ts`: {@link AcpWebSocketConnection}, one connection over a
 *   WebSocket on `/acp` (no resume);
 * - `answer.ts`: answers to agent requests, for both;
 * - `sse.ts`: the Server-Sent Events parser over a fetch body;
 * - `backoff.ts`: reconnect timing;
 * - `error.ts`: {@link AcpHttpError}, the one error type;
 * - `protocol.ts`: header names and message classification.
 *
 * Uses only `fetch`, `ReadableStream`, `AbortController` and `TextDecoder`:
 * runs in Node 20+, Bun and browsers. ACP types come from
 * `@agentclientprotocol/sdk`.
 */
export { AcpHttpConnection } from "./connection.js";
export type { AcpHttpConnectionOptions, RequestOptions, StreamStats } from "./connection.js";
export { AcpWebSocketConnection, ACP_PATH } from "./websocket.js";
export type { AcpWebSocketConnectionOptions } from "./websocket.js";
export type { AcpConnection } from "./types.js";
export { AcpHttpError } from "./error.js";
export type { AcpHttpErrorKind, Problem, RpcErrorObject } from "./error.js";
export { DEFAULT_RECONNECT_POLICY, reconnectDelayMs } from "./backoff.js";
export type { ReconnectPolicy } from "./backoff.js";
export { parseSse } from "./sse.js";
export type { SseEvent } from "./sse.js";
export {
  CONNECTION_ID_HEADER,
  LAST_EVENT_ID_ANSWER_HEADER,
  LAST_EVENT_ID_HEADER,
  RPC_PATH,
} from "./protocol.js";
