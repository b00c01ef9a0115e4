"""The shapes this package takes and returns.

ACP messages (session updates, permission requests, questions, content
blocks) stay JSON dicts exactly as on the wire (camelCase keys, the ACP
schema's names); the TypedDicts here document the keys this client reads.
The server's inventory entries are read into `SessionInfo`, whose fields
are Python names.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
import sys
from typing import Any, Literal, TypedDict, Union

if sys.version_info >= (3, 11):
    from typing import NotRequired
else:  # pragma: no cover - Python 3.10
    from typing_extensions import NotRequired

__all__ = [
    "ContentBlock",
    "SessionUpdate",
    "SessionNotification",
    "PermissionRequest",
    "PermissionDecision",
    "PermissionHandler",
    "QuestionRequest",
    "QuestionAnswer",
    "QuestionHandler",
    "SessionUpdateHandler",
    "TurnInterruptedHandler",
    "SessionInfo",
    "SessionDetails",
    "SessionPage",
    "SessionEvent",
    "SessionEventPage",
    "FsEntry",
    "RunResult",
    "ProcessInfo",
    "OutputChunk",
    "StopReason",
]

ContentBlock = dict[str, Any]
"""An ACP content block, e.g. ``{"type": "text", "text": "hello"}``."""

SessionUpdate = dict[str, Any]
"""An ACP session update: ``{"sessionUpdate": "agent_message_chunk", "content":
{"type": "text", "text": …}}``, ``{"sessionUpdate": "tool_call", "toolCallId", "title",
"kind", "status"}``, ``tool_call_update``, ``plan``, … (the ACP schema's `SessionUpdate`)."""

StopReason = str
"""Why a turn ended (ACP): ``end_turn``, ``max_tokens``, ``max_turn_requests``,
``refusal`` or ``cancelled``."""


class SessionNotification(TypedDict):
    """The params of ACP's ``session/update`` notification."""

    sessionId: str
    update: SessionUpdate


class PermissionRequest(TypedDict):
    """The params of ACP's ``session/request_permission``: the tool call
    (``toolCall["title"]``, ``toolCall["toolCallId"]``, …) and the options, each
    ``{"optionId", "name", "kind"}`` with `kind` ``allow_once``, ``allow_always``,
    ``reject_once`` or ``reject_always``."""

    sessionId: str
    toolCall: dict[str, Any]
    options: list[dict[str, Any]]


PermissionDecision = Union[
    Literal["allow", "allow-always", "reject", "reject-always", "cancel"],
    dict[str, str],
]
"""How to answer a permission request: ``"allow"`` picks the first option of
kind ``allow_once`` (else ``allow_always``), ``"allow-always"`` one of kind
``allow_always``; ``"reject"`` and ``"reject-always"`` likewise; ``"cancel"``
(or an option the request lacks) answers outcome ``cancelled`` (the turn then
usually ends with stop reason ``cancelled``); ``{"optionId": "…"}`` picks that
option."""

PermissionHandler = Callable[[PermissionRequest], Union[PermissionDecision, Awaitable[PermissionDecision]]]
"""Decides permission requests; sync or async; an exception counts as ``"cancel"``."""

QuestionRequest = dict[str, Any]
"""ACP's ``elicitation/create`` params: `message`, `sessionId`, and either a
form (``mode: "form"``, ``requestedSchema``: the fields) or a URL to open
(``mode: "url"``, `url`, `elicitationId`)."""

QuestionAnswer = dict[str, Any]
"""An answer to a question: ``{"action": "accept", "content": {field: value}}``
(a URL question takes no content), ``{"action": "decline"}`` or
``{"action": "cancel"}``."""

QuestionHandler = Callable[[QuestionRequest], Union[QuestionAnswer, Awaitable[QuestionAnswer]]]
"""Answers questions; sync or async; an exception, or an ``accept`` whose content
does not fit the form (see `check_answer`), is sent as ``{"action": "cancel"}``."""

SessionUpdateHandler = Callable[[SessionNotification], None]
"""Called with every session update of every session of the client, in order."""

TurnInterruptedHandler = Callable[[dict[str, Any]], None]
"""Called with ``_sandboxagent/turn/interrupted`` params: ``{sessionId, reason,
stopReason, promptId, requestIds}``."""


@dataclass(frozen=True)
class SessionInfo:
    """One session as the server's inventory knows it
    (`research/contract.md`, "Control plane"). The server's own keys are
    fields; `metadata` holds the keys the caller stored with
    ``new_session(metadata=…)`` or `set_metadata`."""

    session_id: str
    agent: str | None
    cwd: str | None
    title: str | None
    #: RFC 3339 UTC timestamps.
    created_at: str | None
    updated_at: str | None
    ended: bool
    #: Restored from the store and not loaded since.
    dormant: bool
    #: Messages recorded in the session's event log (dropped ones included).
    event_count: int | None
    model: str | None
    mode: str | None
    #: The text of the session's first prompt (cut to 200 characters).
    first_prompt: str | None
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SessionDetails(SessionInfo):
    """A session as ``session/new`` or ``session/load`` answered it: the
    inventory fields plus ACP's `modes` and `configOptions` as sent."""

    modes: dict[str, Any] | None = None
    config_options: list[dict[str, Any]] | None = None


@dataclass(frozen=True)
class SessionPage:
    """One page of the inventory, newest first; `next_cursor` is ``None`` on the last."""

    sessions: list[SessionInfo]
    next_cursor: str | None


class SessionEvent(TypedDict):
    """One message of a session's event log: `offset` (0-based, never reused),
    `at` (RFC 3339), `direction` (``client_to_agent`` or ``agent_to_client``),
    `message` (the JSON-RPC object)."""

    offset: int
    at: str
    direction: Literal["client_to_agent", "agent_to_client"]
    message: dict[str, Any]


class SessionEventPage(TypedDict):
    """A page of a session's event log; ask for `nextOffset` next."""

    events: list[SessionEvent]
    nextOffset: int


class FsEntry(TypedDict):
    """A file system entry (`research/contract.md`, "Host file system")."""

    name: str
    path: str
    entryType: Literal["file", "directory", "symlink", "other"]
    size: int
    modified: NotRequired[str]


class RunResult(TypedDict):
    """What `run_process` returns. `stdout`/`stderr` are text, or base64 when
    ``stdoutEncoding``/``stderrEncoding`` is ``"base64"``; `durationMs` in milliseconds."""

    exitCode: int | None
    signal: str | None
    stdout: str
    stderr: str
    stdoutEncoding: NotRequired[Literal["base64"]]
    stderrEncoding: NotRequired[Literal["base64"]]
    truncated: bool
    timedOut: bool
    durationMs: int


class ProcessInfo(TypedDict):
    """A process as the server describes it (`id`: 32 hex digits; `outputBytes`:
    bytes written so far, the offset of the next byte; times RFC 3339 UTC)."""

    id: str
    pid: int | None
    command: str
    args: list[str]
    cwd: str
    tty: bool
    title: str | None
    sessionId: str | None
    toolCallId: str | None
    state: Literal["running", "exited"]
    exitCode: int | None
    signal: str | None
    startedAt: str
    endedAt: str | None
    outputBytes: int


class OutputChunk(TypedDict):
    """One read of a process's output: `offset` of its first byte (all streams
    in one sequence), `stream` (``stdout``, ``stderr``, ``tty``), `data` (text,
    or base64 when ``encoding`` is ``"base64"``)."""

    offset: int
    stream: Literal["stdout", "stderr", "tty"]
    data: str
    encoding: NotRequired[Literal["base64"]]
