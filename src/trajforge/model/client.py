"""The OpenAI-compatible HTTP model client (OpenRouter, vLLM, llama.cpp server, OpenAI, ...).

This module owns one chat-completion call end to end: the request body (tools, max_tokens,
OpenRouter provider routing and reasoning control, each sent only when set), the retry policy,
the mapping of HTTP failures to model.errors / FatalModelError, and normalising the response
into a Completion. The SDK's own retries are switched off so the policy here is the only one:
429, 5xx, 408/409, timeouts and dropped connections are retried with exponential backoff and
full jitter (or the server's Retry-After, capped); other 4xx fail at once. The API key is held
only by the SDK and is scrubbed from every message this module builds.
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import random
import time
from collections.abc import Mapping
from typing import Any

import httpx2
import openai
from openai import AsyncOpenAI

from trajforge.errors import FatalModelError
from trajforge.model.errors import APIFailure, ModelCallError, ModelOutputError, RateLimitedError
from trajforge.model.parse import (
    INVALID_TOOL_NAME, arguments_text, content_text, extract_hermes_tool_calls, join_reasoning,
    reasoning_from_message, split_reasoning,
)
from trajforge.model.types import Completion, ModelSettings, ToolCall, Usage

log = logging.getLogger(__name__)

DEFAULT_BASE_URL = "https://openrouter.ai/api/v1"
_RETRYABLE_STATUS = {408, 409, 429}  # plus every 5xx
_FATAL_STATUS = {401, 403}


def request_options(settings: ModelSettings) -> dict[str, Any]:
    """The per-run part of the request body: only the options that are set."""
    opts: dict[str, Any] = {}
    if settings.max_tokens is not None:
        opts["max_tokens"] = settings.max_tokens
    if settings.temperature is not None:
        opts["temperature"] = settings.temperature
    extra: dict[str, Any] = {}
    provider = {key: value for key, value in (
        ("only", settings.providers_allowed), ("ignore", settings.providers_ignored),
        ("order", settings.providers_order), ("sort", settings.provider_sort)) if value}
    if provider:
        extra["provider"] = provider
    if settings.reasoning_disabled:
        # An explicit "off" wins over an effort level; exclude keeps stray reasoning out of the reply.
        extra["reasoning"] = {"enabled": False, "exclude": True}
    elif settings.reasoning_effort:
        extra["reasoning"] = {"effort": settings.reasoning_effort}
    if extra:
        opts["extra_body"] = extra
    return opts


def parse_retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds the server asks us to wait (retry-after-ms, Retry-After seconds or HTTP date)."""
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            return max(0.0, float(value) / scale)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value:
        parsed = email.utils.parsedate_tz(value)
        if parsed is not None:
            return max(0.0, email.utils.mktime_tz(parsed) - time.time())
    return None


def backoff_delay(attempt: int, retry_after: float | None, *, base: float, maximum: float,
                  retry_after_cap: float, rng: random.Random) -> float:
    """Seconds to wait before retry number `attempt + 1` (attempt counts from 0).

    The server's Retry-After wins (capped); otherwise exponential backoff with full jitter,
    uniform in [0, min(maximum, base * 2**attempt)].
    """
    if retry_after is not None:
        wait = min(retry_after, retry_after_cap)
        # A little jitter so a thousand callers told "1s" do not all come back in the same instant.
        return wait + rng.uniform(0, 0.1 * wait)
    return rng.uniform(0, min(maximum, base * 2 ** attempt))


def usage_from(raw: Any) -> Usage:
    """Usage of one call; `cost` is OpenRouter's extra field, reasoning tokens sit in the details."""
    if raw is None:
        return Usage()
    details = getattr(raw, "completion_tokens_details", None)
    extra = getattr(raw, "model_extra", None) or {}
    try:
        cost = float(extra.get("cost") or 0.0)
    except (TypeError, ValueError):
        cost = 0.0
    return Usage(prompt_tokens=int(getattr(raw, "prompt_tokens", 0) or 0),
                 completion_tokens=int(getattr(raw, "completion_tokens", 0) or 0),
                 reasoning_tokens=int(getattr(details, "reasoning_tokens", 0) or 0), cost=cost)


class _Retryable(Exception):
    """Internal: a failed attempt worth repeating; `final` is raised once attempts run out."""

    def __init__(self, final: ModelCallError, retry_after: float | None = None) -> None:
        super().__init__(str(final))
        self.final = final
        self.retry_after = retry_after


