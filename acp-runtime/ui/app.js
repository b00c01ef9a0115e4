// sandbox-agent inspector: watch and drive the agents of one runtime.
//
// The page speaks the runtime's own API (research/contract.md, "Inspector"):
// the control plane for agents and sessions, and /v2/rpc for everything a
// client does (initialize, session/new, session/load, prompts, answers to
// permission requests), with a fetch-based SSE stream per connection,
// resumed with Last-Event-ID after a drop or a reload.
//
// Processes (GET /v2/processes…) are listed and their output followed over
// the same fetch-based SSE, by byte offset; the Terminal view is a shell on
// the process API's WebSocket, drawn by xterm.js (ui/vendor/, imported
// when the view opens).
//
// A session's timeline is drawn from its event log
// (GET /v2/sessions/{id}/events), read from the next offset whenever the
// stream says something happened: the log is the one ordered record, so
// after a reload or a drop nothing is shown twice and nothing is missing.
// Everything the agent or a client wrote is put on the page as text
// (textContent), never as HTML.
//
// The modules, from the top down. Each imports only modules on lines below
// its own, so there is no import cycle; modules on one line never import
// each other. The server serves each file named here (src/http/ui.rs).
//
//   app.js          this entry: starts the router
//   router.js       the `#/…` address to its view
//   agents.js  health.js  sessions.js  session.js  files.js  processes.js
//   terminal.js     the views, one module each (processes.js has two)
//   question.js     an agent question's card in a session's timeline
//   output.js       a process's output followed live
//   connection.js   one ACP connection per agent, kept for the tab
//   pager.js        cursor paging of a listing
//   http.js         fetch() with the bearer token, problem details
//   meta.js         what the runtime adds under `_meta`
//   sse.js  links.js  process.js  storage.js  dom.js
//                   leaves: SSE parsing, `#/…` addresses, a process's
//                   names, sessionStorage, building elements

import { route } from "./router.js";

window.addEventListener("hashchange", route);
route();
