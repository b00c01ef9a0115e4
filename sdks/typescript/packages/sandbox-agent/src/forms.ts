/**
 * The two argument forms of `SandboxAgentClient`'s calls, told apart and
 * checked (`research/contract.md`, "The TypeScript packages"): seed 001's
 * request objects (`mkdirFs({path, sessionId?})`, `prompt({sessionId,
 * prompt})`) and today's positional forms (`mkdirFs(path, {sessionId?})`);
 * plus the tables of what each options object and query may hold.
 */
import type { ContentBlock, PromptRequest } from "@agentclientprotocol/sdk";
import { type Spec, checkCallOptions, checkFields, isObject, typeError } from "./check.js";
import type { CallOptions, PromptOptions } from "./client.js";
import type { ProcessRequest } from "./process.js";
import type { EmbeddedServerOptions, FsOptions, ListSessionsQuery, SandboxAgentClientOptions } from "./types.js";

/** What each client option must be (every option, so a new one cannot go unchecked). */
export const CLIENT_OPTIONS = {
  baseUrl: "string",
  agent: "string",
  token: "string?",
  autoConnect: "boolean?",
  onSessionUpdate: "function?",
  onTurnInterrupted: "function?",
  onPermissionRequest: "function?",
  onQuestion: "function?",
  headers: "object?",
  fetch: "function?",
  transport: "string?",
  WebSocket: "function?",
  requestTimeoutMs: "number?",
} as const satisfies Record<keyof SandboxAgentClientOptions, Spec>;

/** What each embedded server option must be. */
export const EMBEDDED_SERVER_OPTIONS = {
  binary: "string?",
  args: "array?",
  startupTimeoutMs: "number?",
  shutdownGraceMs: "number?",
  logs: "string?",
} as const satisfies Record<keyof EmbeddedServerOptions, Spec>;

/** The fields every file call takes besides its paths. */
export const FS_FIELDS = { sessionId: "string?" } as const satisfies Record<keyof FsOptions, Spec>;
export const MOVE_FIELDS = { ...FS_FIELDS, overwrite: "boolean?" } as const;
export const LIST_SESSIONS_QUERY = {
  limit: "number?",
  cursor: "string?",
  agent: "string?",
  state: "string?",
  q: "string?",
} as const satisfies Record<keyof ListSessionsQuery, Spec>;
export const LIST_PROCESSES_QUERY = { limit: "number?", cursor: "string?", sessionId: "string?", state: "string?" } as const;
export const PROCESS_FIELDS = {
  command: "string",
  args: "array?",
  cwd: "string?",
  env: "object?",
  stdin: "string?",
  sessionId: "string?",
} as const satisfies Record<keyof ProcessRequest, Spec>;

/** A query string's values, as `#http` sends them. */
export type Query = Record<string, string | number | boolean | undefined>;

/** A file call's arguments, whichever form it was given in. */
export interface FsCall {
  /** `path` and the listed fields (nothing else: an unknown field never reaches the URL). */
  query: Query;
  options: CallOptions;
  /** Given as `(path, fs?, options?)` rather than `({path, …}, options?)`. */
  positional: boolean;
}

/**
 * Which form a call was given: a string first argument is today's
 * positional form, an object seed 001's request object; anything else is a
 * `TypeError` naming both.
 */
export function isPositional(method: string, name: string, value: unknown, shape: string): value is string {
  if (typeof value === "string") return true;
  if (isObject(value)) return false;
  throw typeError(method, name, `a string, or a request ${shape}`, value);
}

/** The two forms of a one-path file call, checked: `(path, fs?, options?)` or `({path, …fields}, options?)`. */
export function fsArgs(method: string, first: unknown, second: unknown, third: unknown, extra: Record<string, Spec> = {}): FsCall {
  const fields: Record<string, Spec> = { path: "string", ...FS_FIELDS, ...extra };
  const shape = `{${Object.entries(fields)
    .map(([name, spec]) => (spec.endsWith("?") ? `${name}?` : name))
    .join(", ")}}`;
  const { path: _path, ...rest } = fields;
  if (isPositional(method, "path", first, shape)) {
    checkFields(method, "fs", second, rest, true);
    checkCallOptions(method, third);
    const fs = (second ?? {}) as Record<string, unknown>;
    return { query: { ...pick(fs, rest), path: first }, options: (third ?? {}) as CallOptions, positional: true };
  }
  checkFields(method, "request", first, fields);
  checkCallOptions(method, second);
  return { query: pick(first as Record<string, unknown>, fields), options: (second ?? {}) as CallOptions, positional: false };
}

/** The two forms of a prompt turn, checked: `(sessionId, text | blocks, options?)` or `(PromptRequest, options?)`. */
export function turnArgs(
  method: string,
  first: unknown,
  second: unknown,
  third: unknown,
): { request: PromptRequest; options: PromptOptions; positional: boolean } {
  if (isPositional(method, "sessionId", first, "{sessionId, prompt}")) {
    if (typeof second !== "string") checkContent(method, "prompt", second, "text or an array of content blocks");
    checkCallOptions(method, third);
    const prompt: ContentBlock[] = typeof second === "string" ? [{ type: "text", text: second }] : (second as ContentBlock[]);
    return { request: { sessionId: first, prompt }, options: (third ?? {}) as PromptOptions, positional: true };
  }
  checkFields(method, "request", first, { sessionId: "string" });
  checkContent(method, "request.prompt", (first as Record<string, unknown>)["prompt"], "an array of content blocks");
  checkCallOptions(method, second);
  return { request: first as PromptRequest, options: (second ?? {}) as PromptOptions, positional: false };
}

/** An array of ACP content blocks (objects with a string `type`); what the agent makes of each is its business. */
function checkContent(method: string, name: string, value: unknown, expected: string): void {
  if (!Array.isArray(value)) throw typeError(method, name, expected, value);
  value.forEach((block: unknown, i) => {
    if (!isObject(block) || typeof block["type"] !== "string") {
      throw typeError(method, `${name}[${i}]`, 'a content block ({type: "text", text}, …)', block);
    }
  });
}

/** The listed fields of `value` (already checked), for a query string or a body. */
export function pick(value: object, fields: Readonly<Record<string, Spec>>): Query {
  const picked: Query = {};
  for (const name of Object.keys(fields)) {
    const field = (value as Record<string, unknown>)[name];
    if (field !== undefined) picked[name] = field as string | number | boolean;
  }
  return picked;
}
