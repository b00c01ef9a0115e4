// A process's output, followed live over SSE by byte offset and shown as
// plain text (the Process view, and an agent's terminal in a tool call).

import { el } from "./dom.js";
import { http, problemOf, sleep } from "./http.js";
import { processPath } from "./process.js";
import { readSse } from "./sse.js";

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
export class OutputPane {
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
