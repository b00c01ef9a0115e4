"""A turn its server died in (`research/contract.md`, "Notifications the
runtime sends"): the real server SIGKILLed while a permission request waits,
started again on the same data dir, and the session's log read with
`get_session_events` and `turn_interrupted_of`."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx

from sandbox_agent import SandboxAgentClient, SandboxAgentError, turn_interrupted_of

from conftest import start_server


async def store_caught_up(url: str) -> None:
    """Waits until ``/v2/health`` says every write is in the store."""
    deadline = time.monotonic() + 30
    async with httpx.AsyncClient() as http:
        while True:
            health = (await http.get(f"{url}/v2/health")).json()
            if health.get("store") == "ok" and health.get("storeWaiting") == 0:
                return
            assert time.monotonic() < deadline, f"store did not catch up: {health}"
            await asyncio.sleep(0.02)


async def test_a_turn_killed_on_a_pending_permission_reads_as_interrupted_after_a_restart() -> None:
    first = start_server()
    asked = asyncio.Event()

    async def never_answer(request: Any) -> str:
        asked.set()
        await asyncio.Event().wait()  # the server dies while it waits
        return "allow"

    client = SandboxAgentClient(first.url, agent="mock", on_permission_request=never_answer)
    sid = (await client.new_session(cwd="/tmp")).session_id
    turn = client.prompt_stream(sid, "ask permission")
    await asyncio.wait_for(asked.wait(), 30)
    await store_caught_up(first.url)
    first.kill()
    await client.close()
    try:
        await turn.result()
        raise AssertionError("the turn cannot end well: its server was killed")
    except SandboxAgentError as error:
        assert error.is_not_connected or error.is_connection_lost

    second = start_server(data_dir=first.data_dir)
    try:
        async with SandboxAgentClient(second.url, agent="mock", auto_connect=False) as reader:
            page = await reader.get_session_events(sid, limit=1000)
            interrupted = [t for t in map(turn_interrupted_of, page["events"]) if t is not None]
            assert len(interrupted) == 1, page["events"]
            assert turn_interrupted_of(page["events"][-1]) == interrupted[0], "the last event"
            assert interrupted[0]["sessionId"] == sid
            assert interrupted[0]["reason"] == "server-stopped"
            assert interrupted[0]["stopReason"] == "cancelled"
            assert len(interrupted[0]["requestIds"]) == 1
            assert turn_interrupted_of(page["events"][0]) is None
    finally:
        second.stop()
