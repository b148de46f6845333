"""The Sandbox interface: every operation a tool performs on a sample's environment.

A sandbox is one sample's isolated environment. Tools never see a host path: they run commands
(foreground with a timeout, or background `Job`s whose output the sandbox keeps), and read,
write and search files, always with paths as the sample sees them (relative to `cwd`, `~/...`,
or absolute under `workdir`). Each backend decides where that happens: the local one on the
host through an O_NOFOLLOW walk, bwrap through a helper inside the sample's namespaces,
containers inside the container. `close()` kills every process the sample started and removes
its workspace. Backends are declared in trajforge.catalog.sandboxes (SANDBOXES) and made by the
run's provider (sandbox/factory.py).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from trajforge.errors import SampleFailure
from trajforge.sandbox.inside.fsops import FileOpError, check_model_path
from trajforge.sandbox.inside.safe_fs import PathEscapeError, SymlinkError

if TYPE_CHECKING:
    from trajforge.catalog.sandboxes import NetworkMode
    from trajforge.sandbox.sandbox_settings import SandboxSettings

T = TypeVar("T")

__all__ = ["ExecResult", "FileOpError", "Job", "LogChunk", "PathEscapeError", "Sandbox", "SandboxError",
           "SymlinkError", "check_model_path", "raise_reply"]

READ_CAP = 256 << 20  # the largest file a tool may ask for


class SandboxError(SampleFailure):
    """The sandbox could not be created or broke (infrastructure): the sample fails as `sandbox`."""

    failure_class = "sandbox"


class SandboxLimitError(SandboxError):
    """The sample hit one of its own limits (memory, /tmp, /dev/shm, its workspace disk). Another
    attempt would most likely hit it again, so it is not retried in-run unless asked."""


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
    async def exec(self, command: str, *, timeout: float, cwd: str | None = None) -> ExecResult:
        """Run a shell command to completion or timeout; on timeout its whole process tree dies."""

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
