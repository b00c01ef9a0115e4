// sandbox-agent inspector: watch and drive the agents of one runtime.
//
// The page speaks the runtime's own API (research/contract.md, "Inspector"):
// the control plane for agents and sessions, and /v2/rpc for everything a
// client does (initialize, session/new, session/load, prompts, answers to
// permission requests), with a fetch-based SSE stream per connection,
// resumed with Last-Event-ID after a drop or a reload.
//
// Processes (GET /v2/processes…) are listed and their output followed over
// the same fetch-based SSE, by byte offset; the Terminal view is a shell on
// the process API's WebSocket, drawn by xterm.js (ui/vendor/, imported
// when the view opens).
//
// A session's timeline is drawn from its event log
// (GET /v2/sessions/{id}/events), read from the next offset whenever the
// stream says something happened: the log is the one ordered record, so
// after a reload or a drop nothing is shown twice and nothing is missing.
// Everything the agent or a client wrote is put on the page as text
// (textContent), never as HTML.

const META = "sandboxagent.dev";
const PREFIX = "sa.";
const store = window.sessionStorage;

// ---------------------------------------------------------------------------
// Small helpers
// ---------------------------------------------------------------------------

/**
 * What the runtime added to an agent's JSON-RPC error (research/contract.md,
 * "Agent errors: stderr and hint"): the agent's stderr lines since the
 * request, pre-formatted, and the hint; none when it added nothing.
 */
function errorDetails(error) {
  const added = (error && error.data && typeof error.data === "object" && error.data[META]) || {};
  const parts = [];
  if (Array.isArray(added.stderr) && added.stderr.length) {
    parts.push(el("pre", { class: "agent-stderr", "aria-label": "agent stderr" }, added.stderr.join("\n")));
  }
  if (typeof added.hint === "string") parts.push(el("p", { class: "hint" }, added.hint));
  return parts;
}

/** Shows `text` in the error area `target`, with the details of the JSON-RPC `error` under it. */
function showError(target, text, error) {
  target.replaceChildren(el("p", {}, text), ...errorDetails(error));
}

/** Creates an element: el("p", {class: "x"}, "text", child…). */
function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key === "class") node.className = value;
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function saved(key, fallback) {
  try {
    const raw = store.getItem(PREFIX + key);
    return raw === null ? fallback : JSON.parse(raw);
  } catch {
    return fallback;
  }
}

function save(key, value) {
  store.setItem(PREFIX + key, JSON.stringify(value));
}

function setStatus(text) {
  document.getElementById("status").textContent = text;
}

function when(iso) {
  if (!iso) return "";
  const date = new Date(iso);
  return Number.isNaN(date.getTime()) ? iso : date.toLocaleString();
}

function meta(holder) {
  return (holder && holder._meta && holder._meta[META]) || {};
}

/** `live`, `dormant` (restored after a restart, not loaded since) or `ended`. */
function stateOf(m) {
  if (m.ended) return "ended";
  return m.dormant ? "dormant" : "live";
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// ---------------------------------------------------------------------------
// HTTP with the bearer token
// ---------------------------------------------------------------------------

let token = saved("token", null);
let asking = null;

class ProblemError extends Error {
  constructor(status, problem) {
    super((problem && (problem.detail || problem.title)) || `HTTP ${status}`);
    this.status = status;
    this.problem = problem;
  }
}

/** Asks for the token once at a time; resolves when one was accepted. */
function askToken(refused) {
  if (asking) return asking;
  const dialog = document.getElementById("token-dialog");
  const form = document.getElementById("token-form");
  const input = document.getElementById("token-input");
  const error = document.getElementById("token-error");
  error.hidden = !refused;
  error.textContent = refused ? "That token was refused: check it and try again." : "";
  asking = new Promise((resolve) => {
    const submit = async (event) => {
      event.preventDefault();
      const candidate = input.value.trim();
      if (!candidate) return;
      const probe = await fetch("/v2/agents", { headers: { authorization: `Bearer ${candidate}` } });
      if (probe.status === 401) {
        error.hidden = false;
        error.textContent = "That token was refused: check it and try again.";
        input.select();
        return;
      }
      token = candidate;
      save("token", token);
      form.removeEventListener("submit", submit);
      dialog.close();
      asking = null;
      resolve();
    };
    form.addEventListener("submit", submit);
  });
  if (!dialog.open) dialog.showModal();
  input.focus();
  return asking;
}

/** fetch() with the token; a 401 asks for one and tries again. `signal`
 * aborts the request (and the reading of its body). */
async function http(path, { method = "GET", body, headers = {}, signal } = {}) {
  for (;;) {
    const all = { ...headers };
    if (token) all.authorization = `Bearer ${token}`;
    if (body !== undefined) all["content-type"] = "application/json";
    const response = await fetch(path, {
      method,
      headers: all,
      body: body === undefined ? undefined : JSON.stringify(body),
      signal,
    });
    if (response.status !== 401) return response;
    await askToken(Boolean(token));
  }
}

async function problemOf(response) {
  try {
    return new ProblemError(response.status, await response.json());
  } catch {
    return new ProblemError(response.status, null);
  }
}

async function getJson(path) {
  const response = await http(path);
  if (!response.ok) throw await problemOf(response);
  return response.json();
}

// ---------------------------------------------------------------------------
// Server-Sent Events read with fetch (an EventSource cannot send the token)
// ---------------------------------------------------------------------------

/** One SSE event of a frame's lines: `{event, id, data}` (`event` is
 * "message" unless named, `id` a string or null); null for a frame without
 * data, such as a heartbeat comment. */
function parseSseFrame(frame) {
  let event = "message";
  let id = null;
  const data = [];
  for (const line of frame.split(/\r?\n/)) {
    if (line.startsWith(":")) continue;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
    if (field === "event") event = value;
    else if (field === "id") id = value;
    else if (field === "data") data.push(value);
  }
  return data.length ? { event, id, data: data.join("\n") } : null;
}

/** Reads an SSE body to its end, calling `onEvent` with each event. */
async function readSse(body, onEvent) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.search(/\r?\n\r?\n/)) >= 0) {
      const frame = buffer.slice(0, end);
      buffer = buffer.slice(end).replace(/^\r?\n\r?\n/, "");
      const event = parseSseFrame(frame);
      if (event) onEvent(event);
    }
  }
}

// ---------------------------------------------------------------------------
// One ACP connection per agent, kept for the tab
// ---------------------------------------------------------------------------

class Connection {
  constructor(agent) {
    this.agent = agent;
    const state = saved(`conn.${agent}`, {});
    this.id = state.id || null;
    this.lastEventId = state.lastEventId || 0;
    this.nextId = state.nextId || 1;
    this.attached = new Set(state.attached || []);
    // URL-mode questions the agent said are finished (`elicitation/complete`
    // names no session and is not in any event log, so the tab keeps them).
    this.completed = new Set(state.completed || []);
    this.listeners = new Set();
    this.streaming = false;
  }

  persist() {
    save(`conn.${this.agent}`, {
      id: this.id,
      lastEventId: this.lastEventId,
      nextId: this.nextId,
      attached: [...this.attached],
      completed: [...this.completed].slice(-COMPLETED_KEPT),
    });
  }

  /** A request id not used before by this tab on this connection. */
  takeId() {
    const id = this.nextId++;
    this.persist();
    return id;
  }

  async ensureOpen() {
    if (!this.id) await this.initialize();
    if (!this.streaming) this.stream();
  }

  async initialize() {
    const response = await http("/v2/rpc", {
      method: "POST",
      body: {
        jsonrpc: "2.0",
        id: 0,
        method: "initialize",
        // Agent questions in both modes: the page draws forms and URL links
        // (research/contract.md, "Inspector").
        params: { protocolVersion: 1, clientCapabilities: { elicitation: { form: {}, url: {} } }, _meta: { [META]: { agent: this.agent } } },
      },
    });
    if (!response.ok) throw await problemOf(response);
    const body = await response.json();
    if (body.error) throw new Error(body.error.message);
    this.id = response.headers.get("x-acp-connection-id");
    this.lastEventId = 0;
    this.attached = new Set();
    this.persist();
  }

  /** The connection expired or was closed: start afresh and tell the views. */
  async reset() {
    this.id = null;
    this.lastEventId = 0;
    this.attached = new Set();
    this.persist();
    await this.initialize();
    for (const listener of this.listeners) listener({ reset: true });
  }

  async post(message) {
    await this.ensureOpen();
    let response = await http("/v2/rpc", {
      method: "POST",
      headers: { "x-acp-connection-id": this.id },
      body: message,
    });
    if (response.status === 404) {
      await this.reset();
      response = await http("/v2/rpc", {
        method: "POST",
        headers: { "x-acp-connection-id": this.id },
        body: message,
      });
    }
    return response;
  }

  /** Sends a request; resolves with the JSON-RPC response object. */
  async request(method, params) {
    const response = await this.post({ jsonrpc: "2.0", id: this.takeId(), method, params });
    if (!response.ok) throw await problemOf(response);
    return response.json();
  }

  async notify(method, params) {
    const response = await this.post({ jsonrpc: "2.0", method, params });
    if (!response.ok) throw await problemOf(response);
  }

  async respond(id, result) {
    const response = await this.post({ jsonrpc: "2.0", id, result });
    if (!response.ok) throw await problemOf(response);
  }

