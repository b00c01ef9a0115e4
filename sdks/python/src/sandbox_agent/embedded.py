"""A private sandbox-agent server started from its binary, as the Rust and
TypeScript SDKs' embedded mode does (`research/contract.md`, "Embedded mode"):

- the binary: the `binary` argument, else ``$SANDBOX_AGENT_BIN`` (which must
  exist when set), else the first ``sandbox-agent`` on the ``PATH``;
- ``server --host 127.0.0.1 --port 0 --exit-on-stdin-eof --shutdown-grace-ms
  <40 % of ours>``, a random token in the environment (never on the command
  line, which ``/proc`` shows to every user), inherited
  ``SANDBOX_AGENT_NO_TOKEN``, ``_HOST`` and ``_PORT`` removed; the caller's
  `host` and `port` (or a ``--host``/``--port`` of its extra arguments)
  replace the default address, each given once;
- ready when the stdout line ``sandbox-agent listening on http://HOST:PORT``
  came and ``GET /v2/health`` answered 200;
- stopped by `EmbeddedServer.stop` (SIGTERM, then SIGKILL after the grace
  period), or when this process exits however it exits: the server's stdin
  is a pipe only this process holds, and its end of file stops the server
  and its agents.

Every start-up failure (no binary, the server exited, not ready in time) is
a `SandboxAgentError` of kind ``"server-start"`` whose message carries the
command line and the server's stderr tail.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
from collections import deque
from collections.abc import Iterable
from typing import Any

import httpx

from ._check import check, check_int, check_str, type_error
from .errors import SandboxAgentError

__all__ = ["EmbeddedServer", "resolve_binary"]

#: Prefix of the server's one stdout line ("Server start-up").
LISTENING_PREFIX = "sandbox-agent listening on "
#: Lines of the server's stderr kept for start-up errors and `logs`.
KEPT_LOG_LINES = 200
#: Lines of the server's stderr a start-up error carries (its tail).
ERROR_LOG_LINES = 20
#: The address a private server listens on unless the caller names one.
DEFAULT_HOST = "127.0.0.1"


def resolve_binary(binary: str | None = None) -> tuple[str, str]:
    """Finds the ``sandbox-agent`` binary: `binary`, else ``$SANDBOX_AGENT_BIN``,
    else the ``PATH``.

    Returns:
        ``(path, source)``, source ``"argument"``, ``"SANDBOX_AGENT_BIN"`` or ``"PATH"``.

    Raises:
        FileNotFoundError: the one named does not exist, or none was found
            (the message lists where it looked).
    """
    if binary is not None:
        if not os.path.isfile(binary):
            raise FileNotFoundError(f"sandbox-agent binary not found at {binary} (the binary argument)")
        return binary, "argument"
    env = os.environ.get("SANDBOX_AGENT_BIN")
    if env:
        if not os.path.isfile(env):
            raise FileNotFoundError(f"sandbox-agent binary not found at {env} ($SANDBOX_AGENT_BIN)")
        return env, "SANDBOX_AGENT_BIN"
    found = shutil.which("sandbox-agent")
    if found is None:
        raise FileNotFoundError(
            "sandbox-agent binary not found: looked at the binary argument, $SANDBOX_AGENT_BIN and the PATH"
        )
    return found, "PATH"


class EmbeddedServer:
    """A running private server; made by `EmbeddedServer.start` (or
    `SandboxAgentClient.start`)."""

    def __init__(self, process: asyncio.subprocess.Process, base_url: str, token: str, binary: str, grace: float) -> None:
        self._process = process
        #: ``http://127.0.0.1:PORT``.
        self.base_url = base_url
        #: The random bearer token the server requires (48 hex characters).
        self.token = token
        #: The binary the server runs.
        self.binary = binary
        self._grace = grace
        self._logs: deque[str] = deque(maxlen=KEPT_LOG_LINES)
        self._log_task: asyncio.Task[None] | None = None
        self._stopping: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int:
        """The server's process id."""
        return self._process.pid

    def logs(self) -> str:
        """The last lines of the server's stderr."""
        return "\n".join(self._logs)

    @classmethod
    async def start(
        cls,
        *,
        binary: str | None = None,
        args: Iterable[str] = (),
        host: str | None = None,
        port: int | None = None,
        startup_timeout: float = 15.0,
        shutdown_grace: float = 5.0,
    ) -> EmbeddedServer:
        """Starts a private server and waits until it serves.

        Args:
            binary: the binary (see `resolve_binary`).
            args: extra ``sandbox-agent server`` arguments (``--data-dir DIR``, …).
            host: the address to listen on (default ``127.0.0.1``; another
                one exposes the server beyond this machine, behind its token).
            port: the TCP port (default 0: a free one, read back into
                `base_url`).
            startup_timeout: seconds start-up may take.
            shutdown_grace: seconds `stop` waits after SIGTERM before SIGKILL.

        Raises:
            TypeError: an argument of the wrong type.
            ValueError: `port` out of 0 to 65535, or the host or port given
                twice (`host`/`port` and ``--host``/``--port`` in `args`).
            SandboxAgentError: kind ``"server-start"``: no binary, the server
                exited first, or was not ready within `startup_timeout` (the
                message carries its stderr tail; `data` is ``{"exitCode",
                "stderr"}``).
        """
        return await cls._start(
            "EmbeddedServer.start", "args", binary, args, host, port, startup_timeout, shutdown_grace
        )

    @classmethod
    async def _start(
        cls,
        call: str,
        args_name: str,
        binary: Any,
        args: Any,
        host: Any,
        port: Any,
        startup_timeout: Any,
        shutdown_grace: float = 5.0,
    ) -> EmbeddedServer:
        """`start`, its argument errors naming `call` and `args_name`."""
        argv = _server_argv(call, args_name, args, host, port, shutdown_grace)
        check_str(call, "binary", binary, optional=True)
        check(call, "startup_timeout", startup_timeout, (int, float), "a number of seconds")
        try:
            path, _ = resolve_binary(binary)
        except FileNotFoundError as error:
            raise SandboxAgentError("server-start", f"{call}: {error}", data={"exitCode": None, "stderr": ""}) from error
        token = secrets.token_hex(24)
        env = {k: v for k, v in os.environ.items() if k not in ("SANDBOX_AGENT_NO_TOKEN", "SANDBOX_AGENT_HOST", "SANDBOX_AGENT_PORT")}
        env["SANDBOX_AGENT_TOKEN"] = token
        command = " ".join([path, *argv])
        try:
            process = await asyncio.create_subprocess_exec(
                path, *argv, env=env,
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            )
        except OSError as error:
            raise SandboxAgentError(
                "server-start", f"{call}: could not run {command}: {error}", data={"exitCode": None, "stderr": ""}
            ) from error
        server = cls(process, "", token, path, shutdown_grace)
        server._log_task = asyncio.ensure_future(server._keep_logs())
        try:
            server.base_url = await asyncio.wait_for(server._listening(), startup_timeout)
            await asyncio.wait_for(server._healthy(), startup_timeout)
        except asyncio.TimeoutError:
            await server._kill()
            raise server._start_error(call, f"was not ready within {startup_timeout} s", command) from None
        except _ExitedEarly:
            exited = server._start_error(call, f"exited with status {process.returncode} before listening", command)
            await server._kill()
            raise exited from None
        except BaseException:
            await server._kill()
            raise
        return server

    def _start_error(self, call: str, what: str, command: str) -> SandboxAgentError:
        """The ``server-start`` error, with the command line and the stderr tail."""
        tail = "\n".join(list(self._logs)[-ERROR_LOG_LINES:])
        return SandboxAgentError(
            "server-start",
            f"{call}: the sandbox-agent server {what} ({command}); its stderr ends:\n{tail or '(nothing)'}",
            data={"exitCode": self._process.returncode, "stderr": tail},
        )

    async def _keep_logs(self) -> None:
        assert self._process.stderr is not None
        async for line in self._process.stderr:
            self._logs.append(line.decode("utf-8", "replace").rstrip("\n"))

    async def _listening(self) -> str:
        assert self._process.stdout is not None
        while True:
            line = await self._process.stdout.readline()
            if not line:
                await self._process.wait()
                if self._log_task is not None:
                    await asyncio.wait({self._log_task}, timeout=1)
                raise _ExitedEarly()
            text = line.decode("utf-8", "replace").strip()
            if text.startswith(LISTENING_PREFIX):
                return text[len(LISTENING_PREFIX):].strip()

    async def _healthy(self) -> None:
        async with httpx.AsyncClient() as http:
            while True:
                try:
                    if (await http.get(f"{self.base_url}/v2/health")).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.05)

    async def _kill(self) -> None:
        if self._process.returncode is None:
            self._process.kill()
        await self._process.wait()
        if self._log_task is not None:
            self._log_task.cancel()

    async def stop(self) -> None:
        """Stops the server (SIGTERM, SIGKILL after the grace period) and waits
        for it to exit. Safe to call more than once."""
        if self._stopping is None:
            self._stopping = asyncio.ensure_future(self._stop())
        await asyncio.shield(self._stopping)

    async def _stop(self) -> None:
        if self._process.returncode is None:
            self._process.terminate()
            try:
                await asyncio.wait_for(self._process.wait(), self._grace)
            except asyncio.TimeoutError:
                self._process.kill()
                await self._process.wait()
        if self._process.stdin is not None:
            self._process.stdin.close()
        if self._log_task is not None:
            self._log_task.cancel()


