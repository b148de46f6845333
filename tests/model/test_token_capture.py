"""Token ids and logprobs in vLLM's reply shapes (model.token_capture), asked for only under
--capture_tokens, and each call's policy version, through the real client and a real server."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.scripted_server import ScriptedServer, chat
from trajforge.model.client import OpenAIClient
from trajforge.model.token_capture import from_reply
from trajforge.model.types import NOT_REQUESTED, NOT_RETURNED, ModelSettings


def reply(prompt_ids: object = (1, 2, 3), token_ids: object = (7, 8), logprobs: object = (-0.5, -0.25)) -> dict:
    body = chat("hi").body
    if prompt_ids is not None:
        body["prompt_token_ids"] = list(prompt_ids)  # type: ignore[call-overload]
    if token_ids is not None:
        body["choices"][0]["token_ids"] = list(token_ids)  # type: ignore[call-overload]
    if logprobs is not None:
        body["choices"][0]["logprobs"] = {"content": [{"token": "x", "logprob": v, "top_logprobs": []}
                                                      for v in logprobs]}  # type: ignore[union-attr]
    return body


def test_ids_and_logprobs_are_taken_as_the_server_sent_them() -> None:
    body = reply()
    got = from_reply(body, body["choices"][0])
    assert got is not None
    assert list(got.prompt_ids) == [1, 2, 3] and list(got.completion_ids) == [7, 8]
    assert got.logprobs == [-0.5, -0.25]


@pytest.mark.parametrize("body", [
    reply(prompt_ids=None), reply(token_ids=None), reply(prompt_ids=[]), reply(prompt_ids=[1, "2"]),
    reply(token_ids=[1.5]), reply(prompt_ids=[1 << 40]), reply(token_ids="1 2"),
], ids=["no prompt ids", "no completion ids", "empty prompt", "a string id", "a float id", "an id past 32 bits",
        "ids as text"])
def test_a_reply_without_usable_ids_gives_none_never_a_guess(body: dict) -> None:
    assert from_reply(body, body["choices"][0]) is None


@pytest.mark.parametrize("logprobs", [None, (-0.5,), (-0.5, "x"), (-0.5, None)],
                         ids=["none", "one short", "not a number", "a null"])
def test_logprobs_that_are_not_one_number_per_id_are_left_out(logprobs: object) -> None:
    body = reply(logprobs=logprobs)
    got = from_reply(body, body["choices"][0])
    assert got is not None and list(got.completion_ids) == [7, 8] and got.logprobs is None


def _complete(settings: ModelSettings, server: ScriptedServer, n: int = 1, between=None) -> list:
    async def go() -> list:
        client = OpenAIClient(settings, "k")
        out = []
        try:
            for i in range(n):
                out.append(await client.complete([{"role": "user", "content": "x"}], []))
                if between is not None:
                    between(client, i)
        finally:
            await client.aclose()
        return out
    return asyncio.run(go())


def test_the_request_fields_are_sent_only_under_capture_tokens() -> None:
    with ScriptedServer(lambda r: chat("hi")) as server:
        [plain] = _complete(ModelSettings(model="m", base_url=server.url), server)
        [asked] = _complete(ModelSettings(model="m", base_url=server.url, capture_tokens=True), server)
        first, second = server.chat_requests()
    assert "return_token_ids" not in first and "logprobs" not in first
    assert second["return_token_ids"] is True and second["logprobs"] is True
    assert plain.tokens is None and plain.tokens_missing == NOT_REQUESTED
    # The server ignored the fields: no ids, and the reply says so.
    assert asked.tokens is None and asked.tokens_missing == NOT_RETURNED
    assert asked.content == "hi"


def test_a_server_that_returns_ids_fills_the_completion() -> None:
    from tests.support.scripted_server import Reply

    with ScriptedServer(lambda r: Reply(body=reply())) as server:
        [c] = _complete(ModelSettings(model="m", base_url=server.url, capture_tokens=True), server)
    assert c.tokens is not None and c.tokens_missing is None
    assert list(c.tokens.prompt_ids) == [1, 2, 3] and c.tokens.logprobs == [-0.5, -0.25]


def test_each_call_carries_the_policy_version_current_when_it_was_sent() -> None:
    def bump(client: OpenAIClient, i: int) -> None:
        client.policy.set(5 + i)  # a trainer's new weights arrive between calls

    with ScriptedServer(lambda r: chat("hi")) as server:
        calls = _complete(ModelSettings(model="m", base_url=server.url, policy_version=4), server, 3, bump)
        unstamped = _complete(ModelSettings(model="m", base_url=server.url), server)
    assert [c.policy_version for c in calls] == [4, 5, 6]
    assert unstamped[0].policy_version is None


@pytest.mark.parametrize("bad", [-1, True, 1.5, "3"])
def test_a_policy_version_is_a_whole_number(bad: object) -> None:
    from trajforge.model.policy import PolicyVersion

    with pytest.raises(ValueError, match="whole number"):
        PolicyVersion().set(bad)  # type: ignore[arg-type]


def test_a_retry_sent_after_an_update_carries_the_new_version() -> None:
    from tests.support.scripted_server import http_error

    holder: dict[str, OpenAIClient] = {}

    def handler(req: object) -> object:
        if len(server.requests) == 1:  # the first attempt fails, and new weights land before the retry
            holder["c"].policy.set(9)
            return http_error(503, "reloading weights")
        return chat("hi")

    async def go() -> object:
        holder["c"] = OpenAIClient(ModelSettings(model="m", base_url=server.url, policy_version=8, max_retries=2),
                                   "k", backoff_base=0.01, backoff_max=0.02)
        try:
            return await holder["c"].complete([{"role": "user", "content": "x"}], [])
        finally:
            await holder["c"].aclose()

    with ScriptedServer(handler) as server:  # type: ignore[arg-type]
        completion = asyncio.run(go())
    assert len(server.requests) == 2 and completion.policy_version == 9  # type: ignore[attr-defined]
