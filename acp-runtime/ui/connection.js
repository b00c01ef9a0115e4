// One ACP connection per agent, kept for the tab: initialize, requests and
// answers on POST /v2/rpc, and its SSE stream, resumed with Last-Event-ID
// after a drop or a reload.

import { setStatus } from "./dom.js";
import { ProblemError, http, problemOf, sleep } from "./http.js";
import { META } from "./meta.js";
import { readSse } from "./sse.js";
import { save, saved } from "./storage.js";

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

export function connectionFor(agent) {
  if (!connections.has(agent)) connections.set(agent, new Connection(agent));
  return connections.get(agent);
}
