"""vision, image_gen and moa against the scripted OpenAI-compatible server (real HTTP, real files).

Ends with the issue's acceptance run: the real CLI with --distribution=default and a scripted
model that calls web_search, web_extract, image_generate, vision_analyze and mixture_of_agents
once each; every call must succeed against the local backends and be counted in tool_stats.
"""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import cli
from tests.support.scripted_server import Recorded, Reply, ScriptedServer, chat, http_error, tool_call
from tests.support.toolsets import run_with
from tests.support.web_fixture import PNG, WebFixture, make_png
from tests.support.run_state import read_records
from trajforge.config import RunConfig
from trajforge.tools import image_gen, moa, vision
from trajforge.tools.tool import ToolContext, Toolset, Unavailable
from trajforge.tools.moa import DEFAULT_REFERENCE_MODELS

BLUE = make_png(2, 2, (0, 0, 255))


@pytest.fixture(scope="module")
def site() -> Any:
    with WebFixture() as fixture:
        yield fixture


def config(server: ScriptedServer, **values: Any) -> RunConfig:
    values.setdefault("network", {"allow": ["127.0.0.1"]})  # fixture images are served on loopback
    return RunConfig.model_validate({"model": "run-model", "base_url": server.url, **values})


async def call(toolset: Toolset, args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    return json.loads(await toolset.tools[0].run(args, ctx))


def image_part(body: dict[str, Any]) -> str:
    parts = body["messages"][-1]["content"]
    assert parts[0]["type"] == "text"
    assert parts[1]["type"] == "image_url"
    return parts[1]["image_url"]["url"]


# --- vision -------------------------------------------------------------------------------------

def test_vision_sends_workspace_image_inline(tmp_path: Path, server: ScriptedServer, clean_env: Any) -> None:
    server.script(chat("A small red rectangle."))

    async def body(ts: Toolset, ctx: ToolContext) -> None:
        (ctx.sandbox.workspace / "pics").mkdir()
        (ctx.sandbox.workspace / "pics" / "red.png").write_bytes(PNG)
        data = await call(ts, {"image_url": "pics/red.png", "question": "What colour is it?"}, ctx)
        assert data == {"success": True, "analysis": "A small red rectangle.", "image_url": "pics/red.png",
                        "model": "run-model"}
        assert ctx.state["tool_model_usage"].prompt_tokens == 10

    run_with(tmp_path, vision.build, config(server), body)
    req = server.chat_requests()[0]
    assert req["model"] == "run-model" and "tools" not in req and req["max_tokens"] == 2000
    assert image_part(req) == "data:image/png;base64," + base64.b64encode(PNG).decode()
    assert "What colour is it?" in req["messages"][0]["content"][0]["text"]


def test_vision_urls_are_inlined_or_passed_through(tmp_path: Path, server: ScriptedServer, site: WebFixture,
                                                   clean_env: Any) -> None:
    server.script(chat("red"), chat("red again"))

    async def body(ts: Toolset, ctx: ToolContext) -> None:
        assert (await call(ts, {"image_url": site.url("/image.png"), "question": "?"}, ctx))["success"] is True

    run_with(tmp_path, vision.build, config(server, tools={"vision": {"model": "eye-model", "max_tokens": 50}}), body)
    run_with(tmp_path, vision.build, config(server, tools={"vision": {"fetch_urls": False}}), body)
    first, second = server.chat_requests()
    assert first["model"] == "eye-model" and first["max_tokens"] == 50
    assert image_part(first).startswith("data:image/png;base64,")
    assert image_part(second) == site.url("/image.png")


def test_vision_bad_images_are_error_results(tmp_path: Path, server: ScriptedServer, site: WebFixture,
                                             clean_env: Any) -> None:
    server.script(http_error(400, "model does not support images"))

    async def body(ts: Toolset, ctx: ToolContext) -> None:
        (ctx.sandbox.workspace / "notes.txt").write_text("not an image")
        (ctx.sandbox.workspace / "ok.png").write_bytes(BLUE)
        cases = {
            "../../etc/passwd": "outside the workspace",
            "missing.png": "no such image file: missing.png",
            "notes.txt": "notes.txt is not a supported image (text/plain); use PNG, JPEG, GIF or WEBP",
            site.url("/notes.txt"): "is not a supported image",
            site.url("/nothing.png"): "returned HTTP 404",
            "": "image_url must be a workspace path or an http(s) URL",
        }
        for source, message in cases.items():
            data = await call(ts, {"image_url": source, "question": "?"}, ctx)
            assert data["success"] is False and message in data["error"], (source, data)
        failed = await call(ts, {"image_url": "ok.png", "question": "?"}, ctx)
        assert failed["success"] is False
        assert failed["error"].startswith("vision model run-model failed:") and "HTTP 400" in failed["error"]

    run_with(tmp_path, vision.build, config(server), body)
    assert len(server.chat_requests()) == 1  # only the valid image reached the model


def test_vision_unavailable_when_it_could_only_fail(server: ScriptedServer, clean_env: Any) -> None:
    def reason(cfg: RunConfig) -> str:
        built = asyncio.run(vision.build(cfg.tool_settings()))
        assert isinstance(built, Unavailable) and built.toolset == "vision"
        return built.reason

    assert "OPENROUTER_API_KEY" in reason(RunConfig.model_validate({"model": "m"}))  # remote, no key
    assert "$NO_SUCH_KEY_VAR, which is not set" in reason(
        config(server, tools={"vision": {"api_key_env": "NO_SUCH_KEY_VAR"}}))
    assert "in-process local model" in reason(RunConfig.model_validate({"model": "local"}))


# --- image_gen ----------------------------------------------------------------------------------

def images_reply(req: Recorded) -> Reply:
    assert req.path == "/v1/images/generations"
    return Reply(body={"created": 0, "data": [{"b64_json": base64.b64encode(BLUE).decode(),
                                               "revised_prompt": "a blue square, flat"}]})


def test_image_generate_saves_into_the_workspace(tmp_path: Path, server: ScriptedServer, clean_env: Any) -> None:
    server.handler = images_reply

    async def body(ts: Toolset, ctx: ToolContext) -> None:
        first = await call(ts, {"prompt": "A Blue Square!", "aspect_ratio": "landscape"}, ctx)
        workdir = ctx.sandbox.workdir
        assert first == {"success": True, "path": "images/a-blue-square.png",
                         "absolute_path": f"{workdir}/images/a-blue-square.png", "url": None,
                         "revised_prompt": "a blue square, flat", "size": "1536x1024", "bytes": len(BLUE)}
        assert (ctx.sandbox.workspace / "images" / "a-blue-square.png").read_bytes() == BLUE
        second = await call(ts, {"prompt": "a blue square"}, ctx)
        assert second["path"] == "images/a-blue-square-2.png" and second["size"] == "1024x1024"

    run_with(tmp_path, image_gen.build, config(server, tools={"image_gen": {"model": "painter"}}), body)
    bodies = [r.body for r in server.requests]
    assert bodies[0] == {"model": "painter", "prompt": "A Blue Square!", "size": "1536x1024", "n": 1}


def test_image_generate_downloads_url_answers(tmp_path: Path, server: ScriptedServer, site: WebFixture,
                                              clean_env: Any) -> None:
    server.handler = lambda req: Reply(body={"created": 0, "data": [{"url": site.url("/image.png")}]})

    async def body(ts: Toolset, ctx: ToolContext) -> None:
        data = await call(ts, {"prompt": "red"}, ctx)
        assert data["url"] == site.url("/image.png") and data["path"] == "images/red.png"
        assert (ctx.sandbox.workspace / "images" / "red.png").read_bytes() == PNG

    run_with(tmp_path, image_gen.build, config(server, tools={"image_gen": {"response_format": "url"}}), body)
    assert server.requests[0].body["response_format"] == "url"


def test_image_generate_failures(tmp_path: Path, server: ScriptedServer, clean_env: Any) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()

    async def body(ts: Toolset, ctx: ToolContext) -> None:
        server.script(http_error(400, "prompt rejected by safety system"))
        rejected = await call(ts, {"prompt": "x"}, ctx)
        assert rejected["success"] is False and "HTTP 400" in rejected["error"]
        server.script(Reply(body={"created": 0, "data": [{"b64_json": base64.b64encode(b"not an image").decode()}]}))
        assert "not a PNG, JPEG, GIF or WEBP" in (await call(ts, {"prompt": "x"}, ctx))["error"]
        server.handler = images_reply
        (ctx.sandbox.workspace / "images").symlink_to(outside)  # the model planted a link
        escaped = await call(ts, {"prompt": "x"}, ctx)
        assert escaped["success"] is False and "cannot save the image" in escaped["error"]
        assert list(outside.iterdir()) == []

    run_with(tmp_path, image_gen.build, config(server), body)


def test_image_gen_needs_a_known_endpoint(clean_env: Any) -> None:
    built = asyncio.run(image_gen.build(RunConfig.model_validate({"model": "m"}).tool_settings()))
    assert isinstance(built, Unavailable) and "tools.image_gen.base_url" in built.reason


# --- moa ----------------------------------------------------------------------------------------

def moa_handler(fail: set[str]) -> Callable[[Recorded], Reply]:
    def handle(req: Recorded) -> Reply:
        body = req.body
        model = body["model"]
        if body["messages"][0]["role"] == "system":
            return chat(f"aggregate by {model}")
        # A short delay so parallel references are observably in flight together.
        if model in fail:
            return http_error(400, f"{model} is down", delay=0.2)
        return chat(f"answer from {model} at {body['temperature']}", delay=0.2)

    return handle


def test_moa_aggregates_parallel_references_and_tolerates_failures(tmp_path: Path, server: ScriptedServer,
                                                                   clean_env: Any) -> None:
    server.handler = moa_handler(fail={"ref-c"})
    tools = {"moa": {"reference_models": ["ref-a", "ref-b", "ref-c"], "aggregator_model": "agg",
                     "reference_max_tokens": 100, "aggregator_temperature": 0.1}}

    async def body(ts: Toolset, ctx: ToolContext) -> None:
        data = await call(ts, {"user_prompt": "Prove that sqrt(2) is irrational."}, ctx)
        assert data["success"] is True and data["response"] == "aggregate by agg"
        assert data["models_used"] == ["ref-a", "ref-b"] and data["aggregator"] == "agg"
        assert data["failures"][0]["model"] == "ref-c" and "ref-c is down" in data["failures"][0]["error"]
        assert ctx.state["tool_model_usage"].prompt_tokens == 30  # two references + the aggregator

    run_with(tmp_path, moa.build, config(server, tools=tools), body)
    chats = server.chat_requests()
    refs = [b for b in chats if b["messages"][0]["role"] == "user"]
    assert sorted(b["model"] for b in refs) == ["ref-a", "ref-b", "ref-c"]
    assert all(b["max_tokens"] == 100 and b["temperature"] == 0.6 for b in refs)
    assert server.max_in_flight == 3  # all references in flight at once
    agg = chats[-1]
    assert agg["model"] == "agg" and agg["temperature"] == 0.1
    system = agg["messages"][0]["content"]
    assert "answer from ref-a at 0.6" in system and "answer from ref-b at 0.6" in system
    assert agg["messages"][1] == {"role": "user", "content": "Prove that sqrt(2) is irrational."}


def test_moa_fails_cleanly_when_too_few_references_answer(tmp_path: Path, server: ScriptedServer,
                                                          clean_env: Any) -> None:
    server.handler = moa_handler(fail={"ref-a", "ref-b"})
    tools = {"moa": {"reference_models": ["ref-a", "ref-b"], "aggregator_model": "agg"}}

    async def body(ts: Toolset, ctx: ToolContext) -> None:
        data = await call(ts, {"user_prompt": "hard"}, ctx)
        assert data["success"] is False and data["error"] == "only 0 of 2 reference models answered (need 1)"
        assert [f["model"] for f in data["failures"]] == ["ref-a", "ref-b"]

    run_with(tmp_path, moa.build, config(server, tools=tools), body)
    assert not any(b["model"] == "agg" for b in server.chat_requests())


def test_moa_default_models(server: ScriptedServer, clean_env: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    async def models(cfg: RunConfig) -> tuple[list[str], str]:
        built = await moa.build(cfg.tool_settings())
        assert isinstance(built, moa.MoaToolset)
        await built.aclose()
        return [m for m, _ in built.references], built.aggregator[0]

    assert asyncio.run(models(config(server))) == (["run-model"] * 3, "run-model")
    monkeypatch.setenv("OPENROUTER_API_KEY", "sk-test-not-used")  # clients are built, never called
    assert asyncio.run(models(RunConfig.model_validate({"model": "m"}))) == (list(DEFAULT_REFERENCE_MODELS), "m")


# --- the acceptance run -----------------------------------------------------------------

def acceptance_policy(site: WebFixture) -> Callable[[Recorded], Reply]:
    """The agent calls each non-browser tool once, then answers; tool-side calls are answered too."""
    calls = [
        tool_call("web_search", {"query": "tidal energy"}),
        tool_call("web_extract", {"urls": [site.url("/article.html"), site.url("/doc.pdf")]}),
        tool_call("image_generate", {"prompt": "a blue square"}),
        tool_call("vision_analyze", {"image_url": "images/a-blue-square.png", "question": "What colour?"}),
        tool_call("mixture_of_agents", {"user_prompt": "Summarise tidal energy in one line."}),
    ]

    def handle(req: Recorded) -> Reply:
        if req.path.endswith("/images/generations"):
            return images_reply(req)
        body = req.body
        if "tools" not in body:  # a tool's own model call (vision, moa)
            content = body["messages"][-1]["content"]
            if isinstance(content, list):
                return chat("A blue square." if image_part(body).startswith("data:image/png") else "no image")
            return chat("aggregate" if body["messages"][0]["role"] == "system" else "reference answer")
        if not any(m["role"] == "tool" for m in body["messages"]):
            return chat(None, tool_calls=calls, reasoning="I will use every tool once.")
        return chat("All tools worked.", reasoning="Everything succeeded.")

    return handle


def test_default_distribution_run_calls_each_tool_successfully(tmp_path: Path, server: ScriptedServer,
                                                              site: WebFixture, clean_env: dict[str, str]) -> None:
    server.handler = acceptance_policy(site)
    (tmp_path / "ds.jsonl").write_text(json.dumps({"prompt": "Research tidal energy."}) + "\n")
    (tmp_path / "cfg.yaml").write_text(f"tools:\n  web:\n    searxng_url: {site.base}\n"
                                       "network:\n  allow: [127.0.0.1]\n")  # the fixture site is on loopback
    env = {k: v for k, v in clean_env.items() if k not in ("SEARXNG_URL", "BRAVE_API_KEY", "TAVILY_API_KEY")}
    proc = subprocess.run(
        cli("run", "--dataset_file=ds.jsonl", "--batch_size=1", "--run_name=acc", f"--base_url={server.url}",
            "--model=scripted-model", "--distribution=default", "--sandbox=local", "--config=cfg.yaml"),
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    for name in ("web", "vision", "image_gen", "moa"):
        assert f"toolset '{name}' unavailable" not in proc.stderr
    [record] = read_records(tmp_path / "data" / "acc")
    for tool in ("web_search", "web_extract", "image_generate", "vision_analyze", "mixture_of_agents"):
        assert record["tool_stats"][tool] == {"count": 1, "success": 1, "failure": 0}, (tool, record["tool_stats"])
        assert record["tool_error_counts"][tool] == 0
    tool_turn = next(t["value"] for t in record["conversations"] if t["from"] == "tool")
    assert "Quarterly tidal report" in tool_turn and "A blue square." in tool_turn and "aggregate" in tool_turn
    assert site.url("/article.html") in tool_turn
