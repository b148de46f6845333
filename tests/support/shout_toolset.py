"""A test-only toolset: one file; tests/test_extensions.py declares it with one `register` line."""

from __future__ import annotations

import shlex
from typing import Any, ClassVar

from trajforge.tools.tool import Tool, ToolContext, Toolset, error, ok
from trajforge.tools.tool_settings import ToolSettings


class Shout(Tool):
    name: ClassVar[str] = "shout"
    toolset: ClassVar[str] = "loud"
    description: ClassVar[str] = "Repeat a text in capitals, computed inside the sample's sandbox."
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        res = await ctx.sandbox.exec(f"printf %s {shlex.quote(args['text'])} | tr a-z A-Z", timeout=10)
        if res.exit_code != 0:
            return error(f"tr failed: {res.stderr}")
        return ok(text=res.stdout)


async def build(run: ToolSettings) -> Toolset:
    return Toolset("loud", [Shout()])
