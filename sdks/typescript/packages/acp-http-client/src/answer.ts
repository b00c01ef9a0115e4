/**
 * Answers to agent requests, the same for every transport: the handler's
 * value is the `result`, a thrown `{code, message, data}` the error.
 */
import type { AnyRequest, AnyResponse } from "@agentclientprotocol/sdk";
import type { RpcErrorObject } from "./error.js";
import { INTERNAL_ERROR, METHOD_NOT_FOUND, isObject } from "./protocol.js";

/** Runs `handler` for `request` and builds the JSON-RPC answer (`-32601` without a handler). */
export async function answerRequest(
  request: AnyRequest,
  handler: ((request: AnyRequest) => unknown) | undefined,
): Promise<AnyResponse> {
  if (handler === undefined) {
    return {
      jsonrpc: "2.0",
      id: request.id,
      error: { code: METHOD_NOT_FOUND, message: `method not found: ${request.method}` },
    };
  }
  try {
    const result = await handler(request);
    return { jsonrpc: "2.0", id: request.id, result: result ?? null };
  } catch (error) {
    return { jsonrpc: "2.0", id: request.id, error: toRpcErrorObject(error) };
  }
}

function toRpcErrorObject(error: unknown): RpcErrorObject {
  if (isObject(error) && typeof error["code"] === "number") {
    const message = typeof error["message"] === "string" ? error["message"] : "error";
    return { code: error["code"], message, ...("data" in error ? { data: error["data"] } : {}) };
  }
  return { code: INTERNAL_ERROR, message: error instanceof Error ? error.message : String(error) };
}
