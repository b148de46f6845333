"""Where a model is reached: the one resolution of an endpoint's URL and API key.

Four kinds of model calls need an endpoint: the run's own model, the tools' models (vision,
image_gen, moa), the rubric judge and the compressor's summariser. Each names a base URL (None:
the default remote API) and may name a variable holding its own key (`tools.NAME.api_key_env`,
`--judge_api_key_env`, `summarization.api_key_env`); otherwise its key is the run's: --api_key,
then $OPENROUTER_API_KEY, then $OPENAI_API_KEY. This is the one place that reads API keys from the
environment, and the one wording of an endpoint that could only refuse every call (NoKey): a
remote URL with no key, or a named variable that is not set. A loopback server needs no key
(local servers accept any; the client sends NO_KEY).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from trajforge.errors import UsageError
from trajforge.model.types import DEFAULT_BASE_URL, ModelSettings

KEY_ENV_VARS = ("OPENROUTER_API_KEY", "OPENAI_API_KEY")
NO_KEY = "no-key"


class NoKey(UsageError):
    """The endpoint would refuse every call for want of a key; the message says every way to give one."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    url: str  # the base URL the calls go to
    key: str = field(repr=False)  # the key they carry (NO_KEY to a loopback server without one)


def resolve_api_key(explicit: str | None, environ: Mapping[str, str] = os.environ) -> str | None:
    """The run's API key, in this order: the explicit --api_key value, then $OPENROUTER_API_KEY,
    then $OPENAI_API_KEY. Empty or blank values are skipped. None when no key is found."""
    for key in (explicit, *(environ.get(name) for name in KEY_ENV_VARS)):
        if key and key.strip():
            return key.strip()
    return None


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


def endpoint(base_url: str | None, *, api_key: str | None = None, key_env: str | None = None,
             key_setting: str | None = None, environ: Mapping[str, str] = os.environ) -> Endpoint:
    """The endpoint at `base_url` and its key: the value of the variable `key_env` when one is
    named (by the setting `key_setting`, which messages name), else the run's key (`api_key`, the
    explicit --api_key, then the environment). NoKey when it could only refuse every call."""
    url = base_url or DEFAULT_BASE_URL
    if key_env:
        key = environ.get(key_env, "").strip()
        if not key:
            raise NoKey(f"{key_setting or 'the setting'} names ${key_env}, which is not set")
        return Endpoint(url, key)
    key = resolve_api_key(api_key, environ)
    if key is not None:
        return Endpoint(url, key)
    if is_loopback(url):
        return Endpoint(url, NO_KEY)
    own = f", or name a variable holding it in {key_setting}" if key_setting else ""
    raise NoKey(f"no API key for {url}: pass --api_key or set OPENROUTER_API_KEY / OPENAI_API_KEY{own}")


def settings_for(run: ModelSettings, model: str, at: Endpoint, **changes: Any) -> ModelSettings:
    """The run's model settings for a call of `model` at `at` (a tool's or the judge's): retries
    and pricing as the run's, sampling left to the model's defaults (--temperature and --top_p
    sample the agent's rollouts), and the run's provider routing only when it is the same model at
    the same endpoint (routing names providers of the run's model; for another it may match none)."""
    same = model == run.model and at.url.rstrip("/") == (run.base_url or DEFAULT_BASE_URL).rstrip("/")
    routing = {} if same else {"providers_allowed": None, "providers_ignored": None, "providers_order": None,
                               "provider_sort": None}
    fields = {"model": model, "base_url": at.url, "api_key": at.key, "temperature": None, "top_p": None}
    return dataclasses.replace(run, **fields | routing | changes)
