/**
 * The one error type of this package. What went wrong is `kind`; an HTTP
 * failure carries its status and RFC 9457 problem document, a JSON-RPC
 * failure its code, message and data.
 */

/** An RFC 9457 problem document, as the server sends with every non-2xx answer. */
export interface Problem {
  /** `urn:sandbox-agent:error:<kind>` on a sandbox-agent server. */
  type?: string;
  /** The status's reason phrase (`Not Found`). */
  title?: string;
  /** The HTTP status, again. */
  status?: number;
  /** What went wrong, for a person. */
  detail?: string;
  /** Other members a server may add. */
  [key: string]: unknown;
}

/** A JSON-RPC error object (JSON-RPC 2.0, section 5.1). */
export interface RpcErrorObject {
  /** The error code (`-32601` method not found, `-32002` resource not found, …). */
  code: number;
  /** What went wrong, for a person. */
  message: string;
  /** Details the answering side added, if any. */
  data?: unknown;
}

/**
 * What failed:
 * - `http`: the server answered with a non-2xx status (`status`, `problem`);
 * - `rpc`: the peer answered a request with a JSON-RPC error (`rpcError`);
 * - `connection-lost`: the server could not be reached, or the connection
 *   broke and could not be resumed;
 * - `timeout`: no answer within the request timeout;
 * - `aborted`: the caller's `AbortSignal` fired;
 * - `closed`: the connection was closed by `close()`;
 * - `invalid-response`: the server answered with something that is not
 *   what the transport promises.
 */
export type AcpHttpErrorKind =
  | "http"
  | "rpc"
  | "connection-lost"
  | "timeout"
  | "aborted"
  | "closed"
  | "invalid-response";

/** The error every call of this package rejects with. */
export class AcpHttpError extends Error {
  /** What failed (see {@link AcpHttpErrorKind}). */
  readonly kind: AcpHttpErrorKind;
  /** HTTP status, for `kind: "http"`. */
  readonly status: number | undefined;
  /** The problem document of a non-2xx answer, when the server sent one. */
  readonly problem: Problem | undefined;
  /** The JSON-RPC error, for `kind: "rpc"`. */
  readonly rpcError: RpcErrorObject | undefined;

  constructor(
    kind: AcpHttpErrorKind,
    message: string,
    details: { status?: number; problem?: Problem; rpcError?: RpcErrorObject; cause?: unknown } = {},
  ) {
    super(message, details.cause === undefined ? undefined : { cause: details.cause });
    this.name = "AcpHttpError";
    this.kind = kind;
    this.status = details.status;
    this.problem = details.problem;
    this.rpcError = details.rpcError;
  }

  /** Builds the `http` error of a non-2xx answer, reading its problem body if any. */
  static async fromResponse(response: Response, what: string): Promise<AcpHttpError> {
    let problem: Problem | undefined;
    const text = await response.text().catch(() => "");
    try {
      const parsed: unknown = JSON.parse(text);
      if (typeof parsed === "object" && parsed !== null && !Array.isArray(parsed)) {
        problem = parsed as Problem;
      }
    } catch {
      // Not JSON: a proxy's HTML page, for instance. Keep the status only.
    }
    const detail = problem?.detail ?? problem?.title ?? (text.slice(0, 200) || response.statusText);
    return new AcpHttpError("http", `${what}: HTTP ${response.status}: ${detail}`, {
      status: response.status,
      ...(problem === undefined ? {} : { problem }),
    });
  }
}

/** The `rpc` error of a JSON-RPC error answer to `method`. */
export function rpcError(method: string, error: RpcErrorObject): AcpHttpError {
  return new AcpHttpError("rpc", `${method}: JSON-RPC error ${error.code}: ${error.message}`, { rpcError: error });
}

/** The `connection-lost` error of a request that could not reach the server. */
export function unreachable(what: string, cause: unknown): AcpHttpError {
  const reason = cause instanceof Error ? cause.message : String(cause);
  return new AcpHttpError("connection-lost", `${what}: the server could not be reached (${reason})`, { cause });
}