  listen(listener) {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  /** Reads the SSE stream for ever, resuming after the last event seen. */
  async stream() {
    this.streaming = true;
    let delay = 250;
    for (;;) {
      try {
        const response = await http("/v2/rpc", {
          headers: {
            accept: "text/event-stream",
            "x-acp-connection-id": this.id,
            // Always sent: a stream of this tab that the server still
            // holds open (before a reload) is taken over, not a 409.
            "last-event-id": String(this.lastEventId),
          },
        });
        if (response.status === 404) {
          await this.reset();
          continue;
        }
        if (response.status === 400) {
          // Our resume point is newer than the server's: the server is not
          // the one this tab spoke to. Start afresh.
          await this.reset();
          continue;
        }
        if (!response.ok || !response.body) throw await problemOf(response);
        setStatus(`connected to ${this.agent}`);
        delay = 250;
        await readSse(response.body, (event) => this.onEvent(event));
      } catch (error) {
        if (error instanceof ProblemError && error.status === 401) continue;
      }
      setStatus(`reconnecting to ${this.agent}…`);
      await sleep(delay);
      delay = Math.min(delay * 2, 5000);
    }
  }

  onEvent({ id, data }) {
    let message;
    try {
      message = JSON.parse(data);
    } catch {
      return;
    }
    const eventId = id === null ? null : Number(id);
    if (Number.isInteger(eventId) && eventId > this.lastEventId) {
      this.lastEventId = eventId;
      this.persist();
    }
    if (message.method === "elicitation/complete" && message.params && typeof message.params.elicitationId === "string") {
      this.completed.add(message.params.elicitationId);
      this.persist();
    }
    for (const listener of this.listeners) listener({ message });
  }
}

/** How many finished URL-question ids a connection keeps for the tab. */
const COMPLETED_KEPT = 200;

const connections = new Map();

function connectionFor(agent) {
  if (!connections.has(agent)) connections.set(agent, new Connection(agent));
  return connections.get(agent);
}

// ---------------------------------------------------------------------------
// Views
// ---------------------------------------------------------------------------

const main = () => document.getElementById("main");
let current = null;

function show(view) {
  if (current && current.unmount) current.unmount();
  current = view;
  const root = main();
  root.replaceChildren();
  view.mount(root).catch((error) => {
    root.append(el("p", { class: "error", role: "alert" }, `Could not load: ${error.message}`));
  });
}

function route() {
  const hash = window.location.hash || "#/sessions";
  const parts = decodeParts(hash);
  for (const link of document.querySelectorAll("nav a")) {
    const here = parts !== null && link.dataset.view === parts[0];
    link.toggleAttribute("aria-current", here);
    if (here) link.setAttribute("aria-current", "page");
  }
  if (!parts) show(new NotFoundView(hash));
  else if (parts[0] === "agents") show(new AgentsView());
  else if (parts[0] === "health") show(new HealthView());
  else if (parts[0] === "processes") show(new ProcessesView());
  else if (parts[0] === "process" && parts.length === 2) show(new ProcessView(parts[1]));
  else if (parts[0] === "terminal") show(new TerminalView(parts[1] || null));
  else if (parts[0] === "files" && parts.length >= 3) show(new FilesView(parts[1], parts.slice(2).join("/")));
  else if (parts[0] === "session" && parts.length >= 3) show(new SessionView(parts[1], parts.slice(2).join("/")));
  else show(new SessionsView());
}

/** The "/"-separated parts of a `#/…` hash, decoded; null when one is not
 * valid percent-encoded UTF-8 (a hand-typed or truncated link). */
function decodeParts(hash) {
  try {
    return hash.slice(2).split("/").map(decodeURIComponent);
  } catch {
    return null;
  }
}

/** What a link that names nothing shows, instead of a script error. */
class NotFoundView {
  constructor(hash) {
    this.hash = hash;
  }

  async mount(root) {
    root.append(
      el("h1", {}, "Not found"),
      el("p", { id: "not-found" }, `Nothing is at ${this.hash}: the address is not a valid inspector link.`),
      el("p", {}, el("a", { href: "#/sessions" }, "All sessions")),
    );
  }
}

function sessionHref(agent, id) {
  return `#/session/${encodeURIComponent(agent)}/${encodeURIComponent(id)}`;
}

// --- Agents ----------------------------------------------------------------

class AgentsView {
  async mount(root) {
    root.append(el("h1", {}, "Agents"));
    this.table = el("table", { "aria-label": "Agents" });
    root.append(this.table);
    await this.load();
  }

  async load() {
    const { agents } = await getJson("/v2/agents");
    const head = el("tr", {}, ["Agent", "Installed", "Running", "Restarts", "Last error", "Install"].map((h) => el("th", { scope: "col" }, h)));
    const rows = agents.map((agent) => this.row(agent));
    this.table.replaceChildren(el("thead", {}, head), el("tbody", {}, rows));
  }

  row(agent) {
    const version = el("input", { type: "text", placeholder: "version", "aria-label": `Version of ${agent.id} to install`, size: 10 });
    const outcome = el("span", { class: "sub", role: "status" });
    const button = el("button", { type: "button", class: "secondary" }, agent.installed ? "Reinstall" : "Install");
    button.addEventListener("click", async () => {
      button.disabled = true;
      const started = Date.now();
      const tick = setInterval(() => {
        outcome.textContent = `installing… ${Math.round((Date.now() - started) / 1000)} s`;
      }, 500);
      outcome.className = "sub";
      outcome.textContent = "installing…";
      try {
        const body = { reinstall: agent.installed };
        if (version.value.trim()) body.version = version.value.trim();
        const response = await http(`/v2/agents/${encodeURIComponent(agent.id)}/install`, { method: "POST", body });
        if (!response.ok) throw await problemOf(response);
        const result = await response.json();
        outcome.className = "sub ok";
        outcome.textContent = result.alreadyInstalled
          ? `already installed${result.version ? ` (${result.version})` : ""}`
          : `installed ${result.version || ""} in ${result.durationMs} ms`;
        await this.load();
      } catch (error) {
        outcome.className = "sub error";
        outcome.textContent = `install failed: ${error.message}`;
      } finally {
        clearInterval(tick);
        button.disabled = false;
      }
    });
    return el(
      "tr",
      {},
      el("td", {}, el("strong", {}, agent.name || agent.id), el("span", { class: "sub" }, agent.id)),
      el(
        "td",
        {},
        el("span", { class: `badge ${agent.installed ? "installed" : ""}` }, agent.installed ? "installed" : "not installed"),
        el("span", { class: "sub" }, agent.version || ""),
      ),
      el("td", {}, agent.running ? el("span", { class: "badge running" }, `pid ${agent.pid}`) : "—"),
      el("td", {}, String(agent.restarts ?? 0)),
      el("td", { class: "error" }, agent.lastError || ""),
      el("td", {}, el("div", { class: "toolbar" }, version, button), outcome),
    );
  }
}

// --- Health ------------------------------------------------------------------

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
class HealthView {
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

// --- Paging ------------------------------------------------------------------

/** Cursor paging of a listing (GET /v2/sessions, GET /v2/processes;
 * research/contract.md, "Inspector"): `cursor` names the page shown,
 * `earlier` holds the cursors of the pages before it (for "Previous").
 * `load` reads the page `cursor` names; `nav` is the Previous / "Page N" /
 * Next bar, its ids prefixed with `name`. */
class Pager {
  constructor(name, load) {
    this.cursor = null;
    this.earlier = [];
    this.nextCursor = null;
    this.load = load;
    this.previous = el("button", { type: "button", class: "secondary", id: `${name}-previous`, disabled: true }, "Previous");
    this.next = el("button", { type: "button", class: "secondary", id: `${name}-next`, disabled: true }, "Next");
    this.label = el("span", { id: `${name}-page`, class: "muted" });
    this.previous.addEventListener("click", () => this.turn(this.earlier.at(-1) ?? null, -1));
    this.next.addEventListener("click", () => this.nextCursor && this.turn(this.nextCursor, +1));
    this.nav = el("nav", { class: "toolbar pager", "aria-label": `Pages of ${name}` }, this.previous, this.label, this.next);
  }

  /** Back to the first page (the filters changed). */
  firstPage() {
    this.cursor = null;
    this.earlier = [];
    this.load();
  }

  /** Shows the page `cursor` names: one forward (+1) or back (-1). */
  turn(cursor, step) {
    // Until the page is drawn, another click would page from the old one.
    this.previous.disabled = this.next.disabled = true;
    if (step > 0) this.earlier.push(this.cursor);
    else this.earlier.pop();
    this.cursor = cursor;
    this.load();
  }

  /** Sets the controls for the page drawn, whose answer named `nextCursor`. */
  drawn(nextCursor) {
    this.nextCursor = nextCursor || null;
    this.previous.disabled = this.earlier.length === 0;
    this.next.disabled = !this.nextCursor;
    this.label.textContent = `Page ${this.earlier.length + 1}`;
  }
}

// --- Sessions ----------------------------------------------------------------

/** Sessions per page of the table (GET /v2/sessions `limit`). */
const SESSIONS_PAGE = 100;

/** One page of the inventory at a time (a Pager); the filters are the
 * server's, so a change starts again at the first page. The 2 s poll
 * reloads the page shown. */
class SessionsView {
  constructor() {
    this.pager = new Pager("sessions", () => this.load().catch((error) => setStatus(`Could not list sessions: ${error.message}`)));
    this.loads = 0;
  }

  async mount(root) {
    root.append(el("h1", {}, "Sessions"));
    const { agents } = await getJson("/v2/agents");
    // Two agent selects on one page (create and filter): each label says
    // which one it is.
    this.agentFilter = el("select", { id: "filter-agent" }, el("option", { value: "" }, "all agents"), agents.map((a) => el("option", { value: a.id }, a.id)));
    this.stateFilter = el(
      "select",
      { id: "filter-state" },
      el("option", { value: "" }, "any state"),
      el("option", { value: "live" }, "live"),
      el("option", { value: "dormant" }, "dormant"),
      el("option", { value: "ended" }, "ended"),
    );
    for (const filter of [this.agentFilter, this.stateFilter]) filter.addEventListener("change", () => this.pager.firstPage());
    const newAgent = el("select", { id: "new-agent", name: "agent" }, agents.map((a) => el("option", { value: a.id }, a.id)));
    // The default a first try works with: an agent already running (it
    // started once, so it has what it needs), else the built-in mock (no
    // install, no key), else the first installed one. Never an agent that
    // would be installed, or fail for a missing key, on the first click.
    const preferred =
      agents.find((a) => a.running && a.id !== "mock") || agents.find((a) => a.id === "mock") || agents.find((a) => a.installed);
    if (preferred) newAgent.value = preferred.id;
    const cwd = el("input", { id: "new-cwd", name: "cwd", type: "text", value: "/tmp", size: 24 });
    const create = el("button", { type: "submit", id: "new-session" }, "New session");
    const error = el("div", { class: "error", role: "alert", id: "new-session-error" });
    const form = el(
      "form",
      { class: "toolbar", "aria-label": "New session" },
      el("label", { for: "new-agent" }, "Agent for a new session", newAgent),
      el("label", { for: "new-cwd" }, "Working directory", cwd),
      create,
    );
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      create.disabled = true;
      error.textContent = "";
      try {
        const agent = newAgent.value;
        const connection = connectionFor(agent);
        const answer = await connection.request("session/new", {
          cwd: cwd.value,
          mcpServers: [],
          _meta: { [META]: { agent } },
        });
        if (answer.error) {
          showError(error, `Could not create the session: ${answer.error.message}`, answer.error);
          return;
        }
        connection.attached.add(answer.result.sessionId);
        connection.persist();
        window.location.hash = sessionHref(agent, answer.result.sessionId);
      } catch (failure) {
        error.textContent = `Could not create the session: ${failure.message}`;
      } finally {
        create.disabled = false;
      }
    });
    this.search = el("input", { id: "filter-title", type: "search", placeholder: "words in the title", size: 24 });
    this.search.addEventListener("input", () => {
      clearTimeout(this.typing);
      this.typing = setTimeout(() => this.pager.firstPage(), 300);
    });
    root.append(
      form,
      error,
      el(
        "div",
        { class: "toolbar" },
        el("label", { for: "filter-agent" }, "Filter by agent", this.agentFilter),
        el("label", { for: "filter-state" }, "Filter by state", this.stateFilter),
        el("label", { for: "filter-title" }, "Filter by title", this.search),
      ),
    );
    this.table = el("table", { "aria-label": "Sessions" });
    root.append(this.table, this.pager.nav);
    await this.load();
    this.timer = setInterval(() => this.load().catch(() => {}), 2000);
  }

