/**
 * `SandboxAgentError`, the one error every call of `SandboxAgentClient`
 * rejects with, and its predicates (seed 001's: not found, unauthorized,
 * connection lost, timeout).
 */
import { AcpHttpError, type AcpHttpErrorKind, type Problem } from "acp-http-client";

/** JSON-RPC error code of ACP's "resource not found" (an unknown session). */
const RESOURCE_NOT_FOUND = -32002;

/**
 * What failed: the transport's kinds (`http`, `rpc`, `connection-lost`,
 * `timeout`, `aborted`, `closed`, `invalid-response`) and the client's
 * guards: `not-connected` (a session call before `connect()` or after
 * `disconnect()`), `disposed` (after `dispose()`).
 */
export type SandboxAgentErrorKind = AcpHttpErrorKind | "not-connected" | "disposed";

/** The error of every `SandboxAgentClient` call. */
export class SandboxAgentError extends Error {
  /** What failed (see {@link SandboxAgentErrorKind}). */
  readonly kind: SandboxAgentErrorKind;
  /**
   * The HTTP status of a non-2xx answer; for a JSON-RPC error that carries a
   * problem (`data: {type, status, detail}`, as file and install calls do),
   * that problem's status.
   */
  readonly status: number | undefined;
  /** The RFC 9457 problem document, when the server sent one. */
  readonly problem: Problem | undefined;
  /** The JSON-RPC error code, for `kind: "rpc"`. */
  readonly code: number | undefined;
  /** The JSON-RPC error's `data`, for `kind: "rpc"`. */
  readonly data: unknown;

  constructor(
    kind: SandboxAgentErrorKind,
    message: string,
    details: { status?: number; problem?: Problem; code?: number; data?: unknown; cause?: unknown } = {},
  ) {
    super(message, details.cause === undefined ? undefined : { cause: details.cause });
    this.name = "SandboxAgentError";
    this.kind = kind;
    this.status = details.status;
    this.problem = details.problem;
    this.code = details.code;
    this.data = details.data;
  }

  /** Converts any error a call met into a `SandboxAgentError` (itself unchanged). */
  static from(error: unknown): SandboxAgentError {
    if (error instanceof SandboxAgentError) return error;
    if (error instanceof AcpHttpError) {
      const rpc = error.rpcError;
      const problem = error.problem ?? problemIn(rpc?.data);
      return new SandboxAgentError(error.kind, error.message, {
        ...(error.status !== undefined ? { status: error.status } : problem?.status !== undefined ? { status: problem.status } : {}),
        ...(problem === undefined ? {} : { problem }),
        ...(rpc === undefined ? {} : { code: rpc.code, data: rpc.data }),
        cause: error,
      });
    }
    const message = error instanceof Error ? error.message : String(error);
    return new SandboxAgentError("connection-lost", message, { cause: error });
  }

  /** Not found: HTTP 404 (unknown connection, session, file, agent, route) or JSON-RPC `-32002`. */
  isNotFound(): boolean {
    return this.status === 404 || this.code === RESOURCE_NOT_FOUND;
  }

  /** HTTP 401: the token is missing or wrong. */
  isUnauthorized(): boolean {
    return this.status === 401;
  }

  /** The server could not be reached, or the connection broke and could not be resumed. */
  isUnreachable(): boolean {
    return this.kind === "connection-lost";
  }

  /** Same as {@link isUnreachable} (seed 001's name: "connection lost"). */
  isConnectionLost(): boolean {
    return this.isUnreachable();
  }

  /** No answer in time: the client's request timeout, or the server's (HTTP 504). */
  isTimeout(): boolean {
    return this.kind === "timeout" || this.status === 504;
  }

  /** The caller's `AbortSignal` fired. */
  isAborted(): boolean {
    return this.kind === "aborted";
  }

  /** A session call without an open connection (before `connect()`, after `disconnect()`). */
  isNotConnected(): boolean {
    return this.kind === "not-connected" || this.kind === "closed";
  }
}

/** The problem document a JSON-RPC error's `data` carries, if any. */
function problemIn(data: unknown): Problem | undefined {
  if (typeof data !== "object" || data === null || Array.isArray(data)) return undefined;
  const record = data as Record<string, unknown>;
  return typeof record["type"] === "string" && typeof record["status"] === "number" ? (record as Problem) : undefined;
}
