"""Slots of the root-mode bwrap runtime: what is costly to make, reused one sample after another.

A slot is a warm helper process (slot_helper.py: pid 1 of the slot's pid namespace, forked once
by the zygote) with its network namespace (zygote.op_netns; in egress mode wired to the run's
router), its memory cgroup (resources.MemoryGroup) and its workspace disk (a copy of the pool's
template in a region of a shared sparse image, loop-mounted, loopdisk.py), and its mount and IPC
namespaces. Each sample gets, from the helper, its workspace mounted in, /tmp, /dev/shm and IPC
namespace renewed when the previous sample left anything in them, and a uid of its own; the slot
holds nothing of a sample once its processes are dead.

A slot is handed to the next sample only after the helper has killed every process of the
previous one and found none left (`end`), its cgroup is empty and its workspace directory is
gone; a slot failing any of that is destroyed instead. So a sample finds no process, socket,
file or mount of the one before. The pool grows to the run's peak concurrency. Once the run
drains (no new sample will start), it keeps only as many idle slots as there are sandboxes still
to be made and destroys the others as their samples end, so that little is left for close.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import socket
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from trajforge.sandbox import loopdisk, workspace
from trajforge.sandbox.base import SandboxError
from trajforge.sandbox.channel import HelperChannel
from trajforge.sandbox.disk import human
from trajforge.sandbox.forkserver import Zygote
from trajforge.sandbox.process import DEFAULT_OUTPUT_CAP, SAFE_PATH
from trajforge.sandbox.resources import (
    MemoryGroup,
    SampleLimits,
    cgroup_parent,
    sweep_leftovers,
    tmpfs_full,
)


@dataclass(slots=True)
class Slot:
    index: int
    root: Path  # the mount point of its disk (on the disks' tmpfs), or a plain directory
    channel: HelperChannel | None = None  # to the slot's helper
    helper_pid: int = 0  # its host pid
    exited: asyncio.Future[int] | None = None  # resolves once the helper is reaped
    net: int | None = None  # the zygote's handle of its network namespace; None: the host's network
    memory: MemoryGroup | None = None
    disk: loopdisk.Region | None = None  # where its disk lives, when the workspace disk is limited
    _oom_seen: int = field(default=0, repr=False)

    @property
    def workspaces(self) -> Path:
        """Where its samples' workspaces are made (loopdisk.WORKSPACES on its disk)."""
        return self.root / loopdisk.WORKSPACES if self.disk is not None else self.root

    @property
    def alive(self) -> bool:
        return self.channel is not None and not self.channel.broken and not (self.exited and self.exited.done())

    def begin(self) -> None:
        """A new sample: memory kills before it are not its."""
        if self.memory is not None:
            self._oom_seen = self.memory.oom_kills()

    def check(self, limits: SampleLimits, helper_pid: int) -> None:
        """After a command: SandboxError naming the limit the sample hit, if any."""
        if self.memory is not None:
            kills = self.memory.oom_kills()
            if kills > self._oom_seen:
                self._oom_seen = kills
                raise SandboxError(f"the sample exceeded its memory limit of {human(limits.memory or 0)} "
                                   "(sandbox_memory): a process was killed by the kernel")
        for inside, size, key in (("tmp", limits.tmp_size, "sandbox_tmp_size"),
                                  ("dev/shm", limits.shm_size, "sandbox_shm_size")):
            if tmpfs_full(f"/proc/{helper_pid}/root/{inside}", size):
                raise SandboxError(f"the sample filled /{inside} ({human(size or 0)}, {key})")
        if self.disk is not None and limits.disk and loopdisk.full(self.root, limits.disk):
            raise SandboxError(f"the sample filled its workspace disk limit of {human(limits.disk)} (sandbox_disk)")


