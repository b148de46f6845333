"""Model endpoints used *by tools* (vision, moa, image_gen), derived from the run's model settings.

A tool's endpoint defaults to the run's: --base_url (None = the client's default remote API)
and the run's key lookup (--api_key, then $OPENROUTER_API_KEY, $OPENAI_API_KEY, as in
model/factory.py). A tool section may name its own `base_url` and `api_key_env` (the variable
holding its key: keys never live in the config). Clients are built once per run by the
toolset's `build`; a problem that would make every call fail (no key for a remote URL, the
in-process local model) raises ToolUnavailable with the reason, and the toolset is not offered.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from trajforge.errors import UsageError
from trajforge.model.client import DEFAULT_BASE_URL
from trajforge.model.retry import RetryPolicy
from trajforge.model.factory import is_local_model, is_loopback, make_client, resolve_api_key
from trajforge.model.types import ModelClient, Usage

if TYPE_CHECKING:
    from trajforge.tools.tool import ToolContext
    from trajforge.tools.tool_settings import ToolSettings

NO_KEY = "no-key"  # loopback servers accept any key; the SDK insists on one


class ToolUnavailable(Exception):
    """The tool's endpoint cannot work in this run; the message says why and how to fix it."""


def endpoint_url(settings: ToolSettings, base_url: str | None) -> str:
    return (base_url or settings.model.base_url or DEFAULT_BASE_URL).rstrip("/")


def is_default_endpoint(settings: ToolSettings, base_url: str | None) -> bool:
    return endpoint_url(settings, base_url) == DEFAULT_BASE_URL.rstrip("/")


def endpoint_key(settings: ToolSettings, section: str, base_url: str | None, api_key_env: str | None,
                 environ: Mapping[str, str] = os.environ) -> str:
    """The key for a tool endpoint; ToolUnavailable when a remote endpoint has none."""
    url = endpoint_url(settings, base_url)
    if api_key_env:
        own = environ.get(api_key_env, "").strip()
        if not own:
            raise ToolUnavailable(f"tools.{section}.api_key_env names ${api_key_env}, which is not set")
        return own
    key = resolve_api_key(settings.model.api_key, environ)
    if key is None:
        if is_loopback(url):
            return NO_KEY
        raise ToolUnavailable(f"no API key for {url}: pass --api_key, set OPENROUTER_API_KEY / OPENAI_API_KEY, "
                              f"or name a variable in tools.{section}.api_key_env")
    return key


def tool_client(settings: ToolSettings, section: str, *, model: str, base_url: str | None, api_key_env: str | None,
                max_tokens: int | None, temperature: float | None, timeout: float,
                environ: Mapping[str, str] = os.environ) -> ModelClient:
    """A chat client for `model` on the tool's endpoint. Raises ToolUnavailable."""
    if is_local_model(model):
        raise ToolUnavailable(f"tools.{section} needs an OpenAI-compatible API, but its model is the in-process "
                              f"local model ({model}); set tools.{section}.base_url and a model it serves")
    key = endpoint_key(settings, section, base_url, api_key_env, environ)
    run = settings.model
    same_model = model == run.model and endpoint_url(settings, base_url) == endpoint_url(settings, None)
    client_settings = dataclasses.replace(
        run, model=model, base_url=endpoint_url(settings, base_url), api_key=key, max_tokens=max_tokens,
        temperature=temperature, top_p=None, request_timeout=timeout,  # the agent's sampling is not the tool's
        max_retries=RetryPolicy(run.max_retries).for_tool().max_retries,  # the agent waits on a tool call
        # Provider routing names providers of the run's model; for another model it may match none.
        providers_allowed=run.providers_allowed if same_model else None,
        providers_ignored=run.providers_ignored if same_model else None,
        providers_order=run.providers_order if same_model else None,
        provider_sort=run.provider_sort if same_model else None,
    )
    try:
        return make_client(client_settings, environ)
    except UsageError as e:
        raise ToolUnavailable(str(e)) from None


def record_usage(ctx: ToolContext, usage: Usage) -> None:
    """Add tokens spent by a tool's own model calls to the sample's `tool_model_usage` state
    (a Usage), so whoever reports tokens and cost can include them."""
    ctx.state.setdefault("tool_model_usage", Usage()).add(usage)
