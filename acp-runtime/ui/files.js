// The Files view: the host file system from a session's working directory,
// browsed, downloaded and uploaded with the token.

import { el, when } from "./dom.js";
import { getJson, http, problemOf, token } from "./http.js";
import { sessionHref } from "./links.js";

/** The host file system from a session's working directory. */
export class FilesView {
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
