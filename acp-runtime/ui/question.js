// Agent questions (ACP elicitation): an agent's `elicitation/create`
// (research/contract.md, "Inspector") is a card in the session's timeline: a
// form built from its restricted JSON Schema, or a link for a URL-mode
// question. Every string in it is the agent's, so it goes on the page as
// text, and only an http(s) URL becomes a link (never opened by the page).

import { el } from "./dom.js";

let questionSeq = 0;

/** `text` when it is an absolute http or https URL, else null. */
function webUrl(text) {
  try {
    const url = new URL(text);
    return url.protocol === "http:" || url.protocol === "https:" ? url.href : null;
  } catch {
    return null;
  }
}

/** The choices of a single-select (`enum`, or `oneOf` of `{const, title}`) or
 * of a multi-select's `items` (`enum`, or `anyOf`): `[{value, title}]`, or
 * null when the schema has none. */
function choicesOf(schema) {
  const titled = Array.isArray(schema.oneOf) ? schema.oneOf : Array.isArray(schema.anyOf) ? schema.anyOf : null;
  if (titled) {
    return titled
      .filter((option) => option && typeof option.const === "string")
      .map((option) => ({ value: option.const, title: typeof option.title === "string" ? option.title : option.const }));
  }
  if (Array.isArray(schema.enum)) return schema.enum.filter((value) => typeof value === "string").map((value) => ({ value, title: value }));
  return null;
}

/** The input type for a string property's `format`. */
const STRING_INPUTS = { email: "email", uri: "url", date: "date", "date-time": "datetime-local" };

/** Counts characters as JSON Schema does (code points, not UTF-16 units). */
const charCount = (text) => [...text].length;

/**
 * One property of a form question: its control and how to read it.
 * `read()` gives `{value}`, `{skip: true}` (optional and left empty) or
 * `{error}` (a message for the person, shown before anything is sent).
 */
function questionField(name, schema, required, id) {
  const title = typeof schema.title === "string" && schema.title ? schema.title : name;
  const marker = required ? el("span", { class: "required", title: "required" }, " *") : null;
  const description = typeof schema.description === "string" && schema.description ? el("span", { class: "sub" }, schema.description) : null;
  const choices = schema.type === "array" ? choicesOf(schema.items || {}) : choicesOf(schema);
  const field = { name, title, required };
  let control;
  if (schema.type === "string" && choices) {
    const select = el(
      "select",
      { id, name, required, "aria-required": required ? "true" : null },
      el("option", { value: "" }, required ? "(choose one)" : "(none)"),
      choices.map((choice) => el("option", { value: choice.value }, choice.title)),
    );
    if (typeof schema.default === "string") select.value = schema.default;
    field.read = () => (select.value ? { value: select.value } : required ? { error: "Choose one." } : { skip: true });
    control = select;
  } else if (schema.type === "string") {
    const type = STRING_INPUTS[schema.format] || "text";
    const input = el("input", {
      id,
      name,
      type,
      required,
      "aria-required": required ? "true" : null,
      minlength: Number.isInteger(schema.minLength) ? schema.minLength : null,
      maxlength: Number.isInteger(schema.maxLength) ? schema.maxLength : null,
      autocomplete: "off",
    });
    if (typeof schema.default === "string") input.value = type === "datetime-local" ? schema.default.slice(0, 16) : schema.default;
    field.read = () => readString(input, schema, required);
    control = input;
  } else if (schema.type === "number" || schema.type === "integer") {
    const integer = schema.type === "integer";
    const input = el("input", {
      id,
      name,
      type: "number",
      required,
      "aria-required": required ? "true" : null,
      min: typeof schema.minimum === "number" ? schema.minimum : null,
      max: typeof schema.maximum === "number" ? schema.maximum : null,
      step: integer ? 1 : "any",
    });
    if (typeof schema.default === "number") input.value = String(schema.default);
    field.read = () => readNumber(input, schema, required, integer);
    control = input;
  } else if (schema.type === "boolean") {
    const box = el("input", { id, name, type: "checkbox" });
    box.checked = schema.default === true;
    field.read = () => ({ value: box.checked });
    field.node = el("div", { class: "field check", "data-field": name }, el("label", { for: id }, box, ` ${title}`, marker), description);
  } else if (schema.type === "array" && choices) {
    const boxes = choices.map((choice, index) => el("input", { type: "checkbox", id: `${id}-${index}`, value: choice.value }));
    const initial = Array.isArray(schema.default) ? schema.default : [];
    for (const box of boxes) box.checked = initial.includes(box.value);
    field.read = () => {
      const values = boxes.filter((box) => box.checked).map((box) => box.value);
      if (!values.length && required) return { error: "Choose at least one." };
      if (Number.isInteger(schema.minItems) && values.length < schema.minItems) return { error: `Choose at least ${schema.minItems}.` };
      if (Number.isInteger(schema.maxItems) && values.length > schema.maxItems) return { error: `Choose at most ${schema.maxItems}.` };
      return values.length || required ? { value: values } : { skip: true };
    };
    field.node = el(
      "fieldset",
      { class: "field choices-field", "data-field": name },
      el("legend", {}, title, marker),
      description,
      boxes.map((box, index) => el("label", { for: box.id, class: "check" }, box, ` ${choices[index].title}`)),
    );
  } else {
    // A type this page does not know (a future ACP type, or a `_`
    // extension): shown, never drawn as an input, never sent.
    const kind = schema.type === "array" ? "array of free values" : typeof schema.type === "string" ? schema.type : "unknown";
    field.read = () => (required ? { error: "The inspector cannot answer this field: decline or cancel the question." } : { skip: true });
    field.node = el(
      "div",
      { class: "field unsupported", "data-field": name, "data-unsupported": kind },
      el("span", {}, title, marker),
      el("span", { class: "sub" }, `This field's type (${kind}) is not supported here; it is left out of the answer.`),
    );
  }
  field.error = el("p", { class: "field-error error", id: `${id}-error`, "data-field-error": name, hidden: true });
  if (control) {
    control.setAttribute("aria-describedby", field.error.id);
    field.node = el("div", { class: "field", "data-field": name }, el("label", { for: id }, title, marker), description, control);
  }
  field.node.append(field.error);
  field.showError = (message) => {
    field.error.textContent = message || "";
    field.error.hidden = !message;
    if (control) control.setAttribute("aria-invalid", message ? "true" : "false");
  };
  field.focus = () => (control || field.node.querySelector("input") || field.node).focus();
  return field;
}

