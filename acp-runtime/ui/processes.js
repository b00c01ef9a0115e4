// The Processes view (the sandbox's processes a page at a time, and a form
// to start one) and the Process view (one process: its output live,
// signals, forget).

import { el, setStatus, when } from "./dom.js";
import { getJson, http, problemOf } from "./http.js";
import { processHref } from "./links.js";
import { OutputPane } from "./output.js";
import { Pager } from "./pager.js";
import { commandLine, exitText, processPath, splitArgv } from "./process.js";

/** Processes per page of the table (GET /v2/processes `limit`). */
const PROCESSES_PAGE = 100;

/** The signals the Process view offers (any name the server knows works). */
const SIGNALS = ["SIGINT", "SIGTERM", "SIGKILL"];

/** The processes of the sandbox, newest first, a page at a time, and a
 * form to start one. The 2 s poll reloads the page shown. */
export class ProcessesView {
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
export class ProcessView {
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
