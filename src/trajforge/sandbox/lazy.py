"""A sandbox made on first use: a sample holds one only from its first tool call to its end.

Most of a sample's life is spent waiting for the model, and its first model call needs no
sandbox. Creating the sandbox when the first tool actually uses it means a run holds fewer
sandboxes at once (a two-call sample holds one for about half its life), and a sample that
never calls a tool never makes one. Every operation of the Sandbox interface creates the real
sandbox first (once, under a lock); `close()` closes it if it was made, and waits for one being
made. A creation failure is the sample's `sandbox` failure, raised from the tool call that
needed it, exactly as from an eager start.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

from trajforge.sandbox.base import READ_CAP, ExecResult, Job, Sandbox, SandboxError


class LazySandbox(Sandbox):
    def __init__(self, create: Callable[[], Awaitable[Sandbox]]) -> None:
        self._create = create
        self._real: Sandbox | None = None
        self._lock = asyncio.Lock()
        self._closed = False

    async def real(self) -> Sandbox:
        if self._real is None:
            async with self._lock:
                if self._closed:
                    raise SandboxError("sandbox used after close()")
                if self._real is None:
                    self._real = await self._create()
        return self._real

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

    @property
    def made(self) -> bool:
        return self._real is not None

    async def start(self) -> None:
        await self.real()

    async def exec(self, command: str, *, timeout: float, cwd: str | None = None) -> ExecResult:
        return await (await self.real()).exec(command, timeout=timeout, cwd=cwd)

    async def spawn(self, command: str, *, cwd: str | None = None) -> Job:
        return await (await self.real()).spawn(command, cwd=cwd)

    async def read_file(self, path: str, *, max_bytes: int = READ_CAP) -> bytes:
        return await (await self.real()).read_file(path, max_bytes=max_bytes)

    async def write_file(self, path: str, data: bytes, *, how: str = "overwrite") -> str:
        return await (await self.real()).write_file(path, data, how=how)

    async def search(self, path: str, pattern: str, *, target: str = "content", glob: str | None = None,
                     limit: int = 50, max_file: int = 2 << 20, max_files: int = 50_000) -> tuple[list[str], bool]:
        return await (await self.real()).search(path, pattern, target=target, glob=glob, limit=limit,
                                                 max_file=max_file, max_files=max_files)

    async def close(self) -> None:
        self._closed = True
        async with self._lock:  # a creation in flight finishes (or fails) first
            real, self._real = self._real, None
        if real is not None:
            await real.close()
