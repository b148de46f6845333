"""A real local web for the web, vision and image_gen tests: one aiohttp server on 127.0.0.1:0.

It serves real HTML pages, a SearXNG-compatible `/search?format=json` endpoint, Brave- and
Tavily-compatible search APIs (checking their auth headers), a generated PDF with text, JSON,
plain text, a PNG, binary data, redirect chains, a 404, a page of several megabytes, a page
that answers only after a delay, and a form page for browser runs. It runs in a background
thread like scripted_server.py so sync and async tests can use it; every request is recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import json
import struct
import threading
import zlib
from dataclasses import dataclass
from typing import Any

from aiohttp import web

BRAVE_KEY = "brave-test-key-123"
TAVILY_KEY = "tvly-test-key-456"

ARTICLE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Tidal Energy &amp; You</title>
<style>body { color: red; } .secret-style { display: none; }</style>
<script>var trackingSecret = "do-not-show"; console.log(trackingSecret);</script></head>
<body>
<h1>Tidal energy</h1>
<p>Tidal power converts the energy of <strong>tides</strong> into electricity.
See <a href="/other.html">the other page</a> for history.</p>
<h2>Advantages</h2>
<ul><li>Predictable output</li><li>Long plant lifetime</li></ul>
<table><tr><th>Site</th><th>MW</th></tr><tr><td>Sihwa</td><td>254</td></tr></table>
<pre><code>print("tide")</code></pre>
<p>Caf\u00e9 na\u00efve \u2014 unicode survives.</p>
</body></html>"""

OTHER = "<html><head><title>Other page</title></head><body><p>History of tidal mills.</p></body></html>"
DATA = {"name": "tides", "values": [1, 2, 3], "nested": {"ok": True}}
NOTES = "plain notes\nline two\n"

