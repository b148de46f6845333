"""A sandbox from a SandboxProvider of its own, for tests that need one sandbox and no run."""

from __future__ import annotations

from pathlib import Path

from trajforge.config import RunConfig
from trajforge.sandbox.interface import Sandbox
from trajforge.sandbox.factory import SandboxProvider


async def create_sandbox(config: RunConfig, *, cwd: str | None, image: str | None, root: Path) -> Sandbox:
    """A started sandbox; closing it closes its provider too."""
    provider = await SandboxProvider(config.sandbox_settings()).start()
    try:
        sb = await provider.create(cwd=cwd, image=image, root=root)
    except BaseException:
        await provider.aclose()
        raise
    close = sb.close

    async def close_both() -> None:
        try:
            await close()
        finally:
            await provider.aclose()

    sb.close = close_both  # type: ignore[method-assign]
    return sb
