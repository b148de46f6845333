"""A task's image: built once per distinct build key, cached across runs under that key.

The tag of a build is `localhost/trajforge-task-env:<key>`, its key covering the build context
with every mode bit and owner, the image id of each base it builds FROM and its build arguments
(tasks/build_key.py): tasks whose builds would be identical share one image, and an image
already in the engine's storage, tagged with the key and carrying it as its build-key label
(LABEL), is not built again, in this run or a later one; `--rebuild` builds every key of the run
once anyway. Within a run each context is built at most once (every sample of it awaits the same
build); across processes of one host (Ray actors, two runs) a lock file per key in the trajforge
cache directory makes the second wait for the first and then find the image. Each image built
also carries its builder's uid (USER_LABEL), which `trajforge tasks prune` goes by.

A build's whole output goes to `<run>/builds/<hash>.log` (the hash of environment/). A build that
fails or passes `build_timeout_sec` (times `--timeout_multiplier`) fails the samples of those
tasks only, as `build` failures whose message holds the log's last lines; the run goes on. A
failed build is not retried within the run (its samples fail at once), and is tried again by
`--resume`. A task with `docker_image` uses that image (checked, or pulled, like a dataset row's image).
"""

from __future__ import annotations

import asyncio
import fcntl
import os
from dataclasses import dataclass
from pathlib import Path

from trajforge.errors import SampleFailure
from trajforge.sandbox.cache_dir import cache_dir
from trajforge.sandbox.interface import BuildOutcome, ImageStore, Provider, SandboxError
from trajforge.tasks.build_key import build_key
from trajforge.tasks.task_settings import TaskSettings
from trajforge.task_spec import TaskSpec

TAG_PREFIX = "localhost/trajforge-task-env"
LABEL = "trajforge.task-env"  # the build key, checked before a cached image is used
USER_LABEL = "trajforge.task-env.user"  # the uid that built it (trajforge tasks prune)
DEFAULT_WORKDIR = "/app"
LOG_TAIL_LINES = 15
LOG_TAIL_CHARS = 2000


class BuildError(SampleFailure):
    """A task's environment could not be built: the sample fails as `build` (retried on --resume)."""

    failure_class = "build"


@dataclass(frozen=True, slots=True)
class TaskImage:
    image: str
    workdir: str  # where the agent works: [environment].workdir, else the image's WORKDIR, else /app


def tag_for(key: str) -> str:
    return f"{TAG_PREFIX}:{key[:32]}"


class TaskImages:
    """The run's task images (one per process, held by the sandbox provider)."""

    def __init__(self, store: ImageStore, settings: TaskSettings) -> None:
        self.store, self.settings = store, settings
        self.log_dir = settings.build_log_dir or cache_dir() / "build-logs"
        self._builds: dict[str, asyncio.Task[tuple[BuildOutcome | None, str]]] = {}
        self._workdirs: dict[str, str] = {}
        self.built: list[str] = []  # keys built by this process (None outcome: found in storage)

    async def image_for(self, spec: TaskSpec) -> TaskImage:
        """The task's image, built or checked; raises BuildError or SandboxError."""
        if spec.docker_image is not None:
            await self.store.ensure(spec.docker_image)
            image = spec.docker_image
        else:
            assert spec.environment_hash is not None
            h = spec.environment_hash
            task = self._builds.get(h)
            if task is None or (task.done() and (task.cancelled() or task.exception() is not None)):
                task = self._builds[h] = asyncio.get_running_loop().create_task(self._build(spec), name=f"build {h}")
            outcome, image = await asyncio.shield(task)
            if outcome is not None and not outcome.ok:
                log = self.log_path(h)
                tail = "\n".join(line for line in log_tail(log).splitlines() if not line.startswith("$ "))
                # The tail first: a checkpoint keeps a message's first 500 characters.
                raise BuildError(f"environment of task {spec.name!r} did not build ({outcome.message}): "
                                 f"...{tail[-300:]}\n(whole log: {log})")
        return TaskImage(image, spec.workdir or await self._workdir(image))

    def log_path(self, environment_hash: str) -> Path:
        return self.log_dir / f"{environment_hash[:32]}.log"

    async def _build(self, spec: TaskSpec) -> tuple[BuildOutcome | None, str]:
        """(None: the image was there already, nothing built; its tag)."""
        assert spec.environment_hash is not None
        key = await build_key(spec, self.store)
        tag = tag_for(key)
        if not self.settings.rebuild and await self._cached(tag, key):
            return None, tag
        async with _host_lock(key):
            if not self.settings.rebuild and await self._cached(tag, key):  # another process built it meanwhile
                return None, tag
            timeout = self.settings.scaled(spec.build_timeout)
            assert timeout is not None
            outcome = await self.store.build(context=spec.environment_dir, tag=tag, timeout=timeout,
                                             log=self.log_path(spec.environment_hash),
                                             labels={LABEL: key, USER_LABEL: str(os.getuid())},
                                             build_args=dict(spec.build_args))
            if outcome.ok and not await self._cached(tag, key):
                outcome = BuildOutcome(False, outcome.seconds, f"the image built as {tag} does not carry its key "
                                                               f"(was it tagged again meanwhile?)")
        if outcome.ok:
            self.built.append(key)
        return outcome, tag

    async def _cached(self, tag: str, key: str) -> bool:
        """Whether `tag` is an image of this key (its label says so), not merely an image of that name."""
        info = await self.store.inspect(tag)
        return info is not None and info.labels.get(LABEL) == key

    async def _workdir(self, image: str) -> str:
        if image not in self._workdirs:
            config = await self.store.inspect(image)
            if config is None:
                raise SandboxError(f"cannot inspect image {image!r} ({self.store.kind})")
            workdir = config.workdir.rstrip("/")
            self._workdirs[image] = workdir if workdir.startswith("/") else DEFAULT_WORKDIR
        return self._workdirs[image]


class _host_lock:
    """An exclusive lock on one build key for the processes of this host (flock, dropped at exit)."""

    def __init__(self, key: str) -> None:
        self.path = cache_dir() / "build-locks" / f"{key[:32]}.lock"
        self.fd = -1

    async def __aenter__(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            await asyncio.to_thread(fcntl.flock, self.fd, fcntl.LOCK_EX)
        except BaseException:
            os.close(self.fd)
            raise

    async def __aexit__(self, *exc: object) -> None:
        os.close(self.fd)  # closing drops the lock


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


async def task_images(provider: Provider, settings: TaskSettings) -> TaskImages:
    """The run's TaskImages; SandboxError when no container engine works here."""
    store = await provider.image_store()

    async def make() -> TaskImages:
        return TaskImages(store, settings)

    return await provider.state("tasks.images", make)


@dataclass(slots=True)
class Pruned:
    removed: list[str]  # tags (or ids) of the images removed
    others: int  # task images of other users (or built before images carried their builder), left alone
    failed: list[str]  # "image: why" of those that could not be removed (a container still uses them)


async def prune(store: ImageStore, uid: int, *, dry_run: bool = False) -> Pruned:
    """Remove every task image that `uid` built (its USER_LABEL), and no other image."""
    out = Pruned([], 0, [])
    for image_id, info in await store.images(LABEL):
        if info.labels.get(USER_LABEL) != str(uid):
            out.others += 1
            continue
        name = f"{TAG_PREFIX}:{info.labels.get(LABEL, '')[:32]} ({image_id[:12]})"
        why = None if dry_run else await store.remove(image_id)
        (out.failed.append(f"{name}: {why}") if why else out.removed.append(name))
    return out
