"""`SandboxAgentClient`: one agent connection over ``/v2/rpc`` for sessions and
prompt turns, plus the server's plain HTTP routes (health, agents, the
session inventory, files, processes). What it sends:
`research/contract.md`, "The Python package" (the TypeScript client's wire
behaviour, with the differences listed there).

Rules (seed 001, as the TypeScript client): the connection opens when the
client is entered (``async with``) or at the first session call unless
``auto_connect=False``; session calls fail with kind ``not-connected`` before
`connect()` and after `disconnect()`; one connection per instance
(`connect()` again while connected is the same connection).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterable, AsyncIterator, Coroutine, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, Union
from urllib.parse import quote

import httpx

from . import __version__ as _version
from ._check import check, check_callable, check_str, check_str_list, check_str_mapping, type_error
from ._connection import AcpHttpConnection, RpcFailure
from ._meta import page_of, to_details, to_info, to_turn_interrupted
from ._protocol import (
    META_NAMESPACE,
    METHOD_DETACH,
    METHOD_LIST_MODELS,
    METHOD_NOT_FOUND,
    METHOD_SET_METADATA,
    METHOD_TERMINATE,
    NOTIFICATION_TURN_INTERRUPTED,
    PROTOCOL_VERSION,
    http_error,
    unreachable,
)
from .errors import SandboxAgentError
from .process import ProcessHandle
from .question import check_answer
from .turn import PromptTurn
from .types import (
    ContentBlock,
    FsEntry,
    PermissionDecision,
    PermissionHandler,
    PermissionRequest,
    ProcessInfo,
    QuestionHandler,
    RunResult,
    SessionDetails,
    SessionEventPage,
    SessionInfo,
    SessionNotification,
    SessionPage,
    SessionUpdateHandler,
    StopReason,
    TurnInterruptedHandler,
)

if TYPE_CHECKING:
    from .embedded import EmbeddedServer

__all__ = ["SandboxAgentClient", "FileDownload", "CLIENT_NAME"]

#: Sent as ``clientInfo.name`` in `initialize`.
CLIENT_NAME = "sandbox-agent (Python)"

Body = Union[str, bytes, Iterable[bytes], AsyncIterable[bytes]]
"""A request body: text (sent as UTF-8), bytes, or an (async) iterable of
byte chunks, which is streamed."""


@dataclass
class FileDownload:
    """A file being downloaded by `SandboxAgentClient.read_fs_file_stream`."""

    #: Where the first byte of the body belongs in the file (the asked
    #: `from_offset` when the rest of the same version comes, else 0).
    offset: int
    #: The file's size in bytes, when the server said.
    size: int | None
    #: The file version's ETag (pass it back with a later `from_offset`).
    etag: str | None
    _response: httpx.Response

    def aiter_bytes(self, chunk_size: int | None = None) -> AsyncIterator[bytes]:
        """The body, chunk by chunk (`chunk_size` bytes each, default as received)."""
        return self._response.aiter_bytes(chunk_size)


class SandboxAgentClient:
    """A client of one sandbox-agent server, bound to one agent.

    ``SandboxAgentClient(base_url, token=None, agent="mock")``; use it as
    ``async with`` (which connects, and closes everything on exit) or call
    `connect` and `close` yourself. Every failure is a `SandboxAgentError`;
    an argument of the wrong type is a `TypeError` naming the call and the
    parameter (``mkdir_fs: path must be a str, not int``).
    """

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        agent: str,
        auto_connect: bool = True,
        on_session_update: SessionUpdateHandler | None = None,
        on_permission_request: PermissionHandler | None = None,
        on_question: QuestionHandler | None = None,
        on_turn_interrupted: TurnInterruptedHandler | None = None,
        headers: Mapping[str, str] | None = None,
        request_timeout: float | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        """
        Args:
            base_url: the server's root URL, e.g. ``http://127.0.0.1:2468``.
            token: bearer token of a server started with ``--token``.
            agent: the agent id every session of this client runs on
                (``mock``, ``claude``, ``codex``, …).
            auto_connect: open the connection on ``async with`` or at the first
                session call (default); ``False``: call `connect` first.
            on_session_update: every session update of every session, in order
                (``{"sessionId", "update"}``).
            on_permission_request: answers the agent's permission requests
                (sync or async; see `PermissionDecision`); without it they are
                answered cancelled.
            on_question: answers the agent's questions (ACP elicitation; sync
                or async). With it the client declares that it answers them;
                without it the server answers them ``cancel``. An ``accept``
                whose content does not fit the form is sent as ``cancel``.
            on_turn_interrupted: a turn its server stopped in
                (``_sandboxagent/turn/interrupted`` params).
            headers: extra headers for every request.
            request_timeout: time limit of each call in seconds (of each session
                call until its answer; of each plain HTTP call until the
                answer's head). Prompt turns and `run_process` have none.
                ``None`` (default): no limit.
            transport: an httpx transport to use (tests, proxies); default httpx's.

        Raises:
            TypeError: an argument of the wrong type.
        """
        check_str("SandboxAgentClient", "base_url", base_url)
        check_str("SandboxAgentClient", "token", token, optional=True)
        check_str("SandboxAgentClient", "agent", agent)
        check("SandboxAgentClient", "auto_connect", auto_connect, bool, "a bool")
        for name, handler in (
            ("on_session_update", on_session_update),
            ("on_permission_request", on_permission_request),
            ("on_question", on_question),
            ("on_turn_interrupted", on_turn_interrupted),
        ):
            check_callable("SandboxAgentClient", name, handler, optional=True)
        check("SandboxAgentClient", "headers", headers, Mapping, "a mapping", optional=True)
        check("SandboxAgentClient", "request_timeout", request_timeout, (int, float), "a number of seconds", optional=True)
        self._base_url = base_url.rstrip("/")
        self._agent = agent
        self._token = token
        self._auto_connect = auto_connect
        self._on_session_update = on_session_update
        self._on_permission_request = on_permission_request
        self._on_question = on_question
        self._on_turn_interrupted = on_turn_interrupted
        self._request_timeout = None if request_timeout is None else float(request_timeout)
        all_headers = dict(headers or {})
        if token is not None:
            all_headers["authorization"] = f"Bearer {token}"
        self._http = httpx.AsyncClient(headers=all_headers, transport=transport, timeout=None)
        #: The open connection, if any; replaced by each `connect` after a disconnect.
        self._connection: AcpHttpConnection | None = None
        #: The `connect` in progress, which session calls wait for.
        self._connecting: asyncio.Task[None] | None = None
        #: Why the last connection ended, when it was lost rather than closed.
        self._lost: SandboxAgentError | None = None
        #: An auto-connect was started (it runs once; later ones need `connect`).
        self._auto_started = False
        self._disposed = False
        #: The turn of each session with a `prompt_stream` running.
        self._turns: dict[str, PromptTurn] = {}
        #: The private server `start` made, stopped by `close`.
        self._server: EmbeddedServer | None = None
        #: Background tasks (a cancelled turn's `session/cancel`), held until done.
        self._background: set[asyncio.Task[None]] = set()

    # ---- lifecycle ----

    @classmethod
    async def start(
        cls,
        *,
        agent: str = "mock",
        binary: str | None = None,
        server_args: Iterable[str] = (),
        host: str | None = None,
        port: int | None = None,
        startup_timeout: float = 15.0,
        **options: Any,
    ) -> SandboxAgentClient:
        """Starts a private server from the ``sandbox-agent`` binary
        (`binary`, else ``$SANDBOX_AGENT_BIN``, else the first on ``PATH``;
        see `EmbeddedServer`) with a random token, and returns a client of it,
        connected. `close` stops the server too.

        Args:
            agent: the agent id (default the built-in ``mock``).
            binary: the binary to run.
            server_args: extra ``sandbox-agent server`` arguments
                (``["--data-dir", DIR]``, …). A ``--host`` or ``--port``
                there replaces the default address, as `host` and `port` do.
            host: the address the server listens on (default ``127.0.0.1``).
            port: its TCP port (default 0: a free one; `base_url` says which).
            startup_timeout: seconds start-up may take.
            options: the other keyword arguments of the constructor.

        Raises:
            TypeError: an argument of the wrong type
                (``SandboxAgentClient.start: port must be an int or None, not str``).
            ValueError: `port` out of 0 to 65535, or the host or port given
                twice (`port=` and ``--port`` in `server_args`).
            SandboxAgentError: kind ``"server-start"``: no binary, or the
                server exited or was not ready in time (the message carries
                the command line and the server's stderr tail); any kind of
                `connect` when connecting failed.
        """
        from .embedded import EmbeddedServer

        check_str("SandboxAgentClient.start", "agent", agent)
        server = await EmbeddedServer._start(
            "SandboxAgentClient.start", "server_args", binary, server_args, host, port, startup_timeout
        )
        try:
            client = cls(server.base_url, server.token, agent=agent, **options)
            client._server = server
            if client._auto_connect:
                await client.connect()
        except BaseException:
            await server.stop()
            raise
        return client

    @property
    def agent(self) -> str:
        """The agent id this client's sessions run on."""
        return self._agent

    @property
    def base_url(self) -> str:
        """The server's root URL, without a trailing slash."""
        return self._base_url

    @property
    def server(self) -> EmbeddedServer | None:
        """The private server `start` made, if this client was made by it."""
        return self._server

    @property
    def connected(self) -> bool:
        """``True`` while a connection is open."""
        return self._connection is not None and not self._connection.closed

    @property
    def connection_id(self) -> str | None:
        """The server's id of the open connection (``x-acp-connection-id``)."""
        return self._connection.connection_id if self.connected and self._connection is not None else None

    @property
    def last_event_id(self) -> int:
        """The id of the newest event the connection's stream delivered (0 without one)."""
        return self._connection.last_event_id if self._connection is not None else 0

    async def __aenter__(self) -> SandboxAgentClient:
        if self._auto_connect:
            await self.connect()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def connect(self) -> None:
        """Opens the connection to the agent (`initialize`), starting the agent
        process at the server if needed (installing it first). Returns at once
        when connected; waits for a connect in progress.

        Raises:
            SandboxAgentError: ``http`` (401 wrong token, 404 unknown agent,
                502 agent failed to start), ``connection-lost`` (no server),
                ``disposed``.
        """
        if self._disposed:
            raise _disposed()
        self._auto_started = True
        if self._connecting is None:
            if self.connected:
                return
            self._connecting = asyncio.ensure_future(self._open())
        connecting = self._connecting
        try:
            await asyncio.shield(connecting)
        finally:
            if self._connecting is connecting and connecting.done():
                self._connecting = None

    async def _open(self) -> None:
        capabilities: dict[str, Any] = {} if self._on_question is None else {"elicitation": {"form": {}, "url": {}}}
        params = {
            "protocolVersion": PROTOCOL_VERSION,
            # Questions reach only connections that declare their modes ("Agent questions").
            "clientCapabilities": capabilities,
            "clientInfo": {"name": CLIENT_NAME, "version": _version},
            "_meta": {META_NAMESPACE: {"agent": self._agent}},
        }
        try:
            connection = await AcpHttpConnection.open(
                self._http,
                self._base_url,
                params,
                on_notification=self._handle_notification,
                on_request=self._handle_request,
                on_close=self._handle_close,
                request_timeout=self._request_timeout,
            )
        except SandboxAgentError as error:
            # Kept for the calls that follow, until a connect() succeeds.
            self._lost = error
            raise
        self._lost = None
        self._connection = connection
        if self._disposed:
            await connection.close()

    def _handle_close(self, error: SandboxAgentError | None) -> None:
        if error is not None:
            self._lost = error

    async def disconnect(self) -> None:
        """Closes the connection (DELETE). Sessions live on at the server;
        session calls fail with ``not-connected`` until `connect` again. Turns
        still running raise kind ``closed``."""
        if self._connecting is not None:
            try:
                await asyncio.shield(self._connecting)
            except SandboxAgentError:
                pass
        connection = self._connection
        self._connection = None
        self._lost = None
        if connection is not None:
            await connection.close()

    async def close(self) -> None:
        """Disconnects for good, closes the HTTP client and stops the server
        `start` made; every later call fails with kind ``disposed``."""
        self._disposed = True
        if self._background:
            await asyncio.wait(set(self._background), timeout=5)
        await self.disconnect()
        await self._http.aclose()
        if self._server is not None:
            await self._server.stop()

    #: The TypeScript client's name for `close`.
    dispose = close

    # ---- server ----

    async def get_health(self) -> dict[str, Any]:
        """``GET /v2/health``: the server's status (``{"status": "ok", …}``; needs no token)."""
        result: dict[str, Any] = await self._json("GET", "/v2/health")
        return result

    async def list_agents(self) -> dict[str, Any]:
        """``GET /v2/agents``: every configured agent, installed or not, as the
        server answers it (and as the TypeScript client returns it):
        ``{"agents": [{id, name, installed, version?, source, running, …}]}``.
        A list comes inside its page object, never bare (see the package
        README, "Return shapes")."""
        result: dict[str, Any] = await self._json("GET", "/v2/agents")
        return result

    async def install_agent(self, agent: str | None = None, *, version: str | None = None, reinstall: bool = False) -> dict[str, Any]:
        """``POST /v2/agents/{agent}/install`` (default: this client's agent);
        `version` is an npm version, dist-tag or range.

        Raises:
            SandboxAgentError: 404 unknown agent, 409 not installable, 502 install failed.
        """
        check_str("install_agent", "agent", agent, optional=True)
        check_str("install_agent", "version", version, optional=True)
        check("install_agent", "reinstall", reinstall, bool, "a bool")
        body: dict[str, Any] = {}
        if version is not None:
            body["version"] = version
        if reinstall:
            body["reinstall"] = True
        name = agent if agent is not None else self._agent
        result: dict[str, Any] = await self._json("POST", f"/v2/agents/{quote(name, safe='')}/install", json_body=body)
        return result

    # ---- sessions ----

    async def new_session(
        self,
        cwd: str,
        mcp_servers: list[dict[str, Any]] | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> SessionDetails:
        """Creates a session on this client's agent (ACP ``session/new``).

        Args:
            cwd: the session's working directory (absolute).
            mcp_servers: ACP MCP server configurations (default none).
            metadata: stored with the session (``_meta["sandboxagent.dev"]``);
                the client's agent wins over an ``agent`` key.

        Returns:
            the session (`session_id`, metadata, modes, config options).

        Raises:
            SandboxAgentError: ``not-connected``, ``rpc`` (the agent refused).
        """
        check_str("new_session", "cwd", cwd)
        check("new_session", "mcp_servers", mcp_servers, list, "a list", optional=True)
        check("new_session", "metadata", metadata, Mapping, "a mapping", optional=True)
        result = await self._call(
            "session/new",
            {
                "cwd": cwd,
                "mcpServers": mcp_servers if mcp_servers is not None else [],
                "_meta": {META_NAMESPACE: {**(metadata or {}), "agent": self._agent}},
            },
        )
        return to_details(str(result.get("sessionId")), cwd, result if isinstance(result, dict) else {})

    async def load_session(
        self, session_id: str, cwd: str, mcp_servers: list[dict[str, Any]] | None = None
    ) -> SessionDetails:
        """Takes up an existing session on this connection (ACP ``session/load``):
        after a `disconnect`, from another client, or one the server restored.
        Its history is replayed to `on_session_update` before this returns.

        Raises:
            SandboxAgentError: `is_not_found` for an unknown session.
        """
        check_str("load_session", "session_id", session_id)
        check_str("load_session", "cwd", cwd)
        check("load_session", "mcp_servers", mcp_servers, list, "a list", optional=True)
        result = await self._call(
            "session/load",
            {"sessionId": session_id, "cwd": cwd, "mcpServers": mcp_servers if mcp_servers is not None else []},
        )
        return to_details(session_id, cwd, result if isinstance(result, dict) else {})

    async def prompt(self, session_id: str, content: str | list[ContentBlock]) -> StopReason:
        """Sends a prompt (ACP ``session/prompt``) and returns the stop reason
        when the turn ends (``end_turn``, ``cancelled``, …). The turn's updates
        go to `on_session_update`; see `prompt_stream` to iterate them. No
        client-side time limit; cancelling the awaiting task cancels the turn
        (``session/cancel``) as `cancel` does.

        Args:
            content: text, or a list of ACP content blocks.

        Raises:
            SandboxAgentError: ``not-connected``; ``rpc`` (the agent failed or died).
        """
        check_str("prompt", "session_id", session_id)
        blocks = _blocks("prompt", content)
        return await self._run_turn(session_id, blocks, None)

    def prompt_stream(self, session_id: str, content: str | list[ContentBlock]) -> PromptTurn:
        """Sends a prompt and returns the running turn: ``async for update in
        turn`` for its session updates (they also go to `on_session_update`),
        ``await turn.result()`` for the stop reason. One turn stream per
        session at a time (a newer one takes the updates over). Call it from
        a coroutine (the turn starts at once).

        Example::

            turn = client.prompt_stream(session.session_id, "hello")
            async for update in turn:
                if update["sessionUpdate"] == "agent_message_chunk":
                    print(update["content"].get("text", ""), end="")
            print(await turn.result())

        Raises:
            TypeError: `session_id` or `content` of the wrong type (at once;
                every other failure comes from the iterator and `result`).
        """
        check_str("prompt_stream", "session_id", session_id)
        blocks = _blocks("prompt_stream", content)
        return PromptTurn(
            session_id,
            lambda turn: self._run_turn(session_id, blocks, turn),
            lambda: self.cancel(session_id),
        )

    async def _run_turn(self, session_id: str, blocks: list[ContentBlock], turn: PromptTurn | None) -> StopReason:
        if turn is not None:
            self._turns[session_id] = turn
        try:
            result = await self._call(
                "session/prompt",
                {"sessionId": session_id, "prompt": blocks},
                # Turns take as long as the agent needs: no client-side limit.
                no_timeout=True,
            )
            stop = result.get("stopReason") if isinstance(result, dict) else None
            if not isinstance(stop, str):
                raise SandboxAgentError("invalid-response", "session/prompt: the answer has no stopReason")
            return stop
        except asyncio.CancelledError:
            # The caller's task was cancelled: so is the turn (the TypeScript
            # client's aborted signal), else it would run on at the agent.
            self._spawn(self._cancel_quietly(session_id))
            raise
        finally:
            if turn is not None and self._turns.get(session_id) is turn:
                del self._turns[session_id]

    async def _cancel_quietly(self, session_id: str) -> None:
        try:
            await self.cancel(session_id)
        except SandboxAgentError:
            pass  # The connection is gone: so is the turn's caller.

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        """Runs `coroutine` in the background, held until it ends."""
        task = asyncio.ensure_future(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def cancel(self, session_id: str) -> None:
        """Asks the agent to stop the session's running turn (ACP
        ``session/cancel``; the turn ends with stop reason ``cancelled``)."""
        check_str("cancel", "session_id", session_id)
        connection = await self._connection_for_call("session/cancel")
        await connection.notify("session/cancel", {"sessionId": session_id})

    async def list_models(self, session_id: str | None = None) -> dict[str, Any]:
        """The models of a session (``{availableModels, currentModelId}``), or of
        this client's agent when `session_id` is omitted."""
        check_str("list_models", "session_id", session_id, optional=True)
        params = {"agent": self._agent} if session_id is None else {"sessionId": session_id}
        result: dict[str, Any] = await self._call(METHOD_LIST_MODELS, params)
        return result

    async def set_metadata(self, session_id: str, metadata: Mapping[str, Any]) -> SessionInfo:
        """Merges `metadata` into the session's stored metadata (JSON Merge
        Patch: ``None`` removes a key). A str ``title``, ``model`` or ``mode``
        also sets those fields. Nothing is sent to the agent.

        Raises:
            SandboxAgentError: `is_not_found` for an unknown session.
        """
        check_str("set_metadata", "session_id", session_id)
        check("set_metadata", "metadata", metadata, Mapping, "a mapping")
        result = await self._call(METHOD_SET_METADATA, {"sessionId": session_id, "metadata": dict(metadata)})
        return to_info(result if isinstance(result, dict) else {})

    async def get_session(self, session_id: str) -> SessionInfo:
        """One session from the server's inventory (``GET /v2/sessions/{id}``,
        of this client's agent). Needs no connection.

        Raises:
            SandboxAgentError: `is_not_found` for an unknown session.
        """
        check_str("get_session", "session_id", session_id)
        entry = await self._json("GET", f"/v2/sessions/{quote(session_id, safe='')}", query={"agent": self._agent})
        return to_info(entry if isinstance(entry, dict) else {})

    async def list_sessions(
        self,
        *,
        limit: int | None = None,
        cursor: str | None = None,
        agent: str | None = None,
        state: Literal["live", "dormant", "ended"] | None = None,
        q: str | None = None,
    ) -> SessionPage:
        """One page of the server's session inventory (``GET /v2/sessions``),
        newest first, every agent unless `agent`. `limit` 1 to 1000 (default
        100); `cursor` the previous page's `next_cursor`; `q` a title filter.
        Needs no connection."""
        check("list_sessions", "limit", limit, int, "an int", optional=True)
        for name, value in (("cursor", cursor), ("agent", agent), ("state", state), ("q", q)):
            check_str("list_sessions", name, value, optional=True)
        query = {"limit": limit, "cursor": cursor, "agent": agent, "state": state, "q": q}
        return page_of(await self._json("GET", "/v2/sessions", query=query))

    async def unstable_list_sessions(self, *, cwd: str | None = None, cursor: str | None = None) -> SessionPage:
        """The same inventory through the connection (ACP ``session/list``,
        50 a page, optional `cwd` filter)."""
        check_str("unstable_list_sessions", "cwd", cwd, optional=True)
        check_str("unstable_list_sessions", "cursor", cursor, optional=True)
        params = {k: v for k, v in (("cwd", cwd), ("cursor", cursor)) if v is not None}
        return page_of(await self._call("session/list", params))

    async def get_session_events(self, session_id: str, *, offset: int = 0, limit: int = 100) -> SessionEventPage:
        """One page of the session's event log (``GET /v2/sessions/{id}/events``):
        every message of the session in order from `offset`, at most `limit`
        (1 to 1000). Needs no connection.

        Raises:
            SandboxAgentError: `is_not_found` for an unknown session.
        """
        check_str("get_session_events", "session_id", session_id)
        check("get_session_events", "offset", offset, int, "an int")
        check("get_session_events", "limit", limit, int, "an int")
        page: SessionEventPage = await self._json(
            "GET",
            f"/v2/sessions/{quote(session_id, safe='')}/events",
            query={"offset": offset, "limit": limit, "agent": self._agent},
        )
        return page

    async def detach_session(self, session_id: str) -> None:
        """This connection stops receiving the session's updates; the session and its turn go on."""
        check_str("detach_session", "session_id", session_id)
        await self._call(METHOD_DETACH, {"sessionId": session_id})

    async def terminate_session(self, session_id: str) -> dict[str, Any]:
        """Ends the session for good (its running turn is cancelled);
        returns ``{"sessionId", "alreadyEnded"}``."""
        check_str("terminate_session", "session_id", session_id)
        result: dict[str, Any] = await self._call(METHOD_TERMINATE, {"sessionId": session_id})
        return result

    # ---- files (the sandbox's file system, "Host file system") ----
    # Relative paths start at the session's cwd when `session_id` is given,
    # else at the server's working directory.

    async def list_fs_entries(self, path: str = ".", *, session_id: str | None = None) -> dict[str, Any]:
        """The entries of a directory sorted by name: ``{"entries": [FsEntry…],
        "truncated": bool}`` (`truncated`: the server's entry limit cut the
        list; always present). The TypeScript client's
        ``listFsEntries(path)`` returns the same object.

        Raises:
            SandboxAgentError: `is_not_found` when nothing is there, 409 not a directory.
        """
        check_str("list_fs_entries", "path", path)
        check_str("list_fs_entries", "session_id", session_id, optional=True)
        result: dict[str, Any] = await self._json("GET", "/v2/fs/entries", query={"path": path, "sessionId": session_id})
        result["truncated"] = result.get("truncated") is True
        return result

    async def stat_fs(self, path: str, *, session_id: str | None = None) -> FsEntry:
        """One entry. Raises `SandboxAgentError` (`is_not_found`) when nothing is there."""
        check_str("stat_fs", "path", path)
        check_str("stat_fs", "session_id", session_id, optional=True)
        entry: FsEntry = await self._json("GET", "/v2/fs/stat", query={"path": path, "sessionId": session_id})
        return entry

    async def mkdir_fs(self, path: str, *, session_id: str | None = None) -> dict[str, Any]:
        """Creates a directory and its parents (an existing one is fine); returns ``{"path"}``."""
        check_str("mkdir_fs", "path", path)
        check_str("mkdir_fs", "session_id", session_id, optional=True)
        result: dict[str, Any] = await self._json("POST", "/v2/fs/mkdir", query={"path": path, "sessionId": session_id})
        return result

    async def move_fs(
        self, from_path: str, to_path: str, *, overwrite: bool = False, session_id: str | None = None
    ) -> dict[str, Any]:
        """Moves `from_path` to `to_path` (whose parent must exist; `overwrite`
        replaces an entry there); returns ``{"from", "to"}``."""
        check_str("move_fs", "from_path", from_path)
        check_str("move_fs", "to_path", to_path)
        check("move_fs", "overwrite", overwrite, bool, "a bool")
        check_str("move_fs", "session_id", session_id, optional=True)
        body: dict[str, Any] = {"from": from_path, "to": to_path, "overwrite": overwrite}
        if session_id is not None:
            body["sessionId"] = session_id
        result: dict[str, Any] = await self._json("POST", "/v2/fs/move", json_body=body)
        return result

    async def delete_fs_entry(self, path: str, *, recursive: bool = False, session_id: str | None = None) -> dict[str, Any]:
        """Deletes a file, or a directory (`recursive` for a non-empty one); returns ``{"path"}``."""
        check_str("delete_fs_entry", "path", path)
        check("delete_fs_entry", "recursive", recursive, bool, "a bool")
        check_str("delete_fs_entry", "session_id", session_id, optional=True)
        query = {"path": path, "recursive": "true" if recursive else None, "sessionId": session_id}
        result: dict[str, Any] = await self._json("DELETE", "/v2/fs/entry", query=query)
        return result

    async def read_fs_file(self, path: str, *, session_id: str | None = None) -> bytes:
        """The bytes of a file (held in memory; see `read_fs_file_stream` for large ones).

        Raises:
            SandboxAgentError: `is_not_found`; 400 ``invalid-path``.
        """
        check_str("read_fs_file", "path", path)
        check_str("read_fs_file", "session_id", session_id, optional=True)
        response = await self._request("GET", "/v2/fs/file", query={"path": path, "sessionId": session_id})
        return response.content

    @asynccontextmanager
    async def read_fs_file_stream(
        self, path: str, *, session_id: str | None = None, from_offset: int = 0, etag: str | None = None
    ) -> AsyncIterator[FileDownload]:
        """A file as a stream, for files too large to hold in memory::

            async with client.read_fs_file_stream(path) as download:
                async for chunk in download.aiter_bytes(): ...

        With `from_offset` (bytes) and the `etag` of an earlier download it
        asks for the rest only (``Range`` with ``If-Range``): the download's
        `offset` is then `from_offset` when the file is unchanged, or 0 when it
        changed and the whole new file comes (start over, never append).
        """
        check_str("read_fs_file_stream", "path", path)
        check_str("read_fs_file_stream", "session_id", session_id, optional=True)
        check("read_fs_file_stream", "from_offset", from_offset, int, "an int")
        check_str("read_fs_file_stream", "etag", etag, optional=True)
        headers: dict[str, str] = {}
        if from_offset > 0:
            headers["range"] = f"bytes={from_offset}-"
            if etag is not None:
                headers["if-range"] = etag
        async with self._stream("GET", "/v2/fs/file", query={"path": path, "sessionId": session_id}, headers=headers) as response:
            partial = response.status_code == 206
            size: int | None = None
            content_range = response.headers.get("content-range", "")
            if partial and "/" in content_range and content_range.rsplit("/", 1)[1].isdigit():
                size = int(content_range.rsplit("/", 1)[1])
            elif not partial and response.headers.get("content-length", "").isdigit():
                size = int(response.headers["content-length"])
            yield FileDownload(
                offset=from_offset if partial else 0,
                size=size,
                etag=response.headers.get("etag"),
                _response=response,
            )

    async def write_fs_file(self, path: str, content: Body, *, session_id: str | None = None) -> dict[str, Any]:
        """Writes a file whole (atomically: readers never see half of it),
        creating its parent directories. An (async) iterable of byte chunks is
        streamed, so a large file needs no memory.

        Returns:
            ``{"path": <absolute path>, "bytesWritten": <bytes>}``.
        """
        check_str("write_fs_file", "path", path)
        check_str("write_fs_file", "session_id", session_id, optional=True)
        body = _body("write_fs_file", "content", content)
        result: dict[str, Any] = await self._json(
            "PUT",
            "/v2/fs/file",
            query={"path": path, "sessionId": session_id},
            content=body,
            content_type="application/octet-stream",
        )
        return {"path": result.get("path"), "bytesWritten": result.get("bytesWritten")}

    async def upload_fs_batch(
        self,
        path: str,
        archive: bytes | Iterable[bytes] | AsyncIterable[bytes],
        *,
        gzip: bool | None = None,
        session_id: str | None = None,
    ) -> dict[str, Any]:
        """Unpacks a tar archive (gzip-compressed or not; `gzip` ``None`` looks
        at the bytes' magic number) into directory `path`, creating it. Unsafe
        entries fail the archive (400 ``invalid-archive``).

        Returns:
            ``{"paths": [<absolute paths>], "truncated": bool}``.
        """
        check_str("upload_fs_batch", "path", path)
        check("upload_fs_batch", "gzip", gzip, bool, "a bool", optional=True)
        check_str("upload_fs_batch", "session_id", session_id, optional=True)
        if isinstance(archive, str):
            raise type_error("upload_fs_batch", "archive", "bytes or an iterable of bytes", archive)
        body = _body("upload_fs_batch", "archive", archive)
        gz = gzip if gzip is not None else isinstance(body, bytes) and body[:2] == b"\x1f\x8b"
        result: dict[str, Any] = await self._json(
            "POST",
            "/v2/fs/upload-batch",
            query={"path": path, "sessionId": session_id},
            content=body,
            content_type="application/gzip" if gz else "application/x-tar",
        )
        return result

    # ---- processes ("Processes and terminals"; plain HTTP, no connection needed) ----

    async def run_process(
        self,
        command: str,
        args: list[str] | None = None,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: str | None = None,
        timeout_ms: int | None = None,
        max_output_bytes: int | None = None,
        session_id: str | None = None,
    ) -> RunResult:
        """Runs a program (argv, never a shell line: use ``sh -c`` for one) to
        completion and returns its exit and output. No client-side limit:
        bound it with `timeout_ms` (milliseconds; the server kills the tree).
        `max_output_bytes` keeps at most that many bytes of each stream.

        Raises:
            SandboxAgentError: 400 ``program-not-found``, 429
                ``too-many-processes``, 404 ``processes-disabled``.
        """
        request = _process_request("run_process", command, args, cwd, env, stdin, session_id)
        check("run_process", "timeout_ms", timeout_ms, int, "an int", optional=True)
        check("run_process", "max_output_bytes", max_output_bytes, int, "an int", optional=True)
        if timeout_ms is not None:
            request["timeoutMs"] = timeout_ms
        if max_output_bytes is not None:
            request["maxOutputBytes"] = max_output_bytes
        result: RunResult = await self._json("POST", "/v2/processes/run", json_body=request, no_timeout=True)
        return result

    async def start_process(
        self,
        command: str,
        args: list[str] | None = None,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: str | None = None,
        tty: bool = False,
        cols: int | None = None,
        rows: int | None = None,
        title: str | None = None,
        session_id: str | None = None,
    ) -> ProcessHandle:
        """Starts a program and returns its handle (output by offset, stdin,
        signals, wait); the process runs on after the handle is dropped. `tty`
        runs it on a pseudo-terminal of `cols` x `rows` (default 80 x 24).

        Raises:
            SandboxAgentError: as `run_process`.
        """
        request = _process_request("start_process", command, args, cwd, env, stdin, session_id)
        check("start_process", "tty", tty, bool, "a bool")
        check("start_process", "cols", cols, int, "an int", optional=True)
        check("start_process", "rows", rows, int, "an int", optional=True)
        check_str("start_process", "title", title, optional=True)
        if tty:
            request["tty"] = True
        for key, value in (("cols", cols), ("rows", rows), ("title", title)):
            if value is not None:
                request[key] = value
        info: ProcessInfo = await self._json("POST", "/v2/processes", json_body=request)
        return ProcessHandle(info, self)

    async def list_processes(
        self,
        *,
        limit: int | None = None,
        cursor: str | None = None,
        session_id: str | None = None,
        state: Literal["running", "exited"] | None = None,
    ) -> dict[str, Any]:
        """One page of processes, newest first (`limit` 1 to 1000, default 100):
        ``{"processes": [ProcessInfo…], "nextCursor"?}``."""
        check("list_processes", "limit", limit, int, "an int", optional=True)
        for name, value in (("cursor", cursor), ("session_id", session_id), ("state", state)):
            check_str("list_processes", name, value, optional=True)
        query = {"limit": limit, "cursor": cursor, "sessionId": session_id, "state": state}
        result: dict[str, Any] = await self._json("GET", "/v2/processes", query=query)
        return result

    async def get_process(self, process_id: str) -> ProcessInfo:
        """One process. Raises `SandboxAgentError` (`is_not_found`) for an unknown or forgotten id."""
        check_str("get_process", "process_id", process_id)
        info: ProcessInfo = await self._json("GET", f"/v2/processes/{quote(process_id, safe='')}")
        return info

    async def process_handle(self, process_id: str) -> ProcessHandle:
        """A handle for an existing process (one `list_processes` showed, say).

        Raises:
            SandboxAgentError: `is_not_found` for an unknown or forgotten id.
        """
        check_str("process_handle", "process_id", process_id)
        return ProcessHandle(await self.get_process(process_id), self)

    # ---- plumbing ----

    async def _connection_for_call(self, what: str) -> AcpHttpConnection:
        """The open connection, waiting for a connect in progress (or starting
        the auto-connect)."""
        if self._disposed:
            raise _disposed()
        if self._connecting is None and self._connection is None and self._auto_connect and not self._auto_started:
            await self.connect()
        if self._connecting is not None:
            await self.connect()
        connection = self._connection
        if connection is None or connection.closed:
            if self._lost is not None:
                raise self._lost
            raise SandboxAgentError("not-connected", f"{what}: not connected; call connect() first")
        return connection

    async def _call(self, method: str, params: Any, *, no_timeout: bool = False) -> Any:
        connection = await self._connection_for_call(method)
        return await connection.request(method, params, no_timeout=no_timeout)

    def _handle_notification(self, message: dict[str, Any]) -> None:
        method = message.get("method")
        params = message.get("params")
        if method == NOTIFICATION_TURN_INTERRUPTED:
            interrupted = to_turn_interrupted(params)
            if interrupted is not None and self._on_turn_interrupted is not None:
                self._on_turn_interrupted(interrupted)
            return
        if method != "session/update" or not isinstance(params, dict):
            return
        session_id = params.get("sessionId")
        update = params.get("update")
        if isinstance(session_id, str) and isinstance(update, dict):
            turn = self._turns.get(session_id)
            if turn is not None:
                turn.push(update)
        if self._on_session_update is not None:
            notification: SessionNotification = {"sessionId": str(session_id), "update": update if isinstance(update, dict) else {}}
            self._on_session_update(notification)

    async def _handle_request(self, request: dict[str, Any]) -> Any:
        method = request.get("method")
        params = request.get("params")
        if method == "session/request_permission" and isinstance(params, dict):
            return await _answer_permission(params, self._on_permission_request)  # type: ignore[arg-type]
        if method == "elicitation/create" and self._on_question is not None and isinstance(params, dict):
            try:
                answer = await _maybe_await(self._on_question(params))
                # Content that does not fit the form is never sent (check it first with check_answer).
                if isinstance(answer, dict) and check_answer(params, answer) is None:
                    return answer
            except Exception:  # noqa: BLE001 - a failing handler cancels the question
                pass
            return {"action": "cancel"}
        raise RpcFailure(METHOD_NOT_FOUND, f"method not found: {method} (this client does not serve it)")

    def _url(self, path: str) -> str:
        return self._base_url + path

    def _timeout(self, no_timeout: bool) -> httpx.Timeout:
        # The limit covers the answer's head: httpx's limits are per phase and per read.
        return httpx.Timeout(None if no_timeout else self._request_timeout)

    def _build(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, Any] | None,
        json_body: Any,
        content: Any,
        content_type: str | None,
        headers: Mapping[str, str] | None,
        no_timeout: bool,
    ) -> httpx.Request:
        if self._disposed:
            raise _disposed()
        params = {k: str(v) for k, v in (query or {}).items() if v is not None}
        all_headers = dict(headers or {})
        kwargs: dict[str, Any] = {}
        if json_body is not None:
            kwargs["json"] = json_body
        elif content is not None:
            all_headers["content-type"] = content_type or "application/octet-stream"
            kwargs["content"] = content
        return self._http.build_request(
            method,
            self._url(path),
            params=params,
            headers=all_headers,
            timeout=self._timeout(no_timeout),
            **kwargs,
        )

    async def _request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        json_body: Any = None,
        content: Any = None,
        content_type: str | None = None,
        headers: Mapping[str, str] | None = None,
        no_timeout: bool = False,
    ) -> httpx.Response:
        """One plain HTTP route, its body read; non-2xx answers raise `SandboxAgentError`."""
        request = self._build(
            method, path, query=query, json_body=json_body, content=content,
            content_type=content_type, headers=headers, no_timeout=no_timeout,
        )
        what = f"{method} {path}"
        try:
            response = await self._http.send(request)
        except httpx.TimeoutException as error:
            raise SandboxAgentError("timeout", f"{what}: no answer within {self._request_timeout} s") from error
        except httpx.HTTPError as error:
            raise unreachable(what, error) from error
        if not response.is_success:
            raise http_error(response, what)
        return response

    async def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        response = await self._request(method, path, **kwargs)
        try:
            return response.json()
        except ValueError as error:
            raise SandboxAgentError("invalid-response", f"{method} {path}: the answer is not JSON") from error

    @asynccontextmanager
    async def _stream(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> AsyncIterator[httpx.Response]:
        """One plain HTTP route whose body is read by the caller (no time limit
        on it); a non-2xx answer raises `SandboxAgentError`."""
        request = self._build(
            method, path, query=query, json_body=None, content=None, content_type=None,
            headers=headers, no_timeout=True,
        )
        what = f"{method} {path}"
        try:
            response = await self._http.send(request, stream=True)
        except httpx.HTTPError as error:
            raise unreachable(what, error) from error
        try:
            if not response.is_success:
                await response.aread()
                raise http_error(response, what)
            yield response
        finally:
            await response.aclose()


def _disposed() -> SandboxAgentError:
    return SandboxAgentError("disposed", "this client was closed")


def _blocks(call: str, content: Any) -> list[ContentBlock]:
    """A prompt as ACP content blocks (text becomes one text block)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list) and all(isinstance(block, dict) for block in content):
        return content
    raise type_error(call, "content", "a str or a list of content block dicts", content)


def _body(call: str, name: str, content: Any) -> Any:
    """A request body for httpx: bytes as they are, text as UTF-8, iterables streamed."""
    if isinstance(content, str):
        return content.encode("utf-8")
    if isinstance(content, (bytes, bytearray, memoryview)):
        return bytes(content)
    if isinstance(content, AsyncIterable) or (isinstance(content, Iterable) and not isinstance(content, Mapping)):
        if isinstance(content, Iterable) and not isinstance(content, AsyncIterable):
            chunks = content

            async def stream() -> AsyncIterator[bytes]:
                for chunk in chunks:
                    yield _chunk(call, name, chunk)

            return stream()

        async def astream() -> AsyncIterator[bytes]:
            async for chunk in content:
                yield _chunk(call, name, chunk)

        return astream()
    raise type_error(call, name, "str, bytes or an iterable of bytes", content)


def _chunk(call: str, name: str, chunk: Any) -> bytes:
    if isinstance(chunk, (bytes, bytearray, memoryview)):
        return bytes(chunk)
    raise type_error(call, name, "an iterable of bytes", chunk, got=f"one yielding {type(chunk).__name__}")


def _process_request(
    call: str, command: Any, args: Any, cwd: Any, env: Any, stdin: Any, session_id: Any
) -> dict[str, Any]:
    check_str(call, "command", command)
    check_str_list(call, "args", args, optional=True)
    check_str(call, "cwd", cwd, optional=True)
    check_str_mapping(call, "env", env, optional=True)
    check_str(call, "stdin", stdin, optional=True)
    check_str(call, "session_id", session_id, optional=True)
    request: dict[str, Any] = {"command": command}
    if args is not None:
        request["args"] = args
    if cwd is not None:
        request["cwd"] = cwd
    if env is not None:
        request["env"] = dict(env)
    if stdin is not None:
        request["stdin"] = stdin
    if session_id is not None:
        request["sessionId"] = session_id
    return request


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


async def _answer_permission(request: PermissionRequest, handler: PermissionHandler | None) -> dict[str, Any]:
    """Answers a permission request through the handler (cancelled without one, or when it raises)."""
    decision: Any = "cancel"
    if handler is not None:
        try:
            decision = await _maybe_await(handler(request))
        except Exception:  # noqa: BLE001 - a failing handler cancels the request
            decision = "cancel"
    option_id = _pick_option(request, decision)
    if option_id is None:
        return {"outcome": {"outcome": "cancelled"}}
    return {"outcome": {"outcome": "selected", "optionId": option_id}}


_DECISION_KINDS: dict[str, tuple[str, ...]] = {
    "allow": ("allow_once", "allow_always"),
    "allow-always": ("allow_always",),
    "reject": ("reject_once", "reject_always"),
    "reject-always": ("reject_always",),
    "cancel": (),
}


def _pick_option(request: PermissionRequest, decision: PermissionDecision | Any) -> str | None:
    """The option a decision names, by the rules of `PermissionDecision`."""
    options = [o for o in request.get("options") or [] if isinstance(o, dict)]
    if isinstance(decision, dict):
        wanted = decision.get("optionId")
        return wanted if any(o.get("optionId") == wanted for o in options) and isinstance(wanted, str) else None
    for kind in _DECISION_KINDS.get(decision, ()) if isinstance(decision, str) else ():
        for option in options:
            if option.get("kind") == kind and isinstance(option.get("optionId"), str):
                return str(option["optionId"])
    return None
