"""A sandbox made on first use: a sample holds one only from its first tool call to its end.

Most of a sample's life is spent waiting for the model, and its first model call needs no
sandbox. Made when the first tool actually uses it, a run holds fewer sandboxes at once (a
two-call sample about half as long) and a sample that never calls a tool makes none. (With bwrap
as root the sandbox itself is made ahead of time by the run's pool, backends/bwrap/sandbox_pool.py:
a first tool call takes one ready.) Every operation of the Sandbox interface makes the real sandbox
first, once (one task, which every caller waits for); `close()` waits for one being made and
closes it. A creation failure is the sample's `sandbox` failure, raised from the tool call that
needed it, exactly as from an eager start.

Until it is made (or closed unused) it is demand: a pool that makes sandboxes ahead keeps one
for it. Not while its sample is parked (`park`: waiting at the model gate behind a provider's
cap, or in a retry's backoff): only samples whose model call is under way may be about to call
a tool, so sessions held back by the provider hold no sandbox either.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

from trajforge.sandbox.interface import READ_CAP, ExecResult, Job, Sandbox, SandboxError


class LazySandbox(Sandbox):
    def __init__(self, create: Callable[[], Awaitable[Sandbox]], *, demand: Callable[[int], None] | None = None) -> None:
        """demand: told -1 when this sandbox stops being demand a pool may keep a sandbox ready for
        (SandboxProvider.lazy counted it), +1 when it is again: once made (or its making failed)
        or closed before any use, never again; meanwhile while its sample is parked."""
        self._create = create
        self._demand = demand
        self._parked = False
        self._real: Sandbox | None = None
        self._closed = False
        self._making: asyncio.Task[Sandbox] | None = None  # the one making: every caller waits for it

    async def _make(self) -> Sandbox:
        try:
            self._real = await self._create()
        finally:
            self._settle()
        return self._real

    def _settle(self) -> None:
        demand, self._demand = self._demand, None
        if demand is not None and not self._parked:
            demand(-1)

    def park(self, parked: bool) -> None:
        """Its sample starts (True) or stops (False) waiting on the run: a parked sample is no
        demand. Once the sandbox is being made, or settled, nothing changes."""
        if self._demand is None or self._making is not None or parked == self._parked:
            return
        self._parked = parked
        self._demand(-1 if parked else 1)

    async def real(self) -> Sandbox:
        if self._real is not None:
            return self._real
        if self._closed:
            raise SandboxError("sandbox used after close()")
        if self._making is None:
            self._making = asyncio.ensure_future(self._make())
        # Shielded: a tool call cancelled while it waits leaves the making to close().
        return await asyncio.shield(self._making)

    def _made(self) -> Sandbox:
        if self._real is None:
            raise SandboxError("the sandbox is made on first use: await an operation first")
        return self._real

    @property
    def workdir(self) -> str:  # type: ignore[override]
        return self._made().workdir

    @property
    def cwd(self) -> str:  # type: ignore[override]
        return self._made().cwd

    @property
    def workspace(self) -> Path | None:  # type: ignore[override]
        return self._real.workspace if self._real is not None else None

    async def start(self) -> None:
        await self.real()

    async def exec(self, command: str, *, timeout: float, cwd: str | None = None) -> ExecResult:
        return await (await self.real()).exec(command, timeout=timeout, cwd=cwd)

    async def spawn(self, command: str, *, cwd: str | None = None) -> Job:
        return await (await self.real()).spawn(command, cwd=cwd)

    async def read_file(self, path: str, *, max_bytes: int = READ_CAP, offset: int | None = None) -> bytes:
        return await (await self.real()).read_file(path, max_bytes=max_bytes, offset=offset)

    async def write_file(self, path: str, data: bytes, *, how: str = "overwrite") -> str:
        return await (await self.real()).write_file(path, data, how=how)

    async def search(self, path: str, pattern: str, *, target: str = "content", glob: str | None = None,
                     limit: int = 50, max_file: int = 2 << 20, max_files: int = 50_000) -> tuple[list[str], bool]:
        return await (await self.real()).search(path, pattern, target=target, glob=glob, limit=limit,
                                                 max_file=max_file, max_files=max_files)

    async def close(self) -> None:
        self._closed = True
        making, self._making = self._making, None
        if making is not None:  # one being made finishes (or fails) first
            await asyncio.wait([making])
            if not making.cancelled():
                making.exception()  # retrieved: a failure nobody needed is not an error at close
        self._settle()  # never used (or its making cancelled before it ran): it will want none now
        real, self._real = self._real, None
        if real is not None:
            await real.close()
