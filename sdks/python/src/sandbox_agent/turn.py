"""`PromptTurn`: one prompt turn, read as an async iterator of its session
updates, with the turn's stop reason from `PromptTurn.result`."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

from .errors import SandboxAgentError
from .types import SessionUpdate, StopReason

__all__ = ["PromptTurn"]

#: Marks the end of the turn in the queue.
_END = object()


class PromptTurn:
    """A running prompt turn, made by `SandboxAgentClient.prompt_stream`.

    ``async for update in turn`` yields the turn's session updates (dicts as
    ACP sends them: text chunks, tool calls, plans, …) in order and ends when
    the turn ends; it raises the turn's `SandboxAgentError` if the turn
    failed. ``await turn.result()`` returns the stop reason. Every update the
    iterator yields arrived before the result (the transport holds the
    answer until the stream delivered what the agent sent before it). The
    turn runs whether or not anyone iterates; one iteration per turn.
    """

    def __init__(
        self,
        session_id: str,
        run: Callable[[PromptTurn], Awaitable[StopReason]],
        cancel: Callable[[], Awaitable[None]],
    ) -> None:
        #: The session this turn runs in.
        self.session_id = session_id
        self._queue: asyncio.Queue[object] = asyncio.Queue()
        self._cancel = cancel
        self._finished = False
        self._iterating = False
        self._task: asyncio.Task[StopReason] = asyncio.ensure_future(self._run(run))

    async def _run(self, run: Callable[[PromptTurn], Awaitable[StopReason]]) -> StopReason:
        try:
            return await run(self)
        finally:
            self._finished = True
            self._queue.put_nowait(_END)

    def push(self, update: SessionUpdate) -> None:
        """Called by the client for each update of this session (internal)."""
        if not self._finished:
            self._queue.put_nowait(update)

    async def result(self) -> StopReason:
        """Waits for the turn's end and returns its stop reason (``end_turn``,
        ``cancelled``, …).

        Raises:
            SandboxAgentError: the turn failed (``rpc``: the agent's error, or
                its process died; ``connection-lost``; ``closed``).
        """
        return await asyncio.shield(self._task)

    @property
    def done(self) -> bool:
        """``True`` once the turn ended."""
        return self._task.done()

    async def cancel(self) -> None:
        """Asks the agent to stop the turn (it then ends with stop reason ``cancelled``)."""
        await self._cancel()

    def __aiter__(self) -> AsyncIterator[SessionUpdate]:
        if self._iterating:
            raise RuntimeError("a PromptTurn can be iterated once")
        self._iterating = True
        return self._updates()

    async def _updates(self) -> AsyncIterator[SessionUpdate]:
        while True:
            item = await self._queue.get()
            if item is _END:
                break
            assert isinstance(item, dict)
            yield item
        if self._task.cancelled():
            raise SandboxAgentError("closed", "the turn was cancelled locally")
        error = self._task.exception()
        if error is not None:
            if isinstance(error, SandboxAgentError):
                raise error
            raise SandboxAgentError("connection-lost", str(error)) from error

    def __del__(self) -> None:
        # A caller that only iterates has seen the error there: do not log it again.
        if self._task.done() and not self._task.cancelled():
            self._task.exception()
