"""Slots of the root-mode bwrap runtime: what is costly to make, reused one sample after another.

A slot (slot.py) is a warm helper process (slot_helper.py: pid 1 of the slot's pid namespace,
forked once by the zygote) with its network namespace (zygote.op_netns; in egress mode wired to the run's
router), its memory cgroup (resources.MemoryGroup) and its workspace disk (a copy of the pool's
template in a region of a shared sparse image, loop-mounted, loopdisk.py), and its mount and IPC
namespaces. Each sample gets, from the helper, its workspace mounted in, /tmp, /dev/shm and IPC
namespace renewed when the previous sample left anything in them, and a uid of its own; the slot
holds nothing of a sample once its processes are dead.

A slot is handed to the next sample only after the helper has killed every process of the
previous one and found none left (`end`), its cgroup is empty and its workspace directory is
gone; a slot failing any of that is destroyed instead. So a sample finds no process, socket,
file or mount of the one before.

The pool grows to the number of slots in use at once, and no faster than MAKING slots at a time:
a sample wanting one when none is idle waits for the first to be made or given back, whichever
comes first. (A burst of first tool calls would otherwise make one slot each, although most of
them are given back within milliseconds: a sample with nothing in its sandbox parks, bwrap.py.)
Once the run drains (no new sample will start), it keeps only as many idle slots as there are
sandboxes still to be made or parked and destroys the others as their samples end, so that
little is left for close.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import os
import socket
from collections.abc import Callable
from pathlib import Path

from trajforge.sandbox import loopdisk, workspace
from trajforge.sandbox.base import SandboxError
from trajforge.sandbox.channel import HelperChannel
from trajforge.sandbox.slot import Slot
from trajforge.sandbox.forkserver import Zygote
from trajforge.sandbox.process import DEFAULT_OUTPUT_CAP
from trajforge.sandbox.resources import MemoryGroup, SampleLimits, cgroup_parent, sweep_leftovers

# Slots made at once when samples wait for one: enough to keep the zygote, the disks' thread and
# the kernel busy, few enough that a burst of first tool calls does not make a slot per call.
MAKING = 4


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
        self._waiters: collections.deque[asyncio.Future[Slot]] = collections.deque()  # callers wanting a slot
        self._making = 0  # slots being made
        self._tasks: set[asyncio.Task[None]] = set()
        self.parked = 0  # samples that gave their slot back and may want one again (bwrap.py)

    async def acquire(self) -> Slot:
        while self._free:
            slot = self._free.pop()
            if slot.alive:
                break
            await self._destroy(slot)
        else:
            if self.closing:
                raise SandboxError("the run's sandboxes are closing")
            waiter: asyncio.Future[Slot] = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            self._start_making()
            try:
                slot = await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                    self._put(waiter.result())  # handed over as this caller left: the next one's
                else:
                    with contextlib.suppress(ValueError):
                        self._waiters.remove(waiter)
                raise
        slot.begin()
        return slot

    def _start_making(self) -> None:
        """As many slots being made as there are callers waiting, at most MAKING at once."""
        while self._making < min(MAKING, len(self._waiters)) and not self.closing:
            self._making += 1
            task = asyncio.ensure_future(self._make_one())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _make_one(self) -> None:
        try:
            slot = await self._make(next(self._ids))
        except Exception as e:  # the first waiter's failure, as its own making would have been
            waiter = self._first_waiter()
            if waiter is not None:
                waiter.set_exception(e)
        else:
            self._put(slot)
        finally:
            self._making -= 1
            self._start_making()

    def _first_waiter(self) -> asyncio.Future[Slot] | None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                return waiter
        return None

    def _put(self, slot: Slot) -> None:
        """A slot ready for a sample: to the first caller waiting, or idle."""
        waiter = self._first_waiter()
        if waiter is not None and not self.closing:
            waiter.set_result(slot)
            return
        self._free.append(slot)
        self._trim()

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
                kept = await asyncio.to_thread(workspace.keep, ws, self.root)
            try:
                await workspace.remove(ws)
            except OSError:
                healthy = False
            healthy = healthy and not os.path.lexists(ws)
        if slot.memory is not None and set(slot.memory.pids()) - {slot.helper_pid}:
            healthy = False  # cannot happen (`end` found no process); never reuse it if it did
        if healthy:
            self._put(slot)
        else:
            await self._destroy(slot)
        return kept

    def parked_closed(self) -> None:
        """A parked sample ended without taking a slot again: one idle slot fewer to keep."""
        self.parked -= 1
        self._trim()

    def drain(self, demand: Callable[[], int]) -> None:
        """From now on keep at most `demand()` idle slots; the others are destroyed in the background."""
        self._demand = demand
        self._trim()

    def _trim(self) -> None:
        while self._demand is not None and len(self._free) > max(0, self._demand()) + self.parked:
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
        """Until the slots being made or destroyed in the background are done."""
        while self._trimming or self._tasks:
            await asyncio.gather(*self._trimming, *self._tasks, return_exceptions=True)

    async def aclose(self) -> None:
        self.closing = True
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_exception(SandboxError("the run's sandboxes are closing"))
        self._waiters.clear()
        await self.settle()  # a slot made meanwhile went to the idle list
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

