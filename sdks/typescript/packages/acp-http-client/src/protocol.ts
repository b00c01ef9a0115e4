/**
 * Wire constants of ACP over HTTP (`research/contract.md`, "Transport:
 * /v2/rpc") and small pure functions that classify a JSON-RPC message. No I/O.
 */
import type { AnyMessage, AnyNotification, AnyRequest, AnyResponse } from "@agentclientprotocol/sdk";

/** The default endpoint path of the transport. */
export const RPC_PATH = "/v2/rpc";
/** Header naming the connection on every request after `initialize`. */
export const CONNECTION_ID_HEADER = "x-acp-connection-id";
/**
 * Header on a POST's `200` answer: the newest event id of the connection
 * when the agent's answer was released ("Answer ordering header").
 */
export const LAST_EVENT_ID_ANSWER_HEADER = "x-acp-last-event-id";
/** The SSE resume header (WHATWG HTML, "Server-sent events"). */
export const LAST_EVENT_ID_HEADER = "last-event-id";

/** JSON-RPC error code: the method is not handled here. */
export const METHOD_NOT_FOUND = -32601;
/** JSON-RPC error code: an internal error of the answering side. */
export const INTERNAL_ERROR = -32603;

/** A request: has `method` and `id`. */
export function isRequest(message: AnyMessage): message is AnyRequest {
  return "method" in message && "id" in message && message.id !== undefined;
}

/** A notification: has `method` and no `id`. */
export function isNotification(message: AnyMessage): message is AnyNotification {
  return "method" in message && !("id" in message && message.id !== undefined);
}

/** A response: no `method`, and a `result` or an `error`. */
export function isResponse(message: AnyMessage): message is AnyResponse {
  return !("method" in message) && ("result" in message || "error" in message);
}

/** `true` for a plain JSON object (not an array, not null). */
export function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/** Joins a base URL (with or without a trailing slash) and an absolute path. */
export function joinUrl(baseUrl: string, path: string): string {
  return baseUrl.replace(/\/+$/, "") + path;
}
