"""Issue 9's acceptance run with every tool: the real CLI, `--distribution=default`, one sample.

A scripted model calls each of the 20 known tools exactly once, one call per turn, in an order
where later calls use earlier results (refs from browser_snapshot, the path image_generate
saved), then answers. Every call must succeed against the local backends: the default sandbox
(bwrap when usable, else local), real Chromium, the local web fixture as search engine and web
site, and the scripted server as chat, vision, image and mixture-of-agents model. The policy
derives each reply from the request alone (how many tool results it holds), so it is
deterministic whatever the timing.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import cli
from tests.support.policies import tool_messages
from tests.support.scripted_server import Recorded, Reply, ScriptedServer, chat, tool_call
from tests.support.web_fixture import WebFixture, make_png
from tests.support.run_state import read_records
from trajforge.sandbox.backends.bwrap.bwrap_backend import probe
from trajforge.tools.browser.toolset import find_chromium
from trajforge.tools.toolsets import KNOWN_TOOLS
from trajforge.catalog.tools_config import BrowserSettings

pytestmark = pytest.mark.timeout(180)

BLUE = make_png(2, 2, (0, 0, 255))
PAGE_QUESTION = "What does the page show?"
IMAGE_QUESTION = "What colour is the square?"

Args = Callable[[dict[str, Any]], dict[str, Any]]


@pytest.fixture(scope="module")
def site() -> Iterator[WebFixture]:
    with WebFixture() as fixture:
        yield fixture


def results_by_tool(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The parsed result of each tool called so far in this request's conversation."""
    names = {tc["id"]: tc["function"]["name"]
             for m in body["messages"] if m["role"] == "assistant" for tc in m.get("tool_calls") or []}
    return {names[m["tool_call_id"]]: json.loads(m["content"]) for m in tool_messages(body)}


def snapshot_ref(done: dict[str, dict[str, Any]], needle: str) -> str:
    """The ref of the snapshot line containing `needle`; an unknown ref (a failed call) if none."""
    snap = done.get("browser_snapshot", {}).get("snapshot", "")
    line = next((ln for ln in snap.splitlines() if needle in ln), "")
    found = re.search(r"\[ref=(e\d+)\]", line)
    return found.group(1) if found else "e999999"


def steps(site: WebFixture) -> list[tuple[str, Args]]:
    """Each tool once, in order; an entry's arguments may depend on earlier results."""
    def fixed(**args: Any) -> Args:
        return lambda done: args

    return [
        ("terminal", fixed(command="echo terminal-ok && mkdir -p notes && pwd")),
        ("process", fixed(action="start", command="echo background-ok")),
        ("write_file", fixed(path="notes/todo.txt", content="alpha\nbeta\n")),
        ("read_file", fixed(path="notes/todo.txt")),
        ("patch", fixed(path="notes/todo.txt", old_string="beta", new_string="gamma")),
        ("search_files", fixed(pattern="gam+a", path="notes")),
        ("web_search", fixed(query="tidal energy")),
        ("web_extract", lambda done: {"urls": [done["web_search"]["results"][0]["url"]]}),
        ("browser_navigate", fixed(url=site.url("/form.html"))),
        ("browser_snapshot", fixed()),
        ("browser_type", lambda done: {"ref": snapshot_ref(done, 'textbox "Your name"'), "text": "Ada"}),
        ("browser_click", lambda done: {"ref": snapshot_ref(done, 'button "Greet"')}),
        ("browser_scroll", fixed(direction="down")),
        ("browser_press", fixed(key="Home")),
        ("browser_back", fixed()),
        ("browser_get_images", fixed()),
        ("browser_vision", fixed(question=PAGE_QUESTION)),
        ("browser_console", fixed()),
        ("image_generate", fixed(prompt="a blue square")),
        ("vision_analyze", lambda done: {"image_url": done["image_generate"]["path"], "question": IMAGE_QUESTION}),
        ("mixture_of_agents", fixed(user_prompt="Summarise tidal energy in one line.")),
    ]


def side_reply(body: dict[str, Any]) -> Reply:
    """A tool's own model call: vision (browser_vision, vision_analyze) or a moa member."""
    content = body["messages"][-1]["content"]
    if isinstance(content, list):
        text = content[0]["text"]
        image = content[1]["image_url"]["url"]
        if not image.startswith("data:image/png;base64,"):
            return chat("no inline PNG received")
        if PAGE_QUESTION in text:
            return chat("A greeting form with a red box.")
        if IMAGE_QUESTION in text and base64.b64decode(image.split(",", 1)[1]) == BLUE:
            return chat("A blue square.")
        return chat("an unexpected image")
    return chat("aggregate answer" if body["messages"][0]["role"] == "system" else "reference answer")


def policy(site: WebFixture) -> Callable[[Recorded], Reply]:
    plan = steps(site)

    def handle(req: Recorded) -> Reply:
        if req.path.endswith("/images/generations"):
            return Reply(body={"created": 0, "data": [{"b64_json": base64.b64encode(BLUE).decode()}]})
        body = req.body
        if "tools" not in body:
            return side_reply(body)
        step = len(tool_messages(body))
        if step < len(plan):
            name, args = plan[step]
            return chat(None, tool_calls=[tool_call(name, args(results_by_tool(body)))],
                        reasoning=f"Step {step + 1}: use {name}.")
        return chat("Every tool worked.", reasoning="All done.")

    return handle