  unmount() {
    clearInterval(this.timer);
    clearTimeout(this.typing);
  }

  /** Reads the page shown (with the filters) and draws it; an answer that
   * a later load overtook is dropped, so a poll never draws a page the
   * user has left. */
  async load() {
    const query = new URLSearchParams({ limit: String(SESSIONS_PAGE) });
    if (this.pager.cursor) query.set("cursor", this.pager.cursor);
    if (this.agentFilter.value) query.set("agent", this.agentFilter.value);
    if (this.stateFilter.value) query.set("state", this.stateFilter.value);
    const text = this.search.value.trim();
    if (text) query.set("q", text);
    const load = ++this.loads;
    const page = await getJson(`/v2/sessions?${query}`);
    if (load !== this.loads) return;
    this.sessions = page.sessions;
    this.render();
    this.pager.drawn(page.nextCursor);
  }

  render() {
    const rows = (this.sessions || []).map((s) => {
      const m = meta(s);
      const stateName = stateOf(m);
      return el(
        "tr",
        { "data-session-id": s.sessionId },
        el("td", {}, el("a", { href: sessionHref(m.agent, s.sessionId) }, s.sessionId)),
        titleCell(s),
        el("td", {}, m.agent),
        el("td", { class: "hide-narrow" }, s.cwd || ""),
        el("td", { class: "hide-narrow" }, when(m.createdAt), el("span", { class: "sub" }, `updated ${when(s.updatedAt)}`)),
        el("td", {}, el("span", { class: `badge ${stateName}` }, stateName)),
        el("td", {}, String(m.eventCount ?? "")),
      );
    });
    const head = el(
      "tr",
      {},
      el("th", { scope: "col" }, "Session"),
      el("th", { scope: "col" }, "Title"),
      el("th", { scope: "col" }, "Agent"),
      el("th", { scope: "col", class: "hide-narrow" }, "Working directory"),
      el("th", { scope: "col", class: "hide-narrow" }, "Created"),
      el("th", { scope: "col" }, "State"),
      el("th", { scope: "col" }, "Events"),
    );
    const filtered = this.agentFilter.value || this.stateFilter.value || this.search.value.trim();
    const empty = this.pager.cursor ? "No sessions on this page." : filtered ? "No sessions match." : "No sessions yet.";
    const body = rows.length ? rows : [el("tr", {}, el("td", { colspan: 7, class: "muted" }, empty))];
    this.table.replaceChildren(el("thead", {}, head), el("tbody", {}, body));
  }
}

/** A session's title; without one, its first prompt's text, muted (what a
 * user typed is often the best name a session has); cut to fit by CSS. */
function titleCell(session) {
  const m = meta(session);
  const title = session.title || m.title;
  if (title) return el("td", { class: "title", title }, title);
  if (m.firstPrompt) {
    return el("td", { class: "title", title: m.firstPrompt }, el("span", { class: "first-prompt" }, m.firstPrompt));
  }
  return el("td", { class: "title" });
}

// --- Agent questions (ACP elicitation) ---------------------------------------
//
// An agent's `elicitation/create` (research/contract.md, "Inspector") is a
// card in the session's timeline: a form built from its restricted JSON
// Schema, or a link for a URL-mode question. Every string in it is the
// agent's, so it goes on the page as text, and only an http(s) URL becomes
// a link (never opened by the page).

let questionSeq = 0;

/** `text` when it is an absolute http or https URL, else null. */
function webUrl(text) {
  try {
    const url = new URL(text);
    return url.protocol === "http:" || url.protocol === "https:" ? url.href : null;
  } catch {
    return null;
  }
}

/** The choices of a single-select (`enum`, or `oneOf` of `{const, title}`) or
 * of a multi-select's `items` (`enum`, or `anyOf`): `[{value, title}]`, or
 * null when the schema has none. */
function choicesOf(schema) {
  const titled = Array.isArray(schema.oneOf) ? schema.oneOf : Array.isArray(schema.anyOf) ? schema.anyOf : null;
  if (titled) {
    return titled
      .filter((option) => option && typeof option.const === "string")
      .map((option) => ({ value: option.const, title: typeof option.title === "string" ? option.title : option.const }));
  }
  if (Array.isArray(schema.enum)) return schema.enum.filter((value) => typeof value === "string").map((value) => ({ value, title: value }));
  return null;
}

/** The input type for a string property's `format`. */
const STRING_INPUTS = { email: "email", uri: "url", date: "date", "date-time": "datetime-local" };

/** Counts characters as JSON Schema does (code points, not UTF-16 units). */
const charCount = (text) => [...text].length;

/**
 * One property of a form question: its control and how to read it.
 * `read()` gives `{value}`, `{skip: true}` (optional and left empty) or
 * `{error}` (a message for the person, shown before anything is sent).
 */
function questionField(name, schema, required, id) {
  const title = typeof schema.title === "string" && schema.title ? schema.title : name;
  const marker = required ? el("span", { class: "required", title: "required" }, " *") : null;
  const description = typeof schema.description === "string" && schema.description ? el("span", { class: "sub" }, schema.description) : null;
  const choices = schema.type === "array" ? choicesOf(schema.items || {}) : choicesOf(schema);
  const field = { name, title, required };
  let control;
  if (schema.type === "string" && choices) {
    const select = el(
      "select",
      { id, name, required, "aria-required": required ? "true" : null },
      el("option", { value: "" }, required ? "(choose one)" : "(none)"),
      choices.map((choice) => el("option", { value: choice.value }, choice.title)),
    );
    if (typeof schema.default === "string") select.value = schema.default;
    field.read = () => (select.value ? { value: select.value } : required ? { error: "Choose one." } : { skip: true });
    control = select;
  } else if (schema.type === "string") {
    const type = STRING_INPUTS[schema.format] || "text";
    const input = el("input", {
      id,
      name,
      type,
      required,
      "aria-required": required ? "true" : null,
      minlength: Number.isInteger(schema.minLength) ? schema.minLength : null,
      maxlength: Number.isInteger(schema.maxLength) ? schema.maxLength : null,
      autocomplete: "off",
    });
    if (typeof schema.default === "string") input.value = type === "datetime-local" ? schema.default.slice(0, 16) : schema.default;
    field.read = () => readString(input, schema, required);
    control = input;
  } else if (schema.type === "number" || schema.type === "integer") {
    const integer = schema.type === "integer";
    const input = el("input", {
      id,
      name,
      type: "number",
      required,
      "aria-required": required ? "true" : null,
      min: typeof schema.minimum === "number" ? schema.minimum : null,
      max: typeof schema.maximum === "number" ? schema.maximum : null,
      step: integer ? 1 : "any",
    });
    if (typeof schema.default === "number") input.value = String(schema.default);
    field.read = () => readNumber(input, schema, required, integer);
    control = input;
  } else if (schema.type === "boolean") {
    const box = el("input", { id, name, type: "checkbox" });
    box.checked = schema.default === true;
    field.read = () => ({ value: box.checked });
    field.node = el("div", { class: "field check", "data-field": name }, el("label", { for: id }, box, ` ${title}`, marker), description);
  } else if (schema.type === "array" && choices) {
    const boxes = choices.map((choice, index) => el("input", { type: "checkbox", id: `${id}-${index}`, value: choice.value }));
    const initial = Array.isArray(schema.default) ? schema.default : [];
    for (const box of boxes) box.checked = initial.includes(box.value);
    field.read = () => {
      const values = boxes.filter((box) => box.checked).map((box) => box.value);
      if (!values.length && required) return { error: "Choose at least one." };
      if (Number.isInteger(schema.minItems) && values.length < schema.minItems) return { error: `Choose at least ${schema.minItems}.` };
      if (Number.isInteger(schema.maxItems) && values.length > schema.maxItems) return { error: `Choose at most ${schema.maxItems}.` };
      return values.length || required ? { value: values } : { skip: true };
    };
    field.node = el(
      "fieldset",
      { class: "field choices-field", "data-field": name },
      el("legend", {}, title, marker),
      description,
      boxes.map((box, index) => el("label", { for: box.id, class: "check" }, box, ` ${choices[index].title}`)),
    );
  } else {
    // A type this page does not know (a future ACP type, or a `_`
    // extension): shown, never drawn as an input, never sent.
    const kind = schema.type === "array" ? "array of free values" : typeof schema.type === "string" ? schema.type : "unknown";
    field.read = () => (required ? { error: "The inspector cannot answer this field: decline or cancel the question." } : { skip: true });
    field.node = el(
      "div",
      { class: "field unsupported", "data-field": name, "data-unsupported": kind },
      el("span", {}, title, marker),
      el("span", { class: "sub" }, `This field's type (${kind}) is not supported here; it is left out of the answer.`),
    );
  }
  field.error = el("p", { class: "field-error error", id: `${id}-error`, "data-field-error": name, hidden: true });
  if (control) {
    control.setAttribute("aria-describedby", field.error.id);
    field.node = el("div", { class: "field", "data-field": name }, el("label", { for: id }, title, marker), description, control);
  }
  field.node.append(field.error);
  field.showError = (message) => {
    field.error.textContent = message || "";
    field.error.hidden = !message;
    if (control) control.setAttribute("aria-invalid", message ? "true" : "false");
  };
  field.focus = () => (control || field.node.querySelector("input") || field.node).focus();
  return field;
}

function readString(input, schema, required) {
  const value = input.value;
  if (input.validity.badInput) return { error: "Enter a complete value." };
  if (value === "") return required ? { error: "Required." } : { skip: true };
  if (Number.isInteger(schema.minLength) && charCount(value) < schema.minLength) return { error: `At least ${schema.minLength} character${schema.minLength === 1 ? "" : "s"}.` };
  if (Number.isInteger(schema.maxLength) && charCount(value) > schema.maxLength) return { error: `At most ${schema.maxLength} characters.` };
  if (schema.format === "email" && input.validity.typeMismatch) return { error: "Enter an email address." };
  if (schema.format === "uri") {
    try {
      new URL(value);
    } catch {
      return { error: "Enter an absolute URI (such as https://example.com/)." };
    }
  }
  if (typeof schema.pattern === "string") {
    let pattern = null;
    try {
      pattern = new RegExp(schema.pattern, "u");
    } catch {
      // A pattern this browser cannot read is not held against the person.
    }
    if (pattern && !pattern.test(value)) return { error: `Does not match the expected form (${schema.pattern}).` };
  }
  // datetime-local has no zone: the person's local time, sent as RFC 3339.
  if (schema.format === "date-time") {
    const date = new Date(value);
    if (Number.isNaN(date.getTime())) return { error: "Enter a date and time." };
    return { value: date.toISOString() };
  }
  return { value };
}

