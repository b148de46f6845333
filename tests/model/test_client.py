"""OpenAIClient and the factory against the real scripted HTTP server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import re
import sys
import time
from typing import Any

import pytest

from tests.support.scripted_server import Reply, ScriptedServer, chat, http_error, tool_call
from trajforge.errors import FatalModelError, UsageError
from trajforge.model.client import OpenAIClient, backoff_delay, parse_retry_after, request_options
from trajforge.model.errors import APIFailure, ModelOutputError, RateLimitedError
from trajforge.model.endpoint import NO_KEY, is_loopback, resolve_api_key
from trajforge.model.factory import make_client, should_use_local
from trajforge.model.types import DEFAULT_MODEL, Completion, ModelSettings, Usage

KEY = "sk-test-SECRET-0123456789abcdef"
MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "list files"}]
TOOLS = [{"type": "function", "function": {
    "name": "terminal", "description": "run a shell command",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]
ROUTING_KEYS = ("provider", "reasoning", "max_tokens", "temperature")


def settings(srv: ScriptedServer, **kw: Any) -> ModelSettings:
    return ModelSettings(model="test/model", base_url=srv.url, **kw)


async def _complete_many(s: ModelSettings, n: int, key: str, tools: list[dict[str, Any]],
                         client_kw: dict[str, Any]) -> list[Completion]:
    kw = {"backoff_base": 0.001, "backoff_max": 0.01, **client_kw}
    client = OpenAIClient(s, key, **kw)
    try:
        return [await client.complete(MESSAGES, tools) for _ in range(n)]
    finally:
        await client.aclose()


def complete(s: ModelSettings, tools: list[dict[str, Any]] | None = None, *, key: str = KEY,
             **client_kw: Any) -> Completion:
    return asyncio.run(_complete_many(s, 1, key, tools or [], client_kw))[0]


# --- tool calls and content ----------------------------------------------------------------------

def test_native_tool_call_and_request_body() -> None:
    with ScriptedServer() as srv:
        srv.script(chat("Listing.", tool_calls=[tool_call("terminal", {"command": "ls"}, "call_abc")]))
        result = complete(settings(srv), TOOLS)
        body = srv.chat_requests()[0]
        auth = srv.requests[0].headers.get("Authorization")
    assert result.content == "Listing."
    assert [(c.id, c.name, json.loads(c.arguments)) for c in result.tool_calls] == [
        ("call_abc", "terminal", {"command": "ls"})]
    assert result.finish_reason == "tool_calls"
    assert body["model"] == "test/model"
    assert body["messages"] == MESSAGES
    assert body["tools"] == TOOLS
    assert body["tool_choice"] == "auto"
    assert auth == f"Bearer {KEY}"


def test_several_native_calls_in_one_response() -> None:
    calls = [tool_call("read_file", {"path": "a.py"}, "c1"), tool_call("read_file", {"path": "b.py"}, "c2"),
             tool_call("terminal", {"command": "pytest"}, "c3")]
    with ScriptedServer() as srv:
        srv.script(chat(None, tool_calls=calls))
        result = complete(settings(srv), TOOLS)
    assert result.content == ""
    assert [c.id for c in result.tool_calls] == ["c1", "c2", "c3"]
    assert json.loads(result.tool_calls[1].arguments) == {"path": "b.py"}


def test_no_tools_means_no_tools_keys() -> None:
    with ScriptedServer() as srv:
        srv.script(chat("hi"))
        complete(settings(srv))
        body = srv.chat_requests()[0]
    assert "tools" not in body and "tool_choice" not in body


def test_plain_text_hermes_tool_calls() -> None:
    text = ('<think>I should look first.</think>Checking.\n'
            '<tool_call>\n{"name": "terminal", "arguments": {"command": "ls"}}\n</tool_call>\n'
            '<tool_call>{"name": "read_file", "arguments": "{\\"path\\": \\"x\\"}"}</tool_call>\n'
            '<tool_call>{"name": "terminal", "arguments": {broken</tool_call>')
    with ScriptedServer() as srv:
        srv.script(chat(text))
        result = complete(settings(srv), TOOLS)
    assert result.content == "Checking."
    assert result.reasoning == "I should look first."
    assert [c.id for c in result.tool_calls] == ["call_1", "call_2", "call_3"]
    assert [c.name for c in result.tool_calls] == ["terminal", "read_file", "terminal"]
    assert json.loads(result.tool_calls[1].arguments) == {"path": "x"}
    assert result.tool_calls[2].arguments == '{"name": "terminal", "arguments": {broken'


def test_hermes_text_is_left_alone_when_native_calls_exist() -> None:
    text = 'see <tool_call>{"name": "x", "arguments": {}}</tool_call>'
    with ScriptedServer() as srv:
        srv.script(chat(text, tool_calls=[tool_call("terminal", {"command": "ls"}, "n1")]))
        result = complete(settings(srv), TOOLS)
    assert [c.id for c in result.tool_calls] == ["n1"]
    assert "<tool_call>" in result.content


def test_finish_reason_length_passed_through() -> None:
    with ScriptedServer() as srv:
        srv.script(chat("truncated answ", finish_reason="length"))
        result = complete(settings(srv))
    assert result.finish_reason == "length"
    assert result.content == "truncated answ"


# --- reasoning shapes -----------------------------------------------------------------------------

@pytest.mark.parametrize("field", ["reasoning", "reasoning_content", "reasoning_details"])
def test_reasoning_fields(field: str) -> None:
    with ScriptedServer() as srv:
        srv.script(chat("4", reasoning="2 + 2 = 4", reasoning_field=field))
        result = complete(settings(srv))
    assert result.content == "4"
    assert result.reasoning == "2 + 2 = 4"


@pytest.mark.parametrize("tag", ["think", "REASONING_SCRATCHPAD"])
def test_reasoning_blocks_in_content(tag: str) -> None:
    with ScriptedServer() as srv:
        srv.script(chat(f"<{tag}>\ncount the letters\n</{tag}>\nThere are 3.", reasoning="native part"))
        result = complete(settings(srv))
    assert result.content == "There are 3."
    assert result.reasoning == "native part\n\ncount the letters"


def test_no_reasoning_is_none() -> None:
    with ScriptedServer() as srv:
        srv.script(chat("plain"))
        assert complete(settings(srv)).reasoning is None


# --- usage ----------------------------------------------------------------------------------------

def test_usage_and_cost_summed_over_calls() -> None:
    u1 = {"prompt_tokens": 100, "completion_tokens": 40, "total_tokens": 140, "cost": 0.0012,
          "completion_tokens_details": {"reasoning_tokens": 25}}
    u2 = {"prompt_tokens": 150, "completion_tokens": 10, "total_tokens": 160, "cost": 0.0008}
    with ScriptedServer() as srv:
        srv.script(chat("a", usage=u1), chat("b", usage=u2))
        results = asyncio.run(_complete_many(settings(srv), 2, KEY, [], {}))
    assert results[0].usage == Usage(prompt_tokens=100, completion_tokens=40, reasoning_tokens=25, cost=0.0012)
    assert results[1].usage.reasoning_tokens == 0
    total = Usage()
    for r in results:
        total.add(r.usage)
    assert (total.prompt_tokens, total.completion_tokens, total.reasoning_tokens) == (250, 50, 25)
    assert total.cost == pytest.approx(0.002)


# --- request options ------------------------------------------------------------------------------

def test_routing_and_reasoning_params_sent_when_set() -> None:
    s_all = dict(max_tokens=512, temperature=0.2, providers_allowed=["anthropic", "openai"],
                 providers_ignored=["together"], providers_order=["openai", "anthropic"],
                 provider_sort="throughput", reasoning_effort="high")
    with ScriptedServer() as srv:
        srv.script(chat("a"), chat("b"), chat("c"), chat("d"))
        complete(settings(srv, **s_all))
        complete(settings(srv))
        complete(settings(srv, reasoning_disabled=True, providers_ignored=["deepinfra"]))
        complete(settings(srv, provider_sort="price"))
        full, bare, disabled, sort_only = srv.chat_requests()
    assert full["max_tokens"] == 512 and full["temperature"] == 0.2
    assert full["provider"] == {"only": ["anthropic", "openai"], "ignore": ["together"],
                                "order": ["openai", "anthropic"], "sort": "throughput"}
    assert full["reasoning"] == {"effort": "high"}
    assert not any(k in bare for k in ROUTING_KEYS)
    assert disabled["reasoning"] == {"enabled": False, "exclude": True}
    assert disabled["provider"] == {"ignore": ["deepinfra"]}
    assert "max_tokens" not in disabled and "temperature" not in disabled
    assert sort_only["provider"] == {"sort": "price"} and "reasoning" not in sort_only


def test_request_options_empty_by_default() -> None:
    assert request_options(ModelSettings(model="m")) == {}


# --- retries and failures -------------------------------------------------------------------------

def test_429_honours_retry_after_then_succeeds() -> None:
    with ScriptedServer() as srv:
        srv.script(http_error(429, headers={"Retry-After": "1"}), chat("ok"))
        start = time.monotonic()
        result = complete(settings(srv))  # backoff is ~1ms, so only Retry-After explains a 1s wait
        elapsed = time.monotonic() - start
        assert len(srv.chat_requests()) == 2
    assert result.content == "ok"
    assert elapsed >= 0.95


def test_retry_after_is_capped(caplog: pytest.LogCaptureFixture) -> None:
    # The wait the client chose, read from its own retry line rather than from the clock. An
    # uncapped wait (the hour asked for) would also outlast the suite's per-test timeout.
    with ScriptedServer() as srv:
        srv.script(http_error(429, headers={"Retry-After": "3600"}), chat("ok"))
        with caplog.at_level(logging.WARNING, logger="trajforge.model"):
            assert complete(settings(srv), retry_after_cap=0.2).content == "ok"
        assert len(srv.chat_requests()) == 2
    waits = [re.search(r"retry 1/\d+ in ([\d.]+)s", r.getMessage()) for r in caplog.records]
    assert [float(m[1]) for m in waits if m] == [0.2]  # the cap, plus at most 10% jitter (shown to 0.1s)


def test_429_exhausted_is_rate_limited() -> None:
    with ScriptedServer() as srv:
        srv.script(*[http_error(429, "slow down", headers={"Retry-After": "0"})] * 3)
        with pytest.raises(RateLimitedError, match="HTTP 429: slow down") as info:
            complete(settings(srv, max_retries=2))
        assert len(srv.chat_requests()) == 3
    assert info.value.failure_class == "rate_limit"


def test_500_then_success() -> None:
    with ScriptedServer() as srv:
        srv.script(http_error(500, "upstream exploded"), http_error(503), chat("recovered"))
        assert complete(settings(srv)).content == "recovered"
        assert len(srv.chat_requests()) == 3


def test_5xx_exhausted_is_api_failure() -> None:
    with ScriptedServer() as srv:
        srv.script(*[http_error(502, "bad gateway")] * 2)
        with pytest.raises(APIFailure, match="HTTP 502: bad gateway") as info:
            complete(settings(srv, max_retries=1))
        assert len(srv.chat_requests()) == 2
    assert srv.url in str(info.value)


@pytest.mark.parametrize("status", [400, 404, 422])
def test_client_errors_not_retried(status: int) -> None:
    with ScriptedServer() as srv:
        srv.script(http_error(status, "context length exceeded"), chat("never sent"))
        with pytest.raises(APIFailure, match=f"HTTP {status}: context length exceeded"):
            complete(settings(srv))
        assert len(srv.chat_requests()) == 1


@pytest.mark.parametrize("status", [401, 403])
def test_auth_failure_is_fatal_and_hides_key(status: int) -> None:
    with ScriptedServer() as srv:
        srv.script(http_error(status, f"Incorrect API key provided: {KEY}"), chat("never sent"))
        with pytest.raises(FatalModelError) as info:
            complete(settings(srv))
        assert len(srv.chat_requests()) == 1
    message = str(info.value)
    assert srv.url in message and f"HTTP {status}" in message
    assert KEY not in message
    assert info.value.__cause__ is None and info.value.__suppress_context__  # no key-echoing SDK error chained


def test_timeout_retried_then_api_failure() -> None:
    with ScriptedServer() as srv:
        # Replies the client would accept had it waited for them: only the cut gives this failure.
        srv.script(*[chat("late", delay=2.0)] * 2)
        with pytest.raises(APIFailure, match="timed out after 0.3s"):
            complete(settings(srv, request_timeout=0.3, max_retries=1))
        assert len(srv.chat_requests()) == 2


def test_timeout_then_success() -> None:
    with ScriptedServer() as srv:
        srv.script(chat("late", delay=2.0), chat("on time"))
        assert complete(settings(srv, request_timeout=0.3)).content == "on time"
        assert len(srv.chat_requests()) == 2


def test_dropped_connection_retried() -> None:
    with ScriptedServer() as srv:
        srv.script(Reply(drop=True), chat("second try"))
        assert complete(settings(srv)).content == "second try"
        assert len(srv.chat_requests()) == 2


def test_dropped_connection_exhausted() -> None:
    with ScriptedServer() as srv:
        srv.script(Reply(drop=True), Reply(drop=True))
        with pytest.raises(APIFailure, match="connection to model API"):
            complete(settings(srv, max_retries=1))
        assert len(srv.chat_requests()) == 2


def test_transient_error_inside_a_200_reply_is_retried() -> None:
    with ScriptedServer() as srv:
        srv.script(Reply(body={"error": {"message": "provider returned error", "code": 502}}), chat("ok"))
        assert complete(settings(srv)).content == "ok"
        assert len(srv.chat_requests()) == 2
        srv.script(*[Reply(body={"error": {"message": "slow down", "code": 429}})] * 2)
        with pytest.raises(RateLimitedError):
            complete(settings(srv, max_retries=1))


@pytest.mark.parametrize("body", [
    {"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": []},
    {"error": {"message": "bad request body", "code": 400}},
])
def test_no_choices_is_model_output_error(body: dict[str, Any]) -> None:
    with ScriptedServer() as srv:
        srv.script(Reply(body=body))
        with pytest.raises(ModelOutputError, match="no choices") as info:
            complete(settings(srv))
    assert info.value.failure_class == "model_error"


def test_many_concurrent_requests_are_not_capped_by_the_pool() -> None:
    n = 150  # above httpx's default pool of 100 connections
    with ScriptedServer(handler=lambda rec: chat("ok", delay=1.5)) as srv:
        async def run_all() -> list[Completion]:
            client = OpenAIClient(settings(srv), KEY)
            try:
                async with asyncio.TaskGroup() as tg:
                    tasks = [tg.create_task(client.complete(MESSAGES, [])) for _ in range(n)]
                return [t.result() for t in tasks]
            finally:
                await client.aclose()

        results = asyncio.run(run_all())
        # A pool capped at 100 would hold the rest back; > 100 at once proves it is not.
        assert srv.max_in_flight > 100
    assert all(r.content == "ok" for r in results)


# --- retry policy pieces --------------------------------------------------------------------------

def test_backoff_delay_full_jitter_bounds() -> None:
    rng = random.Random(7)
    for attempt in range(8):
        ceiling = min(3.0, 0.5 * 2 ** attempt)
        delays = [backoff_delay(attempt, None, base=0.5, maximum=3.0, retry_after_cap=60, rng=rng)
                  for _ in range(200)]
        assert all(0 <= d <= ceiling for d in delays)
        assert max(delays) > 0.5 * ceiling  # really spread over the range, not a constant
    assert 2.0 <= backoff_delay(0, 2.0, base=0.5, maximum=3.0, retry_after_cap=60, rng=rng) <= 2.2
    assert 5.0 <= backoff_delay(0, 999.0, base=0.5, maximum=3.0, retry_after_cap=5, rng=rng) <= 5.5


def test_parse_retry_after_forms() -> None:
    assert parse_retry_after({"retry-after": "7"}) == 7.0
    assert parse_retry_after({"retry-after-ms": "250", "retry-after": "7"}) == 0.25
    assert parse_retry_after({}) is None
    assert parse_retry_after({"retry-after": "soon"}) is None
    future = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 30))
    assert 25 <= (parse_retry_after({"retry-after": future}) or 0) <= 31


# --- factory and keys -----------------------------------------------------------------------------

def test_resolve_api_key_order() -> None:
    env = {"OPENROUTER_API_KEY": "or-key", "OPENAI_API_KEY": "oa-key"}
    assert resolve_api_key("explicit", env) == "explicit"
    assert resolve_api_key(None, env) == "or-key"
    assert resolve_api_key(None, {"OPENAI_API_KEY": "oa-key"}) == "oa-key"
    assert resolve_api_key("", {"OPENROUTER_API_KEY": " ", "OPENAI_API_KEY": "oa-key"}) == "oa-key"
    assert resolve_api_key(None, {}) is None


def test_make_client_uses_env_key_in_order() -> None:
    env = {"OPENROUTER_API_KEY": "or-key-1", "OPENAI_API_KEY": "oa-key-2"}
    with ScriptedServer() as srv:
        srv.script(chat("a"), chat("b"))

        async def go(s: ModelSettings) -> None:
            client = make_client(s, env)
            try:
                await client.complete(MESSAGES, [])
            finally:
                await client.aclose()

        asyncio.run(go(settings(srv)))
        asyncio.run(go(settings(srv, api_key="flag-key")))
        auths = [r.headers.get("Authorization") for r in srv.requests]
    assert auths == ["Bearer or-key-1", "Bearer flag-key"]


def test_no_key_for_remote_url_is_usage_error() -> None:
    with pytest.raises(UsageError, match="no API key for https://api.example.com/v1: pass --api_key"):
        make_client(ModelSettings(model="x/y", base_url="https://api.example.com/v1"), {})
    with pytest.raises(UsageError, match="no API key for https://openrouter.ai/api/v1"):
        make_client(ModelSettings(model="x/y"), {})


def test_loopback_url_without_key_uses_placeholder() -> None:
    with ScriptedServer() as srv:
        srv.script(chat("local server"))

        async def go() -> Completion:
            client = make_client(settings(srv), {})
            try:
                return await client.complete(MESSAGES, [])
            finally:
                await client.aclose()

        assert asyncio.run(go()).content == "local server"
        assert srv.requests[0].headers.get("Authorization") == f"Bearer {NO_KEY}"


def test_key_not_in_repr() -> None:
    async def go() -> str:
        client = OpenAIClient(ModelSettings(model="m", base_url="http://127.0.0.1:9/v1"), KEY)
        try:
            return repr(client)
        finally:
            await client.aclose()

    text = asyncio.run(go())
    assert KEY not in text and "127.0.0.1:9" in text


@pytest.mark.parametrize(("url", "expected"), [
    ("http://127.0.0.1:8000/v1", True), ("http://127.8.9.10/v1", True), ("http://localhost:11434/v1", True),
    ("http://[::1]:8080/v1", True), ("https://openrouter.ai/api/v1", False), ("http://10.0.0.5/v1", False),
    ("http://localhost.evil.com/v1", False), ("not a url", False),
])
def test_is_loopback(url: str, expected: bool) -> None:
    assert is_loopback(url) is expected


def test_should_use_local() -> None:
    assert should_use_local(ModelSettings(model="local"), {"OPENROUTER_API_KEY": "k"})
    assert should_use_local(ModelSettings(model="local:/m/x.gguf", base_url="http://x"), {})
    assert should_use_local(ModelSettings(model=DEFAULT_MODEL), {})
    assert not should_use_local(ModelSettings(model=DEFAULT_MODEL), {"OPENAI_API_KEY": "k"})
    assert not should_use_local(ModelSettings(model=DEFAULT_MODEL, api_key="k"), {})
    assert not should_use_local(ModelSettings(model=DEFAULT_MODEL, base_url="http://127.0.0.1:1/v1"), {})
    assert not should_use_local(ModelSettings(model="openai/gpt-4o"), {})  # named remote model: error instead
    # The default's own name, given by the user, is a named model too (the README's first example).
    assert not should_use_local(ModelSettings(model=DEFAULT_MODEL), {}, named=True)


def test_missing_local_backend_is_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # None in sys.modules makes the import fail exactly as if model/local_model.py were absent.
    monkeypatch.setitem(sys.modules, "trajforge.model.local_model", None)
    with pytest.raises(UsageError, match="local model backend is not installed"):
        make_client(ModelSettings(model="local"), {})

