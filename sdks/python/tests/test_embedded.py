"""`SandboxAgentClient.start`: a private server from the binary
(``$SANDBOX_AGENT_BIN``, then the ``PATH``), with a random token, stopped by
`close` (`research/contract.md`, "Embedded mode")."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from sandbox_agent import EmbeddedServer, SandboxAgentClient, resolve_binary

from conftest import SAY, binary_path, text_of


async def test_start_runs_a_private_server_with_a_token_and_close_stops_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDBOX_AGENT_BIN", binary_path())
    client = await SandboxAgentClient.start(server_args=["--data-dir", str(tmp_path)])
    server = client.server
    assert server is not None and client.connected
    try:
        assert server.base_url.startswith("http://127.0.0.1:")
        assert len(server.token) == 48
        with open(f"/proc/{server.pid}/cmdline", "rb") as cmdline:
            assert server.token.encode() not in cmdline.read(), "the token is not on the command line"
        # The server needs the token: without it, 401.
        async with httpx.AsyncClient() as plain:
            assert (await plain.get(f"{server.base_url}/v2/agents")).status_code == 401
        sid = (await client.new_session(cwd=str(tmp_path))).session_id
        assert text_of([u async for u in client.prompt_stream(sid, "hi")]) == f"{SAY}hi"
    finally:
        await client.close()
    assert not os.path.exists(f"/proc/{server.pid}"), "the server exited and was reaped"
    with pytest.raises(httpx.ConnectError):
        async with httpx.AsyncClient() as plain:
            await plain.get(f"{server.base_url}/v2/health")


async def test_the_binary_is_looked_up_in_sandbox_agent_bin_then_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    binary = binary_path()
    monkeypatch.setenv("SANDBOX_AGENT_BIN", str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match="SANDBOX_AGENT_BIN"):
        resolve_binary()
    monkeypatch.delenv("SANDBOX_AGENT_BIN")
    monkeypatch.setenv("PATH", os.path.dirname(binary))
    path, source = resolve_binary()
    assert source == "PATH" and os.path.samefile(path, binary)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="PATH"):
        await EmbeddedServer.start()
