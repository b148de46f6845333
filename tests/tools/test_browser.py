"""The browser toolset against real headless Chromium and real local pages.

One Chromium serves the whole module (launching it costs about a second): it lives on an event
loop in a background thread, and each test runs its coroutine on that loop. Pages come from a
small http.server on 127.0.0.1:0. The model for browser_vision is the scripted HTTP server.
"""

from __future__ import annotations

import asyncio
import base64
import http.server
import socket
import struct
import threading
import time
import zlib
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.scripted_server import ScriptedServer, chat
from trajforge.config import RunConfig
from trajforge.jsonio import loads
from trajforge.sandbox.backends.local.local_sandbox import LocalSandbox
from trajforge.tools.tool import ToolContext, ToolInfraError, Unavailable, result_failed
from trajforge.tools.browser.toolset import BrowserToolset, build, find_chromium
from trajforge.tools.toolsets import TOOLSET_TOOLS
from trajforge.catalog.tools_config import BrowserSettings

pytestmark = pytest.mark.timeout(120)


def _png(width: int, height: int) -> bytes:
    """A real, solid red PNG image."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    rows = b"".join(b"\x00" + b"\xff\x00\x00" * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows))
            + chunk(b"IEND", b""))


PAGES: dict[str, tuple[str, bytes]] = {
    "/form.html": ("text/html", b"""<!doctype html><html><head><title>Greeting form</title></head><body>
<h1>Greeting form</h1>
<p id="out">Nobody greeted yet</p>
<form id="f"><label for="name">Your name</label> <input id="name" placeholder="name">
  <button type="submit">Greet</button>
  <label>Colour <select id="colour"><option>red</option><option>blue</option></select></label></form>
<ul><li><a href="/second.html">Second page</a></li><li>plain item</li></ul>
<img src="/red.png" alt="Red box" width="40" height="20">
<div style="display:none"><button>Hidden button</button></div>
<script>
document.getElementById('f').addEventListener('submit', e => {
  e.preventDefault();
  document.getElementById('out').textContent = 'Hello, ' + document.getElementById('name').value + '!';
});
</script></body></html>"""),
    "/second.html": ("text/html", b"""<!doctype html><html><head><title>Second</title></head>
<body><h2>The second page</h2><p>Welcome to page two.</p></body></html>"""),
    "/tall.html": ("text/html", b"""<!doctype html><html><head><title>Tall</title></head>
<body><div style="height:5000px">top</div><p>bottom</p></body></html>"""),
    "/console.html": ("text/html", b"""<!doctype html><html><head><title>Console</title></head>
<body><p>noisy</p><script>
console.log('hello from the page'); console.warn('careful now');
throw new Error('boom from script');
</script></body></html>"""),
    "/set.html": ("text/html", b"""<!doctype html><html><head><title>Set</title></head><body><p>set</p>
<script>localStorage.setItem('secret', 'sample-a');</script></body></html>"""),
    "/red.png": ("image/png", _png(8, 4)),
    # 100 images, each with a 100 KB alt and a 2 KB src: 10 MB if alt is returned whole.
    "/alts.html": ("text/html", b"""<!doctype html><html><head><title>Alts</title></head><body><script>
const alt = 'x'.repeat(100000), src = '/red.png?' + 'y'.repeat(2000);
for (let i = 0; i < 100; i++) {
  const img = document.createElement('img'); img.alt = alt + i; img.src = src + i; document.body.appendChild(img);
}
</script></body></html>"""),
    # A page that tries to subvert the caps of the tools' own page scripts: String.prototype.slice
    # hands back 100 KB objects whose length reads as 0 (the scripts run in a world of their own).
    "/hostile.html": ("text/html", b"""<!doctype html><html><head><title>Hostile</title></head><body><script>
for (let i = 0; i < 100; i++) {
  const img = document.createElement('img'); img.alt = 'a' + i; document.body.appendChild(img);
}
document.title = 'T'.repeat(100000);
const big = 'z'.repeat(100000);
String.prototype.slice = function () { return {length: 0, big}; };
</script></body></html>"""),
    # A page whose URL is 1 MB long and that logs 300 messages: every console entry carries the URL.
    "/noisy.html": ("text/html", b"""<!doctype html><html><head><title>N</title></head><body><script>
