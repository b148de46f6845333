"""Building a container image from a build context with the run's engine, and reading an image's config.

Used by task environments (trajforge.tasks.environment), which decide what to build and when;
this module only runs the engine: `build` with its whole output in a log file (never in memory:
a build may print megabytes), killed with its process group at the timeout, and `image inspect`
for the WORKDIR and USER a container of the image starts with. The engine's environment is
Engine.env, so no key of the runner reaches a build (a Dockerfile's RUN lines are the task
author's code).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from trajforge.sandbox.backends.container.container_engine import Engine

LOG_TAIL_LINES = 15
LOG_TAIL_CHARS = 2000


@dataclass(frozen=True, slots=True)
class BuildOutcome:
    ok: bool
    seconds: float
    message: str  # why it failed: the exit code or the timeout


@dataclass(frozen=True, slots=True)
class ImageConfig:
    workdir: str  # "" when the image sets none
    user: str  # "" when the image sets none (root)


async def build_image(engine: Engine, *, context: Path, tag: str, timeout: float, log: Path,
                      labels: dict[str, str] | None = None) -> BuildOutcome:
    """`engine build -t tag context` (its Dockerfile), output appended to `log`; killed after `timeout` s."""
    argv = engine.argv("build", "-t", tag, "-f", str(context / "Dockerfile"),
                       *[f"--label={k}={v}" for k, v in (labels or {}).items()], str(context))
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
            _kill_group(proc.pid)
            await proc.wait()
            out.write(f"\ntrajforge: build stopped after {timeout:g} s (build_timeout_sec)\n".encode())
            return BuildOutcome(False, time.monotonic() - started, f"timed out after {timeout:g} s")
        except BaseException:  # cancelled: the build must not go on without us
            _kill_group(proc.pid)
            await proc.wait()
            raise
    seconds = time.monotonic() - started
    return BuildOutcome(code == 0, seconds, "" if code == 0 else f"exit code {code}")


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def log_tail(log: Path) -> str:
    """The last lines of a build log, for a failure message."""
    try:
        with log.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 8 * LOG_TAIL_CHARS))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip("\n").splitlines()[-LOG_TAIL_LINES:])[-LOG_TAIL_CHARS:]


async def image_present(engine: Engine, image: str) -> bool:
    res = await engine.run("image", "inspect", "--format", "{{.Id}}", image, timeout=60)
    return res.exit_code == 0


async def image_config(engine: Engine, image: str) -> ImageConfig | None:
    """The image's WORKDIR and USER; None when it cannot be inspected."""
    res = await engine.run("image", "inspect", "--format", "{{.Config.WorkingDir}}\t{{.Config.User}}", image,
                           timeout=60)
    if res.exit_code != 0:
        return None
    workdir, _, user = res.stdout.rstrip("\n").partition("\t")
    return ImageConfig(workdir.strip(), user.strip())
