// The Terminal view: a shell on the process API's WebSocket, drawn by
// xterm.js (ui/vendor/, imported when the view opens).

import { el } from "./dom.js";
import { getJson, http, problemOf, sleep, token } from "./http.js";
import { processHref } from "./links.js";
import { commandLine, exitText, processPath } from "./process.js";

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
export class TerminalView {
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
