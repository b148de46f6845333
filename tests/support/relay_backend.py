"""A test-only backend that runs images and tasks: one module; tests/test_architecture.py registers it with one line.

Its sandboxes and its image store relay every call to the container backend's and write each
operation's name into `CALLS`, so a test can see that a Harbor task ran through it and that the
task layer used nothing but the interface (sandbox/interface.py): an operation outside it would
not exist on a RelaySandbox and would fail.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from trajforge.sandbox.backends.container import image_build, image_sandbox
from trajforge.sandbox.interface import (
    BuildOutcome, Change, Copied, ExecResult, ImageInfo, ImageSandbox, Job, Provider, SampleResources, Stopped,
)

CALLS: list[str] = []


class RelaySandbox(ImageSandbox):
    def __init__(self, inner: ImageSandbox) -> None:
        self.inner = inner
        self.image = inner.image

    @property
    def workdir(self) -> str:  # type: ignore[override]
        return self.inner.workdir

    @property
    def cwd(self) -> str:  # type: ignore[override]
        return self.inner.cwd

    @property
    def workspace(self) -> Path | None:  # type: ignore[override]
        return self.inner.workspace

    async def start(self) -> None:
        CALLS.append("start")
        await self.inner.start()

    async def exec(self, command: str, *, timeout: float, cwd: str | None = None, user: str | None = None,
                   env: Mapping[str, str] | None = None) -> ExecResult:
        CALLS.append("exec")
        return await self.inner.exec(command, timeout=timeout, cwd=cwd, user=user, env=env)

    async def spawn(self, command: str, *, cwd: str | None = None) -> Job:
        CALLS.append("spawn")
        return await self.inner.spawn(command, cwd=cwd)

    async def read_file(self, path: str, *, max_bytes: int = 256 << 20, offset: int | None = None) -> bytes:
        CALLS.append("read_file")
        return await self.inner.read_file(path, max_bytes=max_bytes, offset=offset)

    async def write_file(self, path: str, data: bytes, *, how: str = "overwrite") -> str:
        CALLS.append("write_file")
        return await self.inner.write_file(path, data, how=how)

    async def search(self, path: str, pattern: str, **kw: Any) -> tuple[list[str], bool]:
        CALLS.append("search")
        return await self.inner.search(path, pattern, **kw)

    async def close(self) -> None:
        CALLS.append("close")
        await self.inner.close()

    async def run(self, argv: Sequence[str], *, timeout: float, user: str | None = None,
                  env: Mapping[str, str] | None = None) -> ExecResult:
        CALLS.append("run")
        return await self.inner.run(argv, timeout=timeout, user=user, env=env)

    async def upload(self, source: Path, path: str) -> None:
        CALLS.append("upload")
        await self.inner.upload(source, path)

    async def download(self, path: str, limit: int) -> bytes | None:
        CALLS.append("download")
        return await self.inner.download(path, limit)

    async def download_tree(self, path: str, dest: Path, limit: int) -> Copied | None:
        CALLS.append("download_tree")
        return await self.inner.download_tree(path, dest, limit)

    async def stop_processes(self) -> Stopped:
        CALLS.append("stop_processes")
        return await self.inner.stop_processes()

    async def fresh_dirs(self, dirs: Mapping[str, int]) -> None:
        CALLS.append("fresh_dirs")
        await self.inner.fresh_dirs(dirs)

    async def remove(self, path: str) -> None:
        CALLS.append("remove")
        await self.inner.remove(path)

    async def changes(self, wanted: Callable[[str], bool]) -> list[Change] | None:
        CALLS.append("changes")
        return await self.inner.changes(wanted)


async def make(provider: Provider, *, cwd: str | None, image: str | None, root: Path,
               resources: SampleResources | None = None) -> RelaySandbox:
    CALLS.append("make")
    return RelaySandbox(await image_sandbox.make(provider, cwd=cwd, image=image, root=root, resources=resources))


class RelayStore:
    def __init__(self, inner: image_build.ContainerImages) -> None:
        self.inner, self.kind = inner, f"relay over {inner.kind}"

    async def ensure(self, image: str) -> None:
        CALLS.append("store.ensure")
        await self.inner.ensure(image)

    async def inspect(self, image: str) -> ImageInfo | None:
        CALLS.append("store.inspect")
        return await self.inner.inspect(image)

    async def build(self, **kw: Any) -> BuildOutcome:
        CALLS.append("store.build")
        return await self.inner.build(**kw)

    async def images(self, label: str) -> list[tuple[str, ImageInfo]]:
        CALLS.append("store.images")
        return await self.inner.images(label)

    async def remove(self, image: str) -> str | None:
        CALLS.append("store.remove")
        return await self.inner.remove(image)


async def store(provider: Provider) -> RelayStore:
    return RelayStore(await image_build.store(provider))
