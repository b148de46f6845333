"""Choosing and building the model client for a run: the local backend or a remote endpoint.

The endpoint and its key are model/endpoint.py's. This module decides nothing about announcing a
fallback to the local model; `should_use_local` only answers the question, and the runner says
what it does.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from trajforge.errors import UsageError
from trajforge.model.client import OpenAIClient
from trajforge.model.endpoint import endpoint, resolve_api_key
from trajforge.model.types import DEFAULT_MODEL, ModelClient, ModelSettings


def is_local_model(model: str) -> bool:
    """`local` or `local:/path/model.gguf` selects the in-process backend."""
    return model == "local" or model.startswith("local:")


def should_use_local(settings: ModelSettings, environ: Mapping[str, str] = os.environ, *,
                     named: bool = False) -> bool:
    """Whether the run will use the in-process local model.

    Always for `--model local[:path]`. Otherwise only as a fallback: no --base_url, no API key
    anywhere, and no model named (`named`: given as a flag or in a config file): a user who named
    a hosted model, even the default one, gets the "no API key" error instead of a silently
    different model.
    """
    if is_local_model(settings.model):
        return True
    return (not named and settings.model == DEFAULT_MODEL and settings.base_url is None
            and resolve_api_key(settings.api_key, environ) is None)


def check_client(settings: ModelSettings, environ: Mapping[str, str] = os.environ) -> None:
    """Raise the UsageError make_client would, without building the client: a command can refuse
    before it creates any file, and still build its client only when it needs one."""
    if is_local_model(settings.model):
        from trajforge.model.local_model import local_backend_status

        if (reason := local_backend_status(settings.model)) is not None:
            raise UsageError(f"--model {settings.model}: {reason}")
        return
    endpoint(settings.base_url, api_key=settings.api_key, environ=environ)


def make_client(settings: ModelSettings, environ: Mapping[str, str] = os.environ) -> ModelClient:
    """Build the client for `settings`: the local backend for `local[:path]`, else OpenAIClient.

    Raises UsageError when a remote (non-loopback) URL has no API key, or when the local
    backend is asked for but not installed (check_client).
    """
    if is_local_model(settings.model):
        try:
            from trajforge.model.local_model import LocalModelClient
        except ImportError as exc:
            raise UsageError(f"the local model backend is not installed ({exc.msg}); "
                             "use a remote --model with --base_url / an API key instead") from exc
        return LocalModelClient(settings)
    return OpenAIClient(settings, endpoint(settings.base_url, api_key=settings.api_key, environ=environ).key)
