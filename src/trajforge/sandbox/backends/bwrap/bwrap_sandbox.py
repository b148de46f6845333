"""The bwrap backend: every sample in its own namespaces (`--sandbox bwrap`, the auto default).

Commands see a read-only host system (/usr, /etc, /opt and the /bin, /lib... links), the
sample's workspace read-write at /workspace, private sized /tmp and /dev/shm, a private /proc,
and new pid/ipc/uts (and, unless `--sandbox_network host`, network) namespaces. /root, /home, /var,
/run and the runner's files are simply not there. A row's absolute cwd (/app, /app/sub) is a
directory of the workspace that is also mounted at that path.

Each sample has one helper process inside (helper.py), spoken to over a socketpair (channel.py):
commands are spawned by it and file operations run in it, inside the sample's mount view, with
the sample's uid and no privilege, so there is no per-command entry chain and no file access
from the host. Two modes, because the kernel never enforces RLIMIT_NPROC for host uid 0:
- runner is root ("root" mode): the run's pool (sandbox_pool.py) makes sandboxes ahead of time, in the
  background: namespaces, cgroup (memory, CPU, processes), a workspace disk, and a first process
  that drops to a uid of the sandbox's own before the sample's first request (sandbox_init.py).
  A sample takes one at its first tool call and the sandbox is destroyed when the sample ends:
  nothing of it is ever another sample's. Fork bombs stop at the process limit, the sample
  cannot signal, ptrace or read its helper, and nothing of it outlives it. Egress goes through
  the run's router (router.py).
- runner is unprivileged ("user" mode): --unshare-all creates a user namespace and the helper is
  bwrap's command (--as-pid-1), started with a host interpreter visible inside (helper_python);
  the helper and the files are the user's own.
Both modes: background jobs share the sample's pid namespace and live until the sample closes.
`bwrap_argv` builds the whole command line (the one place to add options).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from trajforge.sandbox import workspace
from trajforge.sandbox.interface import ExecResult, Job, Sandbox, SandboxError, unsupported
from trajforge.sandbox.backends.bwrap.bwrap_layout import (
    NOT_FOUND, SYSTEM_DIRS, WORKSPACE, bwrap_argv, find_bwrap, host_layout, resolv_conf_target, sample_mounts,
    shell_config,
)
from trajforge.sandbox.backends.bwrap.bwrap_runtime import RootRuntime, root_runtime
from trajforge.sandbox.backends.bwrap.bwrap_start import START_TIMEOUT, chown_beneath, configure, helper_python, start_user, stop_holder
from trajforge.catalog.sandboxes import NetworkMode
from trajforge.sandbox.channel import HelperChannel
from trajforge.sandbox.host.cgroups import SampleGroup
from trajforge.sandbox.backends.bwrap.prepared import Prepared
from trajforge.sandbox.process import DEFAULT_LIMITS, DEFAULT_OUTPUT_CAP, Limits
from trajforge.sandbox.host.resources import ResourceLimits


class BwrapSandbox(Sandbox):
    """One sample: its workspace, its namespaces and the helper inside them (module doc)."""

    def __init__(
        self, root: Path, *, keep: bool = False, cwd: str | None = None, limits: Limits = DEFAULT_LIMITS,
        network: NetworkMode = NetworkMode.HOST, nproc: int | None = 512, bwrap: str | None = None,
        output_cap: int = DEFAULT_OUTPUT_CAP, runtime: RootRuntime | None = None,
        allow: Sequence[str] = (), sample_limits: ResourceLimits | None = None,
    ) -> None:
        """Without a `runtime` (tests, the probe), a root-mode sandbox starts one of its own."""
        self.root, self.keep, self._cwd_arg = Path(root), keep, cwd
        self.privileged = os.geteuid() == 0
        # RLIMIT_NPROC is per real uid: only meaningful with a uid of the sample's own (root mode).
        self.limits = replace(limits, nproc=nproc if self.privileged else limits.nproc)
        self.nproc = nproc
        # Egress needs the run's router, which only root can make: unprivileged, no network at all.
        self.network = network if self.privileged or network != NetworkMode.EGRESS else NetworkMode.NONE
        self.bwrap = bwrap or find_bwrap()
        self.output_cap = output_cap
        self.uid = os.getuid()  # root mode: the sandbox's own, once taken
        self.workspace: Path | None = None
        self.workdir = WORKSPACE
        self._holder: asyncio.subprocess.Process | None = None  # user mode: the sample's bwrap
        self._channel: HelperChannel | None = None
        self.allow = tuple(allow)
        self.sample_limits = sample_limits or ResourceLimits(memory=None, disk=None)
        self._runtime, self._own_runtime = runtime, False
        self._sandbox: Prepared | None = None  # root mode: the pool's sandbox this sample took

    @property
    def helper_pid(self) -> int:
        """Root mode: host pid of the sandbox's helper (the sample's pid 1)."""
        return self._sandbox.pid if self._sandbox is not None else 0

    @property
    def cgroup(self) -> SampleGroup | None:
        return self._sandbox.group if self._sandbox is not None else None

    def mounts(self, host_cwd: Path) -> tuple[dict[str, Path], str]:
        assert self.workspace is not None
        return sample_mounts(self.workspace, host_cwd, self._cwd_arg)

    async def start(self) -> None:
        if self.bwrap is None:
            raise SandboxError(NOT_FOUND)
        if self.privileged:
            await self._start_root()
        else:
            await self._start_user()

    async def _start_root(self) -> None:
        if self._runtime is None:  # no run provider (tests, the probe): a runtime of our own
            self._runtime = await root_runtime(self.bwrap, self.network, self.allow, self.sample_limits, self.nproc)
            self._own_runtime = True
        self._sandbox = sandbox = await self._runtime.pool(self.root).take()
        self.uid, self.workspace, self._channel = sandbox.uid, sandbox.workspace, sandbox.channel
        assert self._channel is not None
        self._channel.output_cap = self.output_cap
        # The workspace is fresh: nothing of any sample has been in it, so making the row's cwd
        # in it as root (and handing it to the sample's uid) follows nothing a sample made.
        host_cwd = workspace.cwd_in(sandbox.workspace, self._cwd_arg)
        chown_beneath(sandbox.workspace, host_cwd.relative_to(sandbox.workspace).parts, self.uid)
        points, self.cwd = self.mounts(host_cwd)
        aliases = [(inside, _inside(host.relative_to(sandbox.workspace).as_posix()))
                   for inside, host in sorted(points.items(), key=lambda p: len(p[0])) if inside != WORKSPACE]
        begin = {"op": "begin", "uid": self.uid, "gid": self.uid, "aliases": aliases,
                 **self._helper_config(sorted(points))}
        try:
            async with asyncio.timeout(START_TIMEOUT):
                reply, _ = await self._channel.call(begin)
        except TimeoutError:
            raise SandboxError(f"the sandbox helper did not set up the sample within {START_TIMEOUT:g}s") from None
        except (SandboxError, OSError, ValueError) as e:
            raise SandboxError(f"the sandbox helper could not set up the sample: {e}") from None
        if reply.get("uid") != self.uid:
            raise SandboxError(f"the sandbox helper runs as uid {reply.get('uid')}, not {self.uid}")

    async def _start_user(self) -> None:
        self.workspace, host_cwd = workspace.create(self.root, self._cwd_arg)
        points, self.cwd = self.mounts(host_cwd)
        python, python_ro = helper_python(SYSTEM_DIRS)
        argv = bwrap_argv(
            self.bwrap or "bwrap", layout=host_layout(),
            binds=sorted(((h, p) for p, h in points.items()), key=lambda b: len(b[1])),
            chdir="/", network=self.network == NetworkMode.HOST, privileged=False, extra_ro=[*resolv_conf_target(), *python_ro],
            tmp_size=self.sample_limits.tmp_size, shm_size=self.sample_limits.shm_size)
        self._holder, self._channel = await start_user(argv, python, output_cap=self.output_cap)
        # No cgroup for an unprivileged runner: commands yield the CPU to the host (doctor says so).
        await configure(self._channel, self._holder, {**self._helper_config(sorted(points)), "nice": 10})

    def _helper_config(self, roots: list[str]) -> dict[str, object]:
        return {"cwd": self.cwd, "roots": roots, **shell_config(self.limits)}

    def _live(self) -> HelperChannel:
        if self._channel is None:
            raise SandboxError("sandbox used before start() or after close()")
        gone = self._holder.returncode is not None if self._holder is not None else \
            self._sandbox is not None and not self._sandbox.alive
        if self._channel.broken or gone:
            raise SandboxError("the bwrap sandbox of this sample is gone")
        return self._channel

    async def exec(self, command: str, *, timeout: float, cwd: str | None = None, user: str | None = None,
                   env: Mapping[str, str] | None = None) -> ExecResult:
        if user is not None or env is not None:  # its helper runs commands as the sample, with the sample's variables
            raise unsupported("bwrap", "run a command as another user or with variables of its own")
        res = await self._live().exec(command, timeout=timeout, cwd=cwd)
        if self._sandbox is not None:  # a hit limit ends the sample (SandboxError)
            self._sandbox.check(self.sample_limits)
        return res

    async def spawn(self, command: str, *, cwd: str | None = None) -> Job:
        return await self._live().spawn(command, cwd=cwd)

    async def read_file(self, path: str, *, max_bytes: int = 256 << 20, offset: int | None = None) -> bytes:
        return await self._live().read_file(path, max_bytes, offset)

    async def write_file(self, path: str, data: bytes, *, how: str = "overwrite") -> str:
        return await self._live().write_file(path, data, how)

    async def search(self, path: str, pattern: str, *, target: str = "content", glob: str | None = None,
                     limit: int = 50, max_file: int = 2 << 20, max_files: int = 50_000) -> tuple[list[str], bool]:
        return await self._live().search(path, pattern, target=target, glob=glob, limit=limit, max_file=max_file,
                                         max_files=max_files)

    async def close(self) -> None:
        try:
            # The helper exits when its channel closes, and as the pid namespace's init it takes
            # every process of the sample with it.
            channel, self._channel = self._channel, None
            if channel is not None:
                channel.close()
            if self.privileged:
                await self._close_root()
            else:
                await self._close_user()
        finally:
            if self._own_runtime and self._runtime is not None:
                runtime, self._runtime = self._runtime, None
                await runtime.aclose()

    async def _close_root(self) -> None:
        sandbox, self._sandbox = self._sandbox, None
        if sandbox is None or self._runtime is None:
            return
        kept = await self._runtime.pool(self.root).end(sandbox, keep=self.keep)
        if kept is not None:
            self.workspace = kept
            await workspace.defuse(kept)

    async def _close_user(self) -> None:
        holder, self._holder = self._holder, None
        if holder is not None:
            await stop_holder(holder)
        if self.workspace is not None:
            await (workspace.defuse if self.keep else workspace.remove)(self.workspace)


def _inside(rel: str) -> str:
    """A directory of the workspace as the sandbox sees it."""
    return WORKSPACE if rel == "." else f"{WORKSPACE}/{rel}"
