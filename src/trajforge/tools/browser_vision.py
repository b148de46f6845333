"""browser_vision's model call: one screenshot and one question to the vision model.

The endpoint, model and key come from the run's vision settings exactly as for vision_analyze
(tools/aux_models.py), read from the sample's config at call time; the client lives for one
call, since screenshots are asked about rarely and this keeps the browser toolset free of model
state. The prompt and the image encoding are the vision tool's own, so both tools ask alike.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trajforge.errors import FatalModelError
from trajforge.model.errors import ModelCallError
from trajforge.tools.aux_models import ToolUnavailable, record_usage, tool_client
from trajforge.tools.base import error, ok
from trajforge.tools.vision import PROMPT, data_url

if TYPE_CHECKING:
    from trajforge.tools.base import ToolContext


async def ask_about_screenshot(png: bytes, question: str, ctx: ToolContext) -> str:
    """The tool-result JSON: the model's answer about the screenshot, or why there is none."""
    config = ctx.config
    settings = config.tools.vision
    model = settings.model or config.model
    try:
        client = tool_client(config, "vision", model=model, base_url=settings.base_url,
                             api_key_env=settings.api_key_env, max_tokens=settings.max_tokens,
                             temperature=None, timeout=settings.timeout)
    except ToolUnavailable as e:
        return error(f"no vision model for browser_vision: {e}")
    messages = [{"role": "user", "content": [
        {"type": "text", "text": PROMPT.format(question=question)},
        {"type": "image_url", "image_url": {"url": data_url(png, "image/png")}},
    ]}]
    try:
        completion = await client.complete(messages, [])
    except (ModelCallError, FatalModelError) as e:
        return error(f"vision model {model} failed: {e}")
    finally:
        await client.aclose()
    record_usage(ctx, completion.usage)
    if not completion.content.strip():
        return error(f"vision model {model} returned an empty answer")
    return ok(analysis=completion.content, model=model)
