"""``pip install ./sdks/python`` works in a fresh virtual environment: the
package (with ``py.typed``) lands in that environment's site-packages, not
linked to the clone. Offline: the fresh environment sees this one's
packages (httpx, httpx-sse, the build backend) through a ``.pth`` file, so
pip needs no index."""

from __future__ import annotations

import site
import subprocess
import sys
import venv
from pathlib import Path

SDK = Path(__file__).resolve().parents[1]


def test_pip_install_of_the_folder_works_in_a_fresh_virtualenv(tmp_path: Path) -> None:
    env = tmp_path / "fresh"
    venv.create(env, with_pip=True)
    python = env / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()
    (Path(purelib) / "outer.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    done = subprocess.run(
        [str(python), "-m", "pip", "install", "--no-index", "--no-build-isolation", "--disable-pip-version-check", str(SDK)],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    probe = subprocess.run(
        [str(python), "-c", "import sandbox_agent, pathlib; p = pathlib.Path(sandbox_agent.__file__).parent; "
         "print(p); print((p / 'py.typed').is_file()); print(sandbox_agent.__version__)"],
        capture_output=True, text=True, check=True, cwd=tmp_path,
    )
    where, typed, version = probe.stdout.split()
    assert Path(where).is_relative_to(Path(purelib)), "installed into the fresh environment"
    assert typed == "True"
    assert version == "0.1.0"
    assert sys.version_info >= (3, 10)
