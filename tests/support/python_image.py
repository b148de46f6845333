"""A task base image with Python and pytest, built offline from this host: what Terminal-Bench-style
tasks verify with (`python3 -m pytest /tests/...`).

`localhost/trajforge-test-python:latest` is the example tasks' base (tests/support/tasks.py) plus
this host's Debian python3.11 (its binary, its standard library without the parts no test needs,
and the shared libraries they load) and the test venv's pure-Python pytest with its dependencies
in /usr/lib/python3/dist-packages, where Debian's Python finds them. Built once per test session
with a `COPY` of a prepared context: no registry, no RUN line.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.tasks import _base_module
from trajforge.sandbox.backends.container.engine import Engine

TAG = "localhost/trajforge-test-python:latest"
PYTHON = Path("/usr/bin/python3.11")
STDLIB = Path("/usr/lib/python3.11")
_SKIP = {"config-3.11-x86_64-linux-gnu", "test", "idlelib", "tkinter", "lib2to3", "pydoc_data", "ensurepip",
         "distutils", "turtledemo", "__pycache__"}
_PACKAGES = ("pytest", "_pytest", "pluggy", "iniconfig", "packaging", "pygments", "py.py")


def _copy_libs(binary: Path, root: Path, libraries) -> None:  # type: ignore[no-untyped-def]
    for lib in libraries(str(binary)):
        real = Path(lib).resolve()
        dest = root / ("usr/" + lib.lstrip("/").removeprefix("usr/"))
        if not dest.exists():
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(real, dest)


def context(dest: Path) -> Path:
    """The build context: a Dockerfile and root/, what it copies over the base."""
    base = _base_module()
    root = dest / "root"
    (root / "usr/bin").mkdir(parents=True)
    shutil.copy2(PYTHON, root / "usr/bin/python3.11")
    (root / "usr/bin/python3").symlink_to("python3.11")
    (root / "usr/bin/python").symlink_to("python3.11")
    _copy_libs(PYTHON, root, base._libraries)
    shutil.copytree(STDLIB, root / "usr/lib/python3.11", symlinks=True,
                    ignore=lambda d, names: [n for n in names if n in _SKIP])
    for ext in (root / "usr/lib/python3.11/lib-dynload").glob("*.so"):
        _copy_libs(ext, root, base._libraries)
    site = Path(pytest.__file__).parent.parent
    packages = root / "usr/lib/python3/dist-packages"
    packages.mkdir(parents=True)
    for name in _PACKAGES:
        src = site / name
        if src.is_dir():
            shutil.copytree(src, packages / name, ignore=shutil.ignore_patterns("__pycache__"))
        elif src.exists():
            shutil.copy2(src, packages / name)
    (dest / "Dockerfile").write_text("FROM localhost/trajforge-example-base:latest\nCOPY root/ /\nWORKDIR /app\n")
    return dest


@pytest.fixture(scope="session")
def python_base(podman: Engine, task_base: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if not PYTHON.exists() or sys.version_info[:2] != (3, 11):
        pytest.skip("needs Debian's python3.11 on the host (apt-get install python3.11) and a 3.11 test venv")
    # Built when this host has none of this script, this Python and this pytest (a new build would
    # change the base id of every task image built FROM it, under a test suite running beside this one).
    st = PYTHON.stat()
    digest = hashlib.sha256(Path(__file__).read_bytes() + f"{st.st_size}:{st.st_mtime_ns}:{pytest.__version__}:"
                            f"{subprocess.run([podman.binary, 'image', 'inspect', '--format', '{{.Id}}', task_base], env=podman.env, capture_output=True, text=True).stdout}".encode()).hexdigest()[:16]
    found = subprocess.run([podman.binary, "image", "inspect", "--format",
                            '{{index .Config.Labels "trajforge.test-python"}}', TAG], env=podman.env,
                           capture_output=True, text=True, timeout=60)
    if found.returncode != 0 or found.stdout.strip() != digest:
        ctx = context(tmp_path_factory.mktemp("python-image"))
        proc = subprocess.run([podman.binary, "build", "--label", f"trajforge.test-python={digest}", "-t", TAG,
                               str(ctx)], env=podman.env, capture_output=True, timeout=900)
        assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-2000:]
    yield TAG
