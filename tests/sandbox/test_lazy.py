"""A sandbox made on first use (sandbox/lazy.py): none for a sample that uses none, one for many
concurrent first uses, and close() waits for one being made."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from trajforge.config import RunConfig
from trajforge.sandbox.interface import Sandbox, SandboxError
from trajforge.sandbox.factory import SandboxProvider
from trajforge.sandbox.lazy import LazySandbox


def run_with_provider(tmp_path: Path, body) -> None:  # type: ignore[no-untyped-def]
    async def main() -> None:
        async with SandboxProvider(RunConfig(sandbox="local", sandbox_network="host").sandbox_settings()) as p:
            made: list[Sandbox] = []

            async def create() -> Sandbox:
                await asyncio.sleep(0.05)  # long enough for the callers below to overlap
                sb = await p.create(cwd=None, image=None, root=tmp_path)
                made.append(sb)
                return sb

            await body(create, made)

    asyncio.run(main())


def test_unused_sandbox_is_never_made(tmp_path: Path) -> None:
    async def body(create, made) -> None:  # type: ignore[no-untyped-def]
        sb = LazySandbox(create)
        await sb.close()
        assert made == [] and sb.workspace is None
        with pytest.raises(SandboxError):
            await sb.exec("true", timeout=5)  # after close: refused, and still nothing made
        assert made == []

    run_with_provider(tmp_path, body)


def test_concurrent_first_uses_make_one_sandbox_and_close_removes_it(tmp_path: Path) -> None:
    async def body(create, made) -> None:  # type: ignore[no-untyped-def]
        sb = LazySandbox(create)
        outs = await asyncio.gather(*(sb.exec(f"echo {i}", timeout=10) for i in range(5)),
                                    sb.write_file("f.txt", b"x"))
        assert [o.stdout for o in outs[:5]] == [f"{i}\n" for i in range(5)]
        assert len(made) == 1 and await sb.read_file("f.txt") == b"x"
        ws = sb.workspace
        assert ws is not None and ws.exists()
        await sb.close()
        assert not ws.exists()

    run_with_provider(tmp_path, body)


def test_close_waits_for_a_sandbox_being_made(tmp_path: Path) -> None:
    async def body(create, made) -> None:  # type: ignore[no-untyped-def]
        sb = LazySandbox(create)
        first = asyncio.ensure_future(sb.exec("true", timeout=10))
        await asyncio.sleep(0.01)  # the making has begun, not finished
        first.cancel()
        await sb.close()  # must not leak the sandbox that was being made
        assert len(made) == 1 and made[0].workspace is not None and not made[0].workspace.exists()

    run_with_provider(tmp_path, body)
