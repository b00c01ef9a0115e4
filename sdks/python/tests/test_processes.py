"""Processes against the real server (`research/contract.md`, "Processes and
terminals"): run to completion, start and follow the output by offset, a
follow cut for real and resumed, stdin, signals, forget."""

from __future__ import annotations

import pytest

from sandbox_agent import (
    OutputChunkEvent,
    OutputEvent,
    ProcessExit,
    SandboxAgentClient,
    SandboxAgentError,
    chunk_bytes,
)

from conftest import CuttingProxy, Server


def output_bytes(events: list[OutputEvent]) -> bytes:
    return b"".join(chunk_bytes(e.chunk) for e in events if isinstance(e, OutputChunkEvent))


async def test_run_process_to_completion(server: Server) -> None:
    async with SandboxAgentClient(server.url, agent="mock", auto_connect=False) as client:
        result = await client.run_process("sh", ["-c", "echo built; echo oops >&2; exit 3"])
        assert result["exitCode"] == 3 and result["signal"] is None
        assert result["stdout"] == "built\n" and result["stderr"] == "oops\n"
        assert result["timedOut"] is False and result["truncated"] is False
        fed = await client.run_process("cat", stdin="fed through stdin", env={"X": "1"})
        assert fed["stdout"] == "fed through stdin"
        slow = await client.run_process("sleep", ["5"], timeout_ms=200)
        assert slow["timedOut"] is True and slow["signal"] == "SIGKILL"
        with pytest.raises(SandboxAgentError) as caught:
            await client.run_process("no-such-program-here")
        assert caught.value.status == 400
        assert caught.value.problem is not None and caught.value.problem["type"] == "urn:sandbox-agent:error:program-not-found"


async def test_start_process_follow_output_and_resume_by_offset(server: Server) -> None:
    async with SandboxAgentClient(server.url, agent="mock", auto_connect=False) as client:
        handle = await client.start_process("sh", ["-c", "for i in 1 2 3 4 5; do echo line-$i; sleep 0.05; done"])
        assert len(handle.id) == 32 and handle.started["state"] == "running"
        events = [event async for event in handle.output()]
        assert isinstance(events[-1], ProcessExit) and events[-1].exit_code == 0
        whole = output_bytes(events)
        assert whole == b"".join(f"line-{i}\n".encode() for i in range(1, 6))
        # From an offset: exactly the bytes after it.
        later = [event async for event in handle.output(offset=7)]
        assert output_bytes(later) == whole[7:]
        first = next(e for e in later if isinstance(e, OutputChunkEvent))
        assert first.chunk["offset"] == 7 and first.chunk["stream"] == "stdout"
        assert await handle.wait() == ProcessExit(exit_code=0, signal=None)
        info = await handle.refresh()
        assert info["state"] == "exited" and info["outputBytes"] == len(whole)
        assert any(p["id"] == handle.id for p in (await client.list_processes(state="exited"))["processes"])
        await handle.forget()
        with pytest.raises(SandboxAgentError) as caught:
            await client.get_process(handle.id)
        assert caught.value.is_not_found


async def test_a_followed_output_cut_for_real_resumes_with_nothing_lost_or_repeated(server: Server) -> None:
    async with CuttingProxy(server.url, b"GET /v2/processes/", b"line-3") as proxy:
        async with SandboxAgentClient(proxy.url, agent="mock", auto_connect=False) as client:
            script = "for i in $(seq 1 8); do echo line-$i; sleep 0.05; done"
            handle = await client.start_process("sh", ["-c", script])
            events = [event async for event in handle.output()]
            assert proxy.cuts == 1
            assert output_bytes(events) == b"".join(f"line-{i}\n".encode() for i in range(1, 9))
            assert isinstance(events[-1], ProcessExit)


async def test_stdin_signals_and_kill(server: Server) -> None:
    async with SandboxAgentClient(server.url, agent="mock", auto_connect=False) as client:
        cat = await client.start_process("cat")
        await cat.write_stdin("got one\n")
        await cat.write_stdin(b"got two\n", eof=True)
        events = [event async for event in cat.output()]
        assert output_bytes(events) == b"got one\ngot two\n"
        assert events[-1] == ProcessExit(exit_code=0, signal=None)
        with pytest.raises(SandboxAgentError) as caught:
            await cat.write_stdin("late")
        assert caught.value.status == 409
        sleeper = await client.start_process("sleep", ["30"])
        handle = await client.process_handle(sleeper.id)
        await handle.kill()
        assert await handle.wait() == ProcessExit(exit_code=None, signal="SIGKILL")
        with pytest.raises(SandboxAgentError) as caught:
            await handle.resize(100, 40)
        assert caught.value.status == 409
        with pytest.raises(TypeError, match=r"^ProcessHandle.output: offset must be a non-negative int, not -1$"):
            async for _ in handle.output(offset=-1):
                pass
        for call, message in (
            (lambda: handle.resize("100", 40), "ProcessHandle.resize: cols must be an int, not str"),
            (lambda: handle.signal(9), "ProcessHandle.signal: name must be a str, not int"),
            (lambda: handle.write_stdin(1), "ProcessHandle.write_stdin: data must be str or bytes, not int"),
            (lambda: handle.write_stdin("x", eof="yes"), "ProcessHandle.write_stdin: eof must be a bool, not str"),
        ):
            with pytest.raises(TypeError) as wrong:
                await call()  # type: ignore[arg-type]
            assert str(wrong.value) == message


async def test_a_terminal_process_resize_signal_and_close_stdin(server: Server) -> None:
    async with SandboxAgentClient(server.url, agent="mock", auto_connect=False) as client:
        tty = await client.start_process("sh", ["-c", "stty size; read x; stty size"], tty=True, cols=100, rows=30, title="sizes")
        assert tty.started["tty"] is True and tty.started["title"] == "sizes"
        events: list[OutputEvent] = []
        resized = False
        async for event in tty.output():
            events.append(event)
            if not resized and "30 100" in output_bytes(events).decode():
                # The first size is out: resize, then let the script go on.
                resized = True
                await tty.resize(120, 40)
                await tty.write_stdin("\n")
        text = output_bytes(events).decode()
        assert resized and text.endswith("40 120\r\n")
        assert all(e.chunk["stream"] == "tty" for e in events if isinstance(e, OutputChunkEvent))
        sleeper = await client.start_process("sleep", ["30"])
        await sleeper.signal("TERM")
        assert await sleeper.wait() == ProcessExit(exit_code=None, signal="SIGTERM")
        with pytest.raises(SandboxAgentError) as caught:
            await sleeper.signal("NOPE")
        assert caught.value.status in (400, 409)
        cat = await client.start_process("cat")
        await cat.close_stdin()
        assert await cat.wait() == ProcessExit(exit_code=0, signal=None)
