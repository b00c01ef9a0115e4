"""The package is typed (`py.typed`) and passes ``mypy --strict`` for the
oldest Python it supports."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "sandbox_agent"


def test_mypy_strict_for_python_3_10() -> None:
    assert (PACKAGE / "py.typed").is_file()
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--python-version", "3.10", "--no-incremental", "--cache-dir", "/dev/null", str(PACKAGE)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
