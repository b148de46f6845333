"""A build trajforge stops (its timeout, or the run cancelled) leaves nothing in the engine's storage
(backends/container/image_build.py): a podman build killed itself leaves its working container
there for good, so the build's RUN step is ended instead and podman cleans up after itself."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.support.images import busybox_image, podman  # noqa: F401 (fixtures)
from trajforge.sandbox.backends.container import image_build
from trajforge.sandbox.backends.container.engine import Engine


def working_containers(podman: Engine, name: str) -> list[str]:  # noqa: F811
    """The engine's containers (storage-only ones included) whose name starts with `name`."""
    out = subprocess.run([podman.binary, "ps", "-a", "--external", "--format", "{{.Names}}"], env=podman.env,
                         capture_output=True, text=True, timeout=120, check=True).stdout
    return [n for n in out.split() if n.startswith(name)]


def stopped_build(podman: Engine, busybox_image: str, tmp_path: Path) -> list[str]:  # noqa: F811
    """Build FROM a base tagged under a name of this test's own (the working container is named after
    it: no build beside this one has it), cancel the build while its RUN step runs, and say which
    working containers of it the engine still has."""
    name = f"trajforge-test-buildstop-{uuid.uuid4().hex[:10]}"
    base = f"localhost/{name}:latest"
    engine = lambda *a: subprocess.run([podman.binary, *a], env=podman.env, capture_output=True,  # noqa: E731
                                       text=True, timeout=300)
    assert engine("tag", busybox_image, base).returncode == 0
    context, log = tmp_path / "context", tmp_path / "build.log"
    context.mkdir()
    # the step prints "started" (its RUN line, echoed in the log, has the word split), then outlives
    # the test's wait; not by much: with podman killed (the mutation) nobody ends its sleep
    (context / "Dockerfile").write_text(f'FROM {base}\nRUN echo "sta""rted" && sleep 120\n')

    async def body() -> None:
        build = asyncio.create_task(image_build.build_image(podman, context=context, tag=f"{base}-built",
                                                            timeout=3600, log=log))
        async with asyncio.timeout(600):
            while not build.done() and not (log.exists() and "started" in log.read_text().splitlines()):
                await asyncio.sleep(0.05)  # the build's own output is the event: no hook into podman's steps
        assert not build.done(), log.read_text()
        build.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await build

    try:
        asyncio.run(body())
        return working_containers(podman, name)
    finally:
        for left in working_containers(podman, name):
            engine("rm", "-f", left)
        engine("rmi", base)


def test_a_cancelled_build_leaves_no_working_container(tmp_path: Path, busybox_image: str,  # noqa: F811
                                                       podman: Engine) -> None:  # noqa: F811
    assert stopped_build(podman, busybox_image, tmp_path) == []


def test_the_build_test_fails_when_the_engine_itself_is_killed(tmp_path: Path, busybox_image: str,  # noqa: F811
                                                              podman: Engine,  # noqa: F811
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(image_build, "_kill_descendants", lambda pid: 0)  # straight to the group's SIGKILL
    assert stopped_build(podman, busybox_image, tmp_path) != []
