// The page's own addresses (`#/…`) of a session and of a process; the router
// (router.js) reads them back.

export function sessionHref(agent, id) {
  return `#/session/${encodeURIComponent(agent)}/${encodeURIComponent(id)}`;
}

export function processHref(id) {
  return `#/process/${encodeURIComponent(id)}`;
}
