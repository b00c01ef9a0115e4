// Cursor paging of a listing (the Sessions and Processes views).

import { el } from "./dom.js";

/** Cursor paging of a listing (GET /v2/sessions, GET /v2/processes;
 * research/contract.md, "Inspector"): `cursor` names the page shown,
 * `earlier` holds the cursors of the pages before it (for "Previous").
 * `load` reads the page `cursor` names; `nav` is the Previous / "Page N" /
 * Next bar, its ids prefixed with `name`. */
export class Pager {
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
