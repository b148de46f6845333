"""The web toolset against a real local web server (tests/support/web_fixture.py).

Covers provider choice and the Unavailable reasons, SearXNG / Brave / Tavily searches with their
auth, and web_extract on HTML, PDF, JSON, text, binary, redirects, 404s, a huge page, a slow page
and bad URLs, and hostile JSON and PDF documents whose conversion must stay bounded (it runs in
the runner process, in a thread no timeout can stop). Every request is real HTTP on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import http.server
import json
import re
import threading
import tracemalloc
import zlib
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.support.toolsets import run_with
from tests.support.web_fixture import BRAVE_KEY, TAVILY_KEY, WebFixture
from trajforge.config import RunConfig
from trajforge.tools.web import content as web_content
from trajforge.tools.web import pdf as pdf_text
from trajforge.tools.web import toolset as web
from trajforge.tools.tool import ToolContext, Unavailable, result_failed
from trajforge.tools.web.fetch import Fetched
from trajforge.tools.toolsets import build_toolsets
from trajforge.catalog.tools_config import WebSettings
from trajforge.tools.web.search import choose_provider


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
    built = asyncio.run(web.build(config().tool_settings(), {}))
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
        ready, missing = await build_toolsets(["web"], config(searxng_url=site.base).tool_settings())
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
    # A page that would load, 20 s late: only the 0.5 s cut makes the fetch fail, and says so.
    data = extract_all(tmp_path, site, ["/slow.html?delay=20"], timeout=0.5)
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


# --- hostile documents: conversion work is bounded by max_chars, not by the document ----------------

MiB = 1 << 20


@contextmanager
def serve(routes: dict[str, tuple[str, bytes]]) -> Iterator[str]:
    """A real HTTP server on 127.0.0.1 answering each path with (content type, body); yields its base."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            kind, body = routes[self.path.split("?")[0]]
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def extract_from(tmp_path: Path, base: str, paths: list[str], **settings: Any) -> dict[str, Any]:
    async def body(ts: web.WebToolset, ctx: ToolContext) -> dict[str, Any]:
        return await call(ts, "web_extract", {"urls": [base + p for p in paths]}, ctx)

    return with_toolset(tmp_path, config(searxng_url=base, **settings), body)


def traced(fn: Callable[[], Any]) -> tuple[Any, int]:
    """fn's result and the peak of Python memory allocated while it ran."""
    tracemalloc.start()
    try:
        return fn(), tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def fetched(body: bytes, media_type: str) -> Fetched:
    return Fetched(url="http://x.test/d", final_url="http://x.test/d", status=200, reason="OK",
                   media_type=media_type, charset=None, body=body, truncated=False)