function readString(input, schema, required) {
  const value = input.value;
  if (input.validity.badInput) return { error: "Enter a complete value." };
  if (value === "") return required ? { error: "Required." } : { skip: true };
  if (Number.isInteger(schema.minLength) && charCount(value) < schema.minLength) return { error: `At least ${schema.minLength} character${schema.minLength === 1 ? "" : "s"}.` };
  if (Number.isInteger(schema.maxLength) && charCount(value) > schema.maxLength) return { error: `At most ${schema.maxLength} characters.` };
  if (schema.format === "email" && input.validity.typeMismatch) return { error: "Enter an email address." };
  if (schema.format === "uri") {
    try {
      new URL(value);
    } catch {
      return { error: "Enter an absolute URI (such as https://example.com/)." };
    }
  }
  if (typeof schema.pattern === "string") {
    let pattern = null;
    try {
      pattern = new RegExp(schema.pattern, "u");
    } catch {
      // A pattern this browser cannot read is not held against the person.
    }
    if (pattern && !pattern.test(value)) return { error: `Does not match the expected form (${schema.pattern}).` };
  }
  // datetime-local has no zone: the person's local time, sent as RFC 3339.
  if (schema.format === "date-time") {
    const date = new Date(value);
    if (Number.isNaN(date.getTime())) return { error: "Enter a date and time." };
    return { value: date.toISOString() };
  }
  return { value };
}

function readNumber(input, schema, required, integer) {
  if (input.validity.badInput) return { error: "Enter a number." };
  if (input.value === "") return required ? { error: "Required." } : { skip: true };
  const value = Number(input.value);
  if (!Number.isFinite(value)) return { error: "Enter a number." };
  if (integer && !Number.isInteger(value)) return { error: "Enter a whole number." };
  if (typeof schema.minimum === "number" && value < schema.minimum) return { error: `At least ${schema.minimum}.` };
  if (typeof schema.maximum === "number" && value > schema.maximum) return { error: `At most ${schema.maximum}.` };
  return { value };
}

