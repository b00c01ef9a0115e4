"""`SandboxAgentError`, the one exception every call of this package raises,
and its predicates (seed 001's: not found, unauthorized, connection lost,
timeout).

What went wrong is `kind`:

- ``"http"``: the server answered with a non-2xx status (`status`, and the
  RFC 9457 problem document in `problem`; `research/contract.md`, "Problem
  types");
- ``"rpc"``: the agent (or the runtime) answered a request with a JSON-RPC
  error (`code`, `data`; a problem document carried in `data` also fills
  `status` and `problem`);
- ``"connection-lost"``: the server could not be reached, or the connection
  broke and could not be resumed;
- ``"timeout"``: no answer within the client's request timeout;
- ``"closed"``: the connection was closed while the call waited;
- ``"invalid-response"``: the server answered with something that is not
  what the contract promises;
- ``"not-connected"``: a session call before `connect()` or after
  `disconnect()`;
- ``"disposed"``: a call after `close()`;
- ``"server-start"``: `SandboxAgentClient.start` (or `EmbeddedServer.start`)
  found no binary, or its server exited or was not ready in time (the
  message carries the command line and the server's stderr tail; `data` is
  ``{"exitCode": int | None, "stderr": str}``).
"""

from __future__ import annotations

from typing import Any, Literal

__all__ = ["SandboxAgentError", "ErrorKind", "Problem"]

ErrorKind = Literal[
    "http",
    "rpc",
    "connection-lost",
    "timeout",
    "closed",
    "invalid-response",
    "not-connected",
    "disposed",
    "server-start",
]
"""What failed; see the module docstring."""

Problem = dict[str, Any]
"""An RFC 9457 problem document: ``{"type", "title", "status", "detail", …}``;
`type` is ``urn:sandbox-agent:error:<kind>`` on a sandbox-agent server."""

#: JSON-RPC error code of ACP's "resource not found" (an unknown session).
RESOURCE_NOT_FOUND = -32002


class SandboxAgentError(Exception):
    """The error of every `SandboxAgentClient` call.

    Test for a case with the predicates (``error.is_not_found`` and so on,
    properties), not with `kind`: an unreachable server and a stream that
    could not be resumed are both ``is_connection_lost``.

    Attributes:
        kind: what failed (`ErrorKind`).
        status: the HTTP status of a non-2xx answer; for a JSON-RPC error
            that carries a problem document in its `data`, that problem's
            status; else ``None``.
        problem: the RFC 9457 problem document, when the server sent one.
        code: the JSON-RPC error code, for kind ``"rpc"``.
        data: the JSON-RPC error's `data`, for kind ``"rpc"``; for kind
            ``"server-start"``, ``{"exitCode", "stderr"}``.
    """

    kind: ErrorKind
    status: int | None
    problem: Problem | None
    code: int | None
    data: Any

    def __init__(
        self,
        kind: ErrorKind,
        message: str,
        *,
        status: int | None = None,
        problem: Problem | None = None,
        code: int | None = None,
        data: Any = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status
        self.problem = problem
        self.code = code
        self.data = data

    def __repr__(self) -> str:
        return f"SandboxAgentError(kind={self.kind!r}, status={self.status!r}, code={self.code!r}, message={str(self)!r})"

    @classmethod
    def rpc(cls, what: str, error: dict[str, Any]) -> SandboxAgentError:
        """The ``"rpc"`` error of a JSON-RPC error object ``{code, message, data?}``
        answered to `what` (a method name)."""
        code = error.get("code")
        message = error.get("message")
        data = error.get("data")
        problem = data if _is_problem(data) else None
        return cls(
            "rpc",
            f"{what}: JSON-RPC error {code}: {message}",
            status=problem["status"] if problem is not None else None,
            problem=problem,
            code=code if isinstance(code, int) else None,
            data=data,
        )

    @property
    def is_not_found(self) -> bool:
        """Not found: HTTP 404 (unknown connection, session, file, agent,
        process, route) or JSON-RPC ``-32002`` (an unknown session)."""
        return self.status == 404 or self.code == RESOURCE_NOT_FOUND

    @property
    def is_unauthorized(self) -> bool:
        """HTTP 401: the token is missing or wrong."""
        return self.status == 401

    @property
    def is_connection_lost(self) -> bool:
        """The server could not be reached, or the connection broke and
        could not be resumed."""
        return self.kind == "connection-lost"

    @property
    def is_unreachable(self) -> bool:
        """Same as `is_connection_lost` (the TypeScript client's other name)."""
        return self.is_connection_lost

    @property
    def is_timeout(self) -> bool:
        """No answer in time: the client's request timeout, or the server's
        (HTTP 504)."""
        return self.kind == "timeout" or self.status == 504

    @property
    def is_not_connected(self) -> bool:
        """A session call without an open connection (before `connect()`,
        after `disconnect()`, or on a connection closed meanwhile)."""
        return self.kind in ("not-connected", "closed")


def _is_problem(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("type"), str) and isinstance(value.get("status"), int)