class OpenAIClient:
    """ModelClient over any OpenAI-compatible /chat/completions endpoint.

    One instance is shared by every concurrent sample of a run; its connection pool has no
    connection cap, so the runner's concurrency limit is the only one.
    """

    def __init__(self, settings: ModelSettings, api_key: str, *, backoff_base: float = 1.0,
                 backoff_max: float = 30.0, retry_after_cap: float = 60.0,
                 rng: random.Random | None = None) -> None:
        self.model_name = settings.model
        self.base_url = settings.base_url or DEFAULT_BASE_URL
        self._settings = settings
        self._secret = api_key
        self._backoff_base = backoff_base
        self._backoff_max = backoff_max
        self._retry_after_cap = retry_after_cap
        self._rng = rng or random.Random()
        self._options = request_options(settings)
        timeout = httpx2.Timeout(settings.request_timeout, connect=min(settings.request_timeout, 30.0))
        limits = httpx2.Limits(max_connections=None, max_keepalive_connections=1000, keepalive_expiry=30.0)
        self._http = httpx2.AsyncClient(limits=limits, timeout=timeout)
        self._api = AsyncOpenAI(api_key=api_key, base_url=self.base_url, max_retries=0, timeout=timeout,
                                http_client=self._http)

    def __repr__(self) -> str:
        return f"OpenAIClient(model={self.model_name!r}, base_url={self.base_url!r})"

    async def aclose(self) -> None:
        await self._api.close()

    async def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Completion:
        body: dict[str, Any] = {"model": self.model_name, "messages": messages, **self._options}
        if tools:
            body["tools"] = tools
            body["tool_choice"] = "auto"
        attempts = self._settings.max_retries + 1
        for attempt in range(attempts):
            try:
                return await self._attempt(body)
            except _Retryable as failed:
                if attempt + 1 >= attempts:
                    raise failed.final from failed.__cause__
                delay = self._delay(attempt, failed.retry_after)
                log.warning("model call to %s failed (%s); retry %d/%d in %.1fs", self.base_url,
                            failed.final, attempt + 1, attempts - 1, delay)
                await asyncio.sleep(delay)
        raise AssertionError("unreachable: the loop returns or raises")

    def _delay(self, attempt: int, retry_after: float | None) -> float:
        return backoff_delay(attempt, retry_after, base=self._backoff_base, maximum=self._backoff_max,
                             retry_after_cap=self._retry_after_cap, rng=self._rng)

    async def _attempt(self, body: dict[str, Any]) -> Completion:
        timeout = self._settings.request_timeout
        try:
            async with asyncio.timeout(timeout):
                response = await self._api.chat.completions.create(**body)
        except (openai.APITimeoutError, TimeoutError) as exc:
            raise _Retryable(APIFailure(f"model API {self.base_url} timed out after {timeout:g}s")) from exc
        except openai.APIConnectionError as exc:
            raise _Retryable(APIFailure(
                f"connection to model API {self.base_url} failed: {self._scrub(str(exc))}")) from exc
        except openai.APIStatusError as exc:
            error = self._status_error(exc)
            if isinstance(error, FatalModelError):
                raise error from None  # the SDK error's text may echo the rejected key
            raise error from exc
        except openai.APIError as exc:
            raise APIFailure(f"model API {self.base_url} error: {self._scrub(str(exc))}") from exc
        return self._completion(response)

    def _status_error(self, exc: openai.APIStatusError) -> Exception:
        status = exc.status_code
        detail = self._scrub(_error_detail(exc))
        if status in _FATAL_STATUS:
            return FatalModelError(
                f"model API {self.base_url} refused the API key (HTTP {status}): {detail}. "
                "Check --api_key / OPENROUTER_API_KEY / OPENAI_API_KEY and the key's permissions.")
        message = f"model API {self.base_url} returned HTTP {status}: {detail}"
        if status == 429:
            return _Retryable(RateLimitedError(message), parse_retry_after(exc.response.headers))
        if status >= 500 or status in _RETRYABLE_STATUS:
            return _Retryable(APIFailure(message), parse_retry_after(exc.response.headers))
        return APIFailure(message)

    def _scrub(self, text: str) -> str:
        if self._secret and len(self._secret) >= 4:
            text = text.replace(self._secret, "***")
        return text[:500]

    def _completion(self, response: Any) -> Completion:
        choices = getattr(response, "choices", None) or []
        if not choices:
            error = (getattr(response, "model_extra", None) or {}).get("error")
            hint = f": {self._scrub(str(error))}" if error else ""
            raise ModelOutputError(f"model API {self.base_url} returned no choices{hint}")
        choice = choices[0]
        message = getattr(choice, "message", None)
        if message is None:
            raise ModelOutputError(f"model API {self.base_url} returned a choice without a message")
        extra = dict(getattr(message, "model_extra", None) or {})
        text = content_text(message.content) or content_text(getattr(message, "refusal", None))
        content, inline_reasoning = split_reasoning(text)
        calls = _native_calls(getattr(message, "tool_calls", None))
        if not calls:
            content, calls = extract_hermes_tool_calls(content)
        return Completion(content=content,
                          reasoning=join_reasoning([reasoning_from_message(extra), inline_reasoning]),
                          tool_calls=calls, finish_reason=getattr(choice, "finish_reason", None),
                          usage=usage_from(getattr(response, "usage", None)))


def _native_calls(raw: Any) -> list[ToolCall]:
    calls: list[ToolCall] = []
    for n, tc in enumerate(raw or [], start=1):
        fn = getattr(tc, "function", None)
        name = getattr(fn, "name", None) or INVALID_TOOL_NAME
        calls.append(ToolCall(id=getattr(tc, "id", None) or f"call_{n}", name=name,
                              arguments=arguments_text(getattr(fn, "arguments", None))))
    return calls


def _error_detail(exc: openai.APIStatusError) -> str:
    """The provider's own error message when the body has one (OpenRouter nests it in error.message)."""
    body = exc.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and isinstance(inner.get("message"), str):
            return inner["message"]
        if isinstance(body.get("message"), str):
            return body["message"]
    return exc.message
