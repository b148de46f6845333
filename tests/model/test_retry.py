"""One retry policy for every model call (issue 16): the policy itself, and image generation,
whose SDK retries are off, retrying through it against the real scripted server."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.scripted_server import Reply, ScriptedServer, http_error
from tests.support.toolsets import run_with
from tests.support.web_fixture import make_png
from trajforge.config import RunConfig
from trajforge.model.retry import RetryPolicy
from trajforge.tools import image_gen
from trajforge.tools.tool import ToolContext, Toolset


class Flaky(Exception):
    pass


def test_policy_retries_what_is_retryable_and_stops_at_the_rest() -> None:
    calls: list[int] = []

    async def attempt() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise Flaky("not yet")
        return "ok"

    policy = RetryPolicy(max_retries=2, base=0.0)
    assert asyncio.run(policy.run(attempt, lambda e: isinstance(e, Flaky), what="t")) == "ok" and len(calls) == 3
    calls.clear()
    with pytest.raises(Flaky):  # retries run out: the last failure propagates
        asyncio.run(RetryPolicy(max_retries=1, base=0.0).run(attempt, lambda e: isinstance(e, Flaky), what="t"))
    assert len(calls) == 2
    calls.clear()
    with pytest.raises(Flaky):  # not retryable: one attempt
        asyncio.run(policy.run(attempt, lambda e: False, what="t"))
    assert len(calls) == 1
    assert RetryPolicy(max_retries=5).for_tool().max_retries == 2 and RetryPolicy(max_retries=1).for_tool().max_retries == 1


def test_image_generation_retries_under_the_policy(tmp_path: Path, server: ScriptedServer, clean_env: Any) -> None:
    png = make_png(2, 2, (0, 0, 255))
    good = Reply(body={"created": 0, "data": [{"b64_json": base64.b64encode(png).decode()}]})

    async def body(ts: Toolset, ctx: ToolContext) -> None:
        server.script(http_error(503, "busy"), good)
        result = json.loads(await ts.tools[0].run({"prompt": "blue"}, ctx))
        assert result["success"] is True, result
        assert len(server.requests) == 2  # one retry, by the policy
        server.script(http_error(400, "rejected"))
        rejected = json.loads(await ts.tools[0].run({"prompt": "blue"}, ctx))
        assert rejected["success"] is False and len(server.requests) == 3  # a 400 is not retried

    cfg = RunConfig.model_validate({"model": "m", "base_url": server.url, "max_retries": 3})
    run_with(tmp_path, image_gen.build, cfg, body)


def test_image_generation_makes_one_request_with_retries_off(tmp_path: Path, server: ScriptedServer,
                                                             clean_env: Any) -> None:
    async def body(ts: Toolset, ctx: ToolContext) -> None:
        server.script(http_error(503, "busy"))
        result = json.loads(await ts.tools[0].run({"prompt": "blue"}, ctx))
        assert result["success"] is False and "HTTP 503" in result["error"]
        assert len(server.requests) == 1  # the SDK's own retries are off

    cfg = RunConfig.model_validate({"model": "m", "base_url": server.url, "max_retries": 0})
    run_with(tmp_path, image_gen.build, cfg, body)
