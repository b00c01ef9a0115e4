"""scripts/test's last line counts the pytest run with cargo's and node's
(scripts/test-summary reads pytest's closing counts line)."""

from __future__ import annotations

import subprocess

from conftest import REPO

LOG = """\
test result: ok. 2 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.10s
# tests 5
# pass 4
# fail 1
# skipped 0
tests/test_client.py::test_passed_in_name PASSED
================= 40 passed, 2 failed, 3 skipped, 1 error, 4 warnings in 12.34s (0:00:12) =================
"""


def test_the_summary_line_adds_the_pytest_run() -> None:
    done = subprocess.run([str(REPO / "scripts" / "test-summary")], input=LOG, capture_output=True, text=True, check=True)
    assert done.stdout == "== 46 passed, 4 failed, 4 ignored (1 test binaries, 1 node --test run, 1 pytest run)\n"
    only = subprocess.run(
        [str(REPO / "scripts" / "test-summary")], input="==== 7 passed in 0.50s ====\n", capture_output=True, text=True, check=True
    )
    assert only.stdout == "== 7 passed, 0 failed, 0 ignored (0 test binaries, 1 pytest run)\n"


def test_scripts_test_runs_pytest_with_the_binary_and_tees_it_into_the_log() -> None:
    script = (REPO / "scripts" / "test").read_text()
    assert "target/py-sdk/bin/python -m pytest" in script
    assert '-r sdks/python/requirements-test.txt -e sdks/python' in script
    run = next(line for line in script.splitlines() if "-m pytest" in line)
    assert 'tee -a "$log" || status=$?' in run
