"""Shared fixtures: a scripted model server per test, and a clean environment for CLI runs."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.commands import API_KEY_VARS, trajforge_argv
from tests.support.scripted_server import ScriptedServer

REPO = Path(__file__).resolve().parent.parent
cli = trajforge_argv  # `cli("run", ...)`: the argv of a trajforge child (tests.support.commands)

# A suite started in the background by a non-interactive shell (`make test &`, a CI step run that
# way) inherits SIGINT ignored, and so does every child: the tests that interrupt a run with Ctrl-C
# would then see it run on. Children get the default disposition back from a handler set here.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


# Under `make test` the suite inherits make's MAKELEVEL and MAKEFLAGS, and every `make` a test runs
# (the README's commands, dry runs of a recipe) would act as a sub-make: it prints "make[1]:
# Entering directory ..." among its output. The tests run make as a user's shell does.
for _var in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS"):
    os.environ.pop(_var, None)


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with ScriptedServer() as srv:
        yield srv


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """No API keys from the developer's shell leak into a test."""
    for var in API_KEY_VARS:
        monkeypatch.delenv(var, raising=False)
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO / "src")
    return env



def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The task images only this session built go with it (tests.support.tasks)."""
    import shutil
    import sys

    tasks = sys.modules.get("tests.support.tasks")
    podman = shutil.which("podman")
    if tasks is not None and podman is not None:
        tasks.remove_session_images(podman)
