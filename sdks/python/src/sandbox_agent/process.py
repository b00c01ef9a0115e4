"""Processes in the sandbox (`research/contract.md`, "Processes and
terminals"): run to completion, or start one and follow its output, which
resumes by byte offset after a cut, so every byte the server still holds is
delivered exactly once."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Union
from urllib.parse import quote

import httpx
from httpx_sse import EventSource, SSEError

from ._check import check, check_bool, check_int, check_str, type_error
from ._protocol import LAST_EVENT_ID_HEADER, parse_event_id
from .errors import SandboxAgentError
from .types import OutputChunk, ProcessInfo

if TYPE_CHECKING:
    from .client import SandboxAgentClient

__all__ = ["ProcessHandle", "OutputChunkEvent", "OutputDropped", "ProcessExit", "OutputEvent", "chunk_bytes"]

#: Reopen delays of a followed output: 50 ms doubling to 2 s; 8 failures in a
#: row with nothing between them end it (as the TypeScript client).
REOPEN_FIRST_S = 0.05
REOPEN_MAX_S = 2.0
REOPEN_ATTEMPTS = 8


@dataclass(frozen=True)
class OutputChunkEvent:
    """Output bytes: the chunk as the server sent it (see `chunk_bytes`)."""

    chunk: OutputChunk


@dataclass(frozen=True)
class OutputDropped:
    """The server no longer held `dropped` bytes from `offset`; output resumes at `next_offset`."""

    offset: int
    next_offset: int
    dropped: int


@dataclass(frozen=True)
class ProcessExit:
    """The process exited (always the last event): its exit code, ``None`` when
    a signal (e.g. ``"SIGKILL"``) ended it."""

    exit_code: int | None
    signal: str | None


OutputEvent = Union[OutputChunkEvent, OutputDropped, ProcessExit]
"""An item of `ProcessHandle.output`."""


def chunk_bytes(chunk: OutputChunk) -> bytes:
    """The bytes of a chunk (text encoded as UTF-8, base64 decoded)."""
    if chunk.get("encoding") == "base64":
        return base64.b64decode(chunk["data"])
    return chunk["data"].encode("utf-8")


class ProcessHandle:
    """A started (or listed) process; made by `SandboxAgentClient.start_process`
    or `SandboxAgentClient.process_handle`. Dropping it leaves the process
    running."""

    def __init__(self, info: ProcessInfo, client: SandboxAgentClient) -> None:
        #: The process id (32 hex digits).
        self.id: str = info["id"]
        #: The process as it was when this handle was made.
        self.started: ProcessInfo = info
        self._client = client

    def _path(self, suffix: str = "") -> str:
        return f"/v2/processes/{quote(self.id, safe='')}{suffix}"

    async def refresh(self) -> ProcessInfo:
        """The process as it is now (``GET /v2/processes/{id}``).

        Raises:
            SandboxAgentError: `is_not_found` once the process was forgotten.
        """
        info: ProcessInfo = await self._client._json("GET", self._path())
        return info

    async def output(self, offset: int = 0) -> AsyncGenerator[OutputEvent, None]:
        """Follows the output from byte `offset` until the process exits:
        `OutputChunkEvent` items, `OutputDropped` markers, then `ProcessExit`
        (always last). A cut stream is reopened with ``Last-Event-ID`` = the
        offset after the last byte handed out (50 ms doubling to 2 s; 8
        failures in a row with nothing between them raise), so no byte is lost
        or repeated. Use it as ``async for event in handle.output(offset=n)``.

        Raises:
            SandboxAgentError: an HTTP error (404 once the process was
                forgotten) at once; ``connection-lost`` after the retries.
            TypeError: `offset` is not a non-negative int.
        """
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            raise type_error(
                "ProcessHandle.output", "offset", "a non-negative int", offset, got=repr(offset) if isinstance(offset, int) else None
            )
        resume_at = offset
        failures = 0
        while True:
            last_error: BaseException | None = None
            try:
                stream = self._client._stream(
                    "GET",
                    self._path("/output"),
                    query={"offset": resume_at},
                    headers={"accept": "text/event-stream", LAST_EVENT_ID_HEADER: str(resume_at)},
                )
                async with stream as response:
                    async for event in EventSource(response).aiter_sse():
                        failures = 0
                        data: Any = json.loads(event.data)
                        if event.event == "exit":
                            yield ProcessExit(exit_code=data.get("exitCode"), signal=data.get("signal"))
                            return
                        if event.event == "dropped":
                            resume_at = max(resume_at, int(data["nextOffset"]))
                            yield OutputDropped(
                                offset=int(data["offset"]), next_offset=int(data["nextOffset"]), dropped=int(data["dropped"])
                            )
                            continue
                        end = parse_event_id(event.id)
                        if end is not None:
                            if end <= resume_at:
                                continue  # handed out already
                            resume_at = end
                        yield OutputChunkEvent(chunk=data)
            except SandboxAgentError as error:
                if error.kind != "connection-lost":
                    raise
                last_error = error
            except (httpx.HTTPError, SSEError) as error:
                last_error = error
            failures += 1
            if failures > REOPEN_ATTEMPTS:
                if isinstance(last_error, SandboxAgentError):
                    raise last_error
                raise SandboxAgentError(
                    "connection-lost", f"process output: the stream kept ending before the exit ({last_error})"
                ) from last_error
            await asyncio.sleep(min(REOPEN_FIRST_S * 2 ** (failures - 1), REOPEN_MAX_S))

    async def write_stdin(self, data: str | bytes, *, eof: bool = False) -> None:
        """Writes to stdin (text as UTF-8); ``eof=True`` closes stdin after it.

        Raises:
            SandboxAgentError: 409 ``process-exited`` when stdin is closed.
            TypeError: `data` is neither str nor bytes.
        """
        check("ProcessHandle.write_stdin", "data", data, (str, bytes), "str or bytes")
        check_bool("ProcessHandle.write_stdin", "eof", eof)
        body = data.encode("utf-8") if isinstance(data, str) else data
        await self._client._request(
            "POST",
            self._path("/input"),
            query={"eof": "true"} if eof else None,
            content=body,
            content_type="application/octet-stream",
        )

    async def close_stdin(self) -> None:
        """Closes stdin (on a terminal: sends ``^D``)."""
        await self.write_stdin(b"", eof=True)

    async def signal(self, name: str) -> None:
        """Sends a signal by name (``"SIGINT"``, ``"TERM"``, any case).

        Raises:
            SandboxAgentError: 400 for an unknown name, 409 ``process-exited``.
            TypeError: `name` is not a str.
        """
        check_str("ProcessHandle.signal", "name", name)
        await self._client._request("POST", self._path("/signal"), json_body={"signal": name})

    async def kill(self) -> None:
        """``SIGKILL``: kills the whole process tree."""
        await self.signal("SIGKILL")

    async def resize(self, cols: int, rows: int) -> None:
        """Resizes the terminal (`cols` and `rows` 1 to 4096).

        Raises:
            SandboxAgentError: 409 ``not-a-tty`` for a process without a terminal.
        """
        check_int("ProcessHandle.resize", "cols", cols)
        check_int("ProcessHandle.resize", "rows", rows)
        await self._client._request("POST", self._path("/resize"), json_body={"cols": cols, "rows": rows})

    async def wait(self) -> ProcessExit:
        """Waits for the exit (following the output from its current end)."""
        now = await self.refresh()
        if now["state"] == "exited":
            return ProcessExit(exit_code=now["exitCode"], signal=now["signal"])
        # Closed on return, so the follow's HTTP connection is released at once.
        async with aclosing(self.output(now["outputBytes"])) as events:
            async for event in events:
                if isinstance(event, ProcessExit):
                    return event
        raise SandboxAgentError("invalid-response", "process output ended without an exit")

    async def forget(self) -> None:
        """Forgets the process (``DELETE``; a running one's tree is killed first)."""
        await self._client._request("DELETE", self._path())

