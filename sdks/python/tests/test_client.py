"""SandboxAgentClient against the real server and the mock agent: connection
rules, turns, permissions, questions, the inventory, errors."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from sandbox_agent import PromptTurn, SandboxAgentClient, SandboxAgentError, check_answer

from conftest import SAY, Server, start_server, text_of, unused_url


async def collect(turn: PromptTurn) -> list[dict[str, Any]]:
    return [update async for update in turn]


async def test_health_agents_install_need_no_connection(server: Server) -> None:
    async with SandboxAgentClient(server.url, agent="mock", auto_connect=False) as client:
        assert (await client.get_health())["status"] == "ok"
        listed = await client.list_agents()
        assert list(listed) == ["agents"], "the server's answer, the list under its name"
        mock = next(a for a in listed["agents"] if a["id"] == "mock")
        assert mock["installed"] is True and mock["source"] == "builtin"
        installed = await client.install_agent()
        assert installed["agent"] == "mock" and installed["alreadyInstalled"] is True
        with pytest.raises(SandboxAgentError) as caught:
            await client.install_agent("nope")
        assert caught.value.is_not_found and caught.value.status == 404
        assert client.connected is False


async def test_async_with_connects_and_the_first_session_call_auto_connects(server: Server) -> None:
    async with SandboxAgentClient(server.url, agent="mock") as client:
        assert client.connected and client.connection_id
        session = await client.new_session(cwd="/tmp")
        assert session.session_id.startswith("mock-")
    lazy = SandboxAgentClient(server.url, agent="mock")
    try:
        assert not lazy.connected
        session = await lazy.new_session(cwd="/tmp")
        assert lazy.connected and session.agent == "mock"
    finally:
        await lazy.close()


async def test_not_connected_before_connect_and_after_disconnect_one_connection_per_instance(server: Server) -> None:
    client = SandboxAgentClient(server.url, agent="mock", auto_connect=False)
    with pytest.raises(SandboxAgentError) as caught:
        await client.new_session(cwd="/tmp")
    assert caught.value.kind == "not-connected" and caught.value.is_not_connected
    with pytest.raises(SandboxAgentError):
        await client.prompt("mock-x", "hi")
    await client.connect()
    first = client.connection_id
    await client.connect()
    assert client.connection_id == first, "connect() again keeps the one connection"
    session = await client.new_session(cwd="/tmp")
    await client.disconnect()
    assert not client.connected
    with pytest.raises(SandboxAgentError) as caught:
        await client.prompt(session.session_id, "hi")
    assert caught.value.kind == "not-connected"
    # Sessions live on: a new connection loads it and prompts it, the history replayed.
    await client.connect()
    assert client.connection_id != first
    await client.load_session(session.session_id, cwd="/tmp")
    assert await client.prompt(session.session_id, "again") == "end_turn"
    await client.close()
    with pytest.raises(SandboxAgentError) as caught:
        await client.connect()
    assert caught.value.kind == "disposed"
    with pytest.raises(SandboxAgentError) as caught:
        await client.get_health()
    assert caught.value.kind == "disposed"


async def test_prompt_returns_the_stop_reason_and_updates_go_to_on_session_update(server: Server) -> None:
    events: list[dict[str, Any]] = []
    async with SandboxAgentClient(server.url, agent="mock", on_session_update=events.append) as client:
        session = await client.new_session(cwd="/tmp")
        assert await client.prompt(session.session_id, "hello there") == "end_turn"
        mine = [e["update"] for e in events if e["sessionId"] == session.session_id]
        assert text_of(mine) == f"{SAY}hello there"


async def test_prompt_stream_yields_the_turns_updates_in_order_then_the_result(server: Server) -> None:
    async with SandboxAgentClient(server.url, agent="mock") as client:
        session = await client.new_session(cwd="/tmp")
        turn = client.prompt_stream(session.session_id, "please use a tool")
        updates = await collect(turn)
        kinds = [u["sessionUpdate"] for u in updates if u["sessionUpdate"] != "agent_message_chunk"]
        assert kinds == ["tool_call", "tool_call_update"]
        assert updates[0]["toolCallId"] == "mock-tool-1"
        assert text_of(updates) == f"{SAY}please use a tool"
        # One update per word, none lost or repeated.
        assert len(updates) == 2 + len(f"{SAY}please use a tool".split(" "))
        assert await turn.result() == "end_turn"
        assert turn.done
        blocks = await collect(
            client.prompt_stream(session.session_id, [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}])
        )
        assert text_of(blocks) == f"{SAY}a b"


async def test_permission_round_trip_sync_and_async_handlers(server: Server) -> None:
    asked: list[dict[str, Any]] = []
    decision: Any = "allow"

    def handler(request: Any) -> Any:
        asked.append(request)
        return decision

    async with SandboxAgentClient(server.url, agent="mock", on_permission_request=handler) as client:
        sid = (await client.new_session(cwd="/tmp")).session_id
        assert text_of(await collect(client.prompt_stream(sid, "ask permission"))) == "Permission granted."
        assert asked[0]["sessionId"] == sid
        assert asked[0]["toolCall"]["title"] == "Write to mock.txt"
        assert [o["optionId"] for o in asked[0]["options"]] == ["allow-once", "reject-once"]
        decision = "reject"
        assert text_of(await collect(client.prompt_stream(sid, "ask permission"))) == "Permission denied."
        decision = {"optionId": "allow-once"}
        assert text_of(await collect(client.prompt_stream(sid, "ask permission"))) == "Permission granted."
        decision = "cancel"
        assert await client.prompt(sid, "ask permission") == "cancelled"

    async def slow_allow(request: Any) -> str:
        await asyncio.sleep(0.05)
        return "allow"

    async with SandboxAgentClient(server.url, agent="mock", on_permission_request=slow_allow) as client:
        sid = (await client.new_session(cwd="/tmp")).session_id
        turn = client.prompt_stream(sid, "ask permission")
        assert text_of(await collect(turn)) == "Permission granted."
        assert await turn.result() == "end_turn"

    def broken(request: Any) -> str:
        raise ValueError("handler bug")

    # A handler that raises, and no handler at all: answered cancelled.
    for options in ({"on_permission_request": broken}, {}):
        async with SandboxAgentClient(server.url, agent="mock", **options) as client:
            sid = (await client.new_session(cwd="/tmp")).session_id
            assert await client.prompt(sid, "ask permission") == "cancelled"


async def test_questions_answered_through_on_question_and_cancelled_without_it(server: Server) -> None:
    asked: list[dict[str, Any]] = []
    answer: dict[str, Any] = {"action": "accept", "content": {"name": "Ada", "color": "green", "confirm": True}}

    async def on_question(question: dict[str, Any]) -> dict[str, Any]:
        asked.append(question)
        return answer

    async with SandboxAgentClient(server.url, agent="mock", on_question=on_question) as client:
        sid = (await client.new_session(cwd="/tmp")).session_id
        assert text_of(await collect(client.prompt_stream(sid, "ask question"))) == "You answered: name=Ada color=green confirm=true"
        form = asked[0]
        assert form["mode"] == "form" and form["sessionId"] == sid
        assert form["message"] == "The mock agent has a question"
        assert sorted(form["requestedSchema"]["properties"]) == ["color", "confirm", "name"]
        answer = {"action": "decline"}
        assert text_of(await collect(client.prompt_stream(sid, "ask question"))) == "You declined the question."
        # Content that does not fit the form is never sent: the question is cancelled.
        answer = {"action": "accept", "content": {"name": "Ada", "color": "purple"}}
        assert check_answer(form, answer) == 'field "color" must be one of "red", "green", "blue", not "purple"'
        assert text_of(await collect(client.prompt_stream(sid, "ask question"))) == "You cancelled the question."
        answer = {"action": "accept"}
        assert text_of(await collect(client.prompt_stream(sid, "ask url"))) == "You completed the sign-in."
        assert asked[-1]["mode"] == "url"
    async with SandboxAgentClient(server.url, agent="mock") as plain:
        sid = (await plain.new_session(cwd="/tmp")).session_id
        assert text_of(await collect(plain.prompt_stream(sid, "ask question"))) == "You cancelled the question."


async def test_cancel_and_turn_cancel_end_a_turn_with_stop_reason_cancelled(server: Server) -> None:
    async with SandboxAgentClient(server.url, agent="mock") as client:
        sid = (await client.new_session(cwd="/tmp")).session_id
        stalled = asyncio.ensure_future(client.prompt(sid, "!stall"))
        await asyncio.sleep(0.1)
        assert not stalled.done()
        await client.cancel(sid)
        assert await stalled == "cancelled"
        turn = client.prompt_stream(sid, "!stall")
        await asyncio.sleep(0.1)
        await turn.cancel()
        assert await collect(turn) == []
        assert await turn.result() == "cancelled"
        # Cancelling the task that awaits a turn cancels the turn at the agent.
        task = asyncio.ensure_future(client.prompt(sid, "!stall"))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        deadline = asyncio.get_running_loop().time() + 10
        while True:
            page = await client.get_session_events(sid, limit=1000)
            methods = [e["message"].get("method") for e in page["events"] if e["direction"] == "client_to_agent"]
            answers = [e["message"].get("result") for e in page["events"] if e["direction"] == "agent_to_client"]
            if methods.count("session/cancel") == 3 and answers.count({"stopReason": "cancelled"}) == 3:
                break
            assert asyncio.get_running_loop().time() < deadline, methods
            await asyncio.sleep(0.05)
        assert await client.prompt(sid, "after") == "end_turn"


async def test_an_agent_that_dies_mid_turn_raises_from_the_iterator_and_the_result(server: Server) -> None:
    async with SandboxAgentClient(server.url, agent="mock") as client:
        sid = (await client.new_session(cwd="/tmp")).session_id
        turn = client.prompt_stream(sid, "!crash")
        seen: list[dict[str, Any]] = []
        with pytest.raises(SandboxAgentError) as caught:
            async for update in turn:
                seen.append(update)
        assert caught.value.kind == "rpc" and caught.value.code == -32603
        assert text_of(seen) == "Crashing..."
        with pytest.raises(SandboxAgentError):
            await turn.result()
        assert (await client.get_session(sid)).ended is True
        # The client goes on: the next session starts a new agent process.
        nxt = await client.new_session(cwd="/tmp")
        assert await client.prompt(nxt.session_id, "still here") == "end_turn"


async def test_session_inventory_metadata_events_models(server: Server) -> None:
    async with SandboxAgentClient(server.url, agent="mock") as client:
        session = await client.new_session(cwd="/tmp/inventory-py", metadata={"variant": "fast", "labels": {"team": "infra"}})
        assert session.agent == "mock" and session.cwd == "/tmp/inventory-py" and session.ended is False
        assert session.metadata == {"variant": "fast", "labels": {"team": "infra"}}
        assert session.modes is not None and session.modes["currentModeId"] == "default"
        assert session.model == "mock-fast"

        await client.prompt(session.session_id, "first words")
        updated = await client.set_metadata(session.session_id, {"title": "Fix the py login bug", "labels": {"priority": "high"}})
        assert updated.title == "Fix the py login bug"
        assert updated.metadata["labels"] == {"team": "infra", "priority": "high"}

        got = await client.get_session(session.session_id)
        assert got.title == "Fix the py login bug" and got.first_prompt == "first words"
        assert got.event_count is not None and got.event_count >= 4
        assert "title" not in got.metadata and "agent" not in got.metadata

        page = await client.list_sessions(agent="mock", q="py login bug")
        assert [s.session_id for s in page.sessions] == [session.session_id]
        assert page.next_cursor is None
        first = await client.list_sessions(limit=1)
        assert len(first.sessions) == 1 and first.next_cursor
        second = await client.list_sessions(limit=1, cursor=first.next_cursor)
        assert second.sessions[0].session_id != first.sessions[0].session_id

        acp = await client.unstable_list_sessions(cwd="/tmp/inventory-py")
        assert [s.session_id for s in acp.sessions] == [session.session_id]

        events = await client.get_session_events(session.session_id, limit=2)
        assert [e["offset"] for e in events["events"]] == [0, 1]
        assert events["events"][0]["direction"] == "client_to_agent"
        assert events["events"][0]["message"]["method"] == "session/new"
        assert events["nextOffset"] == 2

        models = await client.list_models(session.session_id)
        assert [m["modelId"] for m in models["availableModels"]] == ["mock-fast", "mock-smart"]
        assert models["currentModelId"] == "mock-fast"
        agent_models = await client.list_models()
        assert [m["modelId"] for m in agent_models["availableModels"]] == ["mock-fast", "mock-smart"]
        assert agent_models.get("currentModelId") is None


async def test_detach_and_terminate(server: Server) -> None:
    events: list[dict[str, Any]] = []
    async with SandboxAgentClient(server.url, agent="mock", on_session_update=events.append) as client:
        sid = (await client.new_session(cwd="/tmp")).session_id
        await client.detach_session(sid)
        # The turn still runs and answers; its updates no longer reach this connection.
        assert await client.prompt(sid, "quiet") == "end_turn"
        assert [e for e in events if e["sessionId"] == sid] == []
        assert await client.terminate_session(sid) == {"sessionId": sid, "alreadyEnded": False}
        assert (await client.get_session(sid)).ended is True
        assert (await client.terminate_session(sid))["alreadyEnded"] is True


async def test_errors_map_to_predicates_404_and_json_rpc_not_found(server: Server) -> None:
    async with SandboxAgentClient(server.url, agent="mock") as client:
        with pytest.raises(SandboxAgentError) as caught:
            await client.get_session("nope")
        error = caught.value
        assert error.is_not_found and error.status == 404 and error.kind == "http"
        assert error.problem is not None and error.problem["type"] == "urn:sandbox-agent:error:unknown-session"
        assert not error.is_unauthorized and not error.is_connection_lost and not error.is_timeout
        with pytest.raises(SandboxAgentError) as caught:
            await client.set_metadata("nope", {"a": 1})
        assert caught.value.is_not_found and caught.value.code == -32002 and caught.value.kind == "rpc"
        with pytest.raises(SandboxAgentError) as caught:
            await client.load_session("nope", cwd="/tmp")
        assert caught.value.is_not_found
        with pytest.raises(SandboxAgentError) as caught:
            await client.get_session_events("nope")
        assert caught.value.is_not_found
        sid = (await client.new_session(cwd="/tmp")).session_id
        with pytest.raises(SandboxAgentError) as caught:
            await client.get_session_events(sid, limit=0)
        assert caught.value.status == 400 and not caught.value.is_not_found
        assert caught.value.problem is not None and caught.value.problem["type"] == "urn:sandbox-agent:error:invalid-request"


async def test_a_token_401_is_unauthorized_then_the_right_token_works() -> None:
    server = start_server("--token", "s3cret")
    try:
        anonymous = SandboxAgentClient(server.url, agent="mock", auto_connect=False)
        assert (await anonymous.get_health())["status"] == "ok", "/v2/health needs no token"
        with pytest.raises(SandboxAgentError) as caught:
            await anonymous.list_agents()
        assert caught.value.is_unauthorized and caught.value.status == 401
        assert caught.value.problem is not None and caught.value.problem["type"] == "urn:sandbox-agent:error:unauthorized"
        with pytest.raises(SandboxAgentError) as caught:
            await anonymous.connect()
        assert caught.value.is_unauthorized
        await anonymous.close()
        async with SandboxAgentClient(server.url, "nope", agent="mock", auto_connect=False) as wrong:
            with pytest.raises(SandboxAgentError) as caught:
                await wrong.new_session(cwd="/tmp")
            assert caught.value.kind == "not-connected"
            with pytest.raises(SandboxAgentError) as caught:
                await wrong.connect()
            assert caught.value.is_unauthorized
        async with SandboxAgentClient(server.url, "s3cret", agent="mock") as authed:
            sid = (await authed.new_session(cwd="/tmp")).session_id
            assert text_of(await collect(authed.prompt_stream(sid, "hi"))) == f"{SAY}hi"
            assert len((await authed.list_agents())["agents"]) > 0
    finally:
        server.stop()


async def test_an_unreachable_server_is_connection_lost() -> None:
    client = SandboxAgentClient(unused_url(), agent="mock")
    try:
        with pytest.raises(SandboxAgentError) as caught:
            await client.get_health()
        assert caught.value.is_connection_lost and caught.value.is_unreachable and caught.value.kind == "connection-lost"
        with pytest.raises(SandboxAgentError) as caught:
            await client.new_session(cwd="/tmp")
        assert caught.value.is_connection_lost
        # Later calls still say why the auto-connect failed (not "call connect() first").
        with pytest.raises(SandboxAgentError) as caught:
            await client.new_session(cwd="/tmp")
        assert caught.value.is_connection_lost
        with pytest.raises(SandboxAgentError) as caught:
            await client.connect()
        assert caught.value.is_connection_lost
    finally:
        await client.close()


async def test_a_request_timeout_is_is_timeout_and_a_turn_has_none(server: Server) -> None:
    # A server that accepts and never answers.
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.read()
        finally:
            writer.close()

    hanging = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = hanging.sockets[0].getsockname()[1]
    try:
        async with SandboxAgentClient(f"http://127.0.0.1:{port}", agent="mock", request_timeout=0.3, auto_connect=False) as slow:
            with pytest.raises(SandboxAgentError) as caught:
                await slow.get_session("mock-x")
            assert caught.value.is_timeout and caught.value.kind == "timeout" and not caught.value.is_connection_lost
            with pytest.raises(SandboxAgentError) as caught:
                await slow.connect()
            assert caught.value.is_timeout
    finally:
        hanging.close()
    # A turn outlives request_timeout.
    async with SandboxAgentClient(server.url, agent="mock", request_timeout=1.0) as quick:
        sid = (await quick.new_session(cwd="/tmp")).session_id
        assert await quick.prompt(sid, "!slow 3 600") == "end_turn"


def test_bad_constructor_arguments_raise_type_error_naming_the_call_and_parameter(server: Server) -> None:
    with pytest.raises(TypeError, match=r"^SandboxAgentClient: base_url must be a str, not int$"):
        SandboxAgentClient(42, agent="mock")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^SandboxAgentClient: agent must be a str, not NoneType$"):
        SandboxAgentClient(server.url, agent=None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^SandboxAgentClient: on_permission_request must be callable or None, not str$"):
        SandboxAgentClient(server.url, agent="mock", on_permission_request="allow")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^SandboxAgentClient: request_timeout must be a number of seconds or None, not bool$"):
        SandboxAgentClient(server.url, agent="mock", request_timeout=True)  # type: ignore[arg-type]


# (call, arguments, the whole message): one shared checker names the call and
# the parameter, as the TypeScript client does (`mkdirFs: path must be ...`).
BAD_ARGUMENTS: list[tuple[str, tuple[Any, ...], dict[str, Any], str]] = [
    ("new_session", (), {"cwd": {"path": "/tmp"}}, "new_session: cwd must be a str, not dict"),
    ("new_session", ("/tmp",), {"metadata": "title"}, "new_session: metadata must be a mapping or None, not str"),
    ("load_session", ("mock-x", 7), {}, "load_session: cwd must be a str, not int"),
    ("prompt", ({"sessionId": "x"}, "hi"), {}, "prompt: session_id must be a str, not dict"),
    ("prompt", ("mock-x", 42), {}, "prompt: content must be a str or a list of content block dicts, not int"),
    ("cancel", (None,), {}, "cancel: session_id must be a str, not NoneType"),
    ("set_metadata", ("mock-x", "title"), {}, "set_metadata: metadata must be a mapping, not str"),
    ("get_session", (1,), {}, "get_session: session_id must be a str, not int"),
    ("list_sessions", (), {"limit": "10"}, "list_sessions: limit must be an int or None, not str"),
    ("list_sessions", (), {"limit": True}, "list_sessions: limit must be an int or None, not bool"),
    ("get_session_events", ("mock-x",), {"offset": 1.5}, "get_session_events: offset must be an int, not float"),
    ("install_agent", (), {"reinstall": "yes"}, "install_agent: reinstall must be a bool, not str"),
    ("read_fs_file", ({"path": "/tmp"},), {}, "read_fs_file: path must be a str, not dict"),
    ("mkdir_fs", (123,), {}, "mkdir_fs: path must be a str, not int"),
    ("stat_fs", ("/tmp",), {"session_id": 5}, "stat_fs: session_id must be a str or None, not int"),
    ("list_fs_entries", (b"/tmp",), {}, "list_fs_entries: path must be a str, not bytes"),
    ("move_fs", ("/tmp/a", None), {}, "move_fs: to_path must be a str, not NoneType"),
    ("delete_fs_entry", ("/tmp/x",), {"recursive": "yes"}, "delete_fs_entry: recursive must be a bool, not str"),
    ("write_fs_file", ("/tmp/x", 3.5), {}, "write_fs_file: content must be str, bytes or an iterable of bytes, not float"),
    ("upload_fs_batch", ("/tmp/x", "tar"), {}, "upload_fs_batch: archive must be bytes or an iterable of bytes, not str"),
    ("run_process", ("echo", "hi"), {}, "run_process: args must be a list of str or None, not str"),
    ("run_process", ("echo", ["a", 1]), {}, "run_process: args must be a list of str or None, not a list holding int"),
    ("run_process", ("env",), {"env": {"A": 1}}, "run_process: env must be a mapping of str to str or None, not a mapping holding str: int"),
    ("run_process", ("true",), {"timeout_ms": 1.5}, "run_process: timeout_ms must be an int or None, not float"),
    ("start_process", (["sh"],), {}, "start_process: command must be a str, not list"),
    ("start_process", ("sh",), {"tty": 1}, "start_process: tty must be a bool, not int"),
    ("list_processes", (), {"state": 1}, "list_processes: state must be a str or None, not int"),
    ("get_process", (3,), {}, "get_process: process_id must be a str, not int"),
    ("process_handle", (3,), {}, "process_handle: process_id must be a str, not int"),
]


@pytest.mark.parametrize(("call", "args", "kwargs", "message"), BAD_ARGUMENTS, ids=[f"{c}-{m.split(': ')[1].split()[0]}" for c, _, _, m in BAD_ARGUMENTS])
async def test_a_bad_argument_type_raises_type_error_naming_the_call_and_parameter(
    server: Server, call: str, args: tuple[Any, ...], kwargs: dict[str, Any], message: str
) -> None:
    async with SandboxAgentClient(server.url, agent="mock", auto_connect=False) as client:
        with pytest.raises(TypeError) as caught:
            result = getattr(client, call)(*args, **kwargs)
            if asyncio.iscoroutine(result):
                await result
        assert str(caught.value) == message
        # Raised before anything was sent: not even a connection was opened.
        assert client.connected is False


async def test_prompt_stream_checks_at_once_and_a_streamed_body_checks_each_chunk(server: Server, tmp_path: Any) -> None:
    async with SandboxAgentClient(server.url, agent="mock", auto_connect=False) as client:
        with pytest.raises(TypeError) as caught:
            client.prompt_stream("mock-x", 42)  # type: ignore[arg-type]
        assert str(caught.value) == "prompt_stream: content must be a str or a list of content block dicts, not int"
        with pytest.raises(TypeError) as caught:
            await client.write_fs_file(str(tmp_path / "x"), [b"ok", "text"])  # type: ignore[list-item]
        assert str(caught.value) == "write_fs_file: content must be an iterable of bytes, not one yielding str"
        assert not (tmp_path / "x").exists(), "a body that failed its check was not written"


def test_check_answer_rules() -> None:
    question = {
        "mode": "form",
        "sessionId": "s",
        "message": "m",
        "requestedSchema": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "minLength": 1, "maxLength": 3},
                "age": {"type": "integer", "minimum": 0, "maximum": 150},
                "score": {"type": "number", "maximum": 1},
                "ok": {"type": "boolean"},
                "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}, "maxItems": 2},
                "pick": {"type": "string", "oneOf": [{"const": "x", "title": "X"}]},
                "many": {"type": "array", "items": {"anyOf": [{"const": "p", "title": "P"}]}, "minItems": 1},
            },
            "required": ["name"],
        },
    }

    def check(content: dict[str, Any]) -> str | None:
        return check_answer(question, {"action": "accept", "content": content})

    assert check({"name": "Ada"}) is None
    full = {"name": "Ada", "age": 36, "score": 0.5, "ok": True, "tags": ["a", "b"], "pick": "x", "many": ["p"], "extra": None}
    assert check(full) is None
    assert check({}) == 'field "name" is required'
    assert check({"name": None}) == 'field "name" is required'
    assert check({"name": "Adam"}) == 'field "name" must be at most 3 characters long (is 4)'
    assert check({"name": "é🙂"}) is None, "length in characters"
    assert check({"name": "A", "nope": 1}) == 'field "nope" is not a field of the form'
    assert check({"name": "A", "age": 1.5}) == 'field "age" must be an integer, not 1.5'
    assert check({"name": "A", "age": -1}) == 'field "age" must be at least 0 (is -1)'
    assert check({"name": "A", "score": 2}) == 'field "score" must be at most 1 (is 2)'
    assert check({"name": "A", "ok": "yes"}) == 'field "ok" must be true or false, not "yes"'
    assert check({"name": "A", "age": True}) == 'field "age" must be an integer, not true'
    assert check({"name": "A", "tags": ["c"]}) == 'field "tags" may only hold "a", "b", not "c"'
    assert check({"name": "A", "tags": ["a", "b", "a"]}) == 'field "tags" must hold at most 2 (holds 3)'
    assert check({"name": "A", "pick": "y"}) == 'field "pick" must be one of "x", not "y"'
    assert check({"name": "A", "many": []}) == 'field "many" must hold at least 1 (holds 0)'
    assert check_answer(question, {"action": "decline"}) is None
    url = {"mode": "url", "sessionId": "s", "message": "m", "url": "https://example.invalid", "elicitationId": "e"}
    assert check_answer(url, {"action": "accept"}) is None
    assert check_answer(url, {"action": "accept", "content": {"a": "b"}}) == "a URL question takes no content"
    with pytest.raises(TypeError, match=r"^check_answer: answer must be a dict, not str$"):
        check_answer(question, "accept")  # type: ignore[arg-type]