def tool_results(record: dict[str, Any]) -> dict[str, Any]:
    """Tool name -> the content of its one <tool_response> in the saved conversation."""
    found: dict[str, Any] = {}
    for turn in record["conversations"]:
        if turn["from"] == "tool":
            for block in re.findall(r"<tool_response>\n(.*?)\n</tool_response>", turn["value"], re.S):
                data = json.loads(block)
                assert data["name"] not in found, f"{data['name']} answered twice"
                found[data["name"]] = data["content"]
    return found


def test_default_distribution_run_calls_every_tool_once_successfully(
        tmp_path: Path, server: ScriptedServer, site: WebFixture, clean_env: dict[str, str]) -> None:
    if find_chromium(BrowserSettings()) is None:
        pytest.skip("Chromium is not installed (apt-get install chromium); the CI setup installs it")
    pytest.importorskip("playwright", reason="playwright is not installed in this environment")
    assert len(steps(site)) == len(KNOWN_TOOLS) and {n for n, _ in steps(site)} == set(KNOWN_TOOLS)
    server.handler = policy(site)
    (tmp_path / "ds.jsonl").write_text(json.dumps({"prompt": "Try every tool once."}) + "\n")
    (tmp_path / "cfg.yaml").write_text(f"tools:\n  web:\n    searxng_url: {site.base}\n"
                                       "network:\n  allow: [127.0.0.1]\n")  # the fixture site is on loopback
    env = {k: v for k, v in clean_env.items() if k not in ("SEARXNG_URL", "BRAVE_API_KEY", "TAVILY_API_KEY")}
    proc = subprocess.run(
        cli("run", "--dataset_file=ds.jsonl", "--batch_size=1", "--run_name=all", f"--base_url={server.url}",
            "--model=scripted-model", "--distribution=default", "--max_turns=30", "--config=cfg.yaml"),
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stderr
    assert "unavailable" not in proc.stderr, proc.stderr

    offered = {t["function"]["name"] for t in server.chat_requests()[0]["tools"]}
    assert offered == set(KNOWN_TOOLS)
    [record] = read_records(tmp_path / "data" / "all")
    assert record["completed"] is True and record["api_calls"] == len(KNOWN_TOOLS) + 1
    assert sorted(record["toolsets_used"]) == sorted(["terminal", "file", "web", "browser", "vision",
                                                      "image_gen", "moa"])
    results = tool_results(record)
    for tool in KNOWN_TOOLS:
        assert record["tool_stats"][tool] == {"count": 1, "success": 1, "failure": 0}, (tool, results.get(tool))
        assert record["tool_error_counts"][tool] == 0, tool
    assert set(record["tool_stats"]) == set(KNOWN_TOOLS)

    roles = [t["from"] for t in record["conversations"]]
    assert roles == ["system", "human", *["gpt", "tool"] * len(KNOWN_TOOLS), "gpt"]
    assert record["conversations"][-1]["value"].endswith("Every tool worked.")
    # The default sandbox (auto) is bwrap wherever bwrap works, with the workspace at /workspace.
    bwrap_used = "/workspace" in results["terminal"]["output"].splitlines()
    assert bwrap_used == asyncio.run(probe()).usable, results["terminal"]
    check_results(results, site)


def check_results(r: dict[str, Any], site: WebFixture) -> None:
    """Each call did its real work, not merely returned success."""
    assert r["terminal"]["output"].startswith("terminal-ok\n") and r["terminal"]["exit_code"] == 0
    assert r["process"]["id"] == "proc_1" and r["process"]["status"] in ("running", "exited")
    assert r["write_file"]["bytes_written"] == len("alpha\nbeta\n")
    assert "alpha" in json.dumps(r["read_file"]) and "beta" in json.dumps(r["read_file"])
    assert "+gamma" in r["patch"]["diff"]
    assert r["search_files"]["count"] == 1 and "gamma" in r["search_files"]["matches"][0]
    assert r["web_search"]["results"][0]["url"] == site.url("/article.html")
    assert "Tidal power converts" in json.dumps(r["web_extract"])
    assert r["browser_navigate"]["title"] == "Greeting form" and r["browser_navigate"]["status"] == 200
    assert 'textbox "Your name"' in r["browser_snapshot"]["snapshot"]
    assert r["browser_type"]["typed"] == "Ada"
    # The click submitted the form with the typed name: the type and click refs were right.
    assert r["browser_click"]["title"] == "Greeting" and r["browser_click"]["url"].endswith("?name=Ada")
    assert r["browser_scroll"]["scroll_y"] > 0
    assert r["browser_press"]["key"] == "Home"
    assert r["browser_back"]["title"] == "Greeting form"
    assert r["browser_get_images"]["images"] == [{"src": site.url("/image.png"), "alt": "Red box",
                                                  "width": 4, "height": 3}]
    assert r["browser_vision"]["analysis"] == "A greeting form with a red box."
    assert "form page ready" in [m["text"] for m in r["browser_console"]["messages"]]
    assert r["image_generate"]["path"] == "images/a-blue-square.png"
    assert r["vision_analyze"]["analysis"] == "A blue square."
    assert r["mixture_of_agents"]["response"] == "aggregate answer"
