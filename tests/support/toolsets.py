"""Run a test body against one built toolset and a real local sandbox, closing both afterwards.

The run is described as a RunConfig, turned into the ToolSettings a worker would hand down."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from trajforge.config import RunConfig
from trajforge.sandbox.backends.local.local_sandbox import LocalSandbox
from trajforge.tools.tool import ToolContext, Toolset
from trajforge.tools.tool_settings import ToolSettings


def run_with(tmp_path: Path, build: Callable[[ToolSettings], Awaitable[Any]], cfg: RunConfig,
             body: Callable[[Any, ToolContext], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        settings = cfg.tool_settings()
        built = await build(settings)
        assert isinstance(built, Toolset), built
        sandbox = LocalSandbox(tmp_path / "sandboxes")
        await sandbox.start()
        try:
            return await body(built, ToolContext(sandbox=sandbox, settings=settings))
        finally:
            await sandbox.close()
            await built.aclose()

    return asyncio.run(main())
