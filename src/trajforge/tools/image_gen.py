"""The `image_gen` toolset: image_generate through an OpenAI-compatible /images/generations API.

This module owns the request (model, prompt, size from the aspect ratio, n=1), reading the
answer whether it carries base64 data or a URL (downloaded with the shared fetch limits), and
saving the image into the sample's workspace under images/ with the sandbox's write_file (never
replacing a file, never following a link), so a symlink planted by the model cannot redirect it. The SDK client is created once per
run in `build` (with the key resolved there) and closed by ImageGenToolset.aclose. The toolset
is offered only when an images endpoint is known (ImageGenSettings).

Result: {success, path (relative to the working directory), absolute_path (as commands see it),
url (when the API gave one), revised_prompt (when given), size, bytes}.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import openai
from openai import AsyncOpenAI

from trajforge.model.retry import RetryPolicy
from trajforge.netpolicy import Policy, make_policy
from trajforge.sandbox.interface import FileOpError, PathEscapeError
from trajforge.tools.web import fetch
from trajforge.tools.aux_models import ToolUnavailable, tool_endpoint
from trajforge.tools.web.egress import policy_for
from trajforge.tools.tool import Tool, ToolContext, Toolset, Unavailable, error, ok
from trajforge.catalog.tools_config import ImageGenSettings
from trajforge.tools.vision import image_mime

if TYPE_CHECKING:
    from trajforge.tools.tool_settings import ToolSettings

_EXT = {"image/png": "png", "image/jpeg": "jpg", "image/gif": "gif", "image/webp": "webp"}
_SLUG = re.compile(r"[^a-z0-9]+")


def slug(prompt: str) -> str:
    return _SLUG.sub("-", prompt.lower())[:40].strip("-") or "image"


def _transient(e: Exception) -> bool:
    """Worth another attempt: 429, 5xx, 408/409, a timeout or a dropped connection."""
    if isinstance(e, openai.APIStatusError):
        return e.status_code in (408, 409, 429) or e.status_code >= 500
    return isinstance(e, openai.APIConnectionError)  # includes APITimeoutError


class ImageGenToolset(Toolset):
    def __init__(self, settings: ImageGenSettings, api: AsyncOpenAI, base_url: str, key: str,
                 retry: RetryPolicy | None = None, policy: Policy | None = None) -> None:
        self.retry = retry or RetryPolicy().for_tool()
        self.settings = settings
        self.api = api
        self.base_url = base_url
        self._key = key
        # The API's download URLs go through the egress policy; the API's own host is the user's choice.
        self.http = fetch.new_client(timeout=settings.timeout, max_redirects=5,
                                          policy=policy or make_policy([urlsplit(base_url).hostname or ""]),
                                          user_agent="Mozilla/5.0 (compatible; trajforge image_gen)")
        super().__init__("image_gen", [ImageGenerateTool(self)])

    def scrub(self, text: str) -> str:
        return text.replace(self._key, "***")[:500] if len(self._key) >= 4 else text[:500]

    async def aclose(self) -> None:
        try:
            await self.api.close()
        finally:
            await self.http.aclose()


class ImageGenerateTool(Tool):
    name = "image_generate"
    toolset = "image_gen"
    description = ("Generate an image from a text prompt. The image is saved in the working directory "
                   "(images/...) and its path is returned.")
    parameters = {
        "type": "object",
        "properties": {
            "prompt": {"type": "string", "description": "Detailed description of the image to generate."},
            "aspect_ratio": {"type": "string", "enum": ["square", "landscape", "portrait"],
                             "description": "Shape of the image (default square)."},
        },
        "required": ["prompt"],
    }

    def __init__(self, owner: ImageGenToolset) -> None:
        self.owner = owner

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        prompt = str(args.get("prompt") or "").strip()
        if not prompt:
            return error("prompt must be a non-empty string")
        settings, owner = self.owner.settings, self.owner
        sizes = settings.sizes
        by_aspect = {"square": sizes.square, "landscape": sizes.landscape, "portrait": sizes.portrait}
        size = by_aspect.get(str(args.get("aspect_ratio")), sizes.square)
        extra: dict[str, Any] = {"response_format": settings.response_format} if settings.response_format else {}
        try:
            response = await owner.retry.run(
                lambda: owner.api.images.generate(model=settings.model, prompt=prompt, size=size, n=1,
                                                  **extra),  # type: ignore[call-overload]
                _transient, what=f"image API {owner.base_url}")
        except openai.APIStatusError as e:
            return error(owner.scrub(f"image API {owner.base_url} returned HTTP {e.status_code}: {e.message}"))
        except openai.APITimeoutError:
            return error(f"image API {owner.base_url} timed out after {settings.timeout:g}s")
        except openai.APIError as e:
            return error(owner.scrub(f"image API {owner.base_url} failed: {e}"))
        if not response.data:
            return error(f"image API {owner.base_url} returned no image")
        item = response.data[0]
        try:
            data = await self._image_bytes(item.b64_json, item.url)
        except ValueError as e:
            return error(str(e))
        mime = image_mime(data)
        if mime is None:
            return error(f"image API {owner.base_url} returned data that is not a PNG, JPEG, GIF or WEBP image")
        rel = f"images/{slug(prompt)}.{_EXT[mime]}"
        try:  # "~" is the workspace in every backend; the sandbox may be made by this very write
            saved = await ctx.sandbox.write_file(f"~/{rel}", data, how="new")
        except (PathEscapeError, FileOpError) as e:
            return error(f"cannot save the image as {rel}: {e}")
        workdir = ctx.sandbox.workdir.rstrip("/")
        rel = f"images/{saved.rsplit('/', 1)[-1]}"
        return ok(path=rel, absolute_path=f"{workdir}/{rel}", url=item.url,
                  revised_prompt=getattr(item, "revised_prompt", None), size=size, bytes=len(data))

    async def _image_bytes(self, b64: str | None, url: str | None) -> bytes:
        limit = self.owner.settings.max_image_bytes
        if b64:
            try:
                data = base64.b64decode(b64, validate=True)
            except (binascii.Error, ValueError):
                raise ValueError(f"image API {self.owner.base_url} returned invalid base64 data") from None
            if len(data) > limit:
                raise ValueError(f"the generated image is larger than {limit} bytes")
            return data
        if not url:
            raise ValueError(f"image API {self.owner.base_url} returned neither b64_json nor url")
        try:
            fetched = await fetch.fetch(self.owner.http, url, max_bytes=limit, timeout=self.owner.settings.timeout)
        except fetch.FetchError as e:
            raise ValueError(str(e)) from None
        if fetched.status >= 400 or fetched.truncated:
            raise ValueError(f"cannot download the generated image from {url} "
                             f"({'too large' if fetched.truncated else f'HTTP {fetched.status}'})")
        return fetched.body


async def build(run: ToolSettings) -> ImageGenToolset | Unavailable:
    settings = run.sections.image_gen
    if not (settings.base_url or run.model.base_url):
        return Unavailable("image_gen", "no images endpoint configured: set tools.image_gen.base_url (an "
                                        "OpenAI-compatible API serving /images/generations) or --base_url")
    try:
        at = tool_endpoint(run, "image_gen", settings.base_url, settings.api_key_env)
    except ToolUnavailable as e:
        return Unavailable("image_gen", str(e))
    base_url, key = at.url, at.key
    # The SDK's own retries are off: the one policy (model.retry) retries, as for every model call.
    api = AsyncOpenAI(api_key=key, base_url=base_url, timeout=settings.timeout, max_retries=0)
    return ImageGenToolset(settings, api, base_url, key, RetryPolicy(run.model.max_retries).for_tool(),
                           policy_for(run, [urlsplit(base_url).hostname or ""]))
