"""browser_vision's model call: one screenshot and one question to the vision model.

The endpoint, model and key come from the run's vision settings exactly as for vision_analyze
(tools/aux_models.py), read from the sample's ToolSettings at call time; the client lives for one
call, since screenshots are asked about rarely and this keeps the browser toolset free of model
state. The prompt and the image encoding are the vision tool's own, so both tools ask alike.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trajforge.tools.aux_models import ToolUnavailable
from trajforge.tools.tool import error
from trajforge.tools.vision import ask, data_url, vision_client

if TYPE_CHECKING:
    from trajforge.tools.tool import ToolContext


async def ask_about_screenshot(png: bytes, question: str, ctx: ToolContext) -> str:
    """The tool-result JSON: the model's answer about the screenshot, or why there is none."""
    try:
        client, model = vision_client(ctx.settings)
    except ToolUnavailable as e:
        return error(f"no vision model for browser_vision: {e}")
    try:
        return await ask(client, model, data_url(png, "image/png"), question, ctx)
    finally:
        await client.aclose()
