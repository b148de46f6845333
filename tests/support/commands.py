"""trajforge run as a user runs it: a child `python -m trajforge ...` with this checkout's src/.

The one way the tests start the command in a process of its own (`run_trajforge`), its argv
(`trajforge_argv`, for a Popen that a test drives itself) and the environment it gets by default
(`user_env`: this one without the model API keys a developer's shell may hold), and what a
`make` target runs (`make_recipe`).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
API_KEY_VARS = ("OPENROUTER_API_KEY", "OPENAI_API_KEY")


def trajforge_argv(*args: object) -> list[str]:
    return [sys.executable, "-m", "trajforge", *map(str, args)]


def make_dry_run(directory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`make -n ARGS` in `directory`: the recipe make would run, printed, not run (never a
    "make[1]: Entering directory" line among it, whoever started the tests: tests/conftest.py)."""
    return subprocess.run(["make", "-n", "--no-print-directory", *args], cwd=directory,
                          capture_output=True, text=True, timeout=60)


def make_recipe(*words: str) -> list[list[str]]:
    """The commands `make WORDS` would run (make's own dry run), each as its words, with this
    interpreter's venv; [] when make refuses."""
    proc = make_dry_run(REPO, "-f", str(REPO / "Makefile"), *words, f"VENV={sys.prefix}", "STAMP=")
    if proc.returncode != 0:
        return []
    lines = proc.stdout.replace("\\\n", " ").splitlines()
    return [words for words in (shlex.split(line, comments=True) for line in lines) if words]


def user_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in API_KEY_VARS}
    env["PYTHONPATH"] = str(REPO / "src")
    return env


def run_trajforge(*args: object, cwd: Path | None = None, env: Mapping[str, str] | None = None,
                  timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`trajforge ARGS` in `cwd`, to its end (at most `timeout` seconds), its output captured as text."""
    return subprocess.run(trajforge_argv(*args), cwd=cwd, env=dict(user_env() if env is None else env),
                          capture_output=True, text=True, timeout=timeout)
