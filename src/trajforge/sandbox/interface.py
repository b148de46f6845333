"""The Sandbox interface: every operation a tool performs on a sample's environment.

A sandbox is one sample's isolated environment. Tools never see a host path: they run commands
(foreground with a timeout, or background `Job`s whose output the sandbox keeps), and read,
write and search files, always with paths as the sample sees them (relative to `cwd`, `~/...`,
or absolute under `workdir`). Each backend decides where that happens: the local one on the
host through an O_NOFOLLOW walk, bwrap through a helper inside the sample's namespaces,
containers inside the container. `close()` kills every process the sample started and removes
its workspace. Backends are declared in trajforge.catalog.sandboxes (SANDBOXES) and made by the
run's provider (sandbox/factory.py).

A backend that runs images (tasks' environments: the README's "Task environments") makes
ImageSandboxes, which add what the runner's own steps need beyond the tools' operations (modelled
on inspect_ai's SandboxEnvironment): commands as another user with an environment of their own,
`upload` and `download` of trees and files, stopping every process of the sample, fresh
directories and the list of what the sample changed. Its spec names an ImageStore (build, inspect,
prune) and its `make` takes a sample's own SampleResources. Nothing outside a backend imports the
backend: tasks/ speaks only to these.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from trajforge.errors import SampleFailure
from trajforge.sandbox.inside.fsops import FileOpError, check_model_path
from trajforge.sandbox.inside.safe_fs import PathEscapeError, SymlinkError

if TYPE_CHECKING:
    from trajforge.catalog.sandboxes import NetworkMode
    from trajforge.sandbox.sandbox_settings import SandboxSettings

T = TypeVar("T")

__all__ = ["BuildOutcome", "Change", "Copied", "ExecResult", "FileOpError", "ImageInfo", "ImageSandbox", "ImageStore", "Job", "LogChunk",
           "PathEscapeError", "SampleResources", "Sandbox", "SandboxError", "SandboxSpoiled", "Stopped", "SymlinkError", "check_model_path",
           "raise_reply"]

READ_CAP = 256 << 20  # the largest file a tool may ask for


class SandboxError(SampleFailure):
    """The sandbox could not be created or broke (infrastructure): the sample fails as `sandbox`."""

    failure_class = "sandbox"


class SandboxLimitError(SandboxError):
    """The sample hit one of its own limits (memory, /tmp, /dev/shm, its workspace disk). Another
    attempt would most likely hit it again, so it is not retried in-run unless asked."""


class SandboxSpoiled(SandboxError):
    """The sample itself broke what a runner's step after it needed (it stopped its own container,
    filled its disk, made a path the runner resets unremovable): a caller that scores the sample
    (task verification) scores it as a failure of `kind` (trajforge.failures' table), not an error."""

    def __init__(self, message: str, *, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(slots=True)
class ExecResult:
    exit_code: int | None  # None when killed by the timeout
    stdout: str
    stderr: str
    timed_out: bool = False
    truncated: bool = False
    # The command never ran: its shell could not enter the working directory (a failed tool call).
    start_error: str | None = None


@dataclass(frozen=True, slots=True)
class LogChunk:
    """Output of a background job from an offset: `head + tail`, with `dropped` bytes between
    them left out when there was more than asked for; `end` is the offset to continue from."""

    head: bytes
    tail: bytes
    dropped: int
    end: int


class Job(ABC):
    """A background command; its output stays with the sandbox until read with `read`."""

    pid: int  # as the sample sees it (ps inside the sandbox)

    @property
    @abstractmethod
    def returncode(self) -> int | None:
        """None while running; negative: killed by that signal."""

    @abstractmethod
    async def wait(self, timeout: float | None = None) -> int | None:
        """The return code once it exits, or None after `timeout` seconds."""

    @abstractmethod
    async def kill(self) -> None:
        """SIGKILL the job and everything in its process group."""

    @abstractmethod
    async def read(self, offset: int, cap: int) -> LogChunk:
        """Output from `offset`; at most `cap` bytes (head and tail halves when more)."""


class Sandbox(ABC):
    workdir: str  # the workspace as commands see it
    cwd: str  # the working directory of commands and relative paths, as commands see it
    workspace: Path | None  # host directory of the workspace, for the runner and tests only (None: remote)

    @abstractmethod
    async def start(self) -> None:
        """Create the environment (directory, container...). Raises SandboxError."""

    @abstractmethod
    async def exec(self, command: str, *, timeout: float, cwd: str | None = None, user: str | None = None,
                   env: Mapping[str, str] | None = None) -> ExecResult:
        """Run a shell command to completion or timeout; on timeout its whole process tree dies.
        `user`: as that user of the sandbox (None: its own); `env`: the command's variables beyond
        the sandbox's own (None: the tools' defaults). A backend that cannot do either raises
        SandboxError (unsupported())."""

    @abstractmethod
    async def spawn(self, command: str, *, cwd: str | None = None) -> Job:
        """Start a background shell command, stdout and stderr kept by the sandbox."""

    @abstractmethod
    async def read_file(self, path: str, *, max_bytes: int = READ_CAP, offset: int | None = None) -> bytes:
        """The bytes of a regular file. FileOpError (kind not_found, is_dir, not_regular,
        too_large...) or PathEscapeError/SymlinkError for what the model must change. With
        `offset`, at most `max_bytes` from that byte on (b"" past the end), never too_large: how a
        caller reads a large file in pieces without holding it (tools/read_lines.py)."""

    @abstractmethod
    async def write_file(self, path: str, data: bytes, *, how: str = "overwrite") -> str:
        """Write a regular file, parents created; how: overwrite | replace (atomic, mode kept,
        must exist) | new (never replaces: name-2.ext...). Returns the path written, relative to
        the workspace root it landed in. Errors as read_file."""

    @abstractmethod
    async def search(self, path: str, pattern: str, *, target: str = "content", glob: str | None = None,
                     limit: int = 50, max_file: int = 2 << 20, max_files: int = 50_000) -> tuple[list[str], bool]:
        """search_files (fsops.search) beneath `path`: (results, more exist). `pattern` must be
        a valid Python regex (checked by the caller). Errors as read_file."""

    @abstractmethod
    async def close(self) -> None:
        """Kill every process of this sample and remove the workspace (unless kept). Idempotent."""

    async def __aenter__(self) -> Sandbox:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def unsupported(backend: str, what: str) -> SandboxError:
    return SandboxError(f"the {backend} sandbox cannot {what}")


@dataclass(frozen=True, slots=True)
class SampleResources:
    """What one sample's sandbox gets instead of the run's limits (a task's [environment]); None: the run's."""

    memory: int | None = None  # bytes
    cpus: float | None = None
    disk: int | None = None  # bytes of its workspace disk
    network_none: bool = False  # no network at all
    seed: bool = True  # the image's content at cwd copied into the workspace first (False: it starts empty)


@dataclass(frozen=True, slots=True)
class Change:
    """One path of a sandbox's own filesystem that differs from its image: kind A(dded), C(hanged), D(eleted)."""

    kind: str
    path: str


@dataclass(frozen=True, slots=True)
class Copied:
    """What download_tree copied: bytes of the files kept, and files (and their bytes) left out past its limit."""

    kept: int
    left_out: int = 0
    left_out_bytes: int = 0


@dataclass(slots=True)
class Stopped:
    """What stopping a sandbox's processes found: how many it killed, and a note when something was
    wrong (its process limit reached: a fork bomb), in words for the record."""

    killed: int = 0
    note: str | None = None


class ImageSandbox(Sandbox):
    """A sandbox of an image, with the runner's own operations (task environments: the solution, the
    tests). Paths are the sandbox's own, unrestricted (no workspace bound); none of these runs a
    program of the sandbox's filesystem, so nothing a sample changed there takes part in them."""

    image: str

    @abstractmethod
    async def run(self, argv: Sequence[str], *, timeout: float, user: str | None = None,
                  env: Mapping[str, str] | None = None) -> ExecResult:
        """Program `argv` of the sandbox (a task's `bash /tests/test.sh`) in its working directory, as
        `user` (None: the image's USER) with `env`, and no shell of the sandbox in between (exec
        wraps commands in its `sh`); at the timeout, or cancelled, every process of the sample is
        stopped (stop_processes)."""

    @abstractmethod
    async def upload(self, source: Path, path: str) -> None:
        """Copy the contents of host directory `source` into the sandbox's directory `path`, made
        (with its parents) where missing."""

    @abstractmethod
    async def download(self, path: str, limit: int) -> bytes | None:
        """The bytes of the sandbox's regular file `path` (at most `limit`), a link never followed;
        None when there is none. ValueError when it is something else or larger than `limit`."""

    @abstractmethod
    async def download_tree(self, path: str, dest: Path, limit: int) -> Copied | None:
        """The tree at `path` into host directory `dest` (which must exist), the runner's, links
        copied as links and never followed, device files and FIFOs left out, files in the archive's
        order until `limit` bytes (those past it left out, and counted); None when there is no such
        directory."""

    @abstractmethod
    async def stop_processes(self) -> Stopped:
        """Kill every process in the sample's view but the sandbox's own (a backend's helpers there
        too: the tools' operations may fail after it), leaving the sandbox usable for the runner's
        next steps; checked from outside. SandboxError when they cannot all be stopped."""

    @abstractmethod
    async def fresh_dirs(self, dirs: Mapping[str, int]) -> None:
        """Remove each top-level path of `dirs` (absolute paths, keys) and make every one anew,
        empty, the sandbox root's, with its mode (values), then check it; no process of the sample
        may run (stop_processes first). SandboxError when that cannot be done."""

    @abstractmethod
    async def remove(self, path: str) -> None:
        """Remove the tree at absolute `path`, if any (no process of the sample may run)."""

    @abstractmethod
    async def changes(self, wanted: Callable[[str], bool]) -> list[Change] | None:
        """What differs in the sandbox's own filesystem from its image (its mounts aside), of the
        paths `wanted` accepts; None when the backend cannot tell."""


@dataclass(frozen=True, slots=True)
class ImageInfo:
    id: str
    workdir: str  # "" when the image sets none
    user: str  # "" when the image sets none (root)
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class BuildOutcome:
    ok: bool
    seconds: float
    message: str  # why it failed: the exit code or the timeout


class ImageStore(Protocol):
    """The images of a backend that runs them (its spec's `image_store`): what tasks' environments
    need to build, check and find them."""

    kind: str  # what keeps them, for messages ("podman")

    async def ensure(self, image: str) -> None:
        """Return once `image` is present (pulled if need be); SandboxError when it cannot be had."""

    async def inspect(self, image: str) -> ImageInfo | None:
        """The image's id, WORKDIR, USER and labels; None when there is no such image."""

    async def build(self, *, context: Path, tag: str, timeout: float, log: Path, labels: Mapping[str, str],
                    build_args: Mapping[str, str]) -> BuildOutcome:
        """Build `context`'s Dockerfile as `tag`, its whole output appended to `log`; stopped at `timeout` s."""

    async def images(self, label: str) -> list[tuple[str, ImageInfo]]:
        """(a name of it, its info) of every image carrying `label`."""

    async def remove(self, image: str) -> str | None:
        """Remove an image; why not, or None."""


class Provider(Protocol):
    """What a backend's `make(provider, ...)` may ask of the run-scoped provider
    (sandbox.factory.SandboxProvider): backends depend on this, never on the factory."""

    settings: SandboxSettings
    limits: Any  # process.Limits of the run's commands
    waiting: int  # sandboxes to be made on first use, not made yet, for samples not parked (lazy.py)

    def on_drain(self, hook: Callable[[], None]) -> None: ...

    def on_demand(self, hook: Callable[[], None]) -> None: ...

    async def state(self, key: str, factory: Callable[[], Awaitable[T]],
                    close: Callable[[T], Any] | None = None) -> T: ...

    # process.Limits and resources.ResourceLimits; named, not imported: both modules import this one.
    def command_limits(self, *, memory_cgroup: bool = False) -> Any: ...

    def sample_limits(self) -> Any: ...

    async def network_mode(self) -> NetworkMode: ...

    async def image_store(self) -> ImageStore: ...

    async def create(self, *, cwd: str | None, image: str | None, root: Path,
                     resources: SampleResources | None = None) -> Sandbox: ...


class BackendStatus(Protocol):
    """Whether a backend works here and why not (a spec's `status` target returns one): read by
    `--sandbox auto` (usable, detail) and by `doctor` (the rest)."""

    usable: bool
    detail: str  # what it is, or why it is not usable

    @property
    def uses(self) -> str:
        """What it runs samples with here (a path, an engine), for `doctor`."""

    def doctor_row(self) -> dict[str, Any]:
        """`doctor --json`'s fields of this backend."""

    def doctor_lines(self) -> list[str]:
        """`doctor`'s text of this backend: the rest of its own line, then lines beneath it."""

    def fix(self) -> str | None:
        """How to make it work when it is installed but broken here; None when it is usable, or
        missing (then its spec's `enable`, how to install it, is the way)."""


def raise_reply(reply: dict[str, Any]) -> None:
    """Raise what an error reply of the helper protocol (fsops.reply_of) stands for; nothing for a
    reply without one."""
    kind = reply.get("error")
    if kind is None:
        return
    msg = str(reply.get("msg", ""))
    if kind == "symlink":
        raise SymlinkError(str(reply.get("rel", "")), str(reply.get("link", "")))
    if kind == "escape":
        raise PathEscapeError(msg)
    raise FileOpError(str(kind), msg)