history.replaceState(null, '', '?' + 'q'.repeat(1000000));
for (let i = 0; i < 300; i++) console.log('message ' + i);
</script></body></html>"""),
    # ... and one that would make the snapshot's own join hand back 3 MB, past every check in the page.
    "/hostile_snapshot.html": ("text/html", b"""<!doctype html><html><head><title>H</title></head><body>
<p>hello</p><script>const huge = 'z'.repeat(3000000); Array.prototype.join = function () { return huge; };
</script></body></html>"""),
    # A page that logs 40 MB, subverts what a console collector would call, then leaves.
    "/flood.html": ("text/html", b"""<!doctype html><html><head><title>F</title></head><body><p>flood</p><script>
const mb = 'f'.repeat(1 << 20);
for (let i = 0; i < 40; i++) console.log(mb, i);
console.warn({toString() { return 'w'.repeat(1 << 20); }});
Object.prototype.toJSON = Array.prototype.toJSON = () => mb;
String.prototype.slice = () => mb;
console.error('last words');
</script></body></html>"""),
}


_HELD = threading.Event()  # releases /held.png


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        path = self.path.split("?")[0]
        extra: list[tuple[str, str]] = []
        if path == "/slow.html":
            time.sleep(3)
            kind, body = "text/html", b"<p>finally</p>"
        elif path == "/held.png":  # an image that loads only once the test lets it
            _HELD.wait(60)
            kind, body = PAGES["/red.png"]
        elif path == "/held.html":
            kind, body = "text/html", b'<title>Held</title><img src="/held.png" alt="held" width="40" height="20">'
        elif path == "/show.html":
            cookie = self.headers.get("Cookie") or "none"
            kind = "text/html"
            body = (f"<title>Show</title><p id='c'>cookie: {cookie}</p><p id='s'></p><script>"
                    "document.getElementById('s').textContent = 'storage: ' + "
                    "(localStorage.getItem('secret') || 'none');</script>").encode()
        elif path in PAGES:
            kind, body = PAGES[path]
            if path == "/set.html":
                extra.append(("Set-Cookie", "session=sample-a; Path=/"))
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        for name, value in extra:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


class _Server(http.server.ThreadingHTTPServer):
    block_on_close = False  # the slow page's thread must not hold up teardown


class _LoopThread:
    """An event loop in a background thread, so one Chromium can outlive a single test."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="browser-loop", daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float = 90) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture(scope="module")
