"""The server's ``_meta["sandboxagent.dev"]`` namespace (`research/contract.md`,
"`_meta["sandboxagent.dev"]`: where it appears, which keys") read into
`SessionInfo` fields. No I/O."""

from __future__ import annotations

from typing import Any

from ._protocol import META_NAMESPACE, NOTIFICATION_TURN_INTERRUPTED
from .types import SessionDetails, SessionEvent, SessionInfo, SessionPage

#: Runtime-owned keys and hints: fields of `SessionInfo`, not `metadata`.
_OWN_KEYS = frozenset(
    {"agent", "createdAt", "updatedAt", "ended", "dormant", "eventCount", "firstPrompt", "model", "mode", "title"}
)


def namespace_of(meta: Any) -> dict[str, Any]:
    """The namespace object of a `_meta`, or ``{}``."""
    if not isinstance(meta, dict):
        return {}
    ns = meta.get(META_NAMESPACE)
    return ns if isinstance(ns, dict) else {}


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _fields(entry: dict[str, Any]) -> dict[str, Any]:
    ns = namespace_of(entry.get("_meta"))
    count = ns.get("eventCount")
    return {
        "session_id": str(entry.get("sessionId")),
        "agent": _str(ns.get("agent")),
        "cwd": _str(entry.get("cwd")),
        "title": _str(entry.get("title")) or _str(ns.get("title")),
        "created_at": _str(ns.get("createdAt")),
        "updated_at": _str(ns.get("updatedAt")) or _str(entry.get("updatedAt")),
        "ended": ns.get("ended") is True,
        "dormant": ns.get("dormant") is True,
        "event_count": count if isinstance(count, int) and not isinstance(count, bool) else None,
        "model": _str(ns.get("model")),
        "mode": _str(ns.get("mode")),
        "first_prompt": _str(ns.get("firstPrompt")),
        "metadata": {k: v for k, v in ns.items() if k not in _OWN_KEYS},
    }


def to_info(entry: dict[str, Any]) -> SessionInfo:
    """An inventory entry (``{sessionId, cwd, title?, updatedAt, _meta}``) as a `SessionInfo`."""
    return SessionInfo(**_fields(entry))


def to_details(session_id: str, cwd: str, result: dict[str, Any]) -> SessionDetails:
    """A ``session/new`` or ``session/load`` result as `SessionDetails`."""
    modes = result.get("modes")
    options = result.get("configOptions")
    return SessionDetails(
        **_fields({**result, "sessionId": session_id, "cwd": cwd}),
        modes=modes if isinstance(modes, dict) else None,
        config_options=options if isinstance(options, list) else None,
    )


def page_of(page: Any) -> SessionPage:
    """``{sessions: [entry…], nextCursor?}`` as a `SessionPage`."""
    body = page if isinstance(page, dict) else {}
    sessions = [to_info(e) for e in body.get("sessions") or [] if isinstance(e, dict)]
    cursor = body.get("nextCursor")
    return SessionPage(sessions=sessions, next_cursor=cursor if isinstance(cursor, str) else None)


def to_turn_interrupted(params: Any) -> dict[str, Any] | None:
    """The params of ``_sandboxagent/turn/interrupted`` when `params` reads as them
    (a session id and an array of request ids), else ``None``."""
    if not isinstance(params, dict) or not isinstance(params.get("sessionId"), str):
        return None
    if not isinstance(params.get("requestIds"), list):
        return None
    return params


def turn_interrupted_of(event: SessionEvent) -> dict[str, Any] | None:
    """The interrupted turn an event of a session's log records
    (``{sessionId, reason, stopReason, promptId, requestIds}``), or ``None``
    for any other event."""
    message = event.get("message")
    if event.get("direction") != "agent_to_client" or not isinstance(message, dict):
        return None
    if message.get("method") != NOTIFICATION_TURN_INTERRUPTED:
        return None
    return to_turn_interrupted(message.get("params"))
