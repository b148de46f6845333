"""Typed settings of the toolset backends (the `tools:` section of the YAML config).

Each toolset owns its own class here; RunConfig embeds ToolsSettings as `tools`.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class WebSettings(_Section):
    pass


class BrowserSettings(_Section):
    pass


class VisionSettings(_Section):
    pass


class ImageGenSettings(_Section):
    pass


class MoaSettings(_Section):
    pass


class ToolsSettings(_Section):
    web: WebSettings = WebSettings()
    browser: BrowserSettings = BrowserSettings()
    vision: VisionSettings = VisionSettings()
    image_gen: ImageGenSettings = ImageGenSettings()
    moa: MoaSettings = MoaSettings()
