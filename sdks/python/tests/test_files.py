"""The file calls against the real server (`research/contract.md`, "Host file
system"): bytes round trip, streams, resume, batch upload."""

from __future__ import annotations

import io
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sandbox_agent import SandboxAgentClient, SandboxAgentError

from conftest import Server


async def test_write_read_stat_list_mkdir_move_delete(server: Server, tmp_path: Path) -> None:
    async with SandboxAgentClient(server.url, agent="mock", auto_connect=False) as client:
        path = str(tmp_path / "a" / "hello.txt")
        assert await client.write_fs_file(path, "hello") == {"path": path, "bytesWritten": 5}
        assert await client.read_fs_file(path) == b"hello"
        data = bytes(i % 251 for i in range(300_000))
        await client.write_fs_file(str(tmp_path / "bin"), data)
        assert await client.read_fs_file(str(tmp_path / "bin")) == data
        assert (tmp_path / "bin").read_bytes() == data

        async def parts() -> AsyncIterator[bytes]:
            yield b"part one, "
            yield b"part two"

        assert (await client.write_fs_file(str(tmp_path / "streamed.txt"), parts()))["bytesWritten"] == 18
        assert await client.read_fs_file(str(tmp_path / "streamed.txt")) == b"part one, part two"
        assert (await client.write_fs_file(str(tmp_path / "iter.txt"), [b"x", b"yz"]))["bytesWritten"] == 3

        stat = await client.stat_fs(path)
        assert stat["entryType"] == "file" and stat["size"] == 5
        assert await client.mkdir_fs(str(tmp_path / "b" / "c")) == {"path": str(tmp_path / "b" / "c")}
        listing = await client.list_fs_entries(str(tmp_path))
        assert listing["truncated"] is False, "always present, False when the whole list came"
        assert [(e["name"], e["entryType"]) for e in listing["entries"]] == [
            ("a", "directory"),
            ("b", "directory"),
            ("bin", "file"),
            ("iter.txt", "file"),
            ("streamed.txt", "file"),
        ]
        moved = str(tmp_path / "b" / "hello.txt")
        assert await client.move_fs(path, moved) == {"from": path, "to": moved}
        with pytest.raises(SandboxAgentError) as caught:
            await client.stat_fs(path)
        assert caught.value.is_not_found
        assert caught.value.problem is not None and caught.value.problem["type"] == "urn:sandbox-agent:error:file-not-found"
        with pytest.raises(SandboxAgentError) as caught:
            await client.delete_fs_entry(str(tmp_path / "b"))
        assert caught.value.status == 409
        assert await client.delete_fs_entry(str(tmp_path / "b"), recursive=True) == {"path": str(tmp_path / "b")}
        with pytest.raises(SandboxAgentError) as caught:
            await client.read_fs_file(moved)
        assert caught.value.is_not_found


async def test_read_fs_file_stream_streams_and_resumes_from_an_offset_unless_it_changed(server: Server, tmp_path: Path) -> None:
    async with SandboxAgentClient(server.url, agent="mock", auto_connect=False) as client:
        path = str(tmp_path / "big.bin")
        data = bytes((i * 7) % 256 for i in range(1_000_000))
        await client.write_fs_file(path, data)
        async with client.read_fs_file_stream(path) as whole:
            assert whole.offset == 0 and whole.size == len(data)
            assert whole.etag is not None and whole.etag.startswith('"')
            etag = whole.etag
            assert b"".join([chunk async for chunk in whole.aiter_bytes()]) == data
        async with client.read_fs_file_stream(path, from_offset=600_000, etag=etag) as rest:
            assert rest.offset == 600_000 and rest.size == len(data)
            assert b"".join([chunk async for chunk in rest.aiter_bytes()]) == data[600_000:]
        await client.write_fs_file(path, "changed")
        async with client.read_fs_file_stream(path, from_offset=600_000, etag=etag) as changed:
            assert changed.offset == 0, "a changed file comes whole"
            assert b"".join([chunk async for chunk in changed.aiter_bytes()]) == b"changed"
        with pytest.raises(SandboxAgentError) as caught:
            async with client.read_fs_file_stream(str(tmp_path / "missing")):
                pass
        assert caught.value.is_not_found


async def test_relative_paths_start_at_the_sessions_cwd(server: Server, tmp_path: Path) -> None:
    async with SandboxAgentClient(server.url, agent="mock") as client:
        cwd = tmp_path / "work"
        cwd.mkdir()
        sid = (await client.new_session(cwd=str(cwd))).session_id
        await client.write_fs_file("notes.md", "# notes", session_id=sid)
        assert (cwd / "notes.md").read_text() == "# notes"
        assert (await client.list_fs_entries(".", session_id=sid))["entries"][0]["name"] == "notes.md"


def _tar(files: dict[str, bytes], gz: bool) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz" if gz else "w") as tar:
        for name, content in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    return buffer.getvalue()


async def test_upload_fs_batch_unpacks_a_tar_and_a_tar_gz(server: Server, tmp_path: Path) -> None:
    async with SandboxAgentClient(server.url, agent="mock", auto_connect=False) as client:
        result = await client.upload_fs_batch(str(tmp_path / "up"), _tar({"one.txt": b"1", "sub/two.txt": b"22"}, gz=False))
        assert result["truncated"] is False
        assert str(tmp_path / "up" / "sub" / "two.txt") in result["paths"]
        assert await client.read_fs_file(str(tmp_path / "up" / "sub" / "two.txt")) == b"22"
        await client.upload_fs_batch(str(tmp_path / "upgz"), _tar({"one.txt": b"1"}, gz=True))
        assert (await client.stat_fs(str(tmp_path / "upgz" / "one.txt")))["size"] == 1
        with pytest.raises(SandboxAgentError) as caught:
            await client.upload_fs_batch(str(tmp_path / "bad"), b"not a tar")
        assert caught.value.status == 400
        assert caught.value.problem is not None and caught.value.problem["type"] == "urn:sandbox-agent:error:invalid-archive"