def site() -> Iterator[str]:
    server = _Server(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _config(**browser: Any) -> RunConfig:
    return RunConfig(tools={"browser": {"navigation_timeout": 2, "action_timeout": 2, **browser}},
                     network={"allow": ["127.0.0.1"]})  # the test site is on loopback


def _toolset(config: RunConfig) -> Iterator[tuple[_LoopThread, BrowserToolset]]:
    if find_chromium(BrowserSettings()) is None:
        pytest.skip("Chromium is not installed (apt-get install chromium); the CI setup installs it")
    pytest.importorskip("playwright", reason="playwright is not installed in this environment")
    lt = _LoopThread()
    built = lt.run(build(config.tool_settings()))
    assert isinstance(built, BrowserToolset), built
    yield lt, built
    lt.run(built.aclose())
    lt.stop()


@pytest.fixture(scope="module")
def env() -> Iterator[tuple[_LoopThread, BrowserToolset]]:
    yield from _toolset(_config())


# Timeouts far above what any page here needs, for tests whose page does heavy work (a loaded
# machine stretched the console flood's 41 MB past the 2 s ones, and the call failed as timed out).
_PATIENT = {"navigation_timeout": 60, "action_timeout": 60}


@pytest.fixture(scope="module")
def patient_env() -> Iterator[tuple[_LoopThread, BrowserToolset]]:
    yield from _toolset(_config(**_PATIENT))


class Sample:
    """One sample's tool context on a real local sandbox; `call` runs a tool and parses its JSON."""

    def __init__(self, env: tuple[_LoopThread, BrowserToolset], root: Path, config: RunConfig | None = None):
        self.lt, self.toolset = env
        self.sandbox = LocalSandbox(root)
        self.lt.run(self.sandbox.start())
        self.ctx = ToolContext(sandbox=self.sandbox, settings=(config or _config()).tool_settings())
        self.tools = {t.name: t for t in self.toolset.tools}

    def call_raw(self, name: str, **args: Any) -> str:
        return self.lt.run(self.tools[name].run(args, self.ctx))

    def call(self, name: str, **args: Any) -> dict[str, Any]:
        return loads(self.call_raw(name, **args))

    def end(self) -> None:
        self.lt.run(self.ctx.cleanup.aclose())
        self.lt.run(self.sandbox.close())


@pytest.fixture
def sample(env: tuple[_LoopThread, BrowserToolset], tmp_path: Path) -> Iterator[Sample]:
    s = Sample(env, tmp_path)
    yield s
    s.end()


def _ref(snapshot: str, needle: str) -> str:
    line = next(line for line in snapshot.splitlines() if needle in line)
    return line.split("[ref=")[1].split("]")[0]


def test_toolset_offers_the_ten_spec_tools(env: tuple[_LoopThread, BrowserToolset]) -> None:
    assert [t.name for t in env[1].tools] == list(TOOLSET_TOOLS["browser"])
    for tool in env[1].tools:
        assert tool.schema()["function"]["parameters"]["type"] == "object"


def test_navigate_snapshot_type_click_and_back(sample: Sample, site: str) -> None:
    nav = sample.call("browser_navigate", url=f"{site}/form.html")
    assert nav["success"] and nav["title"] == "Greeting form" and nav["status"] == 200

    snap = sample.call("browser_snapshot")["snapshot"]
    assert 'heading "Greeting form"' in snap and "[level=1]" in snap
    assert 'paragraph "Nobody greeted yet"' in snap
    assert 'textbox "Your name"' in snap and 'button "Greet"' in snap
    assert 'link "Second page"' in snap and "-> /second.html" in snap
    assert 'img "Red box"' in snap and 'listitem "plain item"' in snap
    assert "Hidden button" not in snap

    typed = sample.call("browser_type", ref=_ref(snap, 'textbox "Your name"'), text="Ada")
    assert typed["success"], typed
    assert 'combobox "Colour"' in snap and 'value="red" options=["red","blue"]' in snap
    assert sample.call("browser_type", ref=_ref(snap, "combobox"), text="blue")["success"]
    clicked = sample.call("browser_click", ref=_ref(snap, 'button "Greet"'))
    assert clicked["success"], clicked
    snap2 = sample.call("browser_snapshot")["snapshot"]
    assert 'paragraph "Hello, Ada!"' in snap2 and 'value="Ada"' in snap2 and 'value="blue"' in snap2
    # The same element keeps its ref across snapshots of one document.
    assert _ref(snap2, 'button "Greet"') == _ref(snap, 'button "Greet"')

    went = sample.call("browser_click", ref=_ref(snap2, 'link "Second page"'))
    assert went["success"] and went["title"] == "Second" and went["url"].endswith("/second.html")
    snap3 = sample.call("browser_snapshot")["snapshot"]
    assert 'heading "The second page"' in snap3
    # Refs keep counting up across documents, so an old ref cannot name a new element.
    assert int(_ref(snap3, "The second page")[1:]) > int(_ref(snap2, "Second page")[1:])

    stale = sample.call("browser_click", ref=_ref(snap, 'button "Greet"'))
    assert stale["success"] is False and "browser_snapshot" in stale["error"]

    back = sample.call("browser_back")
    assert back["success"] and back["title"] == "Greeting form"


def test_type_with_submit_and_press_enter(sample: Sample, site: str) -> None:
    sample.call("browser_navigate", url=f"{site}/form.html")
    ref = _ref(sample.call("browser_snapshot")["snapshot"], "textbox")
    assert sample.call("browser_type", ref=ref, text="Grace", submit=True)["submitted"] is True
    assert 'paragraph "Hello, Grace!"' in sample.call("browser_snapshot")["snapshot"]

    sample.call("browser_type", ref=ref, text="Linus")  # focuses the field, no submit
    assert 'paragraph "Hello, Grace!"' in sample.call("browser_snapshot")["snapshot"]
    pressed = sample.call("browser_press", key="Enter")
    assert pressed["success"] and pressed["key"] == "Enter"
    assert 'paragraph "Hello, Linus!"' in sample.call("browser_snapshot")["snapshot"]

    bad_key = sample.call("browser_press", key="NoSuchKey")
    assert bad_key["success"] is False and "NoSuchKey" in bad_key["error"]


def test_scroll_moves_the_viewport(sample: Sample, site: str) -> None:
    sample.call("browser_navigate", url=f"{site}/tall.html")
    down = sample.call("browser_scroll", direction="down")
    assert down["success"] and down["scroll_y"] > 0 and down["at_top"] is False
    up = sample.call("browser_scroll", direction="up")
    assert up["scroll_y"] == 0 and up["at_top"] is True
    assert sample.call("browser_scroll", direction="left")["success"] is False


def test_console_messages_and_js_errors_are_collected(sample: Sample, site: str) -> None:
    sample.call("browser_navigate", url=f"{site}/console.html")
    sample.call("browser_snapshot")
    console = sample.call("browser_console")
    assert {"type": "log", "text": "hello from the page"} in [
        {k: m[k] for k in ("type", "text")} for m in console["messages"]]
    assert any(m["type"] == "warning" and m["text"] == "careful now" for m in console["messages"])
    assert any("boom from script" in e["text"] for e in console["errors"])
    assert console["errors"][0]["url"].endswith("/console.html")


def test_get_images_lists_the_page_images(sample: Sample, site: str) -> None:
    sample.call("browser_navigate", url=f"{site}/form.html")
    images = sample.call("browser_get_images")
    assert images["count"] == 1
    assert images["images"][0] == {"src": f"{site}/red.png", "alt": "Red box", "width": 8, "height": 4}


def test_get_images_waits_a_bounded_time_for_an_image_still_loading(sample: Sample, site: str) -> None:
    """An image that has not loaded is waited for up to a few seconds (so a listing does not depend
    on the network's timing, as the test above once did on a loaded machine), then listed with its
    layout size: a page whose image never comes cannot hold the tool."""
    _HELD.clear()
    try:
        sample.call("browser_navigate", url=f"{site}/held.html")
        images = sample.call("browser_get_images")
        assert images["images"] == [{"src": f"{site}/held.png", "alt": "held", "width": 40, "height": 20}]
    finally:
        _HELD.set()


def test_get_images_result_is_capped(sample: Sample, site: str) -> None:
    assert sample.call("browser_navigate", url=f"{site}/alts.html")["title"] == "Alts"
    raw = sample.call_raw("browser_get_images")
    images = loads(raw)
    assert images["success"] is True and images["truncated"] is True and images["total"] == 100
    assert 0 < images["count"] == len(images["images"]) < 100
    first = images["images"][0]
    assert first["alt"] == "x" * 300 and first["src"] == f"{site}/red.png?" + "y" * (500 - len(f"{site}/red.png?"))
    assert len(raw) <= BrowserSettings().snapshot_max_chars + 500  # the same cap as a snapshot


def test_get_images_caps_hold_when_the_page_subverts_the_tool_script(sample: Sample, site: str) -> None:
    nav = sample.call_raw("browser_navigate", url=f"{site}/hostile.html")
    assert loads(nav)["title"] == "T" * 500 and len(nav) < 1_000  # a page title is cut too
    raw = sample.call_raw("browser_get_images")
    images = loads(raw)
    assert images["success"] is True and images["title"] == "T" * 500
    assert images["count"] == 100
    # The tool's script ran in a world of its own: the page's slice never ran, the real alts came back.
    assert [i["alt"] for i in images["images"]] == [f"a{i}" for i in range(100)]
    assert len(raw) <= BrowserSettings().snapshot_max_chars + 1_000


def test_snapshot_cap_holds_when_the_page_subverts_the_tool_script(sample: Sample, site: str) -> None:
    sample.call_raw("browser_navigate", url=f"{site}/hostile_snapshot.html")
    raw = sample.call_raw("browser_snapshot")
    snap = loads(raw)
    # The page's join never ran (it was 3 MB that reached the runner before Python cut it).
    assert snap["success"] is True and snap["snapshot"] == '- paragraph "hello"', snap
    assert "z" not in raw


def test_console_entries_are_capped_whatever_the_pages_url(sample: Sample, site: str) -> None:
    sample.call_raw("browser_navigate", url=f"{site}/noisy.html")
    raw = sample.call_raw("browser_console")
    messages = loads(raw)["messages"]
    assert len(messages) == 200 and messages[-1]["text"] == "message 299"  # the newest kept
    assert all(len(m["url"]) <= 1000 for m in messages) and len(raw) < 500_000  # was 200 MB


def _bytes_read() -> int:
    """Bytes this process has read so far (Playwright's driver talks to it through a pipe)."""
    return int(dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())["rchar"])


