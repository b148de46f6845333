"""The local backend: a private host directory per sample, commands run as host processes.

This gives each sample its own workspace, clean environment, rlimits and guaranteed cleanup,
but no isolation from the host: shell commands can read anything the runner can. Only the file
tools are confined (`resolve`). Use the bwrap or container backend for real isolation.

Path model: commands see the workspace at its host path (`workdir == str(workspace)`). The
row's `cwd` is created inside the workspace; an absolute `cwd` such as "/app" cannot exist on
the host for every sample, so it is mapped to `<workspace>/app`.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import stat
import sys
import tempfile
from pathlib import Path

from trajforge.sandbox.base import ExecResult, PathEscapeError, Sandbox, SandboxError, check_model_path
from trajforge.sandbox.process import (
    DEFAULT_LIMITS, DEFAULT_OUTPUT_CAP, SAFE_PATH, Limits, bash_limits_prefix, clean_env, kill_group,
    kill_tagged, make_preexec, run_argv, spawn_argv,
)

TAG_VAR = "TRAJFORGE_SANDBOX"
_SHELL = shutil.which("bash", path=SAFE_PATH) or "/bin/sh"


class LocalSandbox(Sandbox):
    # Processes here share the runner's pid namespace, so close() must hunt escaped ones by their
    # environment tag; backends whose processes die with their own pid namespace turn this off.
    sweeps_escaped_processes = True

    def __init__(
        self, root: Path, *, keep: bool = False, cwd: str | None = None,
        limits: Limits = DEFAULT_LIMITS, output_cap: int = DEFAULT_OUTPUT_CAP,
    ) -> None:
        self.root = Path(root)
        self.keep = keep
        self._cwd_arg = cwd
        # bash sets the limits itself, so commands start with vfork (bash_limits_prefix says why).
        if os.path.basename(_SHELL) == "bash":
            self._limits_prefix, self._preexec = bash_limits_prefix(limits), None
        else:
            self._limits_prefix, self._preexec = "", make_preexec(limits)
        self.output_cap = output_cap
        self._jobs: list[asyncio.subprocess.Process] = []
        self._tag = f"{TAG_VAR}={secrets.token_hex(8)}"
        self._started = False

    async def start(self) -> None:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            # resolve(): the real path, so containment checks compare like with like.
            self.workspace = Path(tempfile.mkdtemp(prefix="sample-", dir=self.root)).resolve()
        except OSError as e:
            raise SandboxError(f"cannot create a workspace under {self.root}: {e}") from e
        self._started = True
        self.workdir = str(self.workspace)
        rel = (self._cwd_arg or "").lstrip("/")
        cwd = Path(os.path.normpath(self.workspace / rel)) if rel else self.workspace
        if not cwd.is_relative_to(self.workspace):
            raise SandboxError(f"task cwd {self._cwd_arg!r} points outside the workspace")
        self.cwd = cwd
        self.cwd.mkdir(parents=True, exist_ok=True)
        name, _, value = self._tag.partition("=")
        self.env = clean_env(self.workdir, {name: value})

    def _host_cwd(self, cwd: str | None) -> Path:
        path = self.resolve(cwd) if cwd else self.cwd
        # The model may have deleted its own working directory; recreate it rather than fail.
        path.mkdir(parents=True, exist_ok=True)
        return path

    async def exec(self, command: str, *, timeout: float, cwd: str | None = None) -> ExecResult:
        self._check_open()
        host_cwd = self._host_cwd(cwd)
        try:
            return await run_argv(
                [_SHELL, "-c", self._limits_prefix + command], timeout=timeout, cwd=host_cwd,
                env=self.env, preexec_fn=self._preexec, output_cap=self.output_cap,
            )
        except OSError as e:
            if e.filename is not None and os.fsdecode(e.filename) == str(host_cwd):  # the sample's doing
                return ExecResult(None, "", "", start_error="the command could not start in its working "
                                  f"directory: {e.strerror or e}")
            raise SandboxError(f"cannot start a command: {e}") from e  # fork/exec failed: not the model's

    async def spawn(self, command: str, *, cwd: str | None = None, log_path: Path) -> asyncio.subprocess.Process:
        self._check_open()
        try:
            proc = await spawn_argv(
                [_SHELL, "-c", self._limits_prefix + command], cwd=self._host_cwd(cwd), env=self.env,
                log_path=log_path, preexec_fn=self._preexec,
            )
        except OSError as e:
            raise SandboxError(f"cannot start a background command: {e}") from e
        self._jobs = [p for p in self._jobs if p.returncode is None]
        self._jobs.append(proc)
        return proc

    def resolve(self, path: str) -> Path:
        self._check_open()
        path = check_model_path(path)
        if path == "~" or path.startswith("~/"):  # HOME is the workspace
            path = self.workdir + path[1:]
        # realpath follows every symlink (dangling ones as far as they go), so a link
        # pointing outside resolves outside and is refused.
        real = Path(os.path.realpath(self.cwd / path))
        if not real.is_relative_to(self.workspace):
            raise PathEscapeError(
                f"{path!r} is outside the workspace {self.workdir}; use a path relative to "
                f"the working directory {self.cwd} or an absolute path inside the workspace"
            )
        return real

    def _check_open(self) -> None:
        if not self._started:
            raise SandboxError("sandbox used before start() or after close()")

    async def close(self) -> None:
        """Kill, then delete; safe to repeat. Killing is synchronous and comes first so it
        happens even when close() runs in a `finally` of a cancelled task and is interrupted."""
        self._started = False
        if not hasattr(self, "workspace"):
            return
        for proc in self._jobs:
            if proc.returncode is None:  # unreaped leader: its pid cannot have been reused
                kill_group(proc)
        if self.sweeps_escaped_processes:
            kill_tagged(self._tag)  # foreground leftovers and anything that left its group
        waits = [asyncio.ensure_future(p.wait()) for p in self._jobs if p.returncode is None]
        if waits:  # reap, bounded: a process stuck in the kernel must not hang the sample
            await asyncio.wait(waits, timeout=5)
        self._jobs.clear()
        if not self.keep and not _remove_if_flat(self.workspace):
            await asyncio.to_thread(_remove_tree, self.workspace)


def _remove_if_flat(root: Path, most: int = 16) -> bool:
    """Remove a workspace holding at most `most` plain files, on the spot; False if it holds more,
    has subdirectories or resists. Such a removal takes tens of µs, less than the thread hop it
    saves, and cannot stall the event loop; anything larger goes to a thread."""
    try:
        with os.scandir(root) as it:
            entries = [e for _, e in zip(range(most + 1), it)]
        if len(entries) > most or any(e.is_dir(follow_symlinks=False) for e in entries):
            return False
        for e in entries:
            os.unlink(e.path)
        os.rmdir(root)
    except FileNotFoundError:
        return not root.exists()
    except OSError:  # read-only directory and the like: _remove_tree knows how
        return False
    return True


def _remove_tree(root: Path) -> None:
    def force(func, path, exc) -> None:  # type: ignore[no-untyped-def]
        """Files the model made read-only: make the parent writable and retry once."""
        exc = exc[1] if isinstance(exc, tuple) else exc  # onerror passes exc_info
        if not isinstance(exc, PermissionError) or Path(path) == root:
            return
        try:
            os.chmod(os.path.dirname(path), stat.S_IRWXU)
            func(path)
        except OSError:
            pass

    if not root.exists():
        return
    if sys.version_info >= (3, 12):
        shutil.rmtree(root, onexc=force)
    else:
        shutil.rmtree(root, onerror=force)
