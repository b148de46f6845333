"""The model transport (aiohttp) under OpenAIClient, against the real scripted HTTP server on
127.0.0.1. tests/model/test_client.py covers the client's policy in depth; this runs the cases
that touch the wire."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from tests.support.scripted_server import Reply, ScriptedServer, chat, http_error, tool_call
from trajforge.errors import FatalModelError
from trajforge.model.client import OpenAIClient
from trajforge.model.errors import APIFailure, RateLimitedError
from trajforge.model.transport import env_proxy
from trajforge.model.types import Completion, ModelSettings

KEY = "sk-test-SECRET-0123456789abcdef"
MESSAGES = [{"role": "user", "content": "list files"}]
TOOLS = [{"type": "function", "function": {"name": "terminal", "description": "run",
                                            "parameters": {"type": "object", "properties": {}}}}]


def complete(srv: ScriptedServer, n: int = 1, **settings: Any) -> list[Completion]:
    async def run() -> list[Completion]:
        client = OpenAIClient(ModelSettings(model="m", base_url=srv.url, **settings), KEY,
                              backoff_base=0.001, backoff_max=0.01)
        try:
            return [await client.complete(MESSAGES, TOOLS) for _ in range(n)]
        finally:
            await client.aclose()

    return asyncio.run(run())


def test_request_and_response() -> None:
    with ScriptedServer() as srv:
        srv.script(chat("ok", tool_calls=[tool_call("terminal", {"command": "ls"}, "c1")], reasoning="why"),
                   chat("again"))
        first, second = complete(srv, n=2, max_tokens=64)
        rec = srv.requests[0]
    assert rec.path == "/v1/chat/completions"
    assert rec.headers["Authorization"] == f"Bearer {KEY}"
    assert rec.headers["Content-Type"] == "application/json"
    assert rec.body == {"model": "m", "messages": MESSAGES, "max_tokens": 64, "tools": TOOLS, "tool_choice": "auto"}
    assert (first.content, first.reasoning, first.tool_calls[0].id) == ("ok", "why", "c1")
    assert json.loads(first.tool_calls[0].arguments) == {"command": "ls"}
    assert second.content == "again" and first.usage.prompt_tokens == 10


def test_status_errors() -> None:
    with ScriptedServer() as srv:
        srv.script(http_error(429, headers={"Retry-After": "0.3"}), http_error(503), chat("ok"))
        start = time.monotonic()
        assert complete(srv)[0].content == "ok"
        assert time.monotonic() - start >= 0.25 and len(srv.chat_requests()) == 3
    with ScriptedServer() as srv:
        srv.script(*[http_error(429, "slow down", headers={"Retry-After": "0"})] * 2)
        with pytest.raises(RateLimitedError, match="HTTP 429: slow down"):
            complete(srv, max_retries=1)
    with ScriptedServer() as srv:
        srv.script(http_error(400, "context length exceeded"))
        with pytest.raises(APIFailure, match="HTTP 400: context length exceeded"):
            complete(srv)
        assert len(srv.chat_requests()) == 1
    with ScriptedServer() as srv:
        srv.script(Reply(status=502, body="<html>bad gateway</html>"), Reply(status=502, body=""))
        with pytest.raises(APIFailure, match="HTTP 502"):
            complete(srv, max_retries=1)


def test_auth_failure_is_fatal_and_hides_key() -> None:
    with ScriptedServer() as srv:
        srv.script(http_error(401, f"Incorrect API key provided: {KEY}"))
        with pytest.raises(FatalModelError) as info:
            complete(srv)
    assert "HTTP 401" in str(info.value) and KEY not in str(info.value)
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_dropped_connection_and_timeout_are_retried() -> None:
    with ScriptedServer() as srv:
        srv.script(Reply(drop=True), chat("late", delay=2.0), chat("second try"))
        assert complete(srv, request_timeout=0.5)[0].content == "second try"
        assert len(srv.chat_requests()) == 3
    with ScriptedServer() as srv:
        srv.script(Reply(drop=True), Reply(drop=True))
        with pytest.raises(APIFailure, match="connection to model API"):
            complete(srv, max_retries=1)


def test_refused_connection_is_a_connection_failure() -> None:
    with ScriptedServer() as srv:
        url = srv.url
    async def run() -> None:  # the server is gone: nothing listens on its port any more
        client = OpenAIClient(ModelSettings(model="m", base_url=url, max_retries=0), KEY)
        try:
            await client.complete(MESSAGES, [])
        finally:
            await client.aclose()

    with pytest.raises(APIFailure, match="connection to model API"):
        asyncio.run(run())


def test_concurrency_is_not_capped() -> None:
    with ScriptedServer(handler=lambda rec: chat("ok", delay=1.0)) as srv:
        async def run() -> list[Completion]:
            client = OpenAIClient(ModelSettings(model="m", base_url=srv.url), KEY)
            try:
                async with asyncio.TaskGroup() as tg:
                    tasks = [tg.create_task(client.complete(MESSAGES, [])) for _ in range(120)]
                return [t.result() for t in tasks]
            finally:
                await client.aclose()

        assert all(r.content == "ok" for r in asyncio.run(run()))
        assert srv.max_in_flight > 100


def test_env_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("http_proxy", "https_proxy", "all_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY",
                "NO_PROXY"):
        monkeypatch.delenv(var, raising=False)
    assert env_proxy("https://openrouter.ai/api/v1/chat/completions") is None
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.internal:3128")
    monkeypatch.setenv("NO_PROXY", "localhost,127.0.0.1")
    assert env_proxy("https://openrouter.ai/api/v1/chat/completions") == "http://proxy.internal:3128"
    assert env_proxy("http://127.0.0.1:8000/v1/chat/completions") is None


def test_the_transport_goes_through_the_environments_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("http_proxy", "all_proxy", "no_proxy", "HTTP_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(var, raising=False)
    with ScriptedServer() as srv:
        monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{srv.port}")
        srv.script(chat("via the proxy"))

        async def run() -> Completion:
            # A host that does not resolve: only the proxy can deliver the request.
            client = OpenAIClient(ModelSettings(model="m", base_url="http://model.invalid/v1", max_retries=0), KEY)
            try:
                return await client.complete(MESSAGES, [])
            finally:
                await client.aclose()

        assert asyncio.run(run()).content == "via the proxy"
        assert srv.requests[0].headers["Host"] == "model.invalid"


async def _complete_against_raw(reply: bytes) -> BaseException:
    """Run one call against a bare TCP server that answers every request with `reply` bytes."""
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(reply)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = OpenAIClient(ModelSettings(model="m", base_url=f"http://127.0.0.1:{port}/v1", max_retries=0), KEY)
    try:
        async with server:
            with pytest.raises(Exception) as info:
                await client.complete(MESSAGES, [])
    finally:
        await client.aclose()
    return info.value


def _chain(exc: BaseException | None) -> list[BaseException]:
    seen: list[BaseException] = []
    while exc is not None and exc not in seen:
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    return seen


def test_malformed_http_reply_keeps_key_out_of_the_exception_chain() -> None:
    # aiohttp's parse errors carry request_info, whose repr prints the Authorization header.
    error = asyncio.run(_complete_against_raw(b"HELLO WORLD\r\n\r\n"))
    assert isinstance(error, APIFailure) and "connection to model API" in str(error)
    for exc in _chain(error):
        assert KEY not in repr(exc) and KEY not in str(exc)
        assert KEY not in repr(getattr(exc, "request_info", ""))


def test_non_json_body_is_scrubbed_before_it_is_cut() -> None:
    body = b"<html>" + b"x" * 180 + KEY.encode() + b"</html>"
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body)
    error = asyncio.run(_complete_against_raw(head + body))
    assert isinstance(error, APIFailure) and "invalid JSON" in str(error)
    assert KEY[:8] not in str(error)  # not even the part of the key before the 200-character cut


def test_moderation_403_fails_the_sample_not_the_run() -> None:
    flagged = {"error": {"code": 403, "message": "input flagged",
                         "metadata": {"reasons": ["violence"], "flagged_input": "...", "provider_name": "x"}}}
    with ScriptedServer() as srv:
        srv.script(Reply(status=403, body=flagged), chat("never sent"))
        with pytest.raises(APIFailure, match="HTTP 403: input flagged"):
            complete(srv)
        assert len(srv.chat_requests()) == 1


def test_a_reply_past_the_size_cap_is_refused_as_it_arrives(monkeypatch: pytest.MonkeyPatch) -> None:
    # The endpoint's reply is held whole in the runner: a 300 MB one took it to ~1 GB. The
    # transport stops reading past MAX_RESPONSE_BYTES (the cap is lowered here to keep the test
    # small), an error status's body too.
    from trajforge.model import transport

    monkeypatch.setattr(transport, "MAX_RESPONSE_BYTES", 1 << 20)
    with ScriptedServer() as srv:
        srv.script(chat("x" * (900 << 10)), *[chat("y" * (3 << 20)) for _ in range(2)],
                   *[http_error(500, "z" * (3 << 20)) for _ in range(2)])
        assert complete(srv)[0].content == "x" * (900 << 10)  # under the cap: as before
        for _ in range(2):  # a reply too large, then an error status's body too large
            with pytest.raises(APIFailure, match="more than 1 MiB"):
                complete(srv, max_retries=1)
        assert len(srv.chat_requests()) == 5