def test_a_console_flood_is_capped_in_the_page(patient_env: tuple[_LoopThread, BrowserToolset], site: str,
                                               tmp_path: Path) -> None:
    sample = Sample(patient_env, tmp_path, _config(**_PATIENT))
    try:
        _flood_is_capped(sample, site)
    finally:
        sample.end()


def _flood_is_capped(sample: Sample, site: str) -> None:
    before = _bytes_read()
    assert sample.call("browser_navigate", url=f"{site}/flood.html")["title"] == "F"
    raw = sample.call_raw("browser_console")
    # 41 MB were logged; what crossed to this process is the capped read (Playwright's console
    # events, which carried each message whole, are never subscribed).
    assert _bytes_read() - before < 4 << 20
    messages = loads(raw)["messages"]
    assert [m["type"] for m in messages] == ["log"] * 40 + ["warning", "error"]
    assert all(m["text"] == "f" * 1000 for m in messages[:40]) and messages[40]["text"] == "w" * 1000
    assert messages[-1] == {"type": "error", "text": "last words", "url": f"{site}/flood.html"}
    assert len(raw) < 100_000
    # The page's messages are read once: a second call adds nothing new.
    assert len(loads(sample.call_raw("browser_console"))["messages"]) == 42


def test_navigation_failures_are_error_results(sample: Sample, site: str) -> None:
    with socket.socket() as s:  # a port that was free a moment ago: connection refused
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]
    refused = sample.call_raw("browser_navigate", url=f"http://127.0.0.1:{closed_port}/")
    # Chromium reaches the network through the egress proxy, which reports the refused connection.
    assert result_failed(refused) and "connection refused" in loads(refused)["error"].lower()

    slow = sample.call("browser_navigate", url=f"{site}/slow.html")  # 3 s page, 2 s timeout
    assert slow["success"] is False and "Timeout" in slow["error"]

    scheme = sample.call("browser_navigate", url="file:///etc/passwd")
    assert scheme["success"] is False and "http" in scheme["error"]
    assert sample.call("browser_click", ref="not a ref")["success"] is False
    # The session still works after the failures.
    assert sample.call("browser_navigate", url=f"{site}/second.html")["success"] is True


