"""A private sandbox-agent server started from its binary, as the Rust and
TypeScript SDKs' embedded mode does (`research/contract.md`, "Embedded mode"):

- the binary: the `binary` argument, else ``$SANDBOX_AGENT_BIN`` (which must
  exist when set), else the first ``sandbox-agent`` on the ``PATH``;
- ``server --host 127.0.0.1 --port 0 --exit-on-stdin-eof --shutdown-grace-ms
  <40 % of ours>``, a random token in the environment (never on the command
  line, which ``/proc`` shows to every user), inherited
  ``SANDBOX_AGENT_NO_TOKEN``, ``_HOST`` and ``_PORT`` removed;
- ready when the stdout line ``sandbox-agent listening on http://HOST:PORT``
  came and ``GET /v2/health`` answered 200;
- stopped by `EmbeddedServer.stop` (SIGTERM, then SIGKILL after the grace
  period), or when this process exits however it exits: the server's stdin
  is a pipe only this process holds, and its end of file stops the server
  and its agents.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
from collections import deque
from collections.abc import Iterable

import httpx

__all__ = ["EmbeddedServer", "resolve_binary"]

#: Prefix of the server's one stdout line ("Server start-up").
LISTENING_PREFIX = "sandbox-agent listening on "
#: Lines of the server's stderr kept for start-up errors and `logs`.
KEPT_LOG_LINES = 200


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
        startup_timeout: float = 15.0,
        shutdown_grace: float = 5.0,
    ) -> EmbeddedServer:
        """Starts a private server and waits until it serves.

        Args:
            binary: the binary (see `resolve_binary`).
            args: extra ``sandbox-agent server`` arguments (``--data-dir DIR``, …).
            startup_timeout: seconds start-up may take.
            shutdown_grace: seconds `stop` waits after SIGTERM before SIGKILL.

        Raises:
            FileNotFoundError: no binary.
            RuntimeError: the server exited first, or was not ready within
                `startup_timeout` (the message carries its stderr).
        """
        path, _ = resolve_binary(binary)
        if isinstance(args, str):
            raise TypeError("args must be an iterable of str, not str")
        extra = list(args)
        if not all(isinstance(a, str) for a in extra):
            raise TypeError("args must be an iterable of str")
        token = secrets.token_hex(24)
        env = {k: v for k, v in os.environ.items() if k not in ("SANDBOX_AGENT_NO_TOKEN", "SANDBOX_AGENT_HOST", "SANDBOX_AGENT_PORT")}
        env["SANDBOX_AGENT_TOKEN"] = token
        argv = [
            "server", "--host", "127.0.0.1", "--port", "0", "--exit-on-stdin-eof",
            # The server's own agent grace fits inside ours (as in the Rust SDK).
            "--shutdown-grace-ms", str(max(1, int(shutdown_grace * 1000 * 0.4))),
            *extra,
        ]
        process = await asyncio.create_subprocess_exec(
            path, *argv, env=env,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        server = cls(process, "", token, path, shutdown_grace)
        server._log_task = asyncio.ensure_future(server._keep_logs())
        try:
            server.base_url = await asyncio.wait_for(server._listening(), startup_timeout)
            await asyncio.wait_for(server._healthy(), startup_timeout)
        except asyncio.TimeoutError:
            await server._kill()
            raise RuntimeError(f"sandbox-agent server was not ready within {startup_timeout} s:\n{server.logs()}") from None
        except BaseException:
            await server._kill()
            raise
        return server

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
                raise RuntimeError(
                    f"sandbox-agent server exited ({self._process.returncode}) before listening:\n{self.logs()}"
                )
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