/** A value of an answer as the person reads it. */
function shownValue(value) {
  if (Array.isArray(value)) return value.map(shownValue).join(", ");
  if (value !== null && typeof value === "object") return JSON.stringify(value);
  return String(value);
}

/**
 * One `elicitation/create` in the timeline. `view` is the SessionView (its
 * connection answers), `message` the agent request as logged. The card
 * goes pending → sent (this tab answered) → answered (the answer is in the
 * log, or another client's answer was announced), and then is read-only;
 * a URL question also turns done on `elicitation/complete`.
 */
export class QuestionCard {
  constructor(view, message) {
    this.view = view;
    this.message = message;
    const params = message.params || {};
    this.params = params;
    this.mode = params.mode;
    this.elicitationId = typeof params.elicitationId === "string" ? params.elicitationId : null;
    this.fields = [];
    const prefix = `question-${++questionSeq}`;
    this.status = el("p", { class: "muted answer", role: "status" });
    this.buttons = el("div", { class: "choices" });
    this.fieldset = el("fieldset", { class: "question-fields" });
    const form = el("form", { novalidate: true, "aria-label": "Agent question" }, this.fieldset, this.buttons);
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      this.accept();
    });
    const tool = params.toolCallId && view.tools.get(params.toolCallId);
    this.node = el(
      "div",
      { class: "item question", "data-question": "pending", "data-mode": typeof this.mode === "string" ? this.mode : "unknown" },
      el("div", { class: "who" }, "question from the agent"),
      el("p", { class: "message" }, typeof params.message === "string" ? params.message : ""),
      tool ? el("p", { class: "sub" }, `About the tool call: ${tool.title.textContent}`) : null,
      form,
      this.status,
    );
    if (this.mode === "form") this.drawForm(params.requestedSchema || {}, prefix);
    else if (this.mode === "url") this.drawUrl(params.url);
    else this.fieldset.append(el("p", { class: "muted" }, `This kind of question (${String(this.mode)}) cannot be answered here: decline or cancel it.`));
    const decline = el("button", { type: "button", class: "secondary", "data-action": "decline" }, "Decline");
    const cancel = el("button", { type: "button", class: "secondary", "data-action": "cancel" }, "Cancel");
    decline.addEventListener("click", () => this.send({ action: "decline" }));
    cancel.addEventListener("click", () => this.send({ action: "cancel" }));
    this.buttons.append(decline, cancel);
    if (this.elicitationId && view.connection.completed.has(this.elicitationId)) this.complete();
  }

  drawForm(schema, prefix) {
    if (typeof schema.title === "string" && schema.title) this.fieldset.append(el("legend", {}, schema.title));
    if (typeof schema.description === "string" && schema.description) this.fieldset.append(el("p", { class: "sub" }, schema.description));
    const required = new Set(Array.isArray(schema.required) ? schema.required : []);
    const properties = schema.properties && typeof schema.properties === "object" ? schema.properties : {};
    // Required fields first, each group in the schema's order.
    const names = Object.keys(properties).sort((a, b) => Number(required.has(b)) - Number(required.has(a)));
    names.forEach((name, index) => {
      const property = properties[name] && typeof properties[name] === "object" ? properties[name] : {};
      const field = questionField(name, property, required.has(name), `${prefix}-${index}`);
      this.fields.push(field);
      this.fieldset.append(field.node);
    });
    if (required.size) this.fieldset.append(el("p", { class: "sub" }, "Fields marked * are required."));
    this.buttons.append(el("button", { type: "submit", "data-action": "accept" }, "Submit"));
  }

  drawUrl(text) {
    const href = typeof text === "string" ? webUrl(text) : null;
    // Opened only by the person, in a new tab that cannot reach this page.
    const target = href
      ? el("a", { href, target: "_blank", rel: "noopener noreferrer", "data-question-url": "" }, href)
      : el("code", { "data-question-url-text": "" }, String(text));
    this.fieldset.append(
      el("p", {}, href ? "Open this link, finish there, then press Continue:" : "The agent gave an address the inspector does not open (not http or https):"),
      el("p", { class: "url" }, target),
    );
    this.buttons.append(el("button", { type: "submit", "data-action": "accept" }, "Continue"));
  }

  /** Submit (or Continue): checks every field first; nothing is sent while one is invalid. */
  accept() {
    if (this.mode === "url") {
      this.send({ action: "accept" });
      return;
    }
    if (this.mode !== "form") return;
    const content = {};
    let firstInvalid = null;
    for (const field of this.fields) {
      const read = field.read();
      field.showError(read.error);
      if (read.error) firstInvalid = firstInvalid || field;
      else if (!read.skip) content[field.name] = read.value;
    }
    if (firstInvalid) {
      this.node.dataset.invalid = "yes";
      this.status.textContent = "Check the fields marked above; nothing was sent.";
      firstInvalid.focus();
      return;
    }
    delete this.node.dataset.invalid;
    this.send({ action: "accept", content });
  }

  async send(result) {
    this.lock(true);
    this.status.textContent = "sending…";
    try {
      await this.view.connection.respond(this.message.id, result);
      if (this.node.dataset.question === "pending") {
        this.node.dataset.question = "sent";
        this.status.textContent = "sent";
      }
    } catch (error) {
      this.status.textContent = `could not answer: ${error.message}`;
      this.lock(false);
    }
  }

  lock(locked) {
    this.fieldset.disabled = locked;
    for (const button of this.buttons.querySelectorAll("button")) button.disabled = locked;
  }

  /** The answer that reached the agent, from the log (`result` or `error`). */
  answered(result, error) {
    this.answer = { result: error ? null : result, error };
    this.showAnswer();
  }

  /** Another client answered first, or the runtime cancelled the question
   * (`_sandboxagent/request/resolved`); `outcome` is the winning result
   * (`{"outcome": "cancelled"}` from a runtime that predates the
   * elicitation form of it). */
  resolvedElsewhere(outcome) {
    const result = outcome && typeof outcome.action === "string" ? outcome : { action: "cancel" };
    this.elsewhere = true;
    this.node.dataset.resolved = result.action;
    // The log's answer, when already read, is the same one.
    if (!this.answer) this.answer = { result, error: null };
    this.showAnswer();
  }

  /** Nobody can answer it any more (its turn was interrupted when the
   * server stopped): read-only, greyed, with `reason`. */
  closed(reason) {
    if (this.answer) return;
    this.lock(true);
    this.node.dataset.question = "closed";
    this.status.textContent = reason;
  }

  /** `elicitation/complete` for this URL question: the agent says the flow finished. */
  complete() {
    if (this.node.dataset.url === "done") return;
    this.node.dataset.url = "done";
    this.fieldset.append(el("p", { class: "ok", "data-url-done": "" }, "done: the agent says this step is finished."));
    if (this.answer) this.showAnswer();
  }

  /** Read-only from now on, with the answer in words. */
  showAnswer() {
    const { result, error } = this.answer;
    this.lock(true);
    this.node.dataset.question = "answered";
    const action = error ? "error" : (result && result.action) || "unknown";
    this.node.dataset.answer = action;
    const parts = [this.elsewhere ? "Answered elsewhere: " : "You "];
    if (action === "accept" && this.mode === "url") {
      parts.push(this.node.dataset.url === "done" ? "continued." : "continued; waiting for the agent to say it is done.");
    } else if (action === "accept") {
      const content = (result && result.content) || {};
      // In the form's order (the announced outcome's keys may be sorted),
      // then any the form did not ask for.
      const known = this.fields.filter((field) => field.name in content);
      const names = [...known.map((field) => field.name), ...Object.keys(content).filter((name) => !this.fields.some((field) => field.name === name))];
      const titles = new Map(known.map((field) => [field.name, field.title]));
      const values = names.map((name) => el("li", { "data-answer-field": name }, `${titles.get(name) || name}: ${shownValue(content[name])}`));
      if (this.elsewhere) parts[0] = values.length ? "Answered elsewhere:" : "Answered elsewhere (no values).";
      else parts.push(values.length ? "answered:" : "answered (no values).");
      if (values.length) parts.push(el("ul", {}, values));
    } else if (action === "decline") {
      parts.push("declined.");
    } else if (action === "cancel") {
      parts.push("cancelled.");
    } else if (action === "error") {
      parts.push(`answered with an error: ${error.message}`);
    } else {
      parts.push(`answered: ${action}`);
    }
    this.status.replaceChildren(...parts.filter(Boolean));
  }
}
