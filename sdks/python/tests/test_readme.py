"""The READMEs' Python examples as a new user follows them: saved as written
(only the port changed), run with this environment's Python against a real
server, their output compared with the output the README shows."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, Server


def blocks_after(readme: Path, heading: str) -> list[tuple[str, str]]:
    """The fenced blocks after the line `heading`, up to the next heading of
    the same or a higher level, as ``(lang, text)``."""
    lines = readme.read_text().split("\n")
    start = lines.index(heading)
    level = len(heading) - len(heading.lstrip("#"))
    blocks: list[tuple[str, str]] = []
    i = start + 1
    while i < len(lines):
        marks = re.match(r"^(#+) ", lines[i])
        if marks is not None and len(marks.group(1)) <= level:
            break
        if lines[i].startswith("```"):
            end = lines.index("```", i + 1)
            blocks.append((lines[i][3:], "\n".join(lines[i + 1 : end]) + "\n"))
            i = end
        i += 1
    return blocks


@pytest.mark.parametrize(
    ("readme", "heading"),
    [
        (REPO / "README.md", "## Use it from Python"),
        (REPO / "sdks" / "python" / "README.md", "## Stream a turn and answer a permission"),
    ],
    ids=["README.md", "sdks/python/README.md"],
)
def test_the_readme_example_runs_as_written(server: Server, tmp_path: Path, readme: Path, heading: str) -> None:
    blocks = blocks_after(readme, heading)
    at = next(i for i, (lang, _) in enumerate(blocks) if lang == "python")
    example, (output_lang, expected) = blocks[at][1], blocks[at + 1]
    assert output_lang == "", "the bare block after the example is its output"
    code_lines = [line for line in example.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert len(code_lines) <= 20, f"the example is short ({len(code_lines)} lines of code)"
    assert '"http://127.0.0.1:2468"' in example
    script = tmp_path / "turn.py"
    script.write_text(example.replace("http://127.0.0.1:2468", server.url))
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == expected


def test_the_install_commands_name_the_repository_path() -> None:
    for readme, heading in ((REPO / "README.md", "## Use it from Python"), (REPO / "sdks/python/README.md", "## Install")):
        install = next(text for lang, text in blocks_after(readme, heading) if lang == "sh")
        assert "pip install ./sdks/python" in install
