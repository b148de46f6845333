"""Run a test body against one built toolset and a real local sandbox, closing both afterwards."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from trajforge.config import RunConfig
from trajforge.sandbox.local import LocalSandbox
from trajforge.tools.base import ToolContext, Toolset


def run_with(tmp_path: Path, build: Callable[[RunConfig], Awaitable[Any]], cfg: RunConfig,
             body: Callable[[Any, ToolContext], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        built = await build(cfg)
        assert isinstance(built, Toolset), built
        sandbox = LocalSandbox(tmp_path / "sandboxes")
        await sandbox.start()
        try:
            return await body(built, ToolContext(sandbox=sandbox, config=cfg))
        finally:
            await sandbox.close()
            await built.aclose()

    return asyncio.run(main())
