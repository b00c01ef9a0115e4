"""Wire constants of the server (`research/contract.md`, "Transport: /v2/rpc",
"Answer ordering header", "Extension methods and control plane") and small
pure helpers: no I/O here."""

from __future__ import annotations

import json
from typing import Any

import httpx

from .errors import SandboxAgentError

#: The transport's endpoint path.
RPC_PATH = "/v2/rpc"
#: Header naming the connection on every request after `initialize`.
CONNECTION_ID_HEADER = "x-acp-connection-id"
#: Header of a POST's 200 answer: the newest event id when the answer was released.
LAST_EVENT_ID_ANSWER_HEADER = "x-acp-last-event-id"
#: The SSE resume header (WHATWG HTML, "Server-sent events").
LAST_EVENT_ID_HEADER = "last-event-id"
#: The `_meta` key of everything the server adds.
META_NAMESPACE = "sandboxagent.dev"
#: ACP protocol version this client speaks.
PROTOCOL_VERSION = 1

#: JSON-RPC error code: the method is not handled here.
METHOD_NOT_FOUND = -32601
#: JSON-RPC error code: an internal error of the answering side.
INTERNAL_ERROR = -32603

#: Extension methods the runtime answers ("Extension methods and control plane").
METHOD_SET_METADATA = "_sandboxagent/session/set_metadata"
METHOD_LIST_MODELS = "_sandboxagent/session/list_models"
METHOD_DETACH = "_sandboxagent/session/detach"
METHOD_TERMINATE = "_sandboxagent/session/terminate"
#: Notification of a turn its server stopped in ("Notifications the runtime sends").
NOTIFICATION_TURN_INTERRUPTED = "_sandboxagent/turn/interrupted"

#: Statuses of the event stream's GET after which reconnecting cannot help:
#: the connection is unknown (404), the token refused (401, 403), the request wrong (400).
FATAL_STREAM_STATUSES = frozenset({400, 401, 403, 404, 410})


def is_request(message: dict[str, Any]) -> bool:
    """A JSON-RPC request: has `method` and a non-null `id`."""
    return "method" in message and message.get("id") is not None


def is_notification(message: dict[str, Any]) -> bool:
    """A JSON-RPC notification: has `method` and no `id`."""
    return "method" in message and message.get("id") is None


def is_response(message: dict[str, Any]) -> bool:
    """A JSON-RPC response: no `method`, and a `result` or an `error`."""
    return "method" not in message and ("result" in message or "error" in message)


def http_error(response: httpx.Response, what: str) -> SandboxAgentError:
    """The ``"http"`` error of a non-2xx answer whose body was read, with its
    problem document when the body is one."""
    problem: dict[str, Any] | None = None
    text = ""
    try:
        text = response.text
        parsed = json.loads(text)
        if isinstance(parsed, dict):
            problem = parsed
    except (ValueError, httpx.HTTPError):
        pass  # Not JSON (a proxy's HTML page): the status only.
    detail = None
    if problem is not None:
        detail = problem.get("detail") or problem.get("title")
    if not detail:
        detail = text[:200] or response.reason_phrase
    return SandboxAgentError(
        "http",
        f"{what}: HTTP {response.status_code}: {detail}",
        status=response.status_code,
        problem=problem,
    )


def unreachable(what: str, cause: BaseException) -> SandboxAgentError:
    """The ``"connection-lost"`` error of a request that could not reach the server."""
    error = SandboxAgentError("connection-lost", f"{what}: the server could not be reached ({cause or type(cause).__name__})")
    error.__cause__ = cause
    return error


def parse_event_id(value: str | None) -> int | None:
    """An SSE `id:` field as a non-negative integer, else ``None``."""
    if value is None or not value.isdigit():
        return None
    return int(value)
