"""Starts the real ``sandbox-agent server`` for the tests, as the Rust and
TypeScript harnesses do: ``--host 127.0.0.1 --port 0``, a private
``--data-dir``, the address read from the one stdout line ``sandbox-agent
listening on http://HOST:PORT`` (`research/contract.md`, "Server start-up").
The binary is ``$SANDBOX_AGENT_BIN``, else ``<repo>/target/debug/sandbox-agent``.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import socket
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[3]
LISTENING_PREFIX = "sandbox-agent listening on "
STARTUP_TIMEOUT_S = 60
SAY = "Hello from the mock agent. You said: "


def binary_path() -> str:
    """The binary under test, checked to exist."""
    path = os.environ.get("SANDBOX_AGENT_BIN") or str(REPO / "target" / "debug" / "sandbox-agent")
    if not os.path.isfile(path):
        raise RuntimeError(f"sandbox-agent binary not found at {path}: build it (cargo build --workspace) or set SANDBOX_AGENT_BIN")
    return path


@dataclass
class Server:
    """A running test server; `stop` ends it and removes its data dir."""

    url: str
    data_dir: str
    process: subprocess.Popen[str]
    stderr_lines: list[str] = field(default_factory=list)

    def kill(self) -> None:
        """SIGKILL, keeping the data dir (for a restart on it)."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        for pipe in (self.process.stdout, self.process.stderr):
            if pipe is not None:
                pipe.close()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=2)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for pipe in (self.process.stdout, self.process.stderr):
            if pipe is not None:
                pipe.close()
        shutil.rmtree(self.data_dir, ignore_errors=True)


def start_server(*args: str, data_dir: str | None = None) -> Server:
    """Starts a server; `args` are extra flags (``--token T`` replaces
    ``--no-token``), `data_dir` an earlier server's (a restart)."""
    data_dir = data_dir or tempfile.mkdtemp(prefix="sa-py-test-")
    # A developer's own token or timeouts must not change what the tests see.
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOX_AGENT_")}
    auth = [] if "--token" in args else ["--no-token"]
    process = subprocess.Popen(
        [binary_path(), "server", "--host", "127.0.0.1", "--port", "0", "--data-dir", data_dir, *auth, *args],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    server = Server(url="", data_dir=data_dir, process=process)
    assert process.stderr is not None and process.stdout is not None
    stderr = process.stderr

    def drain() -> None:
        for line in stderr:
            server.stderr_lines.append(line)

    threading.Thread(target=drain, daemon=True).start()
    found: list[str] = []
    stdout = process.stdout

    def read_listening() -> None:
        for line in stdout:
            if line.startswith(LISTENING_PREFIX):
                found.append(line[len(LISTENING_PREFIX):].strip())
                return

    reader = threading.Thread(target=read_listening, daemon=True)
    reader.start()
    reader.join(STARTUP_TIMEOUT_S)
    if not found:
        server.stop()
        raise RuntimeError(f"server did not start within {STARTUP_TIMEOUT_S} s:\n{''.join(server.stderr_lines)}")
    server.url = found[0]
    return server


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    """One server (``--no-token``) shared by the tests that need nothing special."""
    s = start_server()
    yield s
    s.stop()


def unused_url() -> str:
    """A loopback URL nothing listens on (a port bound then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def text_of(updates: list[dict[str, Any]]) -> str:
    """The text of a turn's ``agent_message_chunk`` updates, joined."""
    return "".join(
        u["content"]["text"]
        for u in updates
        if u.get("sessionUpdate") == "agent_message_chunk" and u["content"].get("type") == "text"
    )


class CuttingProxy:
    """A TCP proxy in front of the server that cuts, for real (both sockets
    closed), the first connection whose request starts with `request_prefix`
    once the bytes the server sent back on it contain `marker` and end an
    SSE event (a blank line, then the chunk's CRLF). Every other connection is relayed untouched."""

    def __init__(self, upstream: str, request_prefix: bytes, marker: bytes) -> None:
        host, port = upstream.removeprefix("http://").split(":")
        self._upstream = (host, int(port))
        self._prefix = request_prefix
        self._marker = marker
        self.cuts = 0
        self._server: asyncio.base_events.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []
        self.url = ""

    async def __aenter__(self) -> CuttingProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self._writers:
            writer.transport.abort()
        await asyncio.sleep(0)

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_connection(*self._upstream)
        self._writers += [client_w, up_w]
        state: dict[str, Any] = {"watch": False, "seen": b""}

        async def up() -> None:
            while data := await client_r.read(65536):
                # A kept-alive connection carries one request after another:
                # watch it while it carries the request to cut.
                if data.startswith(self._prefix):
                    state["watch"] = self.cuts == 0
                    state["seen"] = b""
                elif re.match(rb"^[A-Z]+ /", data):
                    state["watch"] = False
                up_w.write(data)
                await up_w.drain()
            up_w.close()

        async def down() -> None:
            while data := await up_r.read(65536):
                client_w.write(data)
                await client_w.drain()
                if state["watch"] and self.cuts == 0:
                    seen = state["seen"] + data
                    state["seen"] = seen
                    # An event ends with a blank line; with chunked transfer
                    # coding the chunk's CRLF follows it.
                    if self._marker in seen and seen.endswith((b"\n\n", b"\n\n\r\n")):
                        self.cuts += 1
                        break
            for writer in (client_w, up_w):
                writer.transport.abort()

        tasks = [asyncio.ensure_future(up()), asyncio.ensure_future(down())]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        await asyncio.sleep(0)
        for writer in (client_w, up_w):
            writer.transport.abort()
        for task in tasks:
            task.cancel()

