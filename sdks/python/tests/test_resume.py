"""A stream cut for real mid-turn (a TCP proxy closes the connection that
carries the event stream) is resumed with ``Last-Event-ID``: the turn yields
every update once, in order (`research/contract.md`, "GET (Server-Sent
Events)")."""

from __future__ import annotations

from sandbox_agent import SandboxAgentClient

from conftest import CuttingProxy, Server, text_of


async def test_a_stream_cut_mid_turn_is_resumed_nothing_lost_or_repeated(server: Server) -> None:
    async with CuttingProxy(server.url, b"GET /v2/rpc", b"chunk-3 ") as proxy:
        async with SandboxAgentClient(proxy.url, agent="mock") as client:
            sid = (await client.new_session(cwd="/tmp")).session_id
            turn = client.prompt_stream(sid, "!slow 8 40")
            updates = [u async for u in turn]
            assert await turn.result() == "end_turn"
            assert proxy.cuts == 1, "the stream was cut once"
            assert text_of(updates) == "".join(f"chunk-{i} " for i in range(1, 9))
            assert len(updates) == 8
            connection = client._connection
            assert connection is not None and connection.reconnects >= 1
            # The same connection goes on after the resume.
            assert await client.prompt(sid, "after") == "end_turn"
            assert client.connected
