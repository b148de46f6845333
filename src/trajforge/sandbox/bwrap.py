"""The bwrap backend: every sample in its own namespaces (`--sandbox bwrap`, the auto default).

Commands see a read-only host system (/usr, /etc, /opt and the /bin, /lib... links), the
sample's workspace read-write at /workspace, private sized /tmp and /dev/shm, a private /proc,
and new pid/ipc/uts (and, unless `--sandbox_network host`, network) namespaces. /root, /home, /var,
/run and the runner's files are simply not there. A row's absolute cwd (/app, /app/sub) is a
directory of the workspace that is also mounted at that path.

Each sample has one helper process inside (helper.py), spoken to over a socketpair (channel.py):
commands are spawned by it and file operations run in it, inside the sample's mount view, so
there is no per-command entry chain and no file access from the host. Two modes, because the
kernel never enforces RLIMIT_NPROC for host uid 0:
- runner is root ("root" mode): a sample takes a slot (slots.py, bwrap_root.py): a warm helper,
  the init of the slot's pid namespace, with the slot's network namespace, memory cgroup,
  workspace disk and mount namespace. The sample gets its workspace mounted in, /tmp, /dev/shm
  and IPC renewed if the previous sample left anything there, and a uid of its own, the
  helper's real and effective uid while it runs (slot_helper.py). Fork bombs stop at the process
  limit, the sample cannot signal, ptrace or read the helper, and nothing of it outlives it.
  Egress goes through the run's router (router.py); the limits of resources.py hold.
  Parking (the run's sandboxes unless workspaces are kept): a sample's first command, run while
  nothing else of it is in progress, goes with `park`; if the sample then holds nothing in its
  sandbox (no process or job, its workspace as made, /tmp, /dev/shm and IPC empty:
  after_command in slot_helper.py) the helper ends it and the slot goes back to the pool; the
  sample takes one again, with the same uid and cwd, at its next operation, and cannot tell the
  two apart. So a burst of samples waiting for their model after one command shares far
  fewer slots than there are samples. Only the first command parks: a sample back for more keeps the slot it takes (moving
  costs a sample's set-up, ~1 ms of CPU, per move).
- runner is unprivileged ("user" mode): --unshare-all creates a user namespace and the helper is
  bwrap's command (--as-pid-1), started with a host interpreter visible inside (helper_python);
  the helper and the files are the user's own.
Both modes: background jobs share the sample's pid namespace and live until the sample closes.
`bwrap_argv` builds the whole command line (the one place to add options). Root mode's slot and
parking, the sample's side, are bwrap_slotted.SlottedSample, which this class mixes in.
"""

from __future__ import annotations

import asyncio
import functools
import os
import secrets
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from trajforge.sandbox import workspace
from trajforge.sandbox.base import ExecResult, Job, Sandbox, SandboxError
from trajforge.sandbox.bwrap_layout import (
    NOT_FOUND, SYSTEM_DIRS, WORKSPACE, bwrap_argv, find_bwrap, host_layout, resolv_conf_target, sample_mounts,
    shell_config,
)
from trajforge.sandbox.bwrap_root import RootRuntime, root_runtime
from trajforge.sandbox.bwrap_slotted import SlottedSample
from trajforge.sandbox.bwrap_start import configure, helper_python, start_user, stop_holder
from trajforge.sandbox.channel import HelperChannel
from trajforge.sandbox.process import DEFAULT_LIMITS, DEFAULT_OUTPUT_CAP, Limits
from trajforge.sandbox.resources import SampleLimits
from trajforge.sandbox.slot import Slot
from trajforge.sandbox.slots import SlotPool

# Sandbox uids (root mode) come from a range no real account uses.
_UID_BASE, _UID_SPAN = 1_800_000_000, 200_000_000


