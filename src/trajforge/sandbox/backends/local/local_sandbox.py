"""The local backend: a private host directory per sample, commands run as host processes.

This gives each sample its own workspace, clean environment, rlimits and guaranteed cleanup,
but no isolation from the host: shell commands can read anything the runner can. Only the file
operations are confined: fsops on the host, walking from the workspace with O_NOFOLLOW.

Path model: commands see the workspace at its host path (`workdir == str(workspace)`). The
row's `cwd` is created inside the workspace; an absolute `cwd` such as "/app" cannot exist on
the host for every sample, so it is mapped to `<workspace>/app`.

Processes cannot outlive the sample: every command joins the sample's cgroup (reaper.py) as its
first act, and close() kills the cgroup, which reaches `setsid env -i sleep 1000 &` too. Where
no cgroup can be made, the environment tag sweep (tagkill.kill_tagged) is the fallback.
Background output goes to an unlinked file only the runner holds.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import tempfile
from collections.abc import Mapping
from pathlib import Path

from trajforge.sandbox import workspace
from trajforge.sandbox.inside import fsops
from trajforge.sandbox.interface import (
    ExecResult,
    Job,
    LogChunk,
    Provider,
    Sandbox,
    SandboxError,
    unsupported,
)
from trajforge.sandbox.process import (
    DEFAULT_LIMITS,
    DEFAULT_OUTPUT_CAP,
    SHELL,
    Limits,
    bash_limits_prefix,
    clean_env,
    kill_group,
    make_preexec,
    run_argv,
)
from trajforge.sandbox.backends.local.joblog import LogRelay
from trajforge.sandbox.backends.local.reaper import Cgroups, SampleCgroup
from trajforge.sandbox.search_child import search_in_child
from trajforge.sandbox.host.tagkill import kill_tagged

TAG_VAR = "TRAJFORGE_SANDBOX"


class LocalSandbox(Sandbox):
    def __init__(
        self, root: Path, *, keep: bool = False, cwd: str | None = None,
        limits: Limits = DEFAULT_LIMITS, output_cap: int = DEFAULT_OUTPUT_CAP, cgroups: Cgroups | None = None,
    ) -> None:
        self.root = Path(root)
        self.keep = keep
        self._cwd_arg = cwd
        self._bash = os.path.basename(SHELL) == "bash"
        # bash sets the limits itself, so commands start with vfork (bash_limits_prefix says why).
        self._limits_prefix, self._preexec = (bash_limits_prefix(limits), None) if self._bash else ("", make_preexec(limits))
        self.output_cap = output_cap
        self._cgroups = cgroups
        self._cgroup: SampleCgroup | None = None
        self._jobs: list[LocalJob] = []
        self._tag = f"{TAG_VAR}={secrets.token_hex(8)}"
        self._started = False
        self.workspace: Path | None = None

    async def start(self) -> None:
        self.workspace, host_cwd = workspace.create(self.root, self._cwd_arg)
        self._started = True
        self.workdir, self.cwd = str(self.workspace), str(host_cwd)
        name, _, value = self._tag.partition("=")
        self.env = clean_env(self.workdir, {name: value})
        if self._cgroups is not None and self._bash:
            self._cgroup = self._cgroups.new()
        if self._cgroup is not None:  # the command's first act: join the sample's cgroup (no fork)
            self._limits_prefix = f"echo $$ > {self._cgroup.procs_file} || exit 126; " + self._limits_prefix

    def _host_cwd(self, cwd: str | None) -> str:
        if cwd:
            root, rel = fsops.locate(cwd, cwd=self.cwd, roots=[self.workdir], workdir=self.workdir)
            path = os.path.join(root, rel) if rel != "." else root
        else:
            path = self.cwd
        # The model may have deleted its own working directory; recreate it rather than fail.
        os.makedirs(path, exist_ok=True)
        return path

    async def exec(self, command: str, *, timeout: float, cwd: str | None = None, user: str | None = None,
                   env: Mapping[str, str] | None = None) -> ExecResult:
        self._check_open()
        if user is not None:
            raise unsupported("local", "run a command as another user")
        host_cwd = self._host_cwd(cwd)
        try:
            return await run_argv(
                [SHELL, "-c", self._limits_prefix + command], timeout=timeout, cwd=host_cwd,
                env=self.env if env is None else {**self.env, **env}, preexec_fn=self._preexec,
                output_cap=self.output_cap,
            )
        except OSError as e:
            if e.filename is not None and os.fsdecode(e.filename) == str(host_cwd):  # the sample's doing
                return ExecResult(None, "", "", start_error="the command could not start in its working "
                                  f"directory: {e.strerror or e}")
            raise SandboxError(f"cannot start a command: {e}") from e  # fork/exec failed: not the model's

    async def spawn(self, command: str, *, cwd: str | None = None) -> Job:
        self._check_open()
        log = anonymous_file()
        relay = LogRelay(log)  # the log is in the host's /tmp: capped (joblog.py)
        try:
            proc = await asyncio.create_subprocess_exec(
                SHELL, "-c", self._limits_prefix + command, stdin=asyncio.subprocess.DEVNULL, stdout=relay.job_end,
                stderr=asyncio.subprocess.STDOUT, cwd=self._host_cwd(cwd), env=self.env, start_new_session=True,
                preexec_fn=self._preexec)
        except OSError as e:
            relay.close()
            os.close(log)
            raise SandboxError(f"cannot start a background command: {e}") from e
        finally:
            os.close(relay.job_end)
        job = LocalJob(proc, log, relay)
        self._jobs.append(job)  # its log stays readable, and is closed, when the sample ends
        return job

    def _where(self, path: str) -> tuple[str, str]:
        self._check_open()
        return fsops.locate(path, cwd=self.cwd, roots=[self.workdir], workdir=self.workdir)

    async def read_file(self, path: str, *, max_bytes: int = 256 << 20, offset: int | None = None) -> bytes:
        return await asyncio.to_thread(fsops.read, *self._where(path), max_bytes, offset)

    async def write_file(self, path: str, data: bytes, *, how: str = "overwrite") -> str:
        return await asyncio.to_thread(fsops.write, *self._where(path), data, how)

    async def search(self, path: str, pattern: str, *, target: str = "content", glob: str | None = None,
                     limit: int = 50, max_file: int = 2 << 20, max_files: int = 50_000) -> tuple[list[str], bool]:
        root, rel = self._where(path)
        return await search_in_child({"root": root, "rel": rel, "shown": path, "pattern": pattern, "target": target,
                                      "glob": glob, "limit": limit, "max_file": max_file, "max_files": max_files})

    def _check_open(self) -> None:
        if not self._started:
            raise SandboxError("sandbox used before start() or after close()")

    async def close(self) -> None:
        """Kill, then delete; safe to repeat. Killing is synchronous and comes first so it
        happens even when close() runs in a `finally` of a cancelled task and is interrupted."""
        self._started = False
        if self.workspace is None:
            return
        for job in self._jobs:
            job.kill_now()
        if self._cgroup is not None:
            self._cgroup.kill()  # everything the sample started, wherever it went
        else:
            kill_tagged(self._tag)  # foreground leftovers and anything that left its group
        waits = [asyncio.ensure_future(j.proc.wait()) for j in self._jobs if j.proc.returncode is None]
        if waits:  # reap, bounded: a process stuck in the kernel must not hang the sample
            await asyncio.wait(waits, timeout=5)
        for job in self._jobs:
            job.forget()
        self._jobs.clear()
        if self._cgroup is not None:
            self._cgroup.remove()
            self._cgroup = None
        await (workspace.defuse if self.keep else workspace.remove)(self.workspace)


async def make(provider: Provider, *, cwd: str | None, image: str | None, root: Path) -> LocalSandbox:
    """The spec's target. Its spec offers the host network only: the provider refuses any other."""
    async def open_cgroups() -> Cgroups | None:
        return await asyncio.to_thread(Cgroups.open)

    cgroups = await provider.state("local.cgroups", open_cgroups, lambda c: c and c.close())
    return LocalSandbox(root, keep=provider.settings.keep_workspaces, cwd=cwd, limits=provider.limits, cgroups=cgroups)