function readNumber(input, schema, required, integer) {
  if (input.validity.badInput) return { error: "Enter a number." };
  if (input.value === "") return required ? { error: "Required." } : { skip: true };
  const value = Number(input.value);
  if (!Number.isFinite(value)) return { error: "Enter a number." };
  if (integer && !Number.isInteger(value)) return { error: "Enter a whole number." };
  if (typeof schema.minimum === "number" && value < schema.minimum) return { error: `At least ${schema.minimum}.` };
  if (typeof schema.maximum === "number" && value > schema.maximum) return { error: `At most ${schema.maximum}.` };
  return { value };
}

/** A value of an answer as the person reads it. */
function shownValue(value) {
  if (Array.isArray(value)) return value.map(shownValue).join(", ");
  if (value !== null && typeof value === "object") return JSON.stringify(value);
  return String(value);
}

/**
 * One `elicitation/create` in the timeline. `view` is the SessionView (its
 * connection answers), `message` the agent request as logged. The card
 * goes pending → sent (this tab answered) → answered (the answer is in the
 * log, or another client's answer was announced), and then is read-only;
 * a URL question also turns done on `elicitation/complete`.
 */
class QuestionCard {
  constructor(view, message) {
    this.view = view;
    this.message = message;
    const params = message.params || {};
    this.params = params;
    this.mode = params.mode;
    this.elicitationId = typeof params.elicitationId === "string" ? params.elicitationId : null;
    this.fields = [];
    const prefix = `question-${++questionSeq}`;
    this.status = el("p", { class: "muted answer", role: "status" });
    this.buttons = el("div", { class: "choices" });
    this.fieldset = el("fieldset", { class: "question-fields" });
    const form = el("form", { novalidate: true, "aria-label": "Agent question" }, this.fieldset, this.buttons);
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      this.accept();
    });
    const tool = params.toolCallId && view.tools.get(params.toolCallId);
    this.node = el(
      "div",
      { class: "item question", "data-question": "pending", "data-mode": typeof this.mode === "string" ? this.mode : "unknown" },
      el("div", { class: "who" }, "question from the agent"),
      el("p", { class: "message" }, typeof params.message === "string" ? params.message : ""),
      tool ? el("p", { class: "sub" }, `About the tool call: ${tool.title.textContent}`) : null,
      form,
      this.status,
    );
    if (this.mode === "form") this.drawForm(params.requestedSchema || {}, prefix);
    else if (this.mode === "url") this.drawUrl(params.url);
    else this.fieldset.append(el("p", { class: "muted" }, `This kind of question (${String(this.mode)}) cannot be answered here: decline or cancel it.`));
    const decline = el("button", { type: "button", class: "secondary", "data-action": "decline" }, "Decline");
    const cancel = el("button", { type: "button", class: "secondary", "data-action": "cancel" }, "Cancel");
    decline.addEventListener("click", () => this.send({ action: "decline" }));
    cancel.addEventListener("click", () => this.send({ action: "cancel" }));
    this.buttons.append(decline, cancel);
    if (this.elicitationId && view.connection.completed.has(this.elicitationId)) this.complete();
  }

  drawForm(schema, prefix) {
    if (typeof schema.title === "string" && schema.title) this.fieldset.append(el("legend", {}, schema.title));
    if (typeof schema.description === "string" && schema.description) this.fieldset.append(el("p", { class: "sub" }, schema.description));
    const required = new Set(Array.isArray(schema.required) ? schema.required : []);
    const properties = schema.properties && typeof schema.properties === "object" ? schema.properties : {};
    // Required fields first, each group in the schema's order.
    const names = Object.keys(properties).sort((a, b) => Number(required.has(b)) - Number(required.has(a)));
    names.forEach((name, index) => {
      const property = properties[name] && typeof properties[name] === "object" ? properties[name] : {};
      const field = questionField(name, property, required.has(name), `${prefix}-${index}`);
      this.fields.push(field);
      this.fieldset.append(field.node);
    });
    if (required.size) this.fieldset.append(el("p", { class: "sub" }, "Fields marked * are required."));
    this.buttons.append(el("button", { type: "submit", "data-action": "accept" }, "Submit"));
  }

  drawUrl(text) {
    const href = typeof text === "string" ? webUrl(text) : null;
    // Opened only by the person, in a new tab that cannot reach this page.
    const target = href
      ? el("a", { href, target: "_blank", rel: "noopener noreferrer", "data-question-url": "" }, href)
      : el("code", { "data-question-url-text": "" }, String(text));
    this.fieldset.append(
      el("p", {}, href ? "Open this link, finish there, then press Continue:" : "The agent gave an address the inspector does not open (not http or https):"),
      el("p", { class: "url" }, target),
    );
    this.buttons.append(el("button", { type: "submit", "data-action": "accept" }, "Continue"));
  }

  /** Submit (or Continue): checks every field first; nothing is sent while one is invalid. */
  accept() {
    if (this.mode === "url") {
      this.send({ action: "accept" });
      return;
    }
    if (this.mode !== "form") return;
    const content = {};
    let firstInvalid = null;
    for (const field of this.fields) {
      const read = field.read();
      field.showError(read.error);
      if (read.error) firstInvalid = firstInvalid || field;
      else if (!read.skip) content[field.name] = read.value;
    }
    if (firstInvalid) {
      this.node.dataset.invalid = "yes";
      this.status.textContent = "Check the fields marked above; nothing was sent.";
      firstInvalid.focus();
      return;
    }
    delete this.node.dataset.invalid;
    this.send({ action: "accept", content });
  }

  async send(result) {
    this.lock(true);
    this.status.textContent = "sending…";
    try {
      await this.view.connection.respond(this.message.id, result);
      if (this.node.dataset.question === "pending") {
        this.node.dataset.question = "sent";
        this.status.textContent = "sent";
      }
    } catch (error) {
      this.status.textContent = `could not answer: ${error.message}`;
      this.lock(false);
    }
  }

  lock(locked) {
    this.fieldset.disabled = locked;
    for (const button of this.buttons.querySelectorAll("button")) button.disabled = locked;
  }

  /** The answer that reached the agent, from the log (`result` or `error`). */
  answered(result, error) {
    this.answer = { result: error ? null : result, error };
    this.showAnswer();
  }

  /** Another client answered first, or the runtime cancelled the question
   * (`_sandboxagent/request/resolved`); `outcome` is the winning result
   * (`{"outcome": "cancelled"}` from a runtime that predates the
   * elicitation form of it). */
  resolvedElsewhere(outcome) {
    const result = outcome && typeof outcome.action === "string" ? outcome : { action: "cancel" };
    this.elsewhere = true;
    this.node.dataset.resolved = result.action;
    // The log's answer, when already read, is the same one.
    if (!this.answer) this.answer = { result, error: null };
    this.showAnswer();
  }

  /** Nobody can answer it any more (its turn was interrupted when the
   * server stopped): read-only, greyed, with `reason`. */
  closed(reason) {
    if (this.answer) return;
    this.lock(true);
    this.node.dataset.question = "closed";
    this.status.textContent = reason;
  }

  /** `elicitation/complete` for this URL question: the agent says the flow finished. */
  complete() {
    if (this.node.dataset.url === "done") return;
    this.node.dataset.url = "done";
    this.fieldset.append(el("p", { class: "ok", "data-url-done": "" }, "done: the agent says this step is finished."));
    if (this.answer) this.showAnswer();
  }

  /** Read-only from now on, with the answer in words. */
  showAnswer() {
    const { result, error } = this.answer;
    this.lock(true);
    this.node.dataset.question = "answered";
    const action = error ? "error" : (result && result.action) || "unknown";
    this.node.dataset.answer = action;
    const parts = [this.elsewhere ? "Answered elsewhere: " : "You "];
    if (action === "accept" && this.mode === "url") {
      parts.push(this.node.dataset.url === "done" ? "continued." : "continued; waiting for the agent to say it is done.");
    } else if (action === "accept") {
      const content = (result && result.content) || {};
      // In the form's order (the announced outcome's keys may be sorted),
      // then any the form did not ask for.
      const known = this.fields.filter((field) => field.name in content);
      const names = [...known.map((field) => field.name), ...Object.keys(content).filter((name) => !this.fields.some((field) => field.name === name))];
      const titles = new Map(known.map((field) => [field.name, field.title]));
      const values = names.map((name) => el("li", { "data-answer-field": name }, `${titles.get(name) || name}: ${shownValue(content[name])}`));
      if (this.elsewhere) parts[0] = values.length ? "Answered elsewhere:" : "Answered elsewhere (no values).";
      else parts.push(values.length ? "answered:" : "answered (no values).");
      if (values.length) parts.push(el("ul", {}, values));
    } else if (action === "decline") {
      parts.push("declined.");
    } else if (action === "cancel") {
      parts.push("cancelled.");
    } else if (action === "error") {
      parts.push(`answered with an error: ${error.message}`);
    } else {
      parts.push(`answered: ${action}`);
    }
    this.status.replaceChildren(...parts.filter(Boolean));
  }
}

// --- One session ---------------------------------------------------------

/** Appends agent text to a message item, keeping ``` code blocks. */
function renderText(container, text) {
  container.replaceChildren();
  const parts = text.split("```");
  parts.forEach((part, index) => {
    if (index % 2 === 1) {
      const newline = part.indexOf("\n");
      const code = newline >= 0 ? part.slice(newline + 1) : part;
      container.append(el("pre", {}, el("code", {}, code)));
    } else if (part.length) {
      container.append(el("p", {}, part));
    }
  });
}

function promptText(params) {
  return ((params && params.prompt) || [])
    .map((block) => (block.type === "text" ? block.text : `[${block.type}]`))
    .join(" ");
}

class SessionView {
  constructor(agent, id) {
    this.agent = agent;
    this.id = id;
    this.nextOffset = 0;
    this.fetching = false;
    this.dirty = false;
    this.loads = new Set(); // request ids of session/load: their replay is history already shown
    this.replaying = 0;
    this.prompts = new Set(); // request ids of session/prompt in the log
    this.permissions = new Map(); // agent request id → card
    this.questions = new Map(); // agent request id → QuestionCard (elicitation/create)
    this.early = new Map(); // agent request id → outcome announced before its question was drawn
    this.resolved = new Set(); // agent request ids another client answered (or the runtime cancelled)
    this.tools = new Map(); // toolCallId → item
    this.terminals = new Map(); // terminal id (a process id) → its OutputPane in a tool call
    this.lastKind = null;
    this.current = null; // the agent message (or thought) item being streamed into
  }