def make_pdf(contents: list[bytes], pages: int, form: bytes | None = None) -> bytes:
    """A PDF of `pages` pages, page i drawing the compressed content stream contents[i % len]: many
    pages can share one stream, so a small file holds a lot of text. With `form`, every page's
    resources also hold it as the form XObject /X1. Text is in Helvetica, font /F1."""
    objects: dict[int, bytes] = {1: b"<< /Type /Catalog /Pages 2 0 R >>",
                                 3: b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"}

    def stream(data: bytes, extra: bytes = b"") -> bytes:
        packed = zlib.compress(data, 9)
        return b"<< %s /Length %d /Filter /FlateDecode >>\nstream\n" % (extra, len(packed)) + packed + b"\nendstream"

    objects[4] = stream(form or b"", b"/Type /XObject /Subtype /Form /BBox [0 0 612 792] "
                                     b"/Resources << /Font << /F1 3 0 R >> >>")
    first_content, first_page = 5, 5 + len(contents)
    for i, content in enumerate(contents):
        objects[first_content + i] = stream(content)
    for i in range(pages):
        objects[first_page + i] = (
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents %d 0 R "
            b"/Resources << /Font << /F1 3 0 R >> /XObject << /X1 4 0 R >> >> >>" % (first_content + i % len(contents)))
    kids = " ".join(f"{first_page + i} 0 R" for i in range(pages))
    objects[2] = f"<< /Type /Pages /Kids [{kids}] /Count {pages} >>".encode()
    out = bytearray(b"%PDF-1.4\n")
    offsets = {}
    for n in sorted(objects):
        offsets[n] = len(out)
        out += b"%d 0 obj\n" % n + objects[n] + b"\nendobj\n"
    xref, size = len(out), max(objects) + 1
    out += b"xref\n0 %d\n0000000000 65535 f \n" % size
    out += b"".join(b"%010d 00000 n \n" % offsets[n] for n in range(1, size))
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (size, xref)
    return bytes(out)


def test_deeply_nested_json_is_pretty_printed_only_up_to_max_chars() -> None:
    # 100 KB of numbers 500 arrays deep: indenting the whole document writes ~1000 spaces per number
    # (50 MB), where only the first 5000 characters are returned.
    body = ("[" * 500 + ",".join(["1"] * 50_000) + "]" * 500).encode()
    page, peak = traced(lambda: web_content.extract(fetched(body, "application/json"), 5_000))
    assert page.error is None and page.truncated is True
    assert len(page.content) == 5_000 and page.content.startswith("[\n  [\n    [\n")
    assert peak < 4 * MiB, peak


def test_hostile_json_over_http_is_bounded_and_never_crashes(tmp_path: Path) -> None:
    deep = b"[" * 100_000 + b"]" * 100_000  # deeper than the recursion limit: json.loads raises RecursionError
    nested = ("[" * 900 + ",".join(["1"] * 200_000) + "]" * 900).encode()
    with serve({"/deep.json": ("application/json", deep), "/nested.json": ("application/json", nested)}) as base:
        data = extract_from(tmp_path, base, ["/deep.json", "/nested.json"], max_chars=3_000)
    deep_page, nested_page = data["results"]
    assert data["success"] is True
    assert deep_page["error"] is None and deep_page["content"] == "[" * 3_000 and deep_page["truncated"] is True
    assert nested_page["error"] is None and len(nested_page["content"]) == 3_000 and nested_page["truncated"] is True
    assert nested_page["content"].startswith("[\n  [\n")


def test_hostile_html_is_converted_only_up_to_max_chars_or_a_cpu_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    # 2 MB of nested lists: html2text indents every item by its depth, minutes of CPU for the whole
    # body. It is fed in pieces and stops once its output passes a few times max_chars...
    lists = ("<ul>" * 5_000 + "<li>x</li>" * 50_000 + "</ul>" * 5_000).encode()
    page, peak = traced(lambda: web_content.extract(fetched(lists, "text/html"), 5_000))
    assert page.error is None and page.truncated is True and len(page.content) == 5_000
    assert peak < 8 * MiB, peak
    # ...or after its CPU budget, saying so where the model reads
    monkeypatch.setattr(web_content, "HTML_CPU_SECONDS", 0.0)
    nested = ("<div>" * 100_000 + "x" + "</div>" * 100_000).encode()
    page = web_content.extract(fetched(nested, "text/html"), 5_000)
    assert page.truncated is True and page.content.endswith(" s of CPU time, at 4096 of 1100001 characters]"), page.content
    normal = b"<html><body><h1>Title</h1><p>Some <b>bold</b> text.</p></body></html>"
    monkeypatch.undo()
    page = web_content.extract(fetched(normal, "text/html"), 5_000)
    assert page.content == "# Title\n\nSome **bold** text." and page.truncated is False


def test_pdf_text_extraction_stops_at_max_chars() -> None:
    # 100 pages share one content stream of 100 lines of 1000 characters: a 10 KB file, 10 MB of text.
    line = b"(" + b"A" * 1000 + b") Tj T*\n"
    body = make_pdf([b"BT /F1 12 Tf 14 TL 72 720 Td\n" + line * 100 + b"ET"], pages=100)
    page, peak = traced(lambda: web_content.extract(fetched(body, "application/pdf"), 5_000))
    assert page.error is None and page.truncated is True
    assert len(page.content) <= 5_000 and page.content.startswith("--- page 1 ---\nAAAA")
    assert page.content.endswith("\n\n[text cut at 5000 characters, in page 1 of 100]")
    assert peak < 8 * MiB, peak


def test_pdf_text_extraction_stops_at_the_page_cap() -> None:
    pages = pdf_text.PDF_MAX_PAGES + 10
    body = make_pdf([b"BT /F1 12 Tf 72 720 Td (Leaf %d) Tj ET" % n for n in range(1, pages + 1)], pages=pages)
    page = web_content.extract(fetched(body, "application/pdf"), 100_000)
    assert page.error is None and page.truncated is True
    last = pdf_text.PDF_MAX_PAGES
    assert f"--- page {last} ---\nLeaf {last}" in page.content and f"Leaf {last + 1}" not in page.content
    assert page.content.endswith(f"[only the first {last} of {pages} pages are extracted]")


@pytest.mark.timeout(120)
def test_pdf_text_extraction_stops_at_its_cpu_budget(monkeypatch: pytest.MonkeyPatch,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    """Pages whose operators yield no text are bounded by CPU time, forms drawn from a page too
    (pypdf catches and logs exceptions from inside a form XObject: the stop must not be one)."""
    monkeypatch.setattr(pdf_text, "PDF_CPU_SECONDS", 0.2)
    empty_text = b"BT /F1 12 Tf " + b"() Tj\n" * 40_000 + b"ET"  # ~0.3 s of pypdf work, no text
    many_pages = make_pdf([empty_text], pages=200)
    many_forms = make_pdf([b"/X1 Do\n" * 5_000], pages=1, form=empty_text)
    for body, total in ((many_pages, 200), (many_forms, 1)):
        page = web_content.extract(fetched(body, "application/pdf"), 5_000)
        stopped = re.fullmatch(r"the PDF has no extractable text \(text extraction stopped after 0\.2 s of CPU time, "
                               rf"at page (\d+) of {total}\)", page.error or "")
        assert stopped and int(stopped[1]) <= min(total, 5), page.error  # about 0.3 s per page
    assert "XFormObject" not in caplog.text


def test_titles_are_capped() -> None:
    html = b"<html><head><title>" + b"T" * 100_000 + b"</title></head><body><p>hi</p></body></html>"
    page = web_content.extract(fetched(html, "text/html"), 5_000)
    assert page.title == "T" * web_content.TITLE_CHARS and page.content == "hi"
