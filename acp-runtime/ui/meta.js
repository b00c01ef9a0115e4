// What the runtime adds under `_meta["sandboxagent.dev"]`: a session's state
// in the inventory, and an agent error's stderr and hint.

import { el } from "./dom.js";

/** The `_meta` key under which the runtime adds its own fields. */
export const META = "sandboxagent.dev";

/**
 * What the runtime added to an agent's JSON-RPC error (research/contract.md,
 * "Agent errors: stderr and hint"): the agent's stderr lines since the
 * request, pre-formatted, and the hint; none when it added nothing.
 */
export function errorDetails(error) {
  const added = (error && error.data && typeof error.data === "object" && error.data[META]) || {};
  const parts = [];
  if (Array.isArray(added.stderr) && added.stderr.length) {
    parts.push(el("pre", { class: "agent-stderr", "aria-label": "agent stderr" }, added.stderr.join("\n")));
  }
  if (typeof added.hint === "string") parts.push(el("p", { class: "hint" }, added.hint));
  return parts;
}

/** Shows `text` in the error area `target`, with the details of the JSON-RPC `error` under it. */
export function showError(target, text, error) {
  target.replaceChildren(el("p", {}, text), ...errorDetails(error));
}

export function meta(holder) {
  return (holder && holder._meta && holder._meta[META]) || {};
}

/** `live`, `dormant` (restored after a restart, not loaded since) or `ended`. */
export function stateOf(m) {
  if (m.ended) return "ended";
  return m.dormant ? "dormant" : "live";
}
