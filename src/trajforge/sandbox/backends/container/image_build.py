"""The container backend's ImageStore (its spec's `image_store`): building, inspecting and removing images.

Used by task environments (trajforge.tasks.environment), which decide what to build and when;
this module only runs the engine: `build` with its whole output in a log file (never in memory:
a build may print megabytes), stopped at the timeout (`_stop_build`), and `image inspect` for the
id, WORKDIR, USER and labels of an image. The engine's environment is Engine.env, so no
key of the runner reaches a build (a Dockerfile's RUN lines are the task author's code).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Mapping
from pathlib import Path

from trajforge.sandbox.backends.container.backend import ContainerBackend, backend_for
from trajforge.sandbox.backends.container.engine import Engine, last_line
from trajforge.sandbox.interface import BuildOutcome, ImageInfo, Provider

class ContainerImages:
    """The run's images, by its engine (one per run: `store`)."""

    def __init__(self, backend: ContainerBackend) -> None:
        self.backend, self.engine, self.kind = backend, backend.engine, backend.engine.kind

    async def ensure(self, image: str) -> None:
        await self.backend.images.ensure(image)

    async def inspect(self, image: str) -> ImageInfo | None:
        return await image_info(self.engine, image)

    async def build(self, *, context: Path, tag: str, timeout: float, log: Path, labels: Mapping[str, str],
                    build_args: Mapping[str, str]) -> BuildOutcome:
        return await build_image(self.engine, context=context, tag=tag, timeout=timeout, log=log, labels=labels,
                                 build_args=build_args)

    async def images(self, label: str) -> list[tuple[str, ImageInfo]]:
        res = await self.engine.run("images", "--filter", f"label={label}", "--format", "{{.ID}}", timeout=120)
        found = []
        for image_id in dict.fromkeys(res.stdout.split()) if res.exit_code == 0 else ():
            info = await image_info(self.engine, image_id)
            if info is not None:
                found.append((image_id, info))
        return found

    async def remove(self, image: str) -> str | None:
        res = await self.engine.run("rmi", image, timeout=300)
        return None if res.exit_code == 0 else last_line(res)


async def store(provider: Provider) -> ContainerImages:
    """The run's ContainerImages (the spec's `image_store`); SandboxError when no engine works here."""
    backend = await backend_for(provider)

    async def make() -> ContainerImages:
        return ContainerImages(backend)

    return await provider.state("container.images", make)


async def build_image(engine: Engine, *, context: Path, tag: str, timeout: float, log: Path,
                      labels: Mapping[str, str] | None = None, build_args: Mapping[str, str] | None = None
                      ) -> BuildOutcome:
    """`engine build -t tag context` (its Dockerfile), output appended to `log`; killed after `timeout` s."""
    argv = engine.argv("build", "-t", tag, "-f", str(context / "Dockerfile"),
                       *[f"--label={k}={v}" for k, v in (labels or {}).items()],
                       *[f"--build-arg={k}={v}" for k, v in (build_args or {}).items()], str(context))
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with log.open("ab") as out:
        out.write(f"$ {' '.join(argv)}\n".encode())
        out.flush()
        try:
            proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.DEVNULL, stdout=out,
                                                        stderr=asyncio.subprocess.STDOUT, env=engine.env,
                                                        cwd="/", start_new_session=True)
        except OSError as e:
            return BuildOutcome(False, 0.0, f"cannot run {engine.kind} build: {e}")
        try:
            async with asyncio.timeout(timeout):
                code = await proc.wait()
        except TimeoutError:
            await _stop_build(proc, engine.kind)
            out.write(f"\ntrajforge: build stopped after {timeout:g} s (build_timeout_sec)\n".encode())
            return BuildOutcome(False, time.monotonic() - started, f"timed out after {timeout:g} s")
        except BaseException:  # cancelled: the build must not go on without us
            await asyncio.shield(_stop_build(proc, engine.kind))
            raise
    seconds = time.monotonic() - started
    return BuildOutcome(code == 0, seconds, "" if code == 0 else f"exit code {code}")


STOP_GRACE = 30.0  # seconds a podman build has to fail its step and remove its working container


async def _stop_build(proc: asyncio.subprocess.Process, kind: str) -> None:
    """End a build without leaving anything in the engine's storage.

    A podman build killed itself (SIGKILL, and SIGTERM or SIGINT alike) leaves its working container
    in the engine's storage for good. So the processes of its RUN step, every descendant of the
    podman process, are killed instead: the step fails, and podman removes its working container
    as after any failed build (--force-rm, its default) and exits. If it has not within STOP_GRACE
    (no step was running: a pull, a commit), or for docker (its client's children are not the
    build's), the whole process group is killed."""
    if kind == "podman" and _kill_descendants(proc.pid):
        try:
            async with asyncio.timeout(STOP_GRACE):
                await proc.wait()
            return
        except TimeoutError:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    await proc.wait()


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                found.extend(int(c) for c in f.read().split())
        except (OSError, ValueError):
            continue
    return found


def _kill_descendants(root: int) -> int:
    """SIGKILL every descendant of `root` (not `root`); how many were signalled. Each is signalled
    through a pidfd opened while it was still its parent's child, so a reused pid is never hit."""
    signalled, todo = 0, [root]
    while todo:
        parent = todo.pop()
        for child in _children(parent):
            try:
                fd = os.pidfd_open(child)
            except OSError:
                continue
            try:
                if child in _children(parent):  # the pidfd is of that child, not of a pid reused since
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
                    signalled += 1
                    todo.append(child)
            except OSError:
                pass
            finally:
                os.close(fd)
    return signalled


async def image_info(engine: Engine, image: str) -> ImageInfo | None:
    """The image's id, WORKDIR, USER and labels; None when it cannot be inspected."""
    res = await engine.run("image", "inspect", "--format",
                           '{{.Id}}\t{{.Config.WorkingDir}}\t{{.Config.User}}\t{{json .Config.Labels}}', image,
                           timeout=60)
    if res.exit_code != 0:
        return None
    image_id, workdir, user, labels = (res.stdout.rstrip("\n").split("\t", 3) + ["", "", ""])[:4]
    try:
        parsed = json.loads(labels or "null") or {}
    except ValueError:
        parsed = {}
    return ImageInfo(image_id.strip(), workdir.strip(), user.strip(),
                     {str(k): str(v) for k, v in parsed.items()} if isinstance(parsed, dict) else {})
