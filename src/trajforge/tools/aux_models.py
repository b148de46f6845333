"""Model endpoints used *by tools* (vision, moa, image_gen), derived from the run's model settings.

A tool's endpoint defaults to the run's --base_url (None = the default remote API) and key; a tool
section may name its own `base_url` and `api_key_env` (the variable holding its key: keys never
live in the config). Both are resolved by model/endpoint.py, as for every model endpoint. Clients
are built once per run by the toolset's `build`; a problem that would make every call fail (no
key for a remote URL, the in-process local model) raises ToolUnavailable with the reason, and the
toolset is not offered.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from trajforge.errors import UsageError
from trajforge.model.endpoint import Endpoint, NoKey, endpoint, settings_for
from trajforge.model.factory import is_local_model, make_client
from trajforge.model.retry import RetryPolicy
from trajforge.model.types import DEFAULT_BASE_URL, ModelClient, Usage

if TYPE_CHECKING:
    from trajforge.tools.tool import ToolContext
    from trajforge.tools.tool_settings import ToolSettings


class ToolUnavailable(Exception):
    """The tool's endpoint cannot work in this run; the message says why and how to fix it."""


def is_default_endpoint(settings: ToolSettings, base_url: str | None) -> bool:
    return (base_url or settings.model.base_url or DEFAULT_BASE_URL).rstrip("/") == DEFAULT_BASE_URL.rstrip("/")


def tool_endpoint(settings: ToolSettings, section: str, base_url: str | None, api_key_env: str | None,
                  environ: Mapping[str, str] = os.environ) -> Endpoint:
    """The endpoint of tool section `section`: its own base URL and key variable, else the run's;
    ToolUnavailable when it could only fail."""
    try:
        return endpoint((base_url or settings.model.base_url or DEFAULT_BASE_URL).rstrip("/"),
                        api_key=settings.model.api_key, key_env=api_key_env,
                        key_setting=f"tools.{section}.api_key_env", environ=environ)
    except NoKey as e:
        raise ToolUnavailable(str(e)) from None


def tool_client(settings: ToolSettings, section: str, *, model: str, base_url: str | None, api_key_env: str | None,
                max_tokens: int | None, temperature: float | None, timeout: float,
                environ: Mapping[str, str] = os.environ) -> ModelClient:
    """A chat client for `model` on the tool's endpoint. Raises ToolUnavailable."""
    if is_local_model(model):
        raise ToolUnavailable(f"tools.{section} needs an OpenAI-compatible API, but its model is the in-process "
                              f"local model ({model}); set tools.{section}.base_url and a model it serves")
    at = tool_endpoint(settings, section, base_url, api_key_env, environ)
    run = settings.model
    client_settings = settings_for(run, model, at, max_tokens=max_tokens, temperature=temperature,
                                   request_timeout=timeout,
                                   max_retries=RetryPolicy(run.max_retries).for_tool().max_retries)  # the agent waits
    try:
        return make_client(client_settings, environ)
    except UsageError as e:
        raise ToolUnavailable(str(e)) from None


def record_usage(ctx: ToolContext, usage: Usage) -> None:
    """Add tokens spent by a tool's own model calls to the sample's `tool_model_usage` state
    (a Usage), so whoever reports tokens and cost can include them."""
    ctx.state.setdefault("tool_model_usage", Usage()).add(usage)