  async mount(root) {
    this.root = root;
    this.title = el("h1", {}, this.id);
    this.state = el("span", { class: "badge", id: "session-state" }, "…");
    this.modeSelect = el("select", { "aria-label": "Mode", hidden: true });
    this.modelSelect = el("select", { "aria-label": "Model", hidden: true });
    this.modeSelect.addEventListener("change", () => this.setMode());
    this.modelSelect.addEventListener("change", () => this.setModel());
    const files = el("a", { href: `#/files/${encodeURIComponent(this.agent)}/${encodeURIComponent(this.id)}`, id: "files-link" }, "Files");
    const rename = el("button", { type: "button", class: "secondary" }, "Rename");
    rename.addEventListener("click", () => this.rename());
    this.terminateButton = el("button", { type: "button", class: "danger" }, "Terminate");
    this.terminateButton.addEventListener("click", () => this.terminate());
    this.timeline = el("section", { class: "timeline", "aria-label": "Timeline", "aria-live": "polite" });
    this.input = el("textarea", { id: "prompt", "aria-label": "Prompt", placeholder: "Prompt the agent (Enter sends, Shift+Enter adds a line)" });
    this.input.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
        event.preventDefault();
        this.send();
      }
    });
    this.sendButton = el("button", { type: "button", id: "send" }, "Send");
    this.sendButton.addEventListener("click", () => this.send());
    this.cancelButton = el("button", { type: "button", class: "secondary", id: "cancel" }, "Cancel turn");
    this.cancelButton.addEventListener("click", () => this.cancel());
    this.error = el("div", { class: "error", role: "alert", id: "session-error" });
    root.append(
      el(
        "div",
        { class: "session" },
        el(
          "div",
          {},
          el("div", { class: "session-head" }, this.title, el("span", { class: "badge" }, this.agent), this.state, this.modeSelect, this.modelSelect, files, rename, this.terminateButton),
          this.error,
        ),
        this.timeline,
        el("div", { class: "composer" }, this.input, el("div", { class: "buttons" }, this.sendButton, this.cancelButton)),
      ),
    );
    this.connection = connectionFor(this.agent);
    this.unlisten = this.connection.listen((event) => this.onEvent(event));
    await this.refreshEntry();
    await this.refresh();
    await this.connection.ensureOpen();
    await this.attach();
    this.schedule();
  }

  unmount() {
    if (this.unlisten) this.unlisten();
    for (const pane of this.terminals.values()) pane.stop();
  }

  async refreshEntry() {
    const entry = await getJson(`/v2/sessions/${encodeURIComponent(this.id)}?agent=${encodeURIComponent(this.agent)}`);
    const m = meta(entry);
    this.title.textContent = entry.title || this.id;
    document.title = `${entry.title || this.id} · sandbox-agent`;
    this.ended = Boolean(m.ended);
    const stateName = stateOf(m);
    this.state.textContent = stateName;
    this.state.className = `badge ${stateName}`;
    for (const control of [this.input, this.sendButton, this.cancelButton, this.terminateButton]) control.disabled = this.ended;
    if (m.model && this.modelSelect.value !== m.model) this.modelSelect.value = m.model;
    if (m.mode && this.modeSelect.value !== m.mode) this.modeSelect.value = m.mode;
  }

  /** Attaches this tab's connection to the session (session/load). */
  async attach() {
    if (this.ended) return;
    if (this.connection.attached.has(this.id)) {
      this.markAttached();
      return;
    }
    const entry = await getJson(`/v2/sessions/${encodeURIComponent(this.id)}?agent=${encodeURIComponent(this.agent)}`);
    const answer = await this.connection.request("session/load", {
      sessionId: this.id,
      cwd: entry.cwd || "/",
      mcpServers: [],
    });
    if (answer.error) {
      showError(this.error, `Watching the log only: the agent could not load the session (${answer.error.message}).`, answer.error);
      return;
    }
    this.connection.attached.add(this.id);
    this.connection.persist();
    this.markAttached();
    // A dormant session (restored after a restart) is live again once loaded.
    if (this.state.textContent === "dormant") await this.refreshEntry();
  }

  /** Says on the page that live events of the session reach this tab. */
  markAttached() {
    this.root.querySelector(".session").dataset.attached = "yes";
  }

  onEvent(event) {
    if (event.reset) {
      this.attach().catch((error) => {
        this.error.textContent = error.message;
      });
      return;
    }
    const message = event.message;
    if (message.method === "_sandboxagent/request/resolved") {
      if (message.params && message.params.sessionId === this.id) this.resolve(message.params);
      return;
    }
    if (message.method === "elicitation/complete") {
      // Names no session: the card with that elicitation id, if this
      // session has it (the connection remembers it for cards drawn later).
      const id = message.params && message.params.elicitationId;
      for (const card of this.questions.values()) if (card.elicitationId === id) card.complete();
      return;
    }
    if (message.method === "_sandboxagent/agent/unparsed") {
      this.add(el("div", { class: "item notice" }, el("div", { class: "who" }, "agent wrote a line that is not JSON-RPC"), el("pre", {}, message.params.raw), el("p", { class: "muted" }, message.params.error)));
      return;
    }
    this.schedule();
  }

  /** Reads the log from the next offset; coalesces while a read runs. */
  schedule() {
    if (this.fetching) {
      this.dirty = true;
      return;
    }
    this.refresh().catch((error) => {
      this.error.textContent = `Could not read the session's events: ${error.message}`;
    });
  }

  async refresh() {
    this.fetching = true;
    try {
      let again = true;
      let changed = false;
      while (again) {
        this.dirty = false;
        const page = await getJson(
          `/v2/sessions/${encodeURIComponent(this.id)}/events?agent=${encodeURIComponent(this.agent)}&offset=${this.nextOffset}&limit=1000`,
        );
        for (const event of page.events) {
          if (event.offset < this.nextOffset) continue;
          this.render(event);
          changed = true;
        }
        this.nextOffset = Math.max(this.nextOffset, page.nextOffset);
        again = page.events.length === 1000 || this.dirty;
      }
      if (changed) await this.refreshEntry();
    } finally {
      this.fetching = false;
    }
  }

  add(node) {
    const atBottom = window.innerHeight + window.scrollY >= document.body.scrollHeight - 40;
    this.timeline.append(node);
    if (atBottom) node.scrollIntoView({ block: "end" });
    return node;
  }

  /** Puts one event-log entry on the page. */
  render({ direction, message }) {
    const toAgent = direction === "client_to_agent";
    if (message.method) {
      if (toAgent) this.renderClientMessage(message);
      else this.renderAgentMessage(message);
    } else if (toAgent) {
      // A client's answer to an agent request.
      const key = JSON.stringify(message.id);
      const card = this.permissions.get(key);
      if (card) card.answered(message.result);
      const question = this.questions.get(key);
      if (question) question.answered(message.result, message.error);
    } else {
      this.renderAnswer(message);
    }
  }

  renderClientMessage(message) {
    const method = message.method;
    if (method === "session/prompt") {
      this.prompts.add(JSON.stringify(message.id));
      this.current = null;
      this.add(el("div", { class: "item user" }, el("div", { class: "who" }, "prompt"), el("p", {}, promptText(message.params))));
    } else if (method === "session/load" || method === "session/resume") {
      this.loads.add(JSON.stringify(message.id));
      this.replaying += 1;
    } else if (method === "session/cancel") {
      this.add(el("div", { class: "item notice muted" }, "cancel requested"));
    }
  }

  renderAnswer(message) {
    const key = JSON.stringify(message.id);
    if (this.loads.has(key)) {
      this.loads.delete(key);
      this.replaying = Math.max(0, this.replaying - 1);
      return;
    }
    const result = message.result || {};
    if (result.modes || result.configOptions) this.takeOptions(result);
    if (this.prompts.has(key)) {
      this.current = null;
      if (message.error) this.add(el("div", { class: "item notice error", "data-turn-failed": "" }, el("p", {}, `turn failed: ${message.error.message}`), errorDetails(message.error)));
      else this.add(el("div", { class: "item notice muted", "data-stop-reason": result.stopReason }, `turn ended: ${result.stopReason}`));
    }
  }

  renderAgentMessage(message) {
    const params = message.params || {};
    if (message.method === "session/update") {
      if (this.replaying > 0) return; // the load replays history the log already showed
      this.renderUpdate(params.update || {});
    } else if (message.method === "session/request_permission") {
      this.renderPermission(message);
    } else if (message.method === "elicitation/create") {
      this.renderQuestion(message);
    } else if (message.method === "_sandboxagent/turn/interrupted") {
      this.renderInterrupted(params);
    } else if (message.method === "_sandboxagent/session/ended") {
      this.current = null;
      const stderr = params.stderr && (params.stderr.tail || params.stderr.head);
      this.add(
        el(
          "div",
          { class: "item ended", "data-reason": params.reason },
          el("div", { class: "who" }, "session ended"),
          el("p", {}, `${params.reason}${params.terminatedBy ? ` (by ${params.terminatedBy})` : ""}${params.message ? `: ${params.message}` : ""}`),
          stderr ? el("pre", {}, stderr) : null,
        ),
      );
    }
  }

  /**
   * A turn that was running when its server stopped (research/contract.md,
   * "Notifications the runtime sends"): a notice ends the turn, and the
   * permission and question cards it names are greyed out, since no agent
   * waits for their answers any more.
   */
  renderInterrupted(params) {
    this.current = null;
    const reason = "not answered: the server stopped during the turn";
    for (const id of params.requestIds || []) {
      const key = JSON.stringify(id);
      const card = this.permissions.get(key);
      if (card) card.closed(reason);
      const question = this.questions.get(key);
      if (question) question.closed(reason);
    }
    this.add(
      el(
        "div",
        { class: "item notice error", "data-interrupted": params.reason || "", "data-stop-reason": params.stopReason || "cancelled" },
        `turn interrupted: the server stopped during it (${params.stopReason || "cancelled"})`,
      ),
    );
  }

  renderUpdate(update) {
    const kind = update.sessionUpdate;
    if (kind === "agent_message_chunk" || kind === "agent_thought_chunk") {
      const text = update.content && update.content.type === "text" ? update.content.text : "";
      if (!this.current || this.current.kind !== kind) {
        const body = el("div", { class: "body" });
        const node = this.add(
          el("div", { class: `item ${kind === "agent_thought_chunk" ? "thought" : "agent"}` }, el("div", { class: "who" }, kind === "agent_thought_chunk" ? "thought" : this.agent), body),
        );
        this.current = { kind, text: "", body, node };
      }
      this.current.text += text;
      renderText(this.current.body, this.current.text);
    } else if (kind === "user_message_chunk") {
      this.current = null;
      const text = update.content && update.content.type === "text" ? update.content.text : "";
      this.add(el("div", { class: "item user" }, el("div", { class: "who" }, "prompt"), el("p", {}, text)));
    } else if (kind === "tool_call" || kind === "tool_call_update") {
      this.current = null;
      let item = this.tools.get(update.toolCallId);
      if (!item) {
        const status = el("span", { class: "badge" });
        const title = el("span", {});
        const node = this.add(el("div", { class: "item tool", "data-tool-call": update.toolCallId }, el("span", { class: "who" }, "tool"), title, status));
        item = { node, status, title };
        this.tools.set(update.toolCallId, item);
      }
      if (update.title) item.title.textContent = update.title;
      const status = update.status || (kind === "tool_call" ? "pending" : null);
      if (status) {
        item.status.textContent = status;
        item.status.className = `badge ${status}`;
        item.node.dataset.status = status;
      }
      for (const content of update.content || []) {
        if (content.type === "terminal") this.showTerminal(item, content.terminalId);
      }
    } else if (kind === "plan") {
      this.current = null;
      const entries = (update.entries || []).map((entry) => el("li", {}, `${entry.content}${entry.status ? ` (${entry.status})` : ""}`));
      this.add(el("div", { class: "item plan" }, el("div", { class: "who" }, "plan"), el("ol", {}, entries)));
    } else if (kind === "current_mode_update") {
      this.modeSelect.value = update.currentModeId;
    } else if (kind === "config_option_update") {
      this.takeOptions({ configOptions: update.configOptions });
    } else if (kind === "session_info_update" && update.title) {
      this.title.textContent = update.title;
    }
  }

  /** An agent's terminal named by a tool call (ACP
   * `ToolCallContent::Terminal`): the runtime runs it as a process of the
   * process API, so its output is followed live, below the tool call. */
  showTerminal(item, terminalId) {
    if (this.terminals.has(terminalId)) return;
    const ended = el("span", { class: "sub", "data-terminal-exit": "" });
    const pane = new OutputPane(terminalId, { "data-terminal": terminalId, "aria-label": "Terminal output" }, (exit) => {
      ended.textContent = exitText(exit);
      ended.dataset.terminalExit = exitText(exit);
    });
    this.terminals.set(terminalId, pane);
    item.node.append(pane.node, ended);
    pane.start();
  }

  /**
   * Another client answered an agent request first (or the session ended):
   * its card goes, a short notice says how it ended.
   */
  resolve({ requestId, outcome }) {
    const key = JSON.stringify(requestId);
    // A question's card stays, read-only, with the answer given elsewhere.
    const question = this.questions.get(key);
    if (question) {
      question.resolvedElsewhere(outcome);
      return;
    }
    if (outcome && typeof outcome.action === "string") {
      this.early.set(key, outcome);
      return;
    }
    if (this.resolved.has(key)) return;
    this.resolved.add(key);
    const how = (outcome && (outcome.optionId || outcome.outcome)) || "answered";
    const card = this.permissions.get(key);
    const notice = el("div", { class: "item notice muted", "data-resolved": how }, `permission answered elsewhere: ${how}`);
    if (card) card.node.replaceWith(notice);
    else this.add(notice);
  }

  renderQuestion(message) {
    this.current = null;
    const key = JSON.stringify(message.id);
    if (this.questions.has(key)) return;
    const card = new QuestionCard(this, message);
    this.questions.set(key, card);
    this.add(card.node);
    if (this.early.has(key)) card.resolvedElsewhere(this.early.get(key));
    // Announced before it was drawn, as a runtime without the elicitation
    // form of the outcome says a cancel (`{"outcome": "cancelled"}`).
    else if (this.resolved.has(key)) card.resolvedElsewhere(null);
    this.early.delete(key);
  }

  renderPermission(message) {
    this.current = null;
    const params = message.params || {};
    const key = JSON.stringify(message.id);
    // Answered by another client before this tab drew it: nothing to ask.
    if (this.resolved.has(key)) return;
    const choices = el("div", { class: "choices" });
    const outcome = el("p", { class: "muted", role: "status" });
    const node = this.add(
      el(
        "div",
        { class: "item permission", "data-permission": "pending" },
        el("div", { class: "who" }, "permission requested"),
        el("p", {}, (params.toolCall && params.toolCall.title) || "The agent asks for permission"),
        choices,
        outcome,
      ),
    );
    const card = {
      node,
      answered: (result) => {
        const selected = result && result.outcome && result.outcome.optionId;
        node.dataset.permission = "answered";
        for (const button of choices.querySelectorAll("button")) button.disabled = true;
        outcome.textContent = selected ? `answered: ${selected}` : "answered: cancelled";
      },
      // No answer can reach the agent any more (`reason` says why).
      closed: (reason) => {
        if (node.dataset.permission !== "pending") return;
        node.dataset.permission = "closed";
        for (const button of choices.querySelectorAll("button")) button.disabled = true;
        outcome.textContent = reason;
      },
    };
    for (const option of params.options || []) {
      const button = el("button", { type: "button", class: option.kind && option.kind.startsWith("reject") ? "secondary" : "", "data-option": option.optionId }, option.name || option.optionId);
      button.addEventListener("click", async () => {
        for (const other of choices.querySelectorAll("button")) other.disabled = true;
        try {
          await this.connection.respond(message.id, { outcome: { outcome: "selected", optionId: option.optionId } });
          outcome.textContent = `sent: ${option.optionId}`;
        } catch (error) {
          outcome.textContent = `could not answer: ${error.message}`;
          for (const other of choices.querySelectorAll("button")) other.disabled = false;
        }
      });
      choices.append(button);
    }
    this.permissions.set(key, card);
  }

  takeOptions(result) {
    const modes = result.modes && result.modes.availableModes;
    if (modes && modes.length) {
      this.modeSelect.replaceChildren(...modes.map((mode) => el("option", { value: mode.id }, mode.name || mode.id)));
      this.modeSelect.value = result.modes.currentModeId;
      this.modeSelect.hidden = false;
    }
    const model = (result.configOptions || []).find((option) => option.category === "model");
    if (model) {
      this.modelConfig = model.id;
      this.modelSelect.replaceChildren(...(model.options || []).map((option) => el("option", { value: option.value }, option.name || option.value)));
      this.modelSelect.value = model.currentValue;
      this.modelSelect.hidden = false;
    }
  }

  /** Sends `method`; its error shows above the timeline, with its details unless `details` is false (a turn's failure shows them in the timeline). */
  async call(method, params, { details = true } = {}) {
    this.error.textContent = "";
    try {
      const answer = await this.connection.request(method, params);
      if (answer.error) showError(this.error, `${method}: ${answer.error.message}`, details ? answer.error : null);
      return answer;
    } catch (error) {
      this.error.textContent = `${method}: ${error.message}`;
      return null;
    }
  }

  async send() {
    const text = this.input.value;
    if (!text.trim() || this.ended) return;
    this.input.value = "";
    await this.attach();
    // The answer comes in this POST's response, not on the stream: the
    // stream's last event of the turn (its final chunk) may have led to a
    // read of the log before the answer was in it, so read it again once
    // the answer is here (it is logged before it is sent).
    this.call("session/prompt", { sessionId: this.id, prompt: [{ type: "text", text }] }, { details: false }).then(() => this.schedule());
  }

  async cancel() {
    try {
      await this.connection.notify("session/cancel", { sessionId: this.id });
    } catch (error) {
      this.error.textContent = `cancel: ${error.message}`;
    }
  }

  async terminate() {
    if (this.terminateButton.dataset.confirm !== "yes") {
      this.terminateButton.dataset.confirm = "yes";
      this.terminateButton.textContent = "Confirm terminate";
      setTimeout(() => {
        this.terminateButton.dataset.confirm = "";
        this.terminateButton.textContent = "Terminate";
      }, 4000);
      return;
    }
    this.terminateButton.dataset.confirm = "";
    this.terminateButton.textContent = "Terminate";
    await this.call("_sandboxagent/session/terminate", { sessionId: this.id });
    this.schedule();
  }

  async rename() {
    const input = el("input", { type: "text", value: this.title.textContent, "aria-label": "Session title", id: "title-input" });
    const done = async (keep) => {
      input.replaceWith(this.title);
      if (!keep) return;
      const title = input.value.trim();
      await this.call("_sandboxagent/session/set_metadata", { sessionId: this.id, metadata: { title } });
      await this.refreshEntry();
    };
    input.addEventListener("keydown", (event) => {
      if (event.key === "Enter") done(true);
      if (event.key === "Escape") done(false);
    });
    this.title.replaceWith(input);
    input.focus();
    input.select();
  }

  async setMode() {
    await this.call("session/set_mode", { sessionId: this.id, modeId: this.modeSelect.value });
  }

  async setModel() {
    if (this.modelConfig) {
      await this.call("session/set_config_option", { sessionId: this.id, configId: this.modelConfig, value: this.modelSelect.value });
    } else {
      await this.call("session/set_model", { sessionId: this.id, modelId: this.modelSelect.value });
    }
  }
}

