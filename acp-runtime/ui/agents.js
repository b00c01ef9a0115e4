// The Agents view: each agent of the runtime, and installing one.

import { el } from "./dom.js";
import { getJson, http, problemOf } from "./http.js";

export class AgentsView {
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