def anonymous_file() -> int:
    """A read-write file no path leads to (the job's log): nothing can swap or read it but us."""
    tmp = tempfile.gettempdir()
    try:
        return os.open(tmp, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600)
    except (OSError, AttributeError):  # a filesystem without O_TMPFILE
        fd, name = tempfile.mkstemp(prefix="trajforge-job-")
        os.unlink(name)
        return fd


class LocalJob(Job):
    def __init__(self, proc: asyncio.subprocess.Process, log: int, relay: LogRelay | None = None) -> None:
        self.proc, self.pid, self._log, self._relay = proc, proc.pid, log, relay

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    async def wait(self, timeout: float | None = None) -> int | None:
        await asyncio.wait([asyncio.ensure_future(self.proc.wait())], timeout=timeout)
        if self._relay is not None:
            self._relay.pull()
        return self.proc.returncode

    def kill_now(self) -> None:
        if self.proc.returncode is None:  # unreaped leader: its pid cannot have been reused
            kill_group(self.proc)

    async def kill(self) -> None:
        self.kill_now()
        await self.wait(5)

    async def read(self, offset: int, cap: int) -> LogChunk:
        if self._log < 0:
            return LogChunk(b"", b"", 0, offset)
        if self._relay is not None:
            self._relay.pull()
        return await asyncio.to_thread(read_log, self._log, offset, cap)

    def forget(self) -> None:
        if self._relay is not None:
            self._relay.close()
        if self._log >= 0:
            os.close(self._log)
            self._log = -1


def read_log(fd: int, offset: int, cap: int) -> LogChunk:
    """From `offset` to the end of the log, head and tail halves when longer than `cap`."""
    size = os.fstat(fd).st_size
    if size - offset <= cap:
        return LogChunk(os.pread(fd, size - offset, offset), b"", 0, size)
    half = cap // 2
    return LogChunk(os.pread(fd, half, offset), os.pread(fd, half, size - half), size - offset - 2 * half, size)
