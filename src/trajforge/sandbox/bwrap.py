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
`bwrap_argv` builds the whole command line (the one place to add options).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import os
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TypeVar


from trajforge.sandbox import workspace
from trajforge.sandbox.base import ExecResult, Job, Sandbox, SandboxError
from trajforge.sandbox.bwrap_layout import (
    NOT_FOUND, SYSTEM_DIRS, WORKSPACE, bwrap_argv, find_bwrap, host_layout, resolv_conf_target, sample_mounts,
    shell_config,
)
from trajforge.sandbox.bwrap_root import RootRuntime, root_runtime
from trajforge.sandbox.bwrap_start import (
    START_TIMEOUT, chown_beneath, configure, helper_python, start_user, stop_holder,
)
from trajforge.sandbox.channel import HelperChannel, SlotIdle
from trajforge.sandbox.process import DEFAULT_LIMITS, DEFAULT_OUTPUT_CAP, Limits
from trajforge.sandbox.resources import MemoryGroup, SampleLimits
from trajforge.sandbox.slot import Slot
from trajforge.sandbox.slots import SlotPool

# Sandbox uids (root mode) come from a range no real account uses.
_UID_BASE, _UID_SPAN = 1_800_000_000, 200_000_000
_TOKENS = itertools.count(1)  # one per sample in a slot: a slot helper serves only the current one
T = TypeVar("T")


