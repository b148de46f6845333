"""The web toolset against a real local web server (tests/support/web_fixture.py).

Covers provider choice and the Unavailable reasons, SearXNG / Brave / Tavily searches with their
auth, and web_extract on HTML, PDF, JSON, text, binary, redirects, 404s, a huge page, a slow page
and bad URLs. Every request is real HTTP on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.toolsets import run_with
from tests.support.web_fixture import BRAVE_KEY, TAVILY_KEY, WebFixture
from trajforge.config import RunConfig
from trajforge.sample.settings import tool_settings
from trajforge.tools import web
from trajforge.tools.base import ToolContext, Unavailable, result_failed
from trajforge.tools.registry import build_toolsets
from trajforge.catalog.settings import WebSettings
from trajforge.tools.web_search import choose_provider


@pytest.fixture(scope="module")
def site() -> Any:
    with WebFixture(huge_bytes=4_000_000) as fixture:
        yield fixture


def config(**web_settings: Any) -> RunConfig:
    # The fixture site is on 127.0.0.1, which the egress policy refuses unless allowed.
    return RunConfig.model_validate({"tools": {"web": web_settings}, "network": {"allow": ["127.0.0.1"]}})


def with_toolset(tmp_path: Path, cfg: RunConfig, body: Callable[[web.WebToolset, ToolContext], Awaitable[Any]],
                 environ: dict[str, str] | None = None) -> Any:
    return run_with(tmp_path, lambda c: web.build(c, environ or {}), cfg, body)


async def call(toolset: web.WebToolset, name: str, args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    tool = next(t for t in toolset.tools if t.name == name)
    text = await tool.run(args, ctx)
    data = json.loads(text)
    assert result_failed(text) == (data.get("success") is False)
    return data


# --- provider choice -------------------------------------------------------------------------

def test_no_provider_means_unavailable_with_how_to_fix() -> None:
    built = asyncio.run(web.build(tool_settings(config()), {}))
    assert isinstance(built, Unavailable)
    assert built.toolset == "web"
    assert "no search provider configured" in built.reason
    for hint in ("tools.web.searxng_url", "SEARXNG_URL", "BRAVE_API_KEY", "TAVILY_API_KEY"):
        assert hint in built.reason


def test_provider_choice_order_and_explicit_provider_reasons() -> None:
    both = {"SEARXNG_URL": "http://127.0.0.1:1", "BRAVE_API_KEY": "k", "TAVILY_API_KEY": "t"}
    assert choose_provider(WebSettings(), both).name == "searxng"  # type: ignore[union-attr]
    assert choose_provider(WebSettings(), {"BRAVE_API_KEY": "k", "TAVILY_API_KEY": "t"}).name == "brave"  # type: ignore[union-attr]
    assert choose_provider(WebSettings(), {"TAVILY_API_KEY": "t"}).name == "tavily"  # type: ignore[union-attr]
    assert choose_provider(WebSettings(provider="tavily"), both).name == "tavily"  # type: ignore[union-attr]
    assert choose_provider(WebSettings(), {"BRAVE_API_KEY": "   "}) == (
        "no search provider configured: set tools.web.searxng_url in the config or SEARXNG_URL / "
        "BRAVE_API_KEY / TAVILY_API_KEY")
    reason = choose_provider(WebSettings(provider="brave", brave_api_key_env="MY_BRAVE"), {"TAVILY_API_KEY": "t"})
    assert reason == "search provider brave has no API key: set MY_BRAVE"
    assert "searxng_url" in str(choose_provider(WebSettings(provider="searxng"), {}))


def test_registry_builds_web_once_and_reports_unavailable(site: WebFixture) -> None:
    async def main() -> None:
        ready, missing = await build_toolsets(["web"], tool_settings(config(searxng_url=site.base)))
        assert missing == [] and [t.name for t in ready["web"].tools] == ["web_search", "web_extract"]
        await ready["web"].aclose()

    asyncio.run(main())


# --- web_search ---------------------------------------------------------------------------------

def test_searxng_search(tmp_path: Path, site: WebFixture) -> None:
    async def body(ts: web.WebToolset, ctx: ToolContext) -> None:
        data = await call(ts, "web_search", {"query": "tidal power"}, ctx)
        assert data["success"] is True and data["provider"] == "searxng"
        assert [r["url"] for r in data["results"]] == [site.url("/article.html"), site.url("/other.html")]
        assert data["results"][0] == {"title": "Tidal energy (tidal power)", "url": site.url("/article.html"),
                                      "snippet": "Tides into power."}
        one = await call(ts, "web_search", {"query": "x", "limit": 1}, ctx)
        assert len(one["results"]) == 1

    with_toolset(tmp_path, config(searxng_url=site.base + "/search"), body)
    searches = [r for r in site.requests if r.path == "/search"]
    assert searches[-2].query == {"q": "tidal power", "format": "json"}


def test_brave_search_sends_key_header_and_count(tmp_path: Path, site: WebFixture) -> None:
    async def body(ts: web.WebToolset, ctx: ToolContext) -> None:
        data = await call(ts, "web_search", {"query": "tides", "limit": 1}, ctx)
        assert data["provider"] == "brave"
        assert data["results"] == [{"title": "Tidal energy (tides)", "url": site.url("/article.html"),
                                    "snippet": "Tides into power."}]

    with_toolset(tmp_path, config(brave_url=site.url("/brave/res/v1/web/search")), body,
                 {"BRAVE_API_KEY": BRAVE_KEY})
    seen = [r for r in site.requests if r.path.startswith("/brave/")][-1]
    assert seen.query == {"q": "tides", "count": "1"}
    assert seen.headers["X-Subscription-Token"] == BRAVE_KEY


def test_tavily_search_posts_query_with_bearer_key(tmp_path: Path, site: WebFixture) -> None:
    async def body(ts: web.WebToolset, ctx: ToolContext) -> None:
        data = await call(ts, "web_search", {"query": "tidal mills"}, ctx)
        assert data["provider"] == "tavily" and len(data["results"]) == 2
        assert data["results"][1]["snippet"] == "History of tidal mills."

    with_toolset(tmp_path, config(provider="tavily", tavily_url=site.url("/tavily/search"), max_results=3), body,
                 {"TAVILY_API_KEY": TAVILY_KEY})
    seen = [r for r in site.requests if r.path == "/tavily/search"][-1]
    assert seen.method == "POST" and seen.body == {"query": "tidal mills", "max_results": 3}


def test_search_api_rejection_is_an_error_result_without_the_key(tmp_path: Path, site: WebFixture) -> None:
    wrong = "tvly-wrong-secret-789"

    async def body(ts: web.WebToolset, ctx: ToolContext) -> None:
        data = await call(ts, "web_search", {"query": "q"}, ctx)
        assert data["success"] is False
        assert "HTTP 401" in data["error"]
        assert wrong not in json.dumps(data)  # the fixture echoes the header back; we must not
        assert "***" in data["error"]
        empty = await call(ts, "web_search", {"query": "  "}, ctx)
        assert empty["error"] == "query must be a non-empty string"

    with_toolset(tmp_path, config(tavily_url=site.url("/tavily/search")), body, {"TAVILY_API_KEY": wrong})


def test_unreachable_search_provider_is_an_error_result(tmp_path: Path) -> None:
    async def body(ts: web.WebToolset, ctx: ToolContext) -> None:
        data = await call(ts, "web_search", {"query": "q"}, ctx)
        assert data["success"] is False and data["error"].startswith("searxng search failed: ConnectError")

    with_toolset(tmp_path, config(searxng_url="http://127.0.0.1:9"), body)


# --- web_extract --------------------------------------------------------------------------------

def extract_all(tmp_path: Path, site: WebFixture, paths: list[str], **settings: Any) -> dict[str, Any]:
    async def body(ts: web.WebToolset, ctx: ToolContext) -> dict[str, Any]:
        return await call(ts, "web_extract", {"urls": [site.url(p) if p.startswith("/") else p for p in paths]}, ctx)

    return with_toolset(tmp_path, config(searxng_url=site.base, **settings), body)


def test_html_becomes_clean_markdown(tmp_path: Path, site: WebFixture) -> None:
    data = extract_all(tmp_path, site, ["/article.html"])
    page = data["results"][0]
    assert data["success"] is True and page["error"] is None
    assert page["title"] == "Tidal Energy & You" and page["content_type"] == "text/html"
    content = page["content"]
    assert content.startswith("# Tidal energy")
    assert "## Advantages" in content and "* Predictable output" in content
    assert f"[the other page]({site.url('/other.html')})" in content  # relative links made absolute
    assert "**tides**" in content and "Sihwa| 254" in content
    assert "Café naïve — unicode survives." in content
    assert "trackingSecret" not in content and "secret-style" not in content  # script and style dropped


def test_pdf_json_and_text_are_handled(tmp_path: Path, site: WebFixture) -> None:
    data = extract_all(tmp_path, site, ["/doc.pdf", "/nameless.pdf", "/data.json", "/notes.txt", "/latin1.html",
                                        "/cp1251.html"], max_urls=6)
    pdf, sniffed, js, txt, latin, cyrillic = data["results"]
    assert pdf["title"] == "Tidal Report"
    assert "Quarterly tidal report" in pdf["content"] and "Second page about turbines" in pdf["content"]
    assert sniffed["error"] is None and "Quarterly tidal report" in sniffed["content"]
    assert json.loads(js["content"]) == {"name": "tides", "values": [1, 2, 3], "nested": {"ok": True}}
    assert js["content"].startswith("{\n  ")  # pretty-printed
    assert txt["content"] == "plain notes\nline two\n"
    assert latin["title"] == "Français" and "déjà vu" in latin["content"]
    assert cyrillic["title"] == "Привет"


def test_redirects_are_followed_up_to_the_limit(tmp_path: Path, site: WebFixture) -> None:
    data = extract_all(tmp_path, site, ["/redirect/3", "/redirect/7", "/to-file"], max_redirects=5)
    ok_page, too_many, to_file = data["results"]
    assert ok_page["final_url"] == site.url("/article.html") and ok_page["title"] == "Tidal Energy & You"
    assert "exceeded the redirect limit (5)" in too_many["error"]
    assert "unsupported protocol" in to_file["error"]
    assert data["success"] is True  # one page worked


def test_huge_page_is_capped_in_bytes_and_characters(tmp_path: Path, site: WebFixture) -> None:
    data = extract_all(tmp_path, site, ["/huge.html"], max_bytes=100_000, max_chars=5_000)
    page = data["results"][0]
    assert page["error"] is None and page["truncated"] is True
    assert page["title"] == "Huge"
    assert 4_000 < len(page["content"]) <= 5_000 and "lorem ipsum" in page["content"]


def test_slow_page_times_out_quickly(tmp_path: Path, site: WebFixture) -> None:
    started = time.monotonic()
    data = extract_all(tmp_path, site, ["/slow.html?delay=20"], timeout=0.5)
    assert time.monotonic() - started < 5
    assert data["success"] is False
    assert data["results"][0]["error"].endswith("timed out after 0.5s")


def test_failures_per_url_and_when_all_fail(tmp_path: Path, site: WebFixture) -> None:
    data = extract_all(tmp_path, site, ["/missing", "/blob.bin", "file:///etc/passwd", "/notes.txt"])
    missing, blob, local_file, notes = data["results"]
    assert data["success"] is True
    assert missing["error"] == "HTTP 404 Not Found"
    assert blob["error"].startswith("unsupported content type application/octet-stream")
    assert "only absolute http:// and https:// URLs" in local_file["error"]
    assert notes["error"] is None
    failed = extract_all(tmp_path, site, ["/missing", "ftp://example.invalid/x"])
    assert failed["success"] is False and "HTTP 404" in failed["error"] and len(failed["results"]) == 2


def test_bad_arguments_are_error_results(tmp_path: Path, site: WebFixture) -> None:
    async def body(ts: web.WebToolset, ctx: ToolContext) -> None:
        empty = await call(ts, "web_extract", {"urls": []}, ctx)
        assert empty["error"] == "urls must be a non-empty list of URL strings"
        too_many = await call(ts, "web_extract", {"urls": [site.url("/notes.txt")] * 3}, ctx)
        assert too_many["error"] == "at most 2 URLs per call; got 3"
        single = await call(ts, "web_extract", {"urls": site.url("/notes.txt")}, ctx)  # a bare string is forgiven
        assert single["results"][0]["content"] == "plain notes\nline two\n"

    with_toolset(tmp_path, config(searxng_url=site.base, max_urls=2), body)
