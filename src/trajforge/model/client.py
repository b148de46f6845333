"""The OpenAI-compatible HTTP model client (OpenRouter, vLLM, llama.cpp server, OpenAI, ...).

This module owns one chat-completion call end to end: the request body (tools, max_tokens,
temperature and top_p, OpenRouter provider routing and reasoning control, each sent only when set), the retry policy,
the mapping of HTTP failures to model.errors / FatalModelError, and normalising the response
into a Completion. Connections belong to model.transport, which does no retries of its own, so
the policy here is the only one: 429, 5xx, 408/409, timeouts and dropped connections are retried
with exponential backoff and full jitter (or the server's Retry-After, capped); other 4xx fail at
once. The API key is held only by the transport and is scrubbed from every message this module
builds.

When the runner has bound a model.gate.ModelGate, every attempt waits there for its turn and
reports how it went (the gate's limiter adapts to 429s and latency); a Retry-After then pauses the
whole endpoint at the gate instead of this one request. Each successful call is priced
(model.pricing) and charged to the running sample (model.spend).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Mapping
from typing import Any

import orjson

from trajforge.errors import FatalModelError
from trajforge.model import gate as model_gate
from trajforge.model import spend, working
from trajforge.model.errors import APIFailure, ModelCallError, ModelOutputError, RateLimitedError
from trajforge.model.errors import ModelTimeoutError
from trajforge.model.parse import (
    INVALID_TOOL_NAME, arguments_text, content_text, extract_hermes_tool_calls, join_reasoning,
    reasoning_from_message, split_reasoning,
)
from trajforge.model.policy import PolicyVersion
from trajforge.model.pricing import call_usage
from trajforge.model.retry import RetryPolicy, backoff_delay, parse_retry_after  # noqa: F401  (re-exported)
from trajforge.model.token_capture import REQUEST_FIELDS, from_reply
from trajforge.model.transport import AiohttpTransport, Transport, TransportError
from trajforge.model.types import DEFAULT_BASE_URL, NOT_RETURNED, Completion, ModelSettings, ToolCall

log = logging.getLogger(__name__)

_RETRYABLE_STATUS = {408, 409, 429}  # plus every 5xx
_FATAL_STATUS = {401, 403}
_OVERLOAD_STATUS = {429, 503}  # the provider says "too much": the gate's limiter shrinks


def request_options(settings: ModelSettings) -> dict[str, Any]:
    """The per-run part of the request body: only the options that are set."""
    opts: dict[str, Any] = {}
    if settings.max_tokens is not None:
        opts["max_tokens"] = settings.max_tokens
    if settings.temperature is not None:
        opts["temperature"] = settings.temperature
    if settings.top_p is not None:
        opts["top_p"] = settings.top_p
    extra: dict[str, Any] = dict(REQUEST_FIELDS) if settings.capture_tokens else {}
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


class _Retryable(Exception):
    """Internal: a failed attempt worth repeating; `final` is raised once attempts run out."""

    def __init__(self, final: ModelCallError, retry_after: float | None = None, *, overload: bool = False) -> None:
        super().__init__(str(final))
        self.final = final
        self.retry_after = retry_after
        self.overload = overload


class OpenAIClient:
    """ModelClient over any OpenAI-compatible /chat/completions endpoint.

    One instance is shared by every concurrent sample of a run; its transport has no connection
    cap, so the runner's concurrency limit is the only one. The request body is encoded once per
    call with orjson and the reply decoded with orjson (the SDK's `chat.completions.create` spent
    more CPU per call on its TypedDict transform and pydantic models than the rest of a trajectory).
    """

    def __init__(self, settings: ModelSettings, api_key: str, *, backoff_base: float = 1.0,
                 backoff_max: float = 30.0, retry_after_cap: float = 60.0,
                 rng: random.Random | None = None) -> None:
        self.model_name = settings.model
        self.base_url = settings.base_url or DEFAULT_BASE_URL
        self._settings = settings
        self._secret = api_key
        self._policy = RetryPolicy(settings.max_retries, backoff_base, backoff_max, retry_after_cap)
        self._rng = rng or random.Random()
        self._options = request_options(settings)
        # The body fields of every request; extra_body is merged at the top level, as the SDK does.
        self._fields = {k: v for k, v in self._options.items() if k != "extra_body"}
        self._fields.update(self._options.get("extra_body", {}))
        self._transport: Transport = AiohttpTransport(self.base_url, api_key, settings.request_timeout)
        self._price = (settings.pricing or {}).get(settings.model)
        self.policy = PolicyVersion(settings.policy_version)

    def __repr__(self) -> str:
        return f"OpenAIClient(model={self.model_name!r}, base_url={self.base_url!r})"

    async def aclose(self) -> None:
        await self._transport.aclose()

    async def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Completion:
        body: dict[str, Any] = {"model": self.model_name, "messages": messages, **self._fields}
        if tools:
            body["tools"] = tools
            body["tool_choice"] = "auto"
        payload = orjson.dumps(body)  # once per call, not per attempt
        attempts = self._policy.attempts
        gate = model_gate.current()
        # Tokens the request may use, for a tokens-per-minute budget (~4 bytes of JSON per token);
        # the gate settles the difference once the reply says how many it really used.
        estimate = len(payload) / 4 + (self._settings.max_tokens or 0)
        for attempt in range(attempts):
            try:
                completion = await self._attempt(payload, gate, estimate)
                spend.charge(completion.usage)
                return completion
            except _Retryable as failed:
                if attempt + 1 >= attempts:
                    raise failed.final from failed.__cause__
                # While the gate adapts, 429s are expected and progress counts them: not a warning each.
                level = logging.INFO if gate is not None and gate.adaptive and failed.overload else logging.WARNING
                if gate is not None and failed.retry_after is not None:
                    # The gate now holds every request to this endpoint until Retry-After ends;
                    # the retry queues there rather than sleeping on its own.
                    log.log(level, "model call to %s failed (%s); retry %d/%d after the endpoint's Retry-After",
                            self.base_url, failed.final, attempt + 1, attempts - 1)
                    continue
                delay = self._delay(attempt, failed.retry_after)
                log.log(level, "model call to %s failed (%s); retry %d/%d in %.1fs", self.base_url,
                        failed.final, attempt + 1, attempts - 1, delay)
                with working.waiting():  # a backoff is the provider's pressure, not the sample's work
                    await asyncio.sleep(delay)
        raise AssertionError("unreachable: the loop returns or raises")

    def _delay(self, attempt: int, retry_after: float | None) -> float:
        return self._policy.delay(attempt, retry_after, self._rng)

    async def _attempt(self, payload: bytes, gate: model_gate.ModelGate | None, estimate: float) -> Completion:
        if gate is None:
            return await self._post(payload)
        ticket = await gate.acquire(self.base_url, estimate)
        result: model_gate.Result = "other"
        retry_after = None
        tokens = None
        try:
            completion = await self._post(payload)
            result, tokens = "ok", completion.usage.prompt_tokens + completion.usage.completion_tokens
            return completion
        except _Retryable as failed:
            result = "overload" if failed.overload else "other"
            retry_after = failed.retry_after
            raise
        finally:
            gate.release(ticket, result, retry_after=retry_after, tokens=tokens)

    async def _post(self, payload: bytes) -> Completion:
        timeout = self._settings.request_timeout
        version = self.policy.value  # as the request leaves: a wait at the gate or a backoff may span an update
        try:
            async with asyncio.timeout(timeout):
                reply = await self._transport.post(payload)
        except TimeoutError as exc:
            raise _Retryable(ModelTimeoutError(f"model API {self.base_url} timed out after {timeout:g}s")) from exc
        except TransportError as exc:
            raise _Retryable(APIFailure(
                f"connection to model API {self.base_url} failed: {self._scrub(str(exc))}")) from exc
        if reply.status >= 300:
            error = self._status_error(reply.status, reply.headers, reply.body)
            if isinstance(error, FatalModelError):
                raise error from None
            raise error
        raw = reply.body
        try:
            response = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            # Scrubbed before it is cut: a key straddling the cut would otherwise leak its prefix.
            raise APIFailure(f"model API {self.base_url} returned invalid JSON: "
                             f"{self._scrub(raw.decode(errors='replace'))[:200]}") from exc
        completion = self._completion(response)
        completion.policy_version = version
        return completion

    def _status_error(self, status: int, headers: Mapping[str, str], body: bytes) -> Exception:
        detail = self._scrub(_error_detail(body))
        if status in _FATAL_STATUS and not _is_moderation(body):
            return FatalModelError(
                f"model API {self.base_url} refused the API key (HTTP {status}): {detail}. "
                "Check --api_key / OPENROUTER_API_KEY / OPENAI_API_KEY and the key's permissions.")
        message = f"model API {self.base_url} returned HTTP {status}: {detail}"
        if status == 429:
            return _Retryable(RateLimitedError(message), parse_retry_after(headers), overload=True)
        if status >= 500 or status in _RETRYABLE_STATUS:
            return _Retryable(APIFailure(message), parse_retry_after(headers), overload=status in _OVERLOAD_STATUS)
        return APIFailure(message)

    def _scrub(self, text: str) -> str:
        if self._secret and len(self._secret) >= 4:
            text = text.replace(self._secret, "***")
        return text[:500]

    def _completion(self, response: Any) -> Completion:
        """Normalise the decoded response body; every field is checked, as providers vary."""
        if not isinstance(response, dict):
            raise ModelOutputError(f"model API {self.base_url} returned {type(response).__name__}, not an object")
        choices = response.get("choices")
        if not isinstance(choices, list) or not choices:
            error = response.get("error")
            hint = f": {self._scrub(str(error))}" if error else ""
            code = error.get("code") if isinstance(error, dict) else None
            # OpenRouter reports a provider failure after the stream started as HTTP 200 with an
            # error object; a transient code there deserves the same retries as the HTTP status.
            if isinstance(code, int) and (code == 429 or code >= 500 or code in _RETRYABLE_STATUS):
                message = f"model API {self.base_url} returned error {code} in its reply{hint}"
                raise _Retryable(RateLimitedError(message) if code == 429 else APIFailure(message),
                                 overload=code in _OVERLOAD_STATUS)
            raise ModelOutputError(f"model API {self.base_url} returned no choices{hint}")
        choice = choices[0]
        message = choice.get("message") if isinstance(choice, dict) else None
        if not isinstance(message, dict):
            raise ModelOutputError(f"model API {self.base_url} returned a choice without a message")
        text = content_text(message.get("content")) or content_text(message.get("refusal"))
        content, inline_reasoning = split_reasoning(text)
        calls = _native_calls(message.get("tool_calls"))
        if not calls:
            content, calls = extract_hermes_tool_calls(content)
        finish = choice.get("finish_reason")
        completion = Completion(content=content,
                                reasoning=join_reasoning([reasoning_from_message(message), inline_reasoning]),
                                tool_calls=calls, finish_reason=finish if isinstance(finish, str) else None,
                                usage=call_usage(response.get("usage"), self._price))
        if self._settings.capture_tokens:
            completion.tokens = from_reply(response, choice)
            completion.tokens_missing = NOT_RETURNED if completion.tokens is None else None
        return completion


def _native_calls(raw: Any) -> list[ToolCall]:
    """The reply's tool calls, each with an id of its own: a call without one, or repeating one
    of an earlier call in the reply, gets `call_<n>` (or `call_<n>_<k>` if that is taken too), so
    no result is paired with the wrong call or lost (results are matched to calls by id)."""
    items = raw if isinstance(raw, list) else []
    given = [tc.get("id") if isinstance(tc, dict) and isinstance(tc.get("id"), str) and tc.get("id") else None
             for tc in items]
    taken = {i for i in given if i is not None}
    used: set[str] = set()
    calls: list[ToolCall] = []
    for n, (tc, call_id) in enumerate(zip(items, given), start=1):
        tc = tc if isinstance(tc, dict) else {}
        fn = tc.get("function") if isinstance(tc.get("function"), dict) else {}
        name = fn.get("name") if isinstance(fn.get("name"), str) and fn.get("name") else INVALID_TOOL_NAME
        if call_id is None or call_id in used:
            call_id, k = f"call_{n}", 1
            while call_id in taken or call_id in used:
                call_id, k = f"call_{n}_{k}", k + 1
        used.add(call_id)
        calls.append(ToolCall(id=call_id, name=name, arguments=arguments_text(fn.get("arguments"))))
    return calls


def _is_moderation(body: bytes) -> bool:
    """OpenRouter's 403 for one flagged input (metadata.reasons / flagged_input): a per-sample
    failure, not a refused key, so it must not stop the run."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return False
    error = data.get("error") if isinstance(data, dict) else None
    meta = error.get("metadata") if isinstance(error, dict) else None
    return isinstance(meta, dict) and ("flagged_input" in meta or "reasons" in meta)


def _error_detail(body: bytes) -> str:
    """The provider's own error message when the body has one (OpenRouter nests it in error.message)."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        data = None
    if isinstance(data, dict):
        inner = data.get("error", data)
        if isinstance(inner, dict) and isinstance(inner.get("message"), str):
            return inner["message"]
        if isinstance(data.get("message"), str):
            return data["message"]
    return body.decode("utf-8", "replace").strip() or "(empty body)"
