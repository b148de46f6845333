"""A session whose policy changes while it runs: each call records the version it was sent under,
and the record's segments still hold every call (the agent loop, a real client, a real server)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from tests.support.scripted_server import Recorded, Reply, ScriptedServer
from tests.support.token_server import TokenServer, terminal_policy
from trajforge.agent.loop import SessionResult, run_session
from trajforge.agent.record import build_record
from trajforge.config import RunConfig
from trajforge.model.client import OpenAIClient
from trajforge.model.types import ModelSettings
from trajforge.sample.lower_settings import tool_settings
from trajforge.sandbox.backends.local.local_sandbox import LocalSandbox
from trajforge.tools import terminal
from trajforge.tools.tool import ToolContext
from trajforge.tools.toolsets import KNOWN_TOOLS


def test_calls_after_a_new_policy_version_carry_it(tmp_path: Path) -> None:
    tokens = TokenServer(terminal_policy(turns=3))
    client: dict[str, OpenAIClient] = {}

    def trainer_updates_weights(req: Recorded) -> Reply:
        reply = tokens(req)
        if tokens.calls[-1]["turn"] == 1:  # new weights land while the second call is being served
            client["c"].policy.set(8)
        return reply

    async def go(url: str) -> SessionResult:
        settings = tool_settings(RunConfig(tool_timeout=10))
        tools = (await terminal.build(settings)).tools
        client["c"] = OpenAIClient(ModelSettings(model="m", base_url=url, capture_tokens=True, policy_version=7), "k")
        sb = LocalSandbox(tmp_path)
        await sb.start()
        try:
            ctx = ToolContext(sb, settings, "id")
            async with ctx.cleanup:
                return await run_session("say alpha", client["c"], tools, ctx, max_turns=5)
        finally:
            await sb.close()
            await client["c"].aclose()

    with ScriptedServer(trainer_updates_weights) as server:
        session = asyncio.run(go(server.url))
    record: dict[str, Any] = build_record(session, prompt_index=0, sample_id="s", batch_num=0, model="m",
                                          toolsets_used=["terminal"], known_tools=KNOWN_TOOLS)
    assert session.api_calls == 4
    assert record["policy_versions"] == [7, 7, 8, 8]  # the second call was sent before the update
    [segment] = record["tokens"]["segments"]
    assert segment["turns"] == [0, 1, 2, 3]
    last = tokens.calls[-1]
    assert segment["input_ids"] == last["prompt_ids"] + last["completion_ids"]
