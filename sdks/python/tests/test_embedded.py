"""`SandboxAgentClient.start`: a private server from the binary
(``$SANDBOX_AGENT_BIN``, then the ``PATH``), with a random token, stopped by
`close` (`research/contract.md`, "Embedded mode")."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import httpx
import pytest

from sandbox_agent import EmbeddedServer, SandboxAgentClient, SandboxAgentError, resolve_binary

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
    # No binary is a failed start: a SandboxAgentError, like every failure.
    with pytest.raises(SandboxAgentError) as caught:
        await SandboxAgentClient.start()
    assert caught.value.kind == "server-start" and "PATH" in str(caught.value)
    assert isinstance(caught.value.__cause__, FileNotFoundError)
    with pytest.raises(SandboxAgentError) as caught:
        await EmbeddedServer.start()
    assert caught.value.kind == "server-start" and "PATH" in str(caught.value)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_a_server_that_exits_at_start_is_a_sandbox_agent_error_with_its_stderr(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SANDBOX_AGENT_BIN", binary_path())
    with pytest.raises(SandboxAgentError) as caught:
        await SandboxAgentClient.start(server_args=["--data-dir", str(tmp_path), "--no-such-flag"])
    error = caught.value
    assert error.kind == "server-start" and error.data["exitCode"] == 2
    message = str(error)
    assert message.startswith("SandboxAgentClient.start: the sandbox-agent server exited with status 2 before listening (")
    assert "--no-such-flag" in message.split("\n")[0], "the first line shows the command line"
    assert "unexpected argument '--no-such-flag'" in message, "the server's stderr tail is in the message"
    assert "unexpected argument '--no-such-flag'" in error.data["stderr"]
    # A port already taken: the server's own reason comes through.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(SandboxAgentError) as caught:
            await SandboxAgentClient.start(port=port, server_args=["--data-dir", str(tmp_path)])
    assert caught.value.kind == "server-start" and caught.value.data["exitCode"] == 1
    assert "Address already in use" in str(caught.value) and f"--port {port}" in str(caught.value)


@pytest.mark.parametrize("how", ["port=", "--port in server_args", "--port= in server_args"])
async def test_the_caller_chooses_the_port(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    monkeypatch.setenv("SANDBOX_AGENT_BIN", binary_path())
    port = free_port()
    data = ["--data-dir", str(tmp_path)]
    if how == "port=":
        client = await SandboxAgentClient.start(port=port, host="127.0.0.1", server_args=data)
    elif how == "--port in server_args":
        client = await SandboxAgentClient.start(server_args=(*data, "--port", str(port)))
    else:
        client = await SandboxAgentClient.start(server_args=(*data, f"--port={port}", "--host=127.0.0.1"))
    try:
        assert client.base_url == f"http://127.0.0.1:{port}"
        assert client.server is not None and client.server.base_url == client.base_url
        sid = (await client.new_session(cwd=str(tmp_path))).session_id
        assert text_of([u async for u in client.prompt_stream(sid, "hi")]) == f"{SAY}hi"
    finally:
        await client.close()


async def test_start_checks_its_arguments_before_running_anything(monkeypatch: pytest.MonkeyPatch) -> None:
    # A binary that does not exist: an argument error must come first.
    monkeypatch.setenv("SANDBOX_AGENT_BIN", "/nonexistent/sandbox-agent")
    cases: list[tuple[dict[str, object], type[Exception], str]] = [
        ({"port": "46102"}, TypeError, "SandboxAgentClient.start: port must be an int or None, not str"),
        ({"host": 127}, TypeError, "SandboxAgentClient.start: host must be a str or None, not int"),
        ({"server_args": "--port 1"}, TypeError, "SandboxAgentClient.start: server_args must be an iterable of str, not str"),
        ({"server_args": ["--port", 1]}, TypeError, "SandboxAgentClient.start: server_args must be an iterable of str, not one holding int"),
        ({"port": 70000}, ValueError, "SandboxAgentClient.start: port must be 0 to 65535, not 70000"),
        (
            {"port": 1, "server_args": ["--port", "2"]},
            ValueError,
            "SandboxAgentClient.start: port= and --port in server_args both set the port: give it once",
        ),
        (
            {"host": "::1", "server_args": ["--host=0.0.0.0"]},
            ValueError,
            "SandboxAgentClient.start: host= and --host in server_args both set the host: give it once",
        ),
    ]
    for kwargs, kind, message in cases:
        with pytest.raises(kind) as caught:
            await SandboxAgentClient.start(**kwargs)  # type: ignore[arg-type]
        assert str(caught.value) == message
    with pytest.raises(TypeError) as caught_type:
        await EmbeddedServer.start(args=7)  # type: ignore[arg-type]
    assert str(caught_type.value) == "EmbeddedServer.start: args must be an iterable of str, not int"
