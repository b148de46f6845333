"""The `vision` toolset: vision_analyze asks a vision-capable chat model about one image.

This module owns turning the model's `image_url` argument into an image content part (a file in
the sample's workspace, read through the sandbox's read_file, so neither a path nor a link or
FIFO swapped in can reach past what the sample itself can read; an http(s) URL,
downloaded with the shared fetch limits and inlined, or passed through when
tools.vision.fetch_urls is off; or a data: URL), and the one chat request per call. The model
client and HTTP client are created once per run in `build` and closed by VisionToolset.aclose.
Model and endpoint default to the run's (VisionSettings).
"""

from __future__ import annotations

import base64
import mimetypes
from typing import TYPE_CHECKING, Any

from trajforge.errors import FatalModelError
from trajforge.model.errors import ModelCallError
from trajforge.model.types import ModelClient
from trajforge.sandbox.interface import FileOpError, PathEscapeError
from trajforge.tools.web import fetch
from trajforge.tools.aux_models import ToolUnavailable, record_usage, tool_client
from trajforge.netpolicy import Policy, make_policy
from trajforge.tools.tool import Tool, ToolContext, Toolset, Unavailable, error, ok
from trajforge.catalog.tools_config import VisionSettings
from trajforge.tools.web.egress import policy_for

if TYPE_CHECKING:
    from trajforge.tools.tool_settings import ToolSettings

_MAGIC = ((b"\x89PNG\r\n\x1a\n", "image/png"), (b"\xff\xd8\xff", "image/jpeg"), (b"GIF87a", "image/gif"),
          (b"GIF89a", "image/gif"))
SUPPORTED = "PNG, JPEG, GIF or WEBP"
PROMPT = ("Describe this image fully and precisely (objects, text, layout, colours, anything notable), "
          "then answer the following question about it.\n\nQuestion: {question}")


def image_mime(data: bytes) -> str | None:
    """The image type from the file's first bytes (names and headers lie; the bytes do not)."""
    for magic, mime in _MAGIC:
        if data.startswith(magic):
            return mime
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


def data_url(data: bytes, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


class VisionToolset(Toolset):
    def __init__(self, settings: VisionSettings, client: ModelClient, model: str,
                 policy: Policy | None = None) -> None:
        self.settings = settings
        self.client = client
        self.model = model
        # None: --sandbox_network none, image URLs are refused (workspace files and data: URLs work).
        self.policy = policy
        self.http = fetch.new_client(timeout=settings.timeout, max_redirects=5, policy=policy or make_policy(),
                                          user_agent="Mozilla/5.0 (compatible; trajforge vision)")
        super().__init__("vision", [VisionAnalyzeTool(self)])

    async def aclose(self) -> None:
        try:
            await self.client.aclose()
        finally:
            await self.http.aclose()


class VisionAnalyzeTool(Tool):
    name = "vision_analyze"
    toolset = "vision"
    description = ("Analyze an image with a vision AI model: get a full description and an answer to your "
                   "question. The image can be a file in the working directory (path) or an http(s) URL.")
    parameters = {
        "type": "object",
        "properties": {
            "image_url": {"type": "string",
                          "description": "Path of an image file in the workspace, or an http(s) URL."},
            "question": {"type": "string", "description": "What you want to know about the image."},
        },
        "required": ["image_url", "question"],
    }

    def __init__(self, owner: VisionToolset) -> None:
        self.owner = owner

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        source = str(args.get("image_url") or "").strip()
        question = str(args.get("question") or "").strip() or "What is in this image?"
        if not source:
            return error("image_url must be a workspace path or an http(s) URL")
        try:
            url = await self._image_part_url(source, ctx)
        except ValueError as e:
            return error(str(e), image_url=source)
        return await ask(self.owner.client, self.owner.model, url, question, ctx, image_url=source)

    async def _image_part_url(self, source: str, ctx: ToolContext) -> str:
        """What goes into image_url.url; ValueError (message for the model) when unusable."""
        settings = self.owner.settings
        limit = settings.max_image_bytes
        lowered = source.lower()
        if lowered.startswith("data:image/"):
            if len(source) > limit * 4 // 3 + 100:
                raise ValueError(f"the data: URL is larger than {limit} bytes")
            return source
        if lowered.startswith(("http://", "https://")):
            if self.owner.policy is None:
                raise ValueError("image URLs are not available in this run (--sandbox_network none); "
                                 "use an image file in the workspace")
            if not settings.fetch_urls:
                return source
            try:
                fetched = await fetch.fetch(self.owner.http, source, max_bytes=limit, timeout=settings.timeout)
            except fetch.FetchError as e:
                raise ValueError(str(e)) from None
            if fetched.status >= 400:
                raise ValueError(f"fetching {source} returned HTTP {fetched.status} {fetched.reason}".strip())
            if fetched.truncated:
                raise ValueError(f"the image at {source} is larger than {limit} bytes")
            data = fetched.body
        else:
            try:
                data = await ctx.sandbox.read_file(source, max_bytes=limit)
            except PathEscapeError as e:
                raise ValueError(str(e)) from None
            except FileOpError as e:
                if e.kind == "too_large":
                    raise ValueError(f"the image {source} is larger than {limit} bytes") from None
                if e.kind in ("not_found", "is_dir", "not_regular", "not_dir"):
                    raise ValueError(f"no such image file: {source}") from None
                raise ValueError(f"cannot read {source}: {e}") from None
        mime = image_mime(data)
        if mime is None:
            guessed = mimetypes.guess_type(source)[0] or "unknown type"
            raise ValueError(f"{source} is not a supported image ({guessed}); use {SUPPORTED}")
        return data_url(data, mime)


def vision_client(run: ToolSettings) -> tuple[ModelClient, str]:
    """The run's vision model client and model name; ToolUnavailable when it could only fail."""
    settings = run.sections.vision
    model = settings.model or run.model.model
    client = tool_client(run, "vision", model=model, base_url=settings.base_url,
                         api_key_env=settings.api_key_env, max_tokens=settings.max_tokens,
                         temperature=None, timeout=settings.timeout)
    return client, model


async def ask(client: ModelClient, model: str, url: str, question: str, ctx: ToolContext, **extra: Any) -> str:
    """One image (a URL or data: URL) and one question to the vision model; the tool-result JSON."""
    messages = [{"role": "user", "content": [
        {"type": "text", "text": PROMPT.format(question=question)},
        {"type": "image_url", "image_url": {"url": url}},
    ]}]
    try:
        completion = await client.complete(messages, [])
    except (ModelCallError, FatalModelError) as e:
        return error(f"vision model {model} failed: {e}", **extra)
    record_usage(ctx, completion.usage)
    if not completion.content.strip():
        return error(f"vision model {model} returned an empty answer", **extra)
    return ok(analysis=completion.content, **extra, model=model)


async def build(run: ToolSettings) -> VisionToolset | Unavailable:
    try:
        client, model = vision_client(run)
    except ToolUnavailable as e:
        return Unavailable("vision", str(e))
    policy = policy_for(run) if run.fetch_model_urls else None
    return VisionToolset(run.sections.vision, client, model, policy)
