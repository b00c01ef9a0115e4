// The Health view: the store and the numbers of GET /metrics.

import { el } from "./dom.js";
import { getJson, http, problemOf } from "./http.js";
import { showError } from "./meta.js";

/** How often the Health view reads the numbers again, in milliseconds. */
const HEALTH_REFRESH_MS = 2000;

/** The samples of Prometheus text (GET /metrics; research/contract.md,
 * "Metrics"): `[{name, labels, value}]`, comments and malformed lines
 * skipped. Label values are unescaped (`\\`, `\"`, `\n`). */
function parseMetrics(text) {
  const samples = [];
  const line = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)/;
  const pair = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g;
  for (const raw of text.split("\n")) {
    if (raw.startsWith("#")) continue;
    const match = line.exec(raw);
    if (!match) continue;
    const labels = {};
    for (const [, key, value] of (match[2] || "").matchAll(pair)) {
      labels[key] = value.replace(/\\(.)/g, (_, c) => (c === "n" ? "\n" : c));
    }
    const value = Number(match[3]);
    if (!Number.isNaN(value)) samples.push({ name: match[1], labels, value });
  }
  return samples;
}

/** The sum of the samples named `name` whose labels include `where`. */
function metricSum(samples, name, where = {}) {
  return samples
    .filter((s) => s.name === name && Object.entries(where).every(([k, v]) => s.labels[k] === v))
    .reduce((sum, s) => sum + s.value, 0);
}

/** The runtime at a glance: the store (GET /v2/health) and the numbers of
 * GET /metrics (connections, sessions, agents, turns and the turn rate
 * between two reads, pending permission requests), read again every
 * HEALTH_REFRESH_MS. A server started with --no-metrics answers /metrics
 * with 404: the view then shows the store alone, and says why. */
export class HealthView {
  async mount(root) {
    this.store = el("dl", { id: "health-store", class: "facts" });
    this.numbers = el("dl", { id: "health-numbers", class: "facts" });
    this.agents = el("table", { id: "health-agents", "aria-label": "Agent processes" });
    this.note = el("p", { id: "health-note", class: "muted" });
    root.append(
      el("h1", {}, "Health"),
      el("h2", {}, "Store"),
      this.store,
      el("h2", {}, "Runtime"),
      this.note,
      this.numbers,
      el("h2", {}, "Agents"),
      this.agents,
    );
    this.previous = null;
    await this.load();
    this.timer = setInterval(() => this.load().catch((error) => showError(this.note, "Could not read the numbers", error)), HEALTH_REFRESH_MS);
  }

  unmount() {
    clearInterval(this.timer);
  }

  async load() {
    const health = await getJson("/v2/health");
    this.store.replaceChildren(
      ...facts([
        ["State", el("span", { class: `badge ${health.store === "ok" ? "installed" : "failed"}`, id: "health-store-state" }, health.store || "none")],
        ["Backend", health.storeBackend || "none"],
        ["Writes waiting", String(health.storeWaiting ?? 0)],
        ["Events dropped", String(health.storeDroppedEvents ?? 0)],
        ["Version", health.version || ""],
        ...(health.storeError ? [["Error", el("span", { class: "error" }, health.storeError)]] : []),
      ]),
    );
    const response = await http("/metrics");
    if (response.status === 404) {
      this.note.textContent = "Metrics are off on this server (--no-metrics): only the store is shown.";
      this.numbers.replaceChildren();
      this.agents.replaceChildren();
      return;
    }
    if (!response.ok) throw await problemOf(response);
    const samples = parseMetrics(await response.text());
    const now = Date.now();
    const turns = metricSum(samples, "sandbox_agent_prompt_turns_total");
    let rate = "—";
    if (this.previous && now > this.previous.at) {
      const perMinute = ((turns - this.previous.turns) * 60000) / (now - this.previous.at);
      rate = `${perMinute.toFixed(1)} / min`;
    }
    this.previous = { at: now, turns };
    this.note.textContent = `Read from GET /metrics every ${HEALTH_REFRESH_MS / 1000} s.`;
    const count = (name, where) => String(metricSum(samples, name, where));
    this.numbers.replaceChildren(
      ...facts([
        ["Open connections", count("sandbox_agent_acp_connections"), "health-connections"],
        ["Connections on /v2/rpc (SSE)", count("sandbox_agent_acp_connections", { transport: "v2_sse" })],
        ["Connections on /acp (HTTP)", count("sandbox_agent_acp_connections", { transport: "acp_http" })],
        ["Connections on /acp (WebSocket)", count("sandbox_agent_acp_connections", { transport: "acp_ws" })],
        ["Live sessions", count("sandbox_agent_sessions", { state: "live" }), "health-live"],
        ["Dormant sessions", count("sandbox_agent_sessions", { state: "dormant" })],
        ["Ended sessions", count("sandbox_agent_sessions", { state: "ended" })],
        ["Prompt turns", String(turns), "health-turns"],
        ["Turn rate", rate, "health-turn-rate"],
        ["Permission requests waiting", count("sandbox_agent_permission_requests_pending"), "health-permissions"],
        ["HTTP requests", count("sandbox_agent_http_requests_total")],
      ]),
    );
    const agents = samples.filter((s) => s.name === "sandbox_agent_agent_processes").map((s) => s.labels.agent);
    const head = el("tr", {}, ["Agent", "Process", "Restarts", "Turns"].map((h) => el("th", { scope: "col" }, h)));
    const rows = agents.map((agent) =>
      el(
        "tr",
        { "data-agent": agent },
        el("td", {}, agent),
        el("td", {}, metricSum(samples, "sandbox_agent_agent_processes", { agent }) > 0 ? el("span", { class: "badge running" }, "running") : "—"),
        el("td", {}, count("sandbox_agent_agent_restarts_total", { agent })),
        el("td", {}, count("sandbox_agent_prompt_turns_total", { agent })),
      ),
    );
    this.agents.replaceChildren(el("thead", {}, head), el("tbody", {}, rows));
  }
}

/** `<dt>`/`<dd>` pairs of `[label, value, id?]` (the id goes on the `<dd>`). */
function facts(pairs) {
  return pairs.flatMap(([label, value, id]) => [el("dt", {}, label), el("dd", id ? { id } : {}, value)]);
}