class _ExitedEarly(Exception):
    """The server's stdout ended before its listening line (it exited)."""


def _names_flag(args: list[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in args)


def _server_argv(call: str, args_name: str, args: Any, host: Any, port: Any, shutdown_grace: float) -> list[str]:
    """The ``server`` command line: our defaults, the caller's host and port,
    then the extra arguments (a ``--host``/``--port`` there replaces ours)."""
    if isinstance(args, (str, bytes)) or not isinstance(args, Iterable):
        raise type_error(call, args_name, "an iterable of str", args)
    extra = list(args)
    for item in extra:
        if not isinstance(item, str):
            raise type_error(call, args_name, "an iterable of str", args, got=f"one holding {type(item).__name__}")
    check_str(call, "host", host, optional=True)
    check_int(call, "port", port, optional=True)
    if port is not None and not 0 <= port <= 65535:
        raise ValueError(f"{call}: port must be 0 to 65535, not {port}")
    address: list[str] = []
    for flag, value, default in (("--host", host, DEFAULT_HOST), ("--port", port, 0)):
        name = flag[2:]
        if _names_flag(extra, flag):
            if value is not None:
                raise ValueError(f"{call}: {name}= and {flag} in {args_name} both set the {name}: give it once")
            continue  # the caller's own flag, as it wrote it
        address += [flag, str(default if value is None else value)]
    return [
        "server", *address, "--exit-on-stdin-eof",
        # The server's own agent grace fits inside ours (as in the Rust SDK).
        "--shutdown-grace-ms", str(max(1, int(shutdown_grace * 1000 * 0.4))),
        *extra,
    ]