class SlotPool:
    """The slots of one workspace root (one per run in practice)."""

    def __init__(self, root: Path, zygote: Zygote, *, network: str, router: int | None, limits: SampleLimits) -> None:
        root.mkdir(parents=True, exist_ok=True)
        # A real path: workspaces made under it need no lookup of their own (workspace.create_fresh).
        self.root = root.resolve()
        self.zygote, self.network, self.router, self.limits = zygote, network, router, limits
        self._free: list[Slot] = []
        self._ids = itertools.count()
        self._disks: loopdisk.Disks | None = None
        self._disks_lock = asyncio.Lock()
        # Where the slots' memory cgroups go, looked up once (a few stat calls) rather than per slot.
        self.memory_parent = cgroup_parent() if limits.memory else None
        self.closing = False
        self._demand: Callable[[], int] | None = None  # draining: how many idle slots may still be used
        self._trimming: set[asyncio.Task[None]] = set()

    async def acquire(self) -> Slot:
        while self._free:
            slot = self._free.pop()
            if slot.alive:
                break
            await self._destroy(slot)
        else:
            slot = await self._make(next(self._ids))
        slot.begin()
        return slot

    async def _make(self, index: int) -> Slot:
        await sweep_leftovers()  # a killed runner's disks and cgroups, once per process
        slot = Slot(index, self.root / f"slot-{index}")

        async def disk() -> None:
            if self.limits.disk:
                disks = await self._workspace_disks()
                slot.root, slot.disk = await asyncio.to_thread(disks.mount, slot.root.name)
            else:
                slot.root.mkdir(parents=True, exist_ok=True)

        async def helper() -> None:  # its network namespace made in the same zygote request
            if self.memory_parent is not None:
                slot.memory = MemoryGroup(*self.memory_parent, self.limits.memory)  # type: ignore[arg-type]
                slot.memory.create()
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            slot.channel = HelperChannel(ours, DEFAULT_OUTPUT_CAP)
            new_net = {"router": self.router, "index": index} if self.network in ("egress", "none") else None
            slot.helper_pid, slot.exited, slot.net = await self.zygote.slot(
                theirs, new_net=new_net, cgroup=slot.memory.procs if slot.memory is not None else None)

        try:
            results = await asyncio.gather(disk(), helper(), return_exceptions=True)
            for outcome in results:
                if isinstance(outcome, BaseException):
                    raise outcome
        except BaseException:
            await self._destroy(slot)
            raise
        return slot

    async def _workspace_disks(self) -> loopdisk.Disks:
        async with self._disks_lock:
            if self._disks is None:
                size = self.limits.disk or 0
                self._disks = await asyncio.to_thread(loopdisk.Disks(self.root, size).create)
            return self._disks

    async def release(self, slot: Slot, ws: Path | None, *, keep: bool, clean_exit: bool) -> Path | None:
        """Give the slot back once its sample is over (`end` answered); the kept workspace, if any."""
        kept = None
        healthy = clean_exit and slot.alive and not self.closing
        if ws is not None:
            if keep:
                kept = await asyncio.to_thread(_keep, ws, self.root)
            try:
                await workspace.remove(ws)
            except OSError:
                healthy = False
            healthy = healthy and not os.path.lexists(ws)
        if slot.memory is not None and set(slot.memory.pids()) - {slot.helper_pid}:
            healthy = False  # cannot happen (`end` found no process); never reuse it if it did
        if healthy:
            self._free.append(slot)
            self._trim()
        else:
            await self._destroy(slot)
        return kept

    def drain(self, demand: Callable[[], int]) -> None:
        """From now on keep at most `demand()` idle slots; the others are destroyed in the background."""
        self._demand = demand
        self._trim()

    def _trim(self) -> None:
        while self._demand is not None and len(self._free) > max(0, self._demand()):
            task = asyncio.ensure_future(self._destroy(self._free.pop(0)))
            self._trimming.add(task)
            task.add_done_callback(self._trimming.discard)

    async def _destroy(self, slot: Slot) -> None:
        channel, slot.channel = slot.channel, None
        if channel is not None:
            channel.close()  # the helper exits, and the kernel kills its pid namespace
        if slot.exited is not None:
            try:
                async with asyncio.timeout(5):
                    await asyncio.shield(slot.exited)
            except TimeoutError:
                with contextlib.suppress(SandboxError):
                    await self.zygote.request("kill", pid=slot.helper_pid)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(10):
                        await asyncio.shield(slot.exited)
        if slot.net is not None:
            net, slot.net = slot.net, None
            with contextlib.suppress(SandboxError):
                await self.zygote.request("drop", ns=net)
        if slot.memory is not None:
            memory, slot.memory = slot.memory, None
            await asyncio.to_thread(memory.remove)
        disk, slot.disk = slot.disk, None
        if disk is not None and self._disks is not None:
            await asyncio.to_thread(self._disks.unmount, slot.root, disk)
        else:
            await asyncio.to_thread(_remove_root, slot.root)

    async def settle(self) -> None:
        """Until the slots being destroyed in the background are gone."""
        while self._trimming:
            await asyncio.gather(*self._trimming, return_exceptions=True)

    async def aclose(self) -> None:
        self.closing = True
        free, self._free = self._free, []
        await asyncio.gather(self.settle(), *(self._destroy(slot) for slot in free), return_exceptions=True)
        if self._disks is not None:
            self._disks.close()
            self._disks = None


# A mkdir or rmdir on the host's (often churned) filesystem can take a millisecond: done in the
# disk's thread, not on the event loop.
def _remove_root(root: Path) -> None:
    with contextlib.suppress(OSError):
        root.rmdir()


def _keep(ws: Path, root: Path) -> Path | None:
    """`keep_workspaces`: the files outlive the slot in a directory beside the slots (moved when
    on the same filesystem, else copied by `cp -a`, which recreates FIFOs instead of opening them)."""
    target = root / ws.name
    try:
        os.rename(ws, target)
        return target
    except OSError:
        pass
    done = subprocess.run(["cp", "-a", "--", f"{ws}/.", str(target)], capture_output=True, env={"PATH": SAFE_PATH},
                          cwd="/", timeout=600)
    return target if done.returncode == 0 else None