# For browser runs: a GET form that submits to /greeting.html, an image and a console message.
FORM = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>Greeting form</title></head><body>
<h1>Greeting form</h1>
<form action="/greeting.html" method="get"><label for="name">Your name</label>
<input id="name" name="name" placeholder="name"> <button type="submit">Greet</button></form>
<img src="/image.png" alt="Red box" width="40" height="30">
<script>console.log("form page ready");</script>
</body></html>"""


def make_png(width: int = 4, height: int = 3, rgb: tuple[int, int, int] = (200, 30, 30)) -> bytes:
    """A valid RGB PNG of one colour (stdlib only)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    rows = b"".join(b"\x00" + bytes(rgb) * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def make_pdf(pages: list[str], title: str) -> bytes:
    """A valid PDF with one line of Helvetica text per page and an Info title, offsets computed."""
    objects: list[bytes] = []
    kids = " ".join(f"{4 + 2 * i} 0 R" for i in range(len(pages)))
    objects.append(b"<< /Type /Catalog /Pages 2 0 R >>")
    objects.append(f"<< /Type /Pages /Kids [{kids}] /Count {len(pages)} >>".encode())
    objects.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    for i, text in enumerate(pages):
        content = f"BT /F1 18 Tf 72 720 Td ({text}) Tj ET".encode()
        objects.append(f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 3 0 R >> >> "
                       f"/Contents {5 + 2 * i} 0 R >>".encode())
        objects.append(b"<< /Length %d >>\nstream\n" % len(content) + content + b"\nendstream")
    objects.append(f"<< /Title ({title}) >>".encode())
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for n, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += f"{n} 0 obj\n".encode() + body + b"\nendobj\n"
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    out += b"".join(f"{off:010d} 00000 n \n".encode() for off in offsets)
    out += (f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R /Info {len(objects)} 0 R >>\n"
            f"startxref\n{xref}\n%%EOF\n").encode()
    return bytes(out)


PDF = make_pdf(["Quarterly tidal report", "Second page about turbines"], "Tidal Report")
PNG = make_png()


@dataclass
class Seen:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: Any


class WebFixture:
    """Use as a context manager; `url(path)` gives an absolute URL on the server."""

    def __init__(self, huge_bytes: int = 5_000_000) -> None:
        self.requests: list[Seen] = []
        self.huge_bytes = huge_bytes
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._closing: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, path: str) -> str:
        return self.base + path

    def _search_results(self, query: str) -> list[dict[str, str]]:
        return [{"url": self.url("/article.html"), "title": f"Tidal energy ({query})", "snippet": "Tides into power."},
                {"url": self.url("/other.html"), "title": "Other page", "snippet": "History of tidal mills."}]

    async def _record(self, request: web.Request) -> None:
        raw = await request.read()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode(errors="replace")
        self.requests.append(Seen(request.method, request.path, dict(request.query), dict(request.headers), body))

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        await self._record(request)
        path = request.path
        if path == "/article.html":
            return web.Response(text=ARTICLE, content_type="text/html", charset="utf-8")
        if path == "/other.html":
            return web.Response(text=OTHER, content_type="text/html")
        if path == "/form.html":
            return web.Response(text=FORM, content_type="text/html")
        if path == "/greeting.html":  # the form's target; tall so that scrolling moves
            name = html.escape(request.query.get("name", "nobody"))
            page = (f"<html><head><title>Greeting</title></head><body><p>Hello, {name}!</p>"
                    '<div style="height:4000px"></div><p>end</p></body></html>')
            return web.Response(text=page, content_type="text/html")
        if path == "/latin1.html":
            page = "<html><title>Fran\u00e7ais</title><p>d\u00e9j\u00e0 vu</p></html>"
            return web.Response(body=page.encode("latin-1"), headers={"Content-Type": "text/html; charset=ISO-8859-1"})
        if path == "/cp1251.html":  # charset only in <meta>, not in the header
            page = '<html><head><meta charset="windows-1251"><title>\u041f\u0440\u0438\u0432\u0435\u0442</title></head>'
            return web.Response(body=page.encode("cp1251") + b"<p>ok</p></html>", headers={"Content-Type": "text/html"})
        if path == "/doc.pdf":
            return web.Response(body=PDF, content_type="application/pdf")
        if path == "/nameless.pdf":  # a PDF served without a useful type: must be sniffed
            return web.Response(body=PDF, headers={"Content-Type": "application/octet-stream"})
        if path == "/data.json":
            return web.Response(text=json.dumps(DATA), content_type="application/json")
        if path == "/notes.txt":
            return web.Response(text=NOTES, content_type="text/plain")
        if path == "/image.png":
            return web.Response(body=PNG, content_type="image/png")
        if path == "/blob.bin":
            return web.Response(body=bytes(range(256)) * 8, content_type="application/octet-stream")
        if path.startswith("/redirect/"):
            left = int(path.rsplit("/", 1)[1])
            raise web.HTTPFound(self.url(f"/redirect/{left - 1}" if left > 1 else "/article.html"))
        if path == "/to-file":
            raise web.HTTPFound("file:///etc/passwd")
        if path == "/huge.html":
            return await self._huge(request)
        if path == "/slow.html":
            # Wait for the delay, or until the fixture shuts down (so no handler is left pending).
            assert self._closing is not None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), float(request.query.get("delay", "30")))
            return web.Response(text="<p>finally</p>", content_type="text/html")
        if path == "/search":  # SearXNG: JSON only when format=json, as a real instance answers
            if request.query.get("format") != "json":
                return web.Response(status=403, text="format not allowed")
            hits = self._search_results(request.query.get("q", ""))
            return web.json_response({"query": request.query.get("q"), "number_of_results": len(hits),
                                      "results": [{"url": h["url"], "title": h["title"], "content": h["snippet"],
                                                   "engine": "fixture"} for h in hits]})
        if path == "/brave/res/v1/web/search":
            if request.headers.get("X-Subscription-Token") != BRAVE_KEY:
                return web.json_response({"error": {"detail": "invalid token"}}, status=401)
            hits = self._search_results(request.query.get("q", ""))[: int(request.query.get("count", "20"))]
            return web.json_response({"type": "search", "query": {"original": request.query.get("q")},
                                      "web": {"type": "search", "results": [
                                          {"title": h["title"], "url": h["url"], "description": h["snippet"]}
                                          for h in hits]}})
        if path == "/tavily/search" and request.method == "POST":
            if request.headers.get("Authorization") != f"Bearer {TAVILY_KEY}":
                return web.json_response({"detail": {"error": f"Unauthorized: {request.headers.get('Authorization')}"}},
                                         status=401)
            body = self.requests[-1].body or {}
            hits = self._search_results(body.get("query", ""))[: int(body.get("max_results", 5))]
            return web.json_response({"query": body.get("query"), "answer": None, "response_time": 0.1,
                                      "results": [{"title": h["title"], "url": h["url"], "content": h["snippet"],
                                                   "score": 0.9} for h in hits]})
        return web.Response(status=404, text="not found")

    async def _huge(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/html"})
        await response.prepare(request)
        await response.write(b"<html><head><title>Huge</title></head><body>")
        block = b"<p>" + b"lorem ipsum dolor sit amet " * 36 + b"</p>\n"
        sent = 0
        try:
            while sent < self.huge_bytes:
                await response.write(block)
                sent += len(block)
            await response.write(b"</body></html>")
        except (ConnectionResetError, asyncio.CancelledError):
            pass  # the client stopped reading at its byte cap, as it should
        return response

    def __enter__(self) -> WebFixture:
        started = threading.Event()

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self._loop)
            self._closing = asyncio.Event()
            app = web.Application()
            app.router.add_route("*", "/{tail:.*}", self._handle)
            runner = self._runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.5)
            self._loop.run_until_complete(runner.setup())
            site = web.TCPSite(runner, "127.0.0.1", 0)
            self._loop.run_until_complete(site.start())
            self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            started.set()
            self._loop.run_forever()
            self._loop.close()

        self._thread = threading.Thread(target=run, name="web-fixture", daemon=True)
        self._thread.start()
        if not started.wait(10):
            raise RuntimeError("web fixture did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None and self._thread is not None and self._runner is not None
        # Clean up while the loop still runs, so handlers still waiting (the slow page) are
        # cancelled properly instead of being destroyed pending.
        assert self._closing is not None
        self._loop.call_soon_threadsafe(self._closing.set)
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