class BwrapSandbox(SlottedSample, Sandbox):
    """One sample: its workspace, its namespaces and the helper inside them (module doc)."""

    def __init__(
        self, root: Path, *, keep: bool = False, cwd: str | None = None, limits: Limits = DEFAULT_LIMITS,
        network: bool = True, nproc: int | None = 512, bwrap: str | None = None,
        output_cap: int = DEFAULT_OUTPUT_CAP, runtime: RootRuntime | None = None, egress: bool = False,
        allow: Sequence[str] = (), sample_limits: SampleLimits | None = None, park: bool = False,
    ) -> None:
        """Without a `runtime` (tests, the probe), a root-mode sandbox starts one of its own."""
        self.root, self.keep, self._cwd_arg = Path(root), keep, cwd
        self.privileged = os.geteuid() == 0
        # RLIMIT_NPROC is per real uid: only meaningful with a uid of the sample's own (root mode).
        self.limits = replace(limits, nproc=nproc if self.privileged else limits.nproc)
        self.network = network
        self.bwrap = bwrap or find_bwrap()
        self.output_cap = output_cap
        self.uid = _UID_BASE + secrets.randbelow(_UID_SPAN) if self.privileged else os.getuid()
        self.workspace: Path | None = None
        self.workdir = WORKSPACE
        self._holder: asyncio.subprocess.Process | None = None  # user mode: the sample's bwrap
        self._channel: HelperChannel | None = None
        self.egress, self.allow = egress and self.privileged, tuple(allow)
        self.sample_limits = sample_limits or SampleLimits(memory=None, disk=None)
        self._runtime, self._own_runtime = runtime, False
        self._slot: Slot | None = None
        self.helper_pid = 0  # root mode: host pid of the slot's helper (the sample's pid 1)
        self._exited: asyncio.Future[int] | None = None
        self._begun = False
        # Parking (module doc): its first command only, unless it starts a job before.
        self._parkable = park and self.privileged and not keep
        self._parked = False
        self._busy = 0  # operations in progress: a sample parks only between them
        self._gate = asyncio.Lock()  # held while a parked sample takes a slot again
        self._parking: asyncio.Future[None] | None = None  # a command run with `park` in progress
        self._releasing: set[asyncio.Task[Path | None]] = set()  # slots given back as the sample parked
        self._pool: SlotPool | None = None

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
            mode = "egress" if self.egress else "host" if self.network else "none"
            self._runtime = await root_runtime(self.bwrap, mode, self.allow, self.sample_limits)
            self._own_runtime = True
        await self._take_slot()

    async def _start_user(self) -> None:
        self.workspace, host_cwd = workspace.create(self.root, self._cwd_arg)
        points, self.cwd = self.mounts(host_cwd)
        python, python_ro = helper_python(SYSTEM_DIRS)
        argv = bwrap_argv(
            self.bwrap or "bwrap", layout=host_layout(),
            binds=sorted(((h, p) for p, h in points.items()), key=lambda b: len(b[1])),
            chdir="/", network=self.network, privileged=False, extra_ro=[*resolv_conf_target(), *python_ro],
            tmp_size=self.sample_limits.tmp_size, shm_size=self.sample_limits.shm_size)
        self._holder, self._channel = await start_user(argv, python, output_cap=self.output_cap)
        await configure(self._channel, self._holder, self._helper_config(sorted(points)))

    def _helper_config(self, roots: list[str]) -> dict[str, object]:
        return {"cwd": self.cwd, "roots": roots, **shell_config(self.limits)}

    def _live(self) -> HelperChannel:
        if self._channel is None:
            raise SandboxError("sandbox used before start() or after close()")
        gone = self._holder.returncode is not None if self._holder is not None else \
            self._exited is not None and self._exited.done()
        if self._channel.broken or gone:
            raise SandboxError("the bwrap sandbox of this sample is gone")
        return self._channel

    async def exec(self, command: str, *, timeout: float, cwd: str | None = None) -> ExecResult:
        return await self._call(functools.partial(self._exec, command, timeout, cwd))

    async def spawn(self, command: str, *, cwd: str | None = None) -> Job:
        self._parkable = False  # the job's process and its log are the sample's until it ends
        return await self._call(lambda channel: channel.spawn(command, cwd=cwd))

    async def read_file(self, path: str, *, max_bytes: int = 256 << 20, offset: int | None = None) -> bytes:
        return await self._call(lambda channel: channel.read_file(path, max_bytes, offset))

    async def write_file(self, path: str, data: bytes, *, how: str = "overwrite") -> str:
        return await self._call(lambda channel: channel.write_file(path, data, how))

    async def search(self, path: str, pattern: str, *, target: str = "content", glob: str | None = None,
                     limit: int = 50, max_file: int = 2 << 20, max_files: int = 50_000) -> tuple[list[str], bool]:
        return await self._call(lambda channel: channel.search(
            path, pattern, target=target, glob=glob, limit=limit, max_file=max_file, max_files=max_files))

    async def close(self) -> None:
        try:
            if self.privileged:
                await self._close_slotted()
            else:
                # The helper exits when its channel closes, and as the pid namespace's init it
                # takes every process of the sample with it.
                channel, self._channel = self._channel, None
                if channel is not None:
                    channel.close()
                await self._close_user()
        finally:
            if self._own_runtime and self._runtime is not None:
                runtime, self._runtime = self._runtime, None
                await runtime.aclose()

    async def _close_user(self) -> None:
        holder, self._holder = self._holder, None
        if holder is not None:
            await stop_holder(holder)
        if self.workspace is not None:
            await (workspace.defuse if self.keep else workspace.remove)(self.workspace)
