"""Typed settings of the toolset backends (the `tools:` section of the YAML config).

Each toolset owns its own class here; RunConfig embeds ToolsConfig as `tools`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class WebSettings(_Section):
    """`tools.web`: web_search + web_extract (tools/web/toolset.py, search.py, content.py).

    The toolset is all-or-nothing, so it is offered only when a search provider is configured
    (web_extract alone would work, but a `web` toolset whose search can only fail is not offered).
    `provider: auto` takes the first configured of: SearXNG (`searxng_url`, else $SEARXNG_URL),
    Brave (key in $BRAVE_API_KEY), Tavily (key in $TAVILY_API_KEY). API keys are only ever read
    from the environment variables named here, never stored in the config.
    """

    provider: Literal["auto", "searxng", "brave", "tavily"] = "auto"
    searxng_url: str | None = Field(None, description="base URL of a SearXNG instance with format=json enabled")
    brave_url: str = "https://api.search.brave.com/res/v1/web/search"
    brave_api_key_env: str = "BRAVE_API_KEY"
    tavily_url: str = "https://api.tavily.com/search"
    tavily_api_key_env: str = "TAVILY_API_KEY"
    max_results: int = Field(5, ge=1, le=20, description="default number of search results")
    max_urls: int = Field(5, ge=1, le=20, description="URLs one web_extract call may fetch")
    timeout: float = Field(20.0, gt=0, description="seconds per search request or page fetch, all included")
    max_bytes: int = Field(2_000_000, ge=1024, description="bytes read from one response; the rest is dropped")
    max_chars: int = Field(20_000, ge=200, description="characters of content returned per page")
    max_redirects: int = Field(5, ge=0, le=20)
    user_agent: str = "Mozilla/5.0 (compatible; trajforge web_extract)"


class BrowserSettings(_Section):
    """Playwright + Chromium backend of the `browser` toolset (tools/browser/toolset.py)."""

    # None: the first of chromium, chromium-browser, google-chrome, google-chrome-stable on PATH.
    executable_path: Path | None = None
    headless: bool = True
    navigation_timeout: float = Field(30.0, gt=0, description="seconds per page load")
    action_timeout: float = Field(10.0, gt=0, description="seconds per click, type, key press")
    snapshot_max_chars: int = Field(12_000, ge=500, description="cap of one browser_snapshot result")
    # One browser context (cookies, storage, page) per sample; beyond this many, samples wait.
    max_contexts: int = Field(16, ge=1)
    viewport_width: int = Field(1280, ge=200)
    viewport_height: int = Field(800, ge=200)
    extra_args: list[str] = []


class VisionSettings(_Section):
    """`tools.vision`: vision_analyze through an OpenAI-compatible chat API (tools/vision.py).

    Defaults: the run's --model, --base_url and API key (--api_key, $OPENROUTER_API_KEY,
    $OPENAI_API_KEY); `api_key_env` names another variable holding the key for `base_url`.
    Image URLs are downloaded here and sent inline (data: URL) unless `fetch_urls` is off, so
    the model's provider never has to reach the image's host.
    """

    model: str | None = None
    base_url: str | None = None
    api_key_env: str | None = None
    max_tokens: int | None = Field(2000, ge=1)
    timeout: float = Field(120.0, gt=0, description="seconds per vision request")
    max_image_bytes: int = Field(10_000_000, ge=1024)
    fetch_urls: bool = True


class ImageSizes(_Section):
    """The `size` sent for each aspect_ratio the image_generate tool offers (gpt-image-1 sizes)."""

    square: str = "1024x1024"
    landscape: str = "1536x1024"
    portrait: str = "1024x1536"


class ImageGenSettings(_Section):
    """`tools.image_gen`: image_generate via POST {base_url}/images/generations (tools/image_gen.py).

    Offered only when an images endpoint is known: `base_url` here, else an explicit --base_url
    (the default remote API is not assumed to serve /images/generations). `response_format`
    None sends none (gpt-image-* always answer base64; others may answer a URL, which is
    downloaded). `sizes` maps the tool's aspect_ratio argument to the `size` sent.
    """

    model: str = "gpt-image-1"
    base_url: str | None = None
    api_key_env: str | None = None
    response_format: Literal["b64_json", "url"] | None = None
    sizes: ImageSizes = ImageSizes()
    timeout: float = Field(180.0, gt=0, description="seconds per generation request")
    max_image_bytes: int = Field(30_000_000, ge=1024)


class MoaSettings(_Section):
    """`tools.moa`: mixture_of_agents (tools/moa.py).

    `reference_models` None means: on the default API (OpenRouter) DEFAULT_REFERENCE_MODELS in
    tools/moa.py; on any other --base_url / `base_url` the run's --model three times (sampled
    at `reference_temperature`), since other servers rarely serve those names.
    `aggregator_model` None means the run's --model. Endpoint and key as for tools.vision.
    """

    reference_models: list[str] | None = None
    aggregator_model: str | None = None
    base_url: str | None = None
    api_key_env: str | None = None
    reference_temperature: float = Field(0.6, ge=0, le=2)
    aggregator_temperature: float = Field(0.4, ge=0, le=2)
    reference_max_tokens: int | None = Field(4096, ge=1)
    aggregator_max_tokens: int | None = Field(4096, ge=1)
    min_successes: int = Field(1, ge=1, description="reference answers needed before aggregating")
    timeout: float = Field(300.0, gt=0, description="seconds per model request")


class ToolsConfig(_Section):
    web: WebSettings = WebSettings()
    browser: BrowserSettings = BrowserSettings()
    vision: VisionSettings = VisionSettings()
    image_gen: ImageGenSettings = ImageGenSettings()
    moa: MoaSettings = MoaSettings()