def test_samples_have_separate_contexts_closed_at_sample_end(
        env: tuple[_LoopThread, BrowserToolset], site: str, tmp_path: Path) -> None:
    browser = env[1].backend.browser
    contexts_before = len(browser.contexts)
    a = Sample(env, tmp_path / "a")
    b = Sample(env, tmp_path / "b")
    try:
        a.call("browser_navigate", url=f"{site}/set.html")
        a.call("browser_navigate", url=f"{site}/show.html")
        seen_a = a.call("browser_snapshot")["snapshot"]
        assert "cookie: session=sample-a" in seen_a and "storage: sample-a" in seen_a

        b.call("browser_navigate", url=f"{site}/show.html")
        seen_b = b.call("browser_snapshot")["snapshot"]
        assert "cookie: none" in seen_b and "storage: none" in seen_b
        assert len(browser.contexts) == contexts_before + 2
        assert a.ctx.state["browser"].context is not b.ctx.state["browser"].context
    finally:
        a.end()
    assert len(browser.contexts) == contexts_before + 1
    assert a.ctx.state["browser"].closed
    b.end()
    assert len(browser.contexts) == contexts_before


def test_browser_vision_sends_the_screenshot_to_the_model(
        env: tuple[_LoopThread, BrowserToolset], site: str, tmp_path: Path) -> None:
    with ScriptedServer() as model:
        model.script(chat("A form with a red box."))
        config = _config().model_copy(update={"model": "vision-test", "base_url": model.url})
        s = Sample(env, tmp_path, config)
        try:
            s.call("browser_navigate", url=f"{site}/form.html")
            raw = s.call_raw("browser_vision", question="What colour is the box?")
        finally:
            s.end()
    assert not result_failed(raw) and "A form with a red box." in raw
    [request] = model.chat_requests()
    parts = [p for m in request["messages"] if isinstance(m.get("content"), list) for p in m["content"]]
    urls = [p["image_url"]["url"] for p in parts if p.get("type") == "image_url"]
    assert len(urls) == 1 and urls[0].startswith("data:image/png;base64,")
    assert base64.b64decode(urls[0].split(",", 1)[1]).startswith(b"\x89PNG")
    assert any("What colour is the box?" in (p.get("text") or "") for p in parts)