// --- Files ----------------------------------------------------------------

/** The host file system from a session's working directory. */
class FilesView {
  constructor(agent, session) {
    this.agent = agent;
    this.session = session;
    this.path = null;
  }

  query(path) {
    const params = new URLSearchParams({ path, sessionId: this.session });
    return params.toString();
  }

  async mount(root) {
    const entry = await getJson(`/v2/sessions/${encodeURIComponent(this.session)}?agent=${encodeURIComponent(this.agent)}`);
    this.path = entry.cwd || "/";
    this.heading = el("h1", {}, "Files");
    this.where = el("p", { class: "muted", id: "files-path" });
    this.status = el("p", { role: "status", id: "files-status" });
    const upload = el("input", { type: "file", multiple: true, id: "upload-files", "aria-label": "Upload files" });
    const folder = el("input", { type: "file", multiple: true, webkitdirectory: true, id: "upload-folder", "aria-label": "Upload a folder" });
    upload.addEventListener("change", () => this.upload(upload.files));
    folder.addEventListener("change", () => this.upload(folder.files));
    this.table = el("table", { "aria-label": "Files" });
    root.append(
      el("p", {}, el("a", { href: sessionHref(this.agent, this.session) }, "← back to the session")),
      this.heading,
      this.where,
      el("div", { class: "toolbar" }, el("label", { for: "upload-files" }, "Upload files", upload), el("label", { for: "upload-folder" }, "Upload a folder", folder)),
      this.status,
      this.table,
    );
    await this.list();
  }

  async list() {
    this.where.textContent = this.path;
    const { entries } = await getJson(`/v2/fs/entries?${this.query(this.path)}`);
    const up = this.path !== "/" ? el("tr", {}, el("td", { colspan: 3 }, el("button", { type: "button", class: "secondary", onclick: () => this.open(parent(this.path)) }, ".. (up)"))) : null;
    const rows = entries.map((entry) => {
      const isDir = (entry.entryType || entry.entry_type) === "directory";
      const name = isDir
        ? el("button", { type: "button", class: "secondary", "data-dir": entry.name, onclick: () => this.open(entry.path) }, `${entry.name}/`)
        : el("button", { type: "button", class: "secondary", "data-file": entry.name, onclick: () => this.download(entry) }, entry.name);
      return el("tr", {}, el("td", {}, name), el("td", {}, isDir ? "" : `${entry.size} bytes`), el("td", { class: "hide-narrow" }, when(entry.modified)));
    });
    const head = el("tr", {}, el("th", { scope: "col" }, "Name"), el("th", { scope: "col" }, "Size"), el("th", { scope: "col", class: "hide-narrow" }, "Modified"));
    this.table.replaceChildren(el("thead", {}, head), el("tbody", {}, up, rows));
  }

