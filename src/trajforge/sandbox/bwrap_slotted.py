"""Root mode of the bwrap backend, the sample's side: its slot taken, parked, taken again, given back.

bwrap.py says what a slot and parking are; SlottedSample is the part of BwrapSandbox that runs
only when the runner is root (its methods are inert in user mode: nothing is ever parked there,
and `_exec` never asks to park). Every operation goes through `_call`: the channel of the slot the
sample holds now, after taking one again if it parked; a request the helper refused because the
sample parked meanwhile (SlotIdle, nothing done) runs again on the next slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from trajforge.sandbox import workspace
from trajforge.sandbox.base import ExecResult, SandboxError
from trajforge.sandbox.bwrap_root import RootRuntime
from trajforge.sandbox.bwrap_start import START_TIMEOUT, chown_beneath
from trajforge.sandbox.channel import HelperChannel, SlotIdle
from trajforge.sandbox.resources import MemoryGroup, SampleLimits
from trajforge.sandbox.slot import Slot
from trajforge.sandbox.slots import SlotPool

_TOKENS = itertools.count(1)  # one per sample in a slot: a slot helper serves only the current one
T = TypeVar("T")


class SlottedSample:
    """Mixed into BwrapSandbox, whose __init__ sets these (and the methods named below)."""

    root: Path
    keep: bool
    uid: int
    cwd: str
    output_cap: int
    sample_limits: SampleLimits
    workspace: Path | None
    helper_pid: int
    _cwd_arg: str | None
    _runtime: RootRuntime | None
    _channel: HelperChannel | None
    _exited: asyncio.Future[int] | None
    _slot: Slot | None
    _pool: SlotPool | None
    _begun: bool
    _parkable: bool
    _parked: bool
    _busy: int
    _gate: asyncio.Lock
    _parking: asyncio.Future[None] | None
    _releasing: set[asyncio.Task[Path | None]]

    if TYPE_CHECKING:  # BwrapSandbox's
        def mounts(self, host_cwd: Path) -> tuple[dict[str, Path], str]: ...
        def _helper_config(self, roots: list[str]) -> dict[str, object]: ...
        def _live(self) -> HelperChannel: ...

    @property
    def memory_group(self) -> MemoryGroup | None:
        return self._slot.memory if self._slot is not None else None

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

    async def _close_slotted(self) -> None:
        async with self._gate:  # a parked sample taking a slot again finishes first
            if self._releasing:
                await asyncio.gather(*self._releasing, return_exceptions=True)
            channel, self._channel = self._channel, None
            if self._parked and self._runtime is not None:
                self._parked = False
                self._slot_pool().parked_closed()
            self._parkable = False
            await self._close_root(channel)

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
            await workspace.defuse(kept)