class BwrapSandbox(Sandbox):
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

    @property
    def memory_group(self) -> MemoryGroup | None:
        return self._slot.memory if self._slot is not None else None

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

    def _slot_pool(self) -> SlotPool:
        if self._pool is None:
            assert self._runtime is not None
            self._pool = self._runtime.pool(self.root)
        return self._pool

    async def _take_slot(self) -> None:
        self._slot = slot = await self._slot_pool().acquire()
        self.helper_pid, self._exited = slot.helper_pid, slot.exited
        self.workspace, host_cwd = workspace.create_fresh(slot.workspaces, self._cwd_arg)
        points, self.cwd = self.mounts(host_cwd)
        # The sample's uid is the helper's for this sample: hand it its directories.
        chown_beneath(self.workspace, host_cwd.relative_to(self.workspace).parts, self.uid)
        assert slot.channel is not None
        self._channel = slot.channel
        self._channel.output_cap = self.output_cap
        self._channel.token = next(_TOKENS)  # on this sample's every request (channel.py)
        lim = self.sample_limits
        begin = {"op": "begin", "uid": self.uid, "tmp": lim.tmp_size, "shm": lim.shm_size,
                 "mounts": [(inside, str(host)) for inside, host in sorted(points.items(), key=lambda p: len(p[0]))],
                 **self._helper_config(sorted(points))}
        try:
            async with asyncio.timeout(START_TIMEOUT):
                reply, _ = await self._channel.call(begin)
        except TimeoutError:
            raise SandboxError(f"the sandbox helper did not set up the sample within {START_TIMEOUT:g}s") from None
        except (SandboxError, OSError) as e:
            raise SandboxError(f"the sandbox helper could not set up the sample: {e}") from None
        self._begun = True
        if reply.get("uid") != self.uid:
            raise SandboxError(f"the sandbox helper runs as uid {reply.get('uid')}, not {self.uid}")

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

    @contextlib.asynccontextmanager
    async def _op(self) -> AsyncIterator[HelperChannel]:
        """The channel for one operation, counted in `_busy` while it runs; a parked sample takes
        a slot again first (one caller does, the others wait for it)."""
        if self._parked or self._gate.locked():
            async with self._gate:
                if self._parked:
                    self._parked = False
                    self._slot_pool().parked -= 1
                    await self._take_slot()
        channel = self._live()
        self._busy += 1
        try:
            yield channel
        finally:
            self._busy -= 1

    async def _call(self, fn: Callable[[HelperChannel], Awaitable[T]]) -> T:
        """One operation; refused because the sample parked meanwhile (a command run with `park`
        ended before the helper read this request: SlotIdle, nothing done), run again on its next slot."""
        try:
            async with self._op() as channel:
                return await fn(channel)
        except SlotIdle:
            if self._parking is not None:
                await asyncio.shield(self._parking)
        async with self._op() as channel:
            return await fn(channel)

    async def exec(self, command: str, *, timeout: float, cwd: str | None = None) -> ExecResult:
        return await self._call(functools.partial(self._exec, command, timeout, cwd))

    async def _exec(self, command: str, timeout: float, cwd: str | None, channel: HelperChannel) -> ExecResult:
        # The only operation in progress: the helper may end the sample after it (module doc).
        park = self._parkable and self._busy == 1
        if not park:
            res = (await channel.run(command, timeout=timeout, cwd=cwd))[0]
            self._check()
            return res
        self._parking = parking = asyncio.get_running_loop().create_future()
        self._parkable = False  # once: a sample back for more keeps the slot it takes next
        release = None
        try:
            res, parked, clean = await channel.run(command, timeout=timeout, cwd=cwd, park=True)
            self._check(parked)
            if parked:
                release = self._parked_now(clean)
        finally:
            self._parking = None
            parking.set_result(None)
        if release is not None:
            await asyncio.shield(release)
        return res

    def _check(self, parked: bool = False) -> None:
        if self._slot is not None:  # a hit limit ends the sample (SandboxError)
            self._slot.check(self.sample_limits, self.helper_pid, parked=parked)

    def _parked_now(self, clean: bool) -> asyncio.Task[Path | None]:
        """The helper ended the sample, which left nothing: its slot goes back to the pool."""
        slot = self._slot
        assert slot is not None
        self._slot, self._channel, self._begun, self._exited = None, None, False, None
        ws, self.workspace = self.workspace, None
        pool = self._slot_pool()
        self._parked = True
        pool.parked += 1
        task = asyncio.ensure_future(pool.release(slot, ws, keep=False, clean_exit=clean))
        self._releasing.add(task)
        task.add_done_callback(self._releasing.discard)
        return task

    async def spawn(self, command: str, *, cwd: str | None = None) -> Job:
        self._parkable = False  # the job's process and its log are the sample's until it ends
        return await self._call(lambda channel: channel.spawn(command, cwd=cwd))

    async def read_file(self, path: str, *, max_bytes: int = 256 << 20) -> bytes:
        return await self._call(lambda channel: channel.read_file(path, max_bytes))

    async def write_file(self, path: str, data: bytes, *, how: str = "overwrite") -> str:
        return await self._call(lambda channel: channel.write_file(path, data, how))

    async def search(self, path: str, pattern: str, *, target: str = "content", glob: str | None = None,
                     limit: int = 50, max_file: int = 2 << 20, max_files: int = 50_000) -> tuple[list[str], bool]:
        return await self._call(lambda channel: channel.search(
            path, pattern, target=target, glob=glob, limit=limit, max_file=max_file, max_files=max_files))

    async def close(self) -> None:
        try:
            if self.privileged:
                async with self._gate:  # a parked sample taking a slot again finishes first
                    if self._releasing:
                        await asyncio.gather(*self._releasing, return_exceptions=True)
                    channel, self._channel = self._channel, None
                    if self._parked and self._runtime is not None:
                        self._parked = False
                        self._slot_pool().parked_closed()
                    self._parkable = False
                    await self._close_root(channel)
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

    async def _close_root(self, channel: HelperChannel | None) -> None:
        slot, self._slot = self._slot, None
        if slot is None or self._runtime is None:
            return
        clean = False
        if channel is not None and self._begun:
            self._begun = False
            try:  # every process of the sample killed, its namespaces left (slot_helper.op_end)
                async with asyncio.timeout(15):
                    reply, _ = await asyncio.shield(channel.call({"op": "end"}))
                clean = reply.get("clean") is True
            except (TimeoutError, SandboxError, OSError):
                clean = False
        kept = await self._slot_pool().release(slot, self.workspace, keep=self.keep, clean_exit=clean)
        if kept is not None:
            self.workspace = kept

    async def _close_user(self) -> None:
        holder, self._holder = self._holder, None
        if holder is not None:
            await stop_holder(holder)
        if self.workspace is not None and not self.keep:
            await workspace.remove(self.workspace)
