// The views by address: the `#/…` hash names one view, shown in <main> (the
// one shown before it is unmounted first).

import { AgentsView } from "./agents.js";
import { el } from "./dom.js";
import { FilesView } from "./files.js";
import { HealthView } from "./health.js";
import { ProcessView, ProcessesView } from "./processes.js";
import { SessionView } from "./session.js";
import { SessionsView } from "./sessions.js";
import { TerminalView } from "./terminal.js";

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

export function route() {
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
