// The Sessions view: the inventory a page at a time, filtered by the server,
// and the form that creates a session.

import { connectionFor } from "./connection.js";
import { el, setStatus, when } from "./dom.js";
import { getJson } from "./http.js";
import { sessionHref } from "./links.js";
import { META, meta, showError, stateOf } from "./meta.js";
import { Pager } from "./pager.js";

/** Sessions per page of the table (GET /v2/sessions `limit`). */
const SESSIONS_PAGE = 100;

/** One page of the inventory at a time (a Pager); the filters are the
 * server's, so a change starts again at the first page. The 2 s poll
 * reloads the page shown. */
export class SessionsView {
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
