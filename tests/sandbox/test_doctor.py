"""`trajforge doctor`'s way out for a backend that does not work: repair what is installed but
broken, install what is missing (a broken Podman's hint used to be to install it)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.conftest import REPO, cli
from trajforge.catalog.sandboxes import SANDBOXES
from trajforge.sandbox.backends.bwrap.bwrap_backend import BwrapStatus
from trajforge.sandbox.backends.container.status import ContainerStatus
from trajforge.sandbox.doctor import enable_hint

BROKEN_STORAGE = "Error: database is locked (a broken podman for the test)"


def broken_podman(tmp_path: Path) -> dict[str, str]:
    """An environment whose `podman` is installed and fails every command, `podman info` included,
    the way a Podman with broken storage does; it comes first on PATH."""
    bin_dir = tmp_path / "broken-bin"
    bin_dir.mkdir(exist_ok=True)
    podman = bin_dir / "podman"
    podman.write_text(f"#!/bin/sh\necho '{BROKEN_STORAGE}' >&2\nexit 125\n")
    podman.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("OPENROUTER_API_KEY", "OPENAI_API_KEY")}
    env["PATH"] = f"{bin_dir}:{env.get('PATH', '/usr/bin:/bin')}"
    env["PYTHONPATH"] = str(REPO / "src")
    return env


def test_a_broken_podman_is_to_be_repaired_not_installed(tmp_path: Path) -> None:
    env = broken_podman(tmp_path)
    proc = subprocess.run(cli("doctor", "--container_engine", "podman"), env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    hint = next(line for line in proc.stdout.splitlines() if line.startswith("to enable container:"))
    assert "apt-get install" not in hint, hint
    assert f"podman is installed ({tmp_path / 'broken-bin' / 'podman'}) but does not work" in hint
    assert BROKEN_STORAGE in hint and "run `podman info` to see why" in hint


def test_a_missing_engine_or_bwrap_is_to_be_installed() -> None:
    container, bwrap = SANDBOXES["container"], SANDBOXES["bwrap"]
    missing = ContainerStatus(False, "podman: not found", None,
                              {"podman": {"usable": False, "detail": "podman not found on PATH"}})
    assert enable_hint(container, missing) == container.capabilities.enable
    assert enable_hint(bwrap, BwrapStatus(False, None, "root", "bwrap not found")) == bwrap.capabilities.enable
    broken = BwrapStatus(False, "/usr/bin/bwrap", "user", "bubblewrap 0.8.0: a test sandbox failed: EPERM")
    hint = enable_hint(bwrap, broken) or ""
    assert "apt-get" not in hint and "/usr/bin/bwrap is installed" in hint and "user namespaces" in hint
    assert enable_hint(bwrap, BwrapStatus(True, "/usr/bin/bwrap", "root", "bubblewrap 0.8.0")) is None
