"""Choosing and building the model client for a run: API-key lookup, local vs remote backend.

This is the one place that reads API keys from the environment, so the lookup order is defined
once. It decides nothing about announcing a fallback to the local model; `should_use_local`
only answers the question, and the runner says what it does.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from urllib.parse import urlsplit

from trajforge.errors import UsageError
from trajforge.model.client import DEFAULT_BASE_URL, OpenAIClient
from trajforge.model.types import DEFAULT_MODEL, ModelClient, ModelSettings

KEY_ENV_VARS = ("OPENROUTER_API_KEY", "OPENAI_API_KEY")
NO_KEY_PLACEHOLDER = "no-key"


def resolve_api_key(explicit: str | None, environ: Mapping[str, str]) -> str | None:
    """The API key to use, in this order: the explicit --api_key value, then $OPENROUTER_API_KEY,
    then $OPENAI_API_KEY. Empty or blank values are skipped. None when no key is found."""
    candidates = [explicit] + [environ.get(name) for name in KEY_ENV_VARS]
    for key in candidates:
        if key and key.strip():
            return key.strip()
    return None


def is_local_model(model: str) -> bool:
    """`local` or `local:/path/model.gguf` selects the in-process backend."""
    return model == "local" or model.startswith("local:")


def is_loopback(url: str) -> bool:
    """True when the URL's host is this machine (localhost, 127.0.0.0/8, ::1)."""
    try:
        host = urlsplit(url).hostname
    except ValueError:
        return False
    if not host:
        return False
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


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
    base_url = settings.base_url or DEFAULT_BASE_URL
    if resolve_api_key(settings.api_key, environ) is None and not is_loopback(base_url):
        raise UsageError(f"no API key for {base_url}: pass --api_key or set OPENROUTER_API_KEY / OPENAI_API_KEY")


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
    check_client(settings, environ)
    # None only on loopback: local servers (vLLM, llama.cpp) accept any key; the SDK needs one.
    key = resolve_api_key(settings.api_key, environ) or NO_KEY_PLACEHOLDER
    return OpenAIClient(settings, key)
