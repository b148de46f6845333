"""Root-mode bwrap sandboxes made ahead of time, in the background, each used by one sample.

Making a sandbox takes privileged work (namespaces, mounts, a cgroup, a loop-mounted disk, a veth
link): the pool does it before a sample asks, so a sample's first tool call finds one ready, and
the work costs the run CPU but no sample any waiting. A `Prepared` sandbox is its first process
(sandbox_init.py: pid 1 of its pid namespace, ready and waiting, holding nothing of the host),
its channel, its uid (unique on the host while it lives: uids.py), cgroup (cgroups.py), workspace (on a disk of its own, loopdisk.py, when the
workspace is size-limited) and network namespace (made by the zygote, in egress mode linked to
the run's router). `take` hands one to a sample; `end` destroys it once the sample is over: its
channel closed (the first process exits and the kernel kills its pid namespace), its cgroup,
disk and workspace removed. Nothing of a sandbox is ever given to a second sample.

The pool is sized to demand: it keeps as many ready or being made as there are samples that
may still want one (`demand`, the provider's sandboxes handed out and not yet made, or the
callers waiting), making MAKING at a time; once the run drains, ready ones beyond the demand are
destroyed while the last samples run.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import random
import socket
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from trajforge.catalog.sandboxes import NetworkMode
from trajforge.sandbox import workspace
from trajforge.sandbox.host import loopdisk
from trajforge.sandbox.interface import SandboxError
from trajforge.sandbox.host.cgroups import SampleGroup, hierarchies
from trajforge.sandbox.channel import HelperChannel
from trajforge.sandbox.host.zygote_client import Zygote
from trajforge.sandbox.process import DEFAULT_OUTPUT_CAP
from trajforge.sandbox.backends.bwrap.prepared import Prepared
from trajforge.sandbox.host.resources import sweep_leftovers
from trajforge.sandbox.host.uids import SANDBOX_UIDS, sandbox_uids
from trajforge.sandbox.sandbox_settings import ResourceLimits

MAKING = 4  # sandboxes made at once: enough to keep the zygote, the disks' threads and the kernel busy
THREADS = 16  # the pool's threads for calls that wait on the kernel (mounts, unmounts, cgroups)
READY_TIMEOUT = 30.0
_LINKS = 1 << 21  # a network link's index: one of 10.128.0.0/9's /30s
_UID_BASE = SANDBOX_UIDS[1]  # the lowest sandbox uid (the DNS forwarder's ids lie below: test_dns.py)
T = TypeVar("T")


class SandboxPool:
    """The sandboxes of one workspace root (one per run in practice)."""

    def __init__(self, root: Path, zygote: Zygote, *, network: NetworkMode, router: int | None, limits: ResourceLimits,
                 nproc: int | None = None, demand: Callable[[], int] = lambda: 0) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.root = root.resolve()
        self.zygote, self.network, self.router, self.limits, self.nproc = zygote, network, router, limits, nproc
        self.demand = demand
        self._ready: collections.deque[Prepared] = collections.deque()
        self._waiters: collections.deque[asyncio.Future[Prepared]] = collections.deque()
        self._links: set[int] = set()
        self._making = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._disks: loopdisk.Disks | None = None
        self._disks_lock = asyncio.Lock()
        self.cgroups = hierarchies() if (limits.memory or limits.cpus or nproc) else None
        self.closing = self.draining = False
        self._threads = ThreadPoolExecutor(THREADS, thread_name_prefix="trajforge-sandboxes")

    # --- handing out -------------------------------------------------------------------------
    async def take(self) -> Prepared:
        """A ready sandbox, or the next one made."""
        while self._ready:
            sandbox = self._ready.popleft()
            if sandbox.alive:
                self.refill()
                return sandbox
            self._background(self.end(sandbox))
        if self.closing:
            raise SandboxError("the run's sandboxes are closing")
        waiter: asyncio.Future[Prepared] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        self.refill()
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self._put(waiter.result())  # handed over as this caller left: the next one's
            else:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)
            raise

    def wanted(self) -> int:
        """Sandboxes to have ready or being made: the samples that may still want one. (A waiter
        leaves the deque as it is answered or cancelled, so its length counts those waiting.)"""
        return max(self.demand(), len(self._waiters))

    def refill(self) -> None:
        """Start making sandboxes up to what is wanted, MAKING at a time; past it while
        draining, destroy ready ones."""
        while not self.closing and self._making < MAKING and len(self._ready) + self._making < self.wanted():
            self._making += 1
            self._background(self._make_one())
        while self.draining and len(self._ready) > max(0, self.wanted() - self._making):
            self._background(self.end(self._ready.pop()))

    def drain(self) -> None:
        """No new sample will start: ready sandboxes beyond the demand go (in the background)."""
        self.draining = True
        self.refill()

    def _background(self, coro) -> None:  # type: ignore[no-untyped-def]
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _make_one(self) -> None:
        try:
            # No counter in the name: a sample without a disk sees it (its workspace's mount source).
            sandbox = await self._make(f"sb-{os.urandom(6).hex()}")
        except Exception as e:  # the first waiter's failure, as its own making would have been
            waiter = self._first_waiter()
            if waiter is not None:
                waiter.set_exception(e)
        else:
            self._put(sandbox)
        finally:
            self._making -= 1
            self.refill()

    def _first_waiter(self) -> asyncio.Future[Prepared] | None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                return waiter
        return None

    def _put(self, sandbox: Prepared) -> None:
        waiter = self._first_waiter()
        if waiter is not None and not self.closing:
            waiter.set_result(sandbox)
        elif self.closing:
            self._background(self.end(sandbox))
        else:
            self._ready.append(sandbox)

    # --- making and destroying ---------------------------------------------------------------
    async def _make(self, name: str) -> Prepared:
        await sweep_leftovers()  # a killed runner's disks and cgroups, once per process
        # A uid no other sandbox on the host has while this one lives (host/uids.py).
        sandbox = Prepared(name, sandbox_uids().take(), self.root / name)
        try:
            await self._blocking(self._workspace_and_group, sandbox, await self._workspace_disks())
            lim = self.limits
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            sandbox.channel = HelperChannel(ours, DEFAULT_OUTPUT_CAP)
            ready = sandbox.channel.expect(0)  # the first process's first frame says it is ready
            sandbox.link = self._new_link() if self.network == NetworkMode.EGRESS else None
            net = {"router": self.router, "index": sandbox.link} if self.network != NetworkMode.HOST else None
            sandbox.pid, sandbox.exited = await self.zygote.fork(
                theirs, "sandbox", net=net, workspace=str(sandbox.workspace), tmp=lim.tmp_size, shm=lim.shm_size,
                cgroups=sandbox.group.procs if sandbox.group is not None else [])
            try:
                async with asyncio.timeout(READY_TIMEOUT):
                    reply, _ = await ready
            except TimeoutError:
                raise SandboxError(f"a sandbox was not ready within {READY_TIMEOUT:g}s") from None
            if "error" in reply:
                raise SandboxError(f"a sandbox could not be made: {reply.get('msg')}")
        except BaseException:
            await self.end(sandbox)
            raise
        return sandbox

    def _workspace_and_group(self, sandbox: Prepared, disks: loopdisk.Disks | None) -> None:
        """Its workspace (on a disk of its own when the workspace is size-limited; the sample's
        uid's) and its cgroup: mounts, a first write to a new filesystem, cgroup directories, in
        one of the pool's threads (one hop from the event loop for all of it)."""
        if disks is not None:
            sandbox.root, sandbox.disk = disks.mount(sandbox.name)
            base = sandbox.root / loopdisk.WORKSPACES
        else:
            sandbox.root.mkdir(0o700)
            base = sandbox.root
        sandbox.workspace, _ = workspace.create_fresh(base, None)
        os.chown(sandbox.workspace, sandbox.uid, sandbox.uid)
        lim = self.limits
        if self.cgroups is not None:
            sandbox.group = SampleGroup(self.cgroups, memory=lim.memory, cpus=lim.cpus, pids=self.nproc).create()

    async def _blocking(self, fn: Callable[..., T], *args: Any) -> T:
        """A blocking call in the pool's own threads: unmounts and cgroup removals wait on the kernel
        for milliseconds, and a run makes hundreds of sandboxes a second (the loop's default
        executor has a handful of threads, shared with every other to_thread of the run)."""
        return await asyncio.get_running_loop().run_in_executor(self._threads, fn, *args)

    def _new_link(self) -> int:
        while True:  # a random free index: the next sample cannot tell how many came before
            index = random.randrange(1, _LINKS)
            if index not in self._links:
                self._links.add(index)
                return index

    async def _workspace_disks(self) -> loopdisk.Disks | None:
        """The pool's disks, made at the first sandbox; None when the workspace has no size limit."""
        if self._disks is not None or not self.limits.disk:
            return self._disks
        async with self._disks_lock:
            if self._disks is None:
                self._disks = await asyncio.to_thread(loopdisk.Disks(self.root, self.limits.disk).create)
            return self._disks

    async def end(self, sandbox: Prepared, *, keep: bool = False) -> Path | None:
        """Destroy a sandbox once its sample is over; the kept workspace, if `keep`."""
        channel, sandbox.channel = sandbox.channel, None
        if channel is not None:
            channel.close()  # its first process exits, and the kernel kills its pid namespace
        if sandbox.exited is not None and sandbox.pid:
            try:
                async with asyncio.timeout(5):
                    await asyncio.shield(sandbox.exited)
            except TimeoutError:
                with contextlib.suppress(SandboxError):
                    await self.zygote.request("kill", pid=sandbox.pid)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(10):
                        await asyncio.shield(sandbox.exited)
        if sandbox.exited is None or sandbox.exited.done():  # no process of it left: its uid is free
            sandbox_uids().give_back(sandbox.uid)
        kept = None
        if keep and sandbox.workspace != Path() and os.path.isdir(sandbox.workspace):
            kept = await self._blocking(workspace.keep, sandbox.workspace, self.root)
        if sandbox.link is not None:
            self._links.discard(sandbox.link)
        group, sandbox.group = sandbox.group, None
        disk, sandbox.disk = sandbox.disk, None
        if group is not None or (disk is not None and self._disks is not None):
            await self._blocking(self._release, sandbox.root, group, disk)
        if disk is None and sandbox.root.exists():
            await workspace.remove(sandbox.root)
        return kept

    def _release(self, root: Path, group: SampleGroup | None, disk: loopdisk.Region | None) -> None:
        """Its cgroup and its disk gone, in one of the pool's threads (one hop for both)."""
        if group is not None:
            group.remove()
        if disk is not None and self._disks is not None:
            self._disks.unmount(root, disk)

    async def settle(self) -> None:
        """Until what is being made or destroyed in the background is done."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def aclose(self) -> None:
        self.closing = True
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_exception(SandboxError("the run's sandboxes are closing"))
        self._waiters.clear()
        await self.settle()  # one made meanwhile is ended by _put
        ready, self._ready = list(self._ready), collections.deque()
        await asyncio.gather(*(self.end(sandbox) for sandbox in ready), return_exceptions=True)
        await self.settle()
        if self._disks is not None:
            self._disks.close()
            self._disks = None
        self._threads.shutdown(wait=False)