  async open(path) {
    this.path = path;
    await this.list().catch((error) => {
      this.status.textContent = `Could not list ${path}: ${error.message}`;
    });
  }

  /** Downloads a file: fetched with the token, saved from a blob URL. */
  async download(entry) {
    this.status.textContent = `downloading ${entry.name}…`;
    try {
      const response = await http(`/v2/fs/file?${this.query(entry.path)}`);
      if (!response.ok) throw await problemOf(response);
      const blob = await response.blob();
      const url = URL.createObjectURL(blob);
      const link = el("a", { href: url, download: entry.name, hidden: true });
      document.body.append(link);
      link.click();
      link.remove();
      setTimeout(() => URL.revokeObjectURL(url), 10_000);
      this.status.textContent = `downloaded ${entry.name} (${blob.size} bytes)`;
    } catch (error) {
      this.status.textContent = `Could not download ${entry.name}: ${error.message}`;
    }
  }

  /** Uploads files (a folder keeps its relative paths) into this directory. */
  async upload(files) {
    let done = 0;
    for (const file of files) {
      const relative = file.webkitRelativePath || file.name;
      const target = `${this.path.replace(/\/$/, "")}/${relative}`;
      this.status.textContent = `uploading ${relative} (${done + 1} of ${files.length})…`;
      const headers = { "content-type": "application/octet-stream" };
      if (token) headers.authorization = `Bearer ${token}`;
      const response = await fetch(`/v2/fs/file?${this.query(target)}`, { method: "PUT", headers, body: file });
      if (!response.ok) {
        const problem = await problemOf(response);
        this.status.textContent = `Could not upload ${relative}: ${problem.message}`;
        return;
      }
      done += 1;
    }
    this.status.textContent = `uploaded ${done} file${done === 1 ? "" : "s"}`;
    await this.list();
  }
}

function parent(path) {
  const trimmed = path.replace(/\/+$/, "");
  const index = trimmed.lastIndexOf("/");
  return index <= 0 ? "/" : trimmed.slice(0, index);
}

// --- Processes -------------------------------------------------------------

/** Processes per page of the table (GET /v2/processes `limit`). */
const PROCESSES_PAGE = 100;

/** The signals the Process view offers (any name the server knows works). */
const SIGNALS = ["SIGINT", "SIGTERM", "SIGKILL"];

function processHref(id) {
  return `#/process/${encodeURIComponent(id)}`;
}

function processPath(id, rest = "") {
  return `/v2/processes/${encodeURIComponent(id)}${rest}`;
}

/** Splits a command line into argv as a shell splits words, expanding
 * nothing (the server runs an argv, never a shell line): blanks separate,
 * '…' keeps every character, "…" keeps every character but \" and \\, and
 * outside quotes \ keeps the next character. Throws on an open quote. */
function splitArgv(line) {
  const words = [];
  let word = null; // null between words; "" is an empty quoted word
  let quote = null;
  for (let i = 0; i < line.length; i += 1) {
    const c = line[i];
    if (quote === "'") {
      if (c === "'") quote = null;
      else word += c;
    } else if (quote === '"') {
      if (c === '"') quote = null;
      else if (c === "\\" && (line[i + 1] === '"' || line[i + 1] === "\\")) {
        i += 1;
        word += line[i];
      } else word += c;
    } else if (c === "'" || c === '"') {
      quote = c;
      word = word ?? "";
    } else if (c === "\\") {
      i += 1;
      if (i < line.length) word = (word ?? "") + line[i];
    } else if (/\s/.test(c)) {
      if (word !== null) words.push(word);
      word = null;
    } else {
      word = (word ?? "") + c;
    }
  }
  if (quote) throw new Error(`a ${quote} quote is not closed`);
  if (word !== null) words.push(word);
  return words;
}

/** A process's argv as one line a shell (and splitArgv) reads back. */
function commandLine(process) {
  const quoted = (word) => (/^[\w@%+=:,./-]+$/.test(word) ? word : `'${word.replace(/'/g, `'\\''`)}'`);
  return [process.command, ...(process.args || [])].map(quoted).join(" ");
}

/** How a process ended: `exit code N`, `ended by SIGNAL`, or "" while it runs. */
function exitText({ exitCode, signal }) {
  if (signal) return `ended by ${signal}`;
  return exitCode === null || exitCode === undefined ? "" : `exit code ${exitCode}`;
}

/** A chunk's bytes as text: `data` itself, or its base64 decoded (bytes
 * that are not UTF-8 shown as U+FFFD). */
function chunkText(chunk) {
  if (chunk.encoding !== "base64") return chunk.data;
  return new TextDecoder().decode(Uint8Array.from(atob(chunk.data), (c) => c.charCodeAt(0)));
}

/** Terminal escape sequences (CSI, OSC, character set designations and
 * two-byte ones), removed from output shown as plain text; the Terminal
 * view renders them instead. */
const ESCAPES = /\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[()*+][ -~]|[@-Z\\-_78=>])/g;

function plainText(text) {
  return text.replace(ESCAPES, "").replace(/\r\n/g, "\n");
}

/**
 * Follows one process's output: GET /v2/processes/{id}/output as SSE,
 * read with fetch so the token goes in a header. Each event's id is the
 * byte offset after its chunk, sent back as Last-Event-ID when the stream
 * drops, so every byte is shown once (research/contract.md, "Output:
 * chunks, pages, following"). `handlers`: onText(text), onDropped(bytes),
 * onExit({exitCode, signal}) after the last chunk, onGone() when the
 * process is not (or no longer) kept.
 */
class OutputFollower {
  constructor(processId, handlers) {
    this.processId = processId;
    this.handlers = handlers;
    this.offset = 0;
    this.abort = new AbortController();
  }

  stop() {
    this.abort.abort();
  }

  async run() {
    let delay = 250;
    while (!this.abort.signal.aborted) {
      let exited = false;
      try {
        const response = await http(processPath(this.processId, "/output"), {
          headers: { accept: "text/event-stream", "last-event-id": String(this.offset) },
          signal: this.abort.signal,
        });
        if (response.status === 404) {
          this.handlers.onGone();
          return;
        }
        if (!response.ok || !response.body) throw await problemOf(response);
        delay = 250;
        await readSse(response.body, (event) => {
          exited = this.take(event) || exited;
        });
      } catch {
        // Dropped or refused: asked again below, from the last offset seen.
      }
      if (exited || this.abort.signal.aborted) return;
      await sleep(delay);
      delay = Math.min(delay * 2, 5000);
    }
  }

  /** Takes one event; true for the process's exit (the stream ends). */
  take({ event, id, data }) {
    let body;
    try {
      body = JSON.parse(data);
    } catch {
      return false;
    }
    if (event === "exit") {
      this.handlers.onExit(body);
      return true;
    }
    if (event === "dropped") this.handlers.onDropped(body.dropped);
    else if (event === "message") this.handlers.onText(chunkText(body));
    const offset = Number(id);
    if (id !== null && Number.isInteger(offset)) this.offset = offset;
    return false;
  }
}

/** A process's output followed live into a <pre>, as plain text. `onExit`
 * is told how it ended. */
class OutputPane {
  constructor(processId, attrs, onExit = () => {}) {
    this.node = el("pre", { class: "output", ...attrs });
    this.follower = new OutputFollower(processId, {
      onText: (text) => this.append(plainText(text)),
      onDropped: (bytes) => this.append(el("span", { class: "muted", "data-dropped": bytes }, `[${bytes} earlier bytes are no longer kept]\n`)),
      onExit,
      onGone: () => this.append(el("span", { class: "muted", "data-gone": "" }, "[this process is no longer kept]\n")),
    });
  }

  start() {
    this.follower.run();
    return this;
  }

  stop() {
    this.follower.stop();
  }

  /** Appends text or a node, keeping the end in view if it was. */
  append(part) {
    const pre = this.node;
    const atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 20;
    pre.append(part);
    if (atEnd) pre.scrollTop = pre.scrollHeight;
  }
}

/** The processes of the sandbox, newest first, a page at a time, and a
 * form to start one. The 2 s poll reloads the page shown. */
class ProcessesView {
  constructor() {
    this.pager = new Pager("processes", () => this.load().catch((error) => setStatus(`Could not list processes: ${error.message}`)));
    this.loads = 0;
  }

  async mount(root) {
    this.commandInput = el("input", { id: "process-command", type: "text", size: 40, placeholder: "sh -c 'npm test'", autocomplete: "off" });
    this.titleInput = el("input", { id: "process-title", type: "text", size: 16, autocomplete: "off" });
    this.ttyInput = el("input", { id: "process-tty", type: "checkbox" });
    this.startButton = el("button", { type: "submit", id: "process-start" }, "Start");
    this.error = el("p", { class: "error", role: "alert", id: "process-error" });
    const form = el(
      "form",
      { class: "toolbar", "aria-label": "Start a process" },
      el("label", { for: "process-command" }, "Command and arguments (an argv, quoted like a shell's words)", this.commandInput),
      el("label", { for: "process-title" }, "Title", this.titleInput),
      el("label", { for: "process-tty", class: "check" }, this.ttyInput, "On a terminal"),
      this.startButton,
    );
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      this.start();
    });
    this.stateFilter = el(
      "select",
      { id: "process-state-filter" },
      el("option", { value: "" }, "any state"),
      el("option", { value: "running" }, "running"),
      el("option", { value: "exited" }, "exited"),
    );
    this.stateFilter.addEventListener("change", () => this.pager.firstPage());
    this.table = el("table", { "aria-label": "Processes" });
    root.append(
      el("h1", {}, "Processes"),
      form,
      this.error,
      el("div", { class: "toolbar" }, el("label", { for: "process-state-filter" }, "Filter by state", this.stateFilter)),
      this.table,
      this.pager.nav,
    );
    await this.load();
    this.timer = setInterval(() => this.load().catch(() => {}), 2000);
  }

  unmount() {
    clearInterval(this.timer);
  }

  async start() {
    this.error.textContent = "";
    let argv;
    try {
      argv = splitArgv(this.commandInput.value);
    } catch (error) {
      this.error.textContent = `Could not read the command: ${error.message}`;
      return;
    }
    if (argv.length === 0) {
      this.error.textContent = "Type a command to start.";
      return;
    }
    const body = { command: argv[0], args: argv.slice(1) };
    if (this.titleInput.value.trim()) body.title = this.titleInput.value.trim();
    if (this.ttyInput.checked) body.tty = true;
    this.startButton.disabled = true;
    try {
      const response = await http("/v2/processes", { method: "POST", body });
      if (!response.ok) throw await problemOf(response);
      const process = await response.json();
      window.location.hash = processHref(process.id);
    } catch (error) {
      this.error.textContent = `Could not start it: ${error.message}`;
    } finally {
      this.startButton.disabled = false;
    }
  }

  /** Reads the page shown and draws it; an answer a later load overtook is
   * dropped. */
  async load() {
    const query = new URLSearchParams({ limit: String(PROCESSES_PAGE) });
    if (this.pager.cursor) query.set("cursor", this.pager.cursor);
    if (this.stateFilter.value) query.set("state", this.stateFilter.value);
    const load = ++this.loads;
    const page = await getJson(`/v2/processes?${query}`);
    if (load !== this.loads) return;
    this.render(page.processes);
    this.pager.drawn(page.nextCursor);
  }

  render(processes) {
    const rows = processes.map((p) =>
      el(
        "tr",
        { "data-process-id": p.id, "data-state": p.state },
        el("td", {}, el("a", { href: processHref(p.id), title: p.id }, p.id.slice(0, 8))),
        el("td", {}, p.pid ?? ""),
        el("td", { class: "command" }, el("code", {}, commandLine(p))),
        el("td", {}, el("span", { class: `badge ${p.state}` }, p.state), p.tty ? el("span", { class: "sub" }, "terminal") : null),
        el("td", { class: "exit" }, exitText(p)),
        el("td", { class: "title", title: p.title || "" }, p.title || ""),
        el("td", { class: "hide-narrow" }, p.sessionId ? el("code", { title: p.sessionId }, p.sessionId.slice(0, 8)) : ""),
        el("td", { class: "hide-narrow" }, when(p.startedAt)),
      ),
    );
    const head = el(
      "tr",
      {},
      ["Process", "PID", "Command", "State", "Exit", "Title"].map((name) => el("th", { scope: "col" }, name)),
      ["Session", "Started"].map((name) => el("th", { scope: "col", class: "hide-narrow" }, name)),
    );
    const empty = this.pager.cursor ? "No processes on this page." : this.stateFilter.value ? "No processes match." : "No processes yet.";
    const body = rows.length ? rows : [el("tr", {}, el("td", { colspan: 8, class: "muted" }, empty))];
    this.table.replaceChildren(el("thead", {}, head), el("tbody", {}, body));
  }
}

/** One process: what it runs, its output live, signals and forget. */
class ProcessView {
  constructor(id) {
    this.id = id;
  }

  async mount(root) {
    this.heading = el("h1", { class: "command" }, el("code", {}, "…"));
    this.state = el("span", { class: "badge", id: "process-state" });
    this.exit = el("span", { id: "process-exit" });
    this.facts = el("p", { class: "muted", id: "process-facts" });
    this.error = el("p", { class: "error", role: "alert", id: "process-error" });
    this.terminalLink = el("a", { href: `#/terminal/${encodeURIComponent(this.id)}`, id: "process-terminal", hidden: true }, "Open in the terminal");
    this.signalButtons = SIGNALS.map((name) =>
      el("button", { type: "button", class: name === "SIGKILL" ? "danger" : "secondary", "data-signal": name, onclick: () => this.signal(name) }, name),
    );
    this.forgetButton = el("button", { type: "button", class: "danger", id: "process-forget", onclick: () => this.forget() }, "Forget");
    this.pane = new OutputPane(this.id, { id: "process-output", "aria-label": "Output" }, () => this.refresh().catch(() => {}));
    root.append(
      el("p", {}, el("a", { href: "#/processes" }, "← all processes")),
      this.heading,
      el("div", { class: "toolbar process-head" }, this.state, this.exit, this.signalButtons, this.forgetButton, this.terminalLink),
      this.facts,
      this.error,
      this.pane.node,
    );
    await this.refresh();
    this.pane.start();
  }

  unmount() {
    this.pane.stop();
  }

  async refresh() {
    const process = await getJson(processPath(this.id));
    document.title = `${process.title || process.command} · sandbox-agent`;
    this.heading.firstChild.textContent = commandLine(process);
    this.state.textContent = process.state;
    this.state.className = `badge ${process.state}`;
    this.exit.textContent = exitText(process);
    const running = process.state === "running";
    for (const button of this.signalButtons) button.disabled = !running;
    this.terminalLink.hidden = !(running && process.tty);
    const facts = [
      process.title,
      process.pid ? `pid ${process.pid}` : null,
      `in ${process.cwd}`,
      process.tty ? "on a terminal" : null,
      process.sessionId ? `session ${process.sessionId}` : null,
      `started ${when(process.startedAt)}`,
      process.endedAt ? `ended ${when(process.endedAt)}` : null,
      `${process.outputBytes} bytes written`,
    ];
    this.facts.textContent = facts.filter(Boolean).join(" · ");
  }

  async signal(name) {
    this.error.textContent = "";
    const response = await http(processPath(this.id, "/signal"), { method: "POST", body: { signal: name } });
    if (!response.ok) this.error.textContent = `${name}: ${(await problemOf(response)).message}`;
  }

  async forget() {
    this.error.textContent = "";
    const response = await http(processPath(this.id), { method: "DELETE" });
    if (response.ok) window.location.hash = "#/processes";
    else this.error.textContent = `Could not forget it: ${(await problemOf(response)).message}`;
  }
}

