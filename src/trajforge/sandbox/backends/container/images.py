"""Is a row's container image available? Checked once per distinct image per run.

`ImageChecker.ensure(image)` inspects the image and, when it is not present, pulls it (bounded
by `--image_pull_timeout`). Every sample naming the same image awaits the same check, so a
dataset of 10,000 rows over three images costs three inspects, not 10,000, and a slow pull
delays only the samples that need that image. An image that cannot be had raises SandboxError
naming the image and the engine's own message: the runner records the sample as a `sandbox`
failure (retried on resume, since a new run checks afresh) and the run goes on.
`prefetch` starts the checks early, off the critical path of the first samples.

`seed(image, path)` serves rows whose `cwd` already holds files in the image (a checked-out
repository, say): the workspace is mounted over that path, so its content is copied out of the
image once per (image, path) and then into each sample's workspace before its container starts.
The copy out is the engine's tar stream, unpacked with the owners in its headers and checked entry
by entry (seed_tar.py); more than MAX_SEED_BYTES stops it.
"""

from __future__ import annotations

import asyncio
import atexit
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from trajforge.sandbox.interface import SandboxError
from trajforge.sandbox.backends.container.engine import Engine, container_name, last_line
from trajforge.sandbox.backends.container.seed_tar import copy_out
from trajforge.sandbox.workspace import RunRoot

MAX_SEED_BYTES = 1 << 30  # content of a row's cwd copied into every sample's workspace


@dataclass(frozen=True, slots=True)
class ImageStatus:
    image: str
    ok: bool
    pulled: bool = False
    message: str = ""  # why it is not available, in the engine's words


class ImageChecker:
    def __init__(self, engine: Engine, *, pull_timeout: float = 300.0, inspect_timeout: float = 60.0) -> None:
        self.engine = engine
        self.pull_timeout = pull_timeout
        self.inspect_timeout = inspect_timeout
        self._checks: dict[str, asyncio.Task[ImageStatus]] = {}
        self._seeds: dict[tuple[str, str], asyncio.Task[Path | None]] = {}
        self._seed_root: Path | None = None

    @property
    def checked(self) -> dict[str, ImageStatus]:
        """Finished checks, by image."""
        return {i: t.result() for i, t in self._checks.items() if t.done() and not t.cancelled()
                and t.exception() is None}

    def _task(self, image: str) -> asyncio.Task[ImageStatus]:
        task = self._checks.get(image)
        if task is None or (task.done() and (task.cancelled() or task.exception() is not None)):
            task = asyncio.get_running_loop().create_task(self._check(image), name=f"image-check {image}")
            self._checks[image] = task
        return task

    def prefetch(self, images: Iterable[str]) -> None:
        """Start checking these images in the background (call from inside the event loop)."""
        for image in dict.fromkeys(images):
            self._task(image)

    async def ensure(self, image: str) -> ImageStatus:
        """Return once `image` is present; raise SandboxError when it cannot be had."""
        # Shielded: one sample being cancelled must not cancel the check others are awaiting.
        status = await asyncio.shield(self._task(image))
        if not status.ok:
            raise SandboxError(f"container image {image!r} is not available ({self.engine.kind}): {status.message}")
        return status

    async def _check(self, image: str) -> ImageStatus:
        inspect = await self.engine.run("image", "inspect", "--format", "{{.Id}}", image, timeout=self.inspect_timeout)
        if inspect.exit_code == 0:
            return ImageStatus(image, True)
        pull = await self.engine.run("pull", image, timeout=self.pull_timeout)
        if pull.exit_code == 0:
            return ImageStatus(image, True, pulled=True)
        if pull.timed_out:
            why = f"not present locally and pull timed out after {self.pull_timeout:g}s"
            return ImageStatus(image, False, message=why)
        return ImageStatus(image, False, message=f"not present locally and pull failed: {last_line(pull)}")

    async def seed(self, image: str, path: str) -> Path | None:
        """A host directory holding what `image` has at `path` (None: nothing there). Cached."""
        key = (image, path)
        task = self._seeds.get(key)
        if task is None or (task.done() and (task.cancelled() or task.exception() is not None)):
            task = asyncio.get_running_loop().create_task(self._extract(image, path), name=f"image-seed {image}")
            self._seeds[key] = task
        return await asyncio.shield(task)

    async def _extract(self, image: str, path: str) -> Path | None:
        if self._seed_root is None:  # a killed runner's is swept at the next start, as its workspaces are
            root = RunRoot()
            atexit.register(root.cleanup)
            self._seed_root = Path(root.name)
        dest = Path(tempfile.mkdtemp(dir=self._seed_root))
        name = container_name()
        created = await self.engine.run("create", "--name", name, "--label", "trajforge=1", "--entrypoint", "sleep",
                                        image, "infinity", timeout=120)
        if created.exit_code != 0:
            raise SandboxError(f"cannot read {path} from image {image!r}: {last_line(created)}")
        try:  # as a tar stream: its headers carry the owners, a copy into a directory does not
            copied = await copy_out(self.engine.argv("cp", f"{name}:{path.rstrip('/')}/.", "-"), self.engine.env,
                                    dest, limit=MAX_SEED_BYTES, what=f"{path} in image {image!r}", timeout=600)
        finally:
            await self.engine.run(*self.engine.rm_args(name), timeout=120)
        return dest if copied else None  # None: the image has no such directory, or an empty one

    async def aclose(self) -> None:
        tasks = [*self._checks.values(), *self._seeds.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
