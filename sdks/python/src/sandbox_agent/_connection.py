"""One ACP connection over ``/v2/rpc`` (`research/contract.md`, "Transport:
/v2/rpc"): `initialize` opens it, POSTs carry requests and answers, one GET
event stream (SSE) carries everything the agent sends, DELETE closes it.

Invariant: the stream's resume point (`last_event_id`) only grows. Every GET
sends it as ``Last-Event-ID``, and an event whose id is at or below it is
dropped, so events reach the handlers once each and in order across any
number of reconnects. A POST's answer is held until the stream delivered the
event its ``x-acp-last-event-id`` names ("Answer ordering header"), so a
turn's answer never overtakes the turn's updates.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
from httpx_sse import EventSource, SSEError

from ._protocol import (
    CONNECTION_ID_HEADER,
    FATAL_STREAM_STATUSES,
    INTERNAL_ERROR,
    LAST_EVENT_ID_ANSWER_HEADER,
    LAST_EVENT_ID_HEADER,
    METHOD_NOT_FOUND,
    RPC_PATH,
    http_error,
    is_notification,
    is_request,
    is_response,
    parse_event_id,
    unreachable,
)
from .errors import SandboxAgentError

#: Reopen delays of the event stream: 0.25 s doubling to 10 s, jittered into
#: ``[d/2, d]``; 10 failures in a row end the connection (the same policy as
#: the TypeScript and Rust clients, `research/contract.md`, "The TypeScript
#: packages").
RECONNECT_FIRST_S = 0.25
RECONNECT_MAX_S = 10.0
RECONNECT_ATTEMPTS = 10

NotificationHandler = Callable[[dict[str, Any]], None]
"""Called in stream order with every notification (the whole JSON-RPC object)."""
RequestHandler = Callable[[dict[str, Any]], Awaitable[Any]]
"""Answers an agent request (the whole JSON-RPC object): its value is the
`result`; a raised `RpcFailure` the JSON-RPC error."""


class RpcFailure(Exception):
    """Raised by a request handler: answered as the JSON-RPC error ``{code, message}``."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class AcpHttpConnection:
    """An open connection; made by `open`. Not thread-safe: one event loop."""

    def __init__(
        self,
        http: httpx.AsyncClient,
        url: str,
        on_notification: NotificationHandler,
        on_request: RequestHandler,
        request_timeout: float | None,
    ) -> None:
        self._http = http
        self._url = url
        self._on_notification = on_notification
        self._on_request = on_request
        self._request_timeout = request_timeout
        self.connection_id = ""
        #: The agent's `initialize` result.
        self.initialize_result: dict[str, Any] = {}
        #: The id of the newest event the stream delivered (0 before the first).
        self.last_event_id = 0
        #: GETs made after the first one, and events dropped as already seen.
        self.reconnects = 0
        self.duplicate_events = 0
        self._next_id = 1
        #: Requests waiting for an answer the stream may carry (after a 504), by id.
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        #: Answers held until the stream delivered their event id.
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._closed: SandboxAgentError | None = None
        self._stream_task: asyncio.Task[None] | None = None
        self._answer_tasks: set[asyncio.Task[None]] = set()
        self._on_close: Callable[[SandboxAgentError | None], None] | None = None

    @classmethod
    async def open(
        cls,
        http: httpx.AsyncClient,
        base_url: str,
        params: dict[str, Any],
        *,
        on_notification: NotificationHandler,
        on_request: RequestHandler,
        on_close: Callable[[SandboxAgentError | None], None] | None = None,
        request_timeout: float | None = None,
    ) -> AcpHttpConnection:
        """Sends `initialize` (id 0, no connection id: that opens a connection),
        keeps the id answered in ``x-acp-connection-id`` and starts the event stream.

        Raises:
            SandboxAgentError: ``http`` (401, 404 unknown agent, 502 agent failed
                to start, …), ``rpc`` (the agent refused), ``connection-lost``,
                ``timeout``, ``invalid-response``.
        """
        connection = cls(http, base_url + RPC_PATH, on_notification, on_request, request_timeout)
        connection._on_close = on_close
        message = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": params}
        response = await connection._exchange(message, "initialize", request_timeout)
        if "error" in response:
            raise SandboxAgentError.rpc("initialize", response["error"])
        if not connection.connection_id:
            raise SandboxAgentError("invalid-response", f"initialize: the answer has no {CONNECTION_ID_HEADER} header")
        result = response.get("result")
        connection.initialize_result = result if isinstance(result, dict) else {}
        connection._stream_task = asyncio.create_task(connection._run_stream())
        return connection

    @property
    def closed(self) -> bool:
        """``True`` once the connection was closed or lost."""
        return self._closed is not None

    async def request(self, method: str, params: Any = None, *, no_timeout: bool = False) -> Any:
        """Sends a JSON-RPC request and returns its `result`.

        Raises:
            SandboxAgentError: ``rpc`` (the JSON-RPC error answer), ``http``,
                ``connection-lost``, ``timeout``, ``closed``.
        """
        self._ensure_open(method)
        request_id = self._next_id
        self._next_id += 1
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        response = await self._exchange(message, method, None if no_timeout else self._request_timeout)
        if "error" in response:
            error = response["error"]
            raise SandboxAgentError.rpc(method, error if isinstance(error, dict) else {})
        return response.get("result")

    async def notify(self, method: str, params: Any = None) -> None:
        """Sends a JSON-RPC notification (answered 202, nothing else).

        Raises:
            SandboxAgentError: ``http``, ``connection-lost``, ``closed``.
        """
        self._ensure_open(method)
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        await self._post_expecting_202(message, method)

    async def close(self) -> None:
        """Stops the stream, fails calls still waiting (kind ``closed``) and sends
        DELETE. Sessions live on at the server. Safe to call more than once."""
        if self._closed is not None:
            return
        self._end(None)
        if self._stream_task is not None:
            self._stream_task.cancel()
        try:
            response = await self._http.delete(self._url, headers={CONNECTION_ID_HEADER: self.connection_id})
            await response.aclose()
        except httpx.HTTPError:
            pass  # The server is gone: the connection is gone with it.
        for task in list(self._answer_tasks):
            task.cancel()

    # ---- requests ----

    def _ensure_open(self, what: str) -> None:
        if self._closed is not None:
            raise self._closed_error(what)

    def _closed_error(self, what: str) -> SandboxAgentError:
        if self._closed is None or self._closed.kind == "closed":
            return SandboxAgentError("closed", f"{what}: the connection is closed")
        return self._closed

    async def _exchange(self, message: dict[str, Any], method: str, timeout: float | None) -> dict[str, Any]:
        """POSTs one request and waits for its answer (from the POST, or from
        the stream after a 504), within `timeout` seconds."""
        try:
            return await asyncio.wait_for(self._exchange_inner(message, method), timeout)
        except asyncio.TimeoutError:
            raise SandboxAgentError("timeout", f"{method}: no answer within {timeout} s") from None
        finally:
            self._pending.pop(message["id"], None)

    async def _exchange_inner(self, message: dict[str, Any], method: str) -> dict[str, Any]:
        request_id = message["id"]
        loop = asyncio.get_running_loop()
        from_stream: asyncio.Future[dict[str, Any]] = loop.create_future()
        if method != "initialize":
            self._pending[request_id] = from_stream
        post = asyncio.ensure_future(self._post(message))
        try:
            # The stream may answer first (after a 504 the POST is gone) or the
            # connection may end meanwhile (`_end` fails `from_stream`).
            waiting: set[asyncio.Future[Any]] = {post, from_stream}
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            post.cancel()
            raise
        if from_stream.done():
            post.cancel()
            return from_stream.result()
        try:
            response = post.result()
        except httpx.HTTPError as error:
            raise unreachable(method, error) from error
        if method == "initialize":
            self.connection_id = response.headers.get(CONNECTION_ID_HEADER, "")
        if response.status_code == 504 and method != "initialize":
            # The server stopped waiting; the agent's answer comes on the stream.
            return await from_stream
        if response.status_code != 200:
            raise http_error(response, method)
        try:
            body = response.json()
        except ValueError:
            body = None
        if not isinstance(body, dict) or not is_response(body) or body.get("id") != request_id:
            raise SandboxAgentError("invalid-response", f"{method}: the answer is not its JSON-RPC response")
        event_id = parse_event_id(response.headers.get(LAST_EVENT_ID_ANSWER_HEADER))
        if event_id is not None and event_id > self.last_event_id:
            await self._delivered(event_id)
        return body

    async def _post(self, message: dict[str, Any]) -> httpx.Response:
        headers = {"content-type": "application/json", "accept": "application/json"}
        if self.connection_id:
            headers[CONNECTION_ID_HEADER] = self.connection_id
        # No httpx timeout: a turn takes as long as the agent needs; callers bound it.
        return await self._http.post(self._url, content=json.dumps(message), headers=headers, timeout=None)

    async def _post_expecting_202(self, message: dict[str, Any], what: str) -> None:
        try:
            response = await self._post(message)
        except httpx.HTTPError as error:
            raise unreachable(what, error) from error
        if not response.is_success:
            raise http_error(response, what)

    async def _delivered(self, event_id: int) -> None:
        """Returns once the stream delivered event `event_id`."""
        if self.last_event_id >= event_id:
            return
        if self._closed is not None:
            raise self._closed_error("waiting for the event stream")
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((event_id, waiter))
        await waiter

    # ---- the event stream ----

    async def _run_stream(self) -> None:
        """GET, read, and on a break GET again from the resume point."""
        failures = 0
        first = True
        while self._closed is None:
            if not first:
                self.reconnects += 1
            first = False
            fatal: SandboxAgentError | None = None
            try:
                headers = {
                    "accept": "text/event-stream",
                    CONNECTION_ID_HEADER: self.connection_id,
                    # Always sent (0 included): a GET with it takes over a stream the
                    # server still thinks is live (a half-open TCP connection).
                    LAST_EVENT_ID_HEADER: str(self.last_event_id),
                }
                async with self._http.stream("GET", self._url, headers=headers, timeout=httpx.Timeout(10.0, read=None)) as response:
                    if response.status_code == 200:
                        failures = 0
                        async for event in EventSource(response).aiter_sse():
                            self._handle_event(event.id, event.data)
                    elif response.status_code in FATAL_STREAM_STATUSES:
                        await response.aread()
                        fatal = http_error(response, "event stream")
            except (httpx.HTTPError, SSEError):
                pass  # Unreachable, or cut mid-stream: resume below.
            if self._closed is not None:
                return
            if fatal is not None:
                self._end(fatal)
                return
            if failures >= RECONNECT_ATTEMPTS:
                self._end(
                    SandboxAgentError(
                        "connection-lost",
                        f"event stream: the server could not be reached again after {failures + 1} attempts",
                    )
                )
                return
            delay = min(RECONNECT_FIRST_S * 2 ** min(failures, 30), RECONNECT_MAX_S)
            await asyncio.sleep(delay / 2 + delay / 2 * random.random())
            failures += 1

    def _handle_event(self, id_field: str, data: str) -> None:
        # httpx-sse keeps the last `id:` for events without one (SSE spec); the
        # only such event here, `_sandboxagent/stream/gap`, opens a stream, where
        # that id is still empty, so it never moves the resume point.
        event_id = parse_event_id(id_field)
        if event_id is not None:
            if event_id <= self.last_event_id:
                self.duplicate_events += 1
                return
            self.last_event_id = event_id
        try:
            message = json.loads(data)
        except ValueError:
            message = None
        if isinstance(message, dict):
            self._dispatch(message)
        if self._waiters:
            ready = [w for w in self._waiters if w[0] <= self.last_event_id]
            self._waiters = [w for w in self._waiters if w[0] > self.last_event_id]
            for _, waiter in ready:
                if not waiter.done():
                    waiter.set_result(None)

    def _dispatch(self, message: dict[str, Any]) -> None:
        if is_request(message):
            task = asyncio.create_task(self._answer(message))
            self._answer_tasks.add(task)
            task.add_done_callback(self._answer_tasks.discard)
        elif is_notification(message):
            try:
                self._on_notification(message)
            except Exception:  # noqa: BLE001 - a handler's bug must not stop the stream
                pass
        elif is_response(message) and isinstance(message.get("id"), int):
            future = self._pending.get(message["id"])
            if future is not None and not future.done():
                future.set_result(message)

    async def _answer(self, request: dict[str, Any]) -> None:
        """Answers one agent request through the request handler."""
        answer: dict[str, Any] = {"jsonrpc": "2.0", "id": request["id"]}
        try:
            result = await self._on_request(request)
            answer["result"] = result
        except RpcFailure as failure:
            answer["error"] = {"code": failure.code, "message": failure.message}
        except Exception as error:  # noqa: BLE001 - any handler failure is an answer
            answer["error"] = {"code": INTERNAL_ERROR, "message": str(error) or type(error).__name__}
        if self._closed is not None:
            return
        try:
            await self._post_expecting_202(answer, f"answer to {request.get('method')}")
        except SandboxAgentError:
            pass  # The connection broke: the stream notices and reports it.

    def _end(self, reason: SandboxAgentError | None) -> None:
        """Ends the connection once: fails what waits and tells `on_close`."""
        if self._closed is not None:
            return
        self._closed = reason if reason is not None else SandboxAgentError("closed", "the connection is closed")
        error = self._closed
        for future in self._pending.values():
            if not future.done():
                future.set_exception(error)
        for _, waiter in self._waiters:
            if not waiter.done():
                waiter.set_exception(error)
        self._waiters = []
        if self._stream_task is not None and self._stream_task is not asyncio.current_task():
            self._stream_task.cancel()
        if self._on_close is not None:
            try:
                self._on_close(reason)
            except Exception:  # noqa: BLE001
                pass


__all__ = ["AcpHttpConnection", "RpcFailure", "METHOD_NOT_FOUND"]