// --- Terminal --------------------------------------------------------------

/** A new shell's size in character cells; an attached process is resized
 * to it. */
const TERMINAL_COLS = 100;
const TERMINAL_ROWS = 30;

/**
 * A shell over the process API's WebSocket (GET /v2/processes/{id}/terminal):
 * binary frames are the terminal's bytes both ways, text frames are JSON
 * (`resize` from here; `exit` and `dropped` from the server). A browser
 * cannot put a header on a WebSocket, so the token goes as `access_token`
 * in the query. A dropped socket reconnects from the byte offset shown, so
 * nothing is drawn twice. xterm.js draws colours and full-screen programs.
 * Without a process id, the view offers to start a shell (`sh`, which
 * reads no rc file).
 */
class TerminalView {
  constructor(processId) {
    this.processId = processId;
    this.offset = 0;
    this.exited = false;
    this.closed = false;
    this.retryDelay = 250;
  }

  async mount(root) {
    root.append(el("h1", {}, "Terminal"));
    if (!this.processId) {
      this.offerShell(root);
      return;
    }
    const process = await getJson(processPath(this.processId));
    if (!process.tty) {
      root.append(el("p", {}, "This process is not on a terminal: ", el("a", { href: processHref(this.processId) }, "see its output"), "."));
      return;
    }
    const { Terminal } = await import("/ui/vendor/xterm.mjs");
    if (this.closed) return; // the user left while it loaded
    this.status = el("p", { role: "status", id: "terminal-status", class: "muted" });
    const screen = el("div", { class: "terminal", id: "terminal" });
    root.append(el("p", {}, el("a", { href: processHref(this.processId) }, commandLine(process)), ` (${process.id.slice(0, 8)})`), this.status, screen);
    this.terminal = new Terminal({ cols: TERMINAL_COLS, rows: TERMINAL_ROWS, fontFamily: 'ui-monospace, "SF Mono", Menlo, Consolas, monospace' });
    this.terminal.open(screen);
    const encoder = new TextEncoder();
    this.terminal.onData((text) => this.send(encoder.encode(text)));
    this.terminal.onBinary((text) => this.send(Uint8Array.from(text, (c) => c.charCodeAt(0))));
    this.connect();
    this.terminal.focus();
  }

  unmount() {
    this.closed = true;
    if (this.socket) this.socket.close();
    if (this.terminal) this.terminal.dispose();
  }

  offerShell(root) {
    const start = el("button", { type: "button", id: "terminal-start" }, "Start a shell");
    const error = el("p", { class: "error", role: "alert" });
    start.addEventListener("click", async () => {
      start.disabled = true;
      error.textContent = "";
      try {
        const body = { command: "sh", tty: true, cols: TERMINAL_COLS, rows: TERMINAL_ROWS, title: "inspector shell" };
        const response = await http("/v2/processes", { method: "POST", body });
        if (!response.ok) throw await problemOf(response);
        const process = await response.json();
        window.location.hash = `#/terminal/${encodeURIComponent(process.id)}`;
      } catch (failure) {
        error.textContent = `Could not start a shell: ${failure.message}`;
        start.disabled = false;
      }
    });
    root.append(
      el("p", { class: "muted" }, "A shell (sh) in the sandbox, as the server's user, listed with the other processes. To reattach to one, open it from the Processes view."),
      start,
      error,
    );
  }

  connect() {
    const query = new URLSearchParams({ offset: String(this.offset) });
    if (token) query.set("access_token", token);
    const scheme = window.location.protocol === "https:" ? "wss:" : "ws:";
    const socket = new WebSocket(`${scheme}//${window.location.host}${processPath(this.processId, "/terminal")}?${query}`);
    socket.binaryType = "arraybuffer";
    socket.addEventListener("open", () => {
      this.retryDelay = 250;
      this.setStatus("connected", "");
      socket.send(JSON.stringify({ type: "resize", cols: this.terminal.cols, rows: this.terminal.rows }));
    });
    socket.addEventListener("message", ({ data }) => this.receive(data));
    socket.addEventListener("close", () => this.closedSocket());
    this.socket = socket;
  }

  receive(data) {
    if (typeof data !== "string") {
      const bytes = new Uint8Array(data);
      this.offset += bytes.length;
      this.terminal.write(bytes);
      return;
    }
    let frame;
    try {
      frame = JSON.parse(data);
    } catch {
      return;
    }
    if (frame.type === "exit") {
      this.exited = true;
      this.setStatus("exited", `The process ended (${exitText(frame)}).`);
    } else if (frame.type === "dropped") {
      this.offset = frame.nextOffset;
      this.setStatus("connected", `${frame.dropped} bytes of earlier output are no longer kept.`);
    } else if (frame.type === "error") {
      this.setStatus("connected", (frame.problem && (frame.problem.detail || frame.problem.title)) || "The server refused a request.");
    }
  }

  /** The socket closed: done after an exit, else reconnect from the offset
   * shown while the process runs (a refused token asks for another). */
  async closedSocket() {
    if (this.closed || this.exited) return;
    this.setStatus("reconnecting", "Reconnecting…");
    await sleep(this.retryDelay);
    this.retryDelay = Math.min(this.retryDelay * 2, 5000);
    try {
      const process = await getJson(processPath(this.processId));
      if (this.closed) return;
      if (process.state === "running") this.connect();
      else this.setStatus("exited", `The process ended (${exitText(process)}).`);
    } catch (error) {
      this.setStatus("gone", `The process is gone: ${error.message}`);
    }
  }

  send(bytes) {
    if (this.socket && this.socket.readyState === WebSocket.OPEN) this.socket.send(bytes);
  }

  setStatus(state, text) {
    this.status.dataset.state = state;
    this.status.textContent = text;
  }
}

// ---------------------------------------------------------------------------

window.addEventListener("hashchange", route);
route();
