// One session: its timeline drawn from its event log (read from the next
// offset whenever the connection's stream says something happened), the
// prompt box, and the session's controls (mode, model, rename, terminate).

import { connectionFor } from "./connection.js";
import { el } from "./dom.js";
import { getJson } from "./http.js";
import { errorDetails, meta, showError, stateOf } from "./meta.js";
import { OutputPane } from "./output.js";
import { exitText } from "./process.js";
import { QuestionCard } from "./question.js";

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

export class SessionView {
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