def test_context_limit_and_a_dead_browser(site: str, tmp_path: Path) -> None:
    """max_contexts=1: a second sample waits for the first to end. A closed Chromium fails the
    sample as infrastructure (ToolInfraError) instead of returning an error to the model."""
    if find_chromium(BrowserSettings()) is None:
        pytest.skip("Chromium is not installed (apt-get install chromium); the CI setup installs it")
    lt = _LoopThread()
    try:
        toolset = lt.run(build(_config(max_contexts=1).tool_settings()))
        assert isinstance(toolset, BrowserToolset), toolset
        a, b = Sample((lt, toolset), tmp_path / "a"), Sample((lt, toolset), tmp_path / "b")
        navigate = {t.name: t for t in toolset.tools}["browser_navigate"]
        assert a.call("browser_navigate", url=f"{site}/second.html")["success"]
        waiting = asyncio.run_coroutine_threadsafe(navigate.run({"url": f"{site}/tall.html"}, b.ctx), lt.loop)
        time.sleep(0.5)
        assert not waiting.done()
        a.end()
        assert loads(waiting.result(30))["title"] == "Tall"

        lt.run(toolset.aclose())
        with pytest.raises(ToolInfraError, match="Chromium"):
            b.call("browser_snapshot")
        b.end()  # closing a context of a dead browser is quiet
    finally:
        lt.stop()


def test_missing_executable_makes_the_toolset_unavailable(tmp_path: Path) -> None:
    built = asyncio.run(build(_config(executable_path=str(tmp_path / "no-chromium")).tool_settings()))
    assert isinstance(built, Unavailable) and built.toolset == "browser"
    assert "Chromium not found" in built.reason and "tools.browser.executable_path" in built.reason


def test_launch_failure_makes_the_toolset_unavailable(tmp_path: Path) -> None:
    pytest.importorskip("playwright", reason="playwright is not installed in this environment")
    fake = tmp_path / "chromium"
    fake.write_text("#!/bin/sh\necho 'not a browser' >&2\nexit 3\n")
    fake.chmod(0o755)
    built = asyncio.run(build(_config(executable_path=str(fake)).tool_settings()))
    assert isinstance(built, Unavailable) and "failed to start" in built.reason
