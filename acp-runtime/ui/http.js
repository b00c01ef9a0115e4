// HTTP with the bearer token: fetch() that asks for a token on a 401 (kept
// for the tab), problem details (RFC 9457) as errors, and the wait between
// two tries of a dropped stream or socket.

import { save, saved } from "./storage.js";

/** The token every request carries; null until the server asks for one.
 * Set here only (askToken); other modules read it, live, as an import. */
export let token = saved("token", null);
let asking = null;

export class ProblemError extends Error {
  constructor(status, problem) {
    super((problem && (problem.detail || problem.title)) || `HTTP ${status}`);
    this.status = status;
    this.problem = problem;
  }
}

/** Asks for the token once at a time; resolves when one was accepted. */
function askToken(refused) {
  if (asking) return asking;
  const dialog = document.getElementById("token-dialog");
  const form = document.getElementById("token-form");
  const input = document.getElementById("token-input");
  const error = document.getElementById("token-error");
  error.hidden = !refused;
  error.textContent = refused ? "That token was refused: check it and try again." : "";
  asking = new Promise((resolve) => {
    const submit = async (event) => {
      event.preventDefault();
      const candidate = input.value.trim();
      if (!candidate) return;
      const probe = await fetch("/v2/agents", { headers: { authorization: `Bearer ${candidate}` } });
      if (probe.status === 401) {
        error.hidden = false;
        error.textContent = "That token was refused: check it and try again.";
        input.select();
        return;
      }
      token = candidate;
      save("token", token);
      form.removeEventListener("submit", submit);
      dialog.close();
      asking = null;
      resolve();
    };
    form.addEventListener("submit", submit);
  });
  if (!dialog.open) dialog.showModal();
  input.focus();
  return asking;
}

/** fetch() with the token; a 401 asks for one and tries again. `signal`
 * aborts the request (and the reading of its body). */
export async function http(path, { method = "GET", body, headers = {}, signal } = {}) {
  for (;;) {
    const all = { ...headers };
    if (token) all.authorization = `Bearer ${token}`;
    if (body !== undefined) all["content-type"] = "application/json";
    const response = await fetch(path, {
      method,
      headers: all,
      body: body === undefined ? undefined : JSON.stringify(body),
      signal,
    });
    if (response.status !== 401) return response;
    await askToken(Boolean(token));
  }
}

export async function problemOf(response) {
  try {
    return new ProblemError(response.status, await response.json());
  } catch {
    return new ProblemError(response.status, null);
  }
}

export async function getJson(path) {
  const response = await http(path);
  if (!response.ok) throw await problemOf(response);
  return response.json();
}

export const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
