"""The Sandbox interface every tool goes through.

A sandbox is one sample's isolated environment: a private host directory (`workspace`) that
commands see at `workdir`, a way to run commands in it (foreground with a timeout, or in the
background), path resolution that refuses escapes, and `close()` that kills every process the
sample started and removes the workspace. Backends: local, bwrap, container.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path


class SandboxError(Exception):
    """The sandbox could not be created or broke (infrastructure): the sample fails as `sandbox`."""


class PathEscapeError(ValueError):
    """A path given by the model points outside the workspace; returned to the model as an error."""


def check_model_path(path: object) -> str:
    """The first check of every model-given path, before any backend maps it."""
    if not isinstance(path, str) or not path.strip():
        raise PathEscapeError("path must be a non-empty string")
    if "\0" in path:
        raise PathEscapeError("path contains a NUL byte")
    return path


@dataclass(slots=True)
class ExecResult:
    exit_code: int | None  # None when killed by the timeout
    stdout: str
    stderr: str
    timed_out: bool = False
    truncated: bool = False
    # The command never ran: its shell could not enter the working directory (a failed tool call).
    start_error: str | None = None


class Sandbox(ABC):
    workspace: Path  # host path of the sample's writable directory
    workdir: str  # the same directory as commands inside the sandbox see it

    @abstractmethod
    async def start(self) -> None:
        """Create the environment (directory, container...). Raises SandboxError."""

    @abstractmethod
    async def exec(self, command: str, *, timeout: float, cwd: str | None = None) -> ExecResult:
        """Run a shell command to completion or timeout; on timeout its whole process tree dies."""

    @abstractmethod
    async def spawn(self, command: str, *, cwd: str | None = None, log_path: Path) -> asyncio.subprocess.Process:
        """Start a background shell command writing stdout+stderr to `log_path` (host path)."""

    @abstractmethod
    def resolve(self, path: str) -> Path:
        """Map a model-given path (relative to the cwd, or absolute as seen inside) to a host path
        inside the workspace; raise PathEscapeError for anything outside, symlinks included."""

    @abstractmethod
    async def close(self) -> None:
        """Kill every process of this sample and remove the workspace (unless kept). Idempotent."""

    async def __aenter__(self) -> Sandbox:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
