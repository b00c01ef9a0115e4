/**
 * The server's `_meta["sandboxagent.dev"]` namespace (`research/contract.md`,
 * "`_meta[\"sandboxagent.dev\"]`: where it appears, which keys"), read into
 * plain fields, and the other wire names this client uses.
 */
import type { SessionDetails, SessionEvent, SessionSummary, TurnInterrupted } from "./types.js";

/** The `_meta` key of everything the server adds. */
export const META_NAMESPACE = "sandboxagent.dev";

/** Runtime-owned keys and hints: fields of {@link SessionSummary}, not `metadata`. */
const OWN_KEYS = new Set([
  "agent",
  "createdAt",
  "updatedAt",
  "ended",
  "dormant",
  "eventCount",
  "firstPrompt",
  "model",
  "mode",
  "title",
]);

/** Extension methods the runtime answers ("Extension methods and control plane"). */
export const METHODS = {
  sessionGet: "_sandboxagent/session/get",
  setMetadata: "_sandboxagent/session/set_metadata",
  listModels: "_sandboxagent/session/list_models",
  detach: "_sandboxagent/session/detach",
  terminate: "_sandboxagent/session/terminate",
} as const;

/** Notifications the runtime sends ("Notifications the runtime sends"). */
export const NOTIFICATIONS = {
  turnInterrupted: "_sandboxagent/turn/interrupted",
} as const;

/**
 * The params of `_sandboxagent/turn/interrupted` when `params` reads as
 * them (a session id, a reason, an array of request ids), else `undefined`.
 */
export function toTurnInterrupted(params: unknown): TurnInterrupted | undefined {
  if (!isRecord(params) || typeof params["sessionId"] !== "string" || !Array.isArray(params["requestIds"])) {
    return undefined;
  }
  return params as unknown as TurnInterrupted;
}

/**
 * The interrupted turn an event of a session's log records
 * (`getSessionEvents`), or `undefined` for any other event.
 */
export function turnInterruptedOf(event: SessionEvent): TurnInterrupted | undefined {
  if (event.direction !== "agent_to_client" || event.message["method"] !== NOTIFICATIONS.turnInterrupted) {
    return undefined;
  }
  return toTurnInterrupted(event.message["params"]);
}

/** The namespace object of a `_meta`, or `{}`. */
export function namespaceOf(meta: unknown): Record<string, unknown> {
  if (!isRecord(meta)) return {};
  const ns = meta[META_NAMESPACE];
  return isRecord(ns) ? ns : {};
}

/** An inventory entry (or a `session/new` result plus its `sessionId` and `cwd`) as a {@link SessionSummary}. */
export function toSummary(entry: Record<string, unknown>): SessionSummary {
  const ns = namespaceOf(entry["_meta"]);
  const metadata: Record<string, unknown> = {};
  for (const [key, value] of Object.entries(ns)) if (!OWN_KEYS.has(key)) metadata[key] = value;
  const title = str(entry["title"]) ?? str(ns["title"]);
  return {
    sessionId: String(entry["sessionId"]),
    agent: str(ns["agent"]),
    cwd: str(entry["cwd"]),
    title,
    createdAt: str(ns["createdAt"]),
    updatedAt: str(ns["updatedAt"]) ?? str(entry["updatedAt"]),
    ended: ns["ended"] === true,
    dormant: ns["dormant"] === true,
    eventCount: typeof ns["eventCount"] === "number" ? ns["eventCount"] : undefined,
    model: str(ns["model"]),
    mode: str(ns["mode"]),
    firstPrompt: str(ns["firstPrompt"]),
    metadata,
  };
}

/** A `session/new` or `session/load` result as {@link SessionDetails}. */
export function toDetails(sessionId: string, cwd: string, result: Record<string, unknown>): SessionDetails {
  return {
    ...toSummary({ ...result, sessionId, cwd }),
    modes: result["modes"] as SessionDetails["modes"],
    configOptions: result["configOptions"] as SessionDetails["configOptions"],
  };
}

export function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

function str(value: unknown): string | undefined {
  return typeof value === "string" ? value : undefined;
}
