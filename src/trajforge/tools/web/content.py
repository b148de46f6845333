"""Turning one fetched response into what web_extract returns: title + readable text, capped.

Dispatch is by the declared media type, with a sniff of the first bytes when the server sent
none or a generic one: HTML -> markdown (charset from the header, else the page's <meta>;
html2text, a maintained converter that drops head, script and style and keeps links, lists,
tables and code), PDF -> text of its pages (pypdf), JSON -> pretty-printed JSON, text/* -> as
is. Other binary types are refused with a clear message rather than dumped as mojibake.

Conversion is CPU work, so callers run `extract` in a worker thread (`asyncio.to_thread`), which
neither the tool's nor the sample's timeout can cancel, and it runs in the runner process, outside
every sandbox limit. So every conversion bounds its own work by what it returns (about max_chars),
never by the size or shape of the document: JSON stops encoding at max_chars, HTML conversion
past a few times max_chars or a CPU budget, PDF text extraction at max_chars, a page cap or a CPU
budget (pdf.py). Those bounds are what make the thread safe.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import asdict, dataclass
from html.parser import HTMLParser

import html2text

from trajforge.tools.web.fetch import Fetched, split_content_type
from trajforge.tools.web.pdf import TITLE_CHARS, pdf_to_text  # the same cap on page and PDF titles

_HTML_TYPES = {"text/html", "application/xhtml+xml"}
_GENERIC_TYPES = {"", "application/octet-stream", "binary/octet-stream"}
_BLANK_RUNS = re.compile(r"\n[ \t]*\n(?:[ \t]*\n)+")


@dataclass(slots=True)
class Page:
    url: str
    final_url: str | None = None
    title: str | None = None
    content_type: str | None = None
    content: str = ""
    truncated: bool = False
    error: str | None = None

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


class _MetaCharset(HTMLParser):
    """Finds <meta charset=...> or <meta http-equiv=content-type content=...; charset=...>."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.charset: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag != "meta" or self.charset:
            return
        values = {k.lower(): v or "" for k, v in attrs}
        if values.get("charset"):
            self.charset = values["charset"].strip().lower()
        elif values.get("http-equiv", "").lower() == "content-type":
            self.charset = split_content_type(values.get("content"))[1]


def html_charset(body: bytes) -> str | None:
    """The charset a page declares in its <head> (used when the HTTP header names none)."""
    parser = _MetaCharset()
    parser.feed(body[:4096].decode("latin-1"))  # latin-1 maps every byte, enough to read ASCII markup
    return parser.charset


class _TitleParser(HTMLParser):
    """Collects the text of the first <title> element (the stdlib parser tolerates broken HTML)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self._in_title = False
        self._done = False
        self.parts: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "title" and not self._done:
            self._in_title = True

    def handle_endtag(self, tag: str) -> None:
        if tag == "title" and self._in_title:
            self._in_title = False
            self._done = True

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.parts.append(data)


def html_title(html: str) -> str | None:
    parser = _TitleParser()
    parser.feed(html[:200_000])  # the title lives in <head>; no need to parse a 2 MB body for it
    title = " ".join("".join(parser.parts).split())[:TITLE_CHARS]
    return title or None


# html2text's work grows with nesting as well as size: 2 MB of nested lists took minutes of CPU.
# It is fed in pieces and stops once its output passes a few times max_chars or after this much
# CPU time of the worker thread.
HTML_PIECE, HTML_CPU_SECONDS = 4_096, 3.0


def html_to_markdown(html: str, base_url: str, max_chars: int = 1 << 62) -> tuple[str, str | None]:
    """The page as markdown, and why the conversion stopped for time (None when it did not: a stop
    for size shows in the text's length)."""
    converter = html2text.HTML2Text(baseurl=base_url)
    converter.body_width = 0  # no hard wrapping: the model reads lines, not a terminal
    converter.ignore_images = True  # image markup is noise in text; browser_get_images exists for that
    converter.unicode_snob = True
    converter.skip_internal_links = True
    converter.start = True  # what handle() sets before it feeds
    deadline, chars, seen, cut = time.thread_time() + HTML_CPU_SECONDS, 0, 0, None
    for at in range(0, len(html), HTML_PIECE):
        converter.feed(html[at:at + HTML_PIECE])
        chars += sum(len(s) for s in converter.outtextlist[seen:])
        seen = len(converter.outtextlist)
        if chars > 4 * max_chars:  # blank runs are squeezed below: keep some margin
            break
        if time.thread_time() > deadline and at + HTML_PIECE < len(html):
            cut = f"conversion stopped after {HTML_CPU_SECONDS:g} s of CPU time, at {at + HTML_PIECE} of {len(html)} characters"
            break
    converter.feed("")
    return _BLANK_RUNS.sub("\n\n", converter.optwrap(converter.finish())).strip(), cut


def pretty_json(raw: str, max_chars: int) -> str | None:
    """`raw` indented, up to just past max_chars (then the caller cuts it); None if it is no JSON.

    Only as much is encoded as is returned: json.dumps(indent=2) of the whole document first would
    cost depth x size (each nesting level indents every line below it), gigabytes for a 1 MB body
    of deeply nested arrays. Parsing is bounded by the body's size (capped by max_bytes);
    nesting deeper than the recursion limit raises RecursionError, taken as not-JSON."""
    try:
        value = json.loads(raw)
        parts: list[str] = []
        size = 0
        # With indent the encoder is the pure-Python generator, so stopping early stops the work.
        for chunk in json.JSONEncoder(indent=2, ensure_ascii=False).iterencode(value):
            parts.append(chunk)
            size += len(chunk)
            if size > max_chars:
                break
    except (ValueError, RecursionError):
        return None
    return "".join(parts)


def _decode(body: bytes, charset: str | None) -> str:
    try:
        return body.decode(charset or "utf-8", errors="replace")
    except LookupError:  # an unknown charset name from the server
        return body.decode("utf-8", errors="replace")


def _sniff(body: bytes) -> str:
    head = body[:512].lstrip().lower()
    if head.startswith(b"%pdf-"):
        return "application/pdf"
    if head.startswith((b"<!doctype html", b"<html")) or b"<body" in head:
        return "text/html"
    if head[:1] in (b"{", b"["):
        return "application/json"
    if b"\x00" not in body[:4096]:
        return "text/plain"
    return ""


def _kind(media: str, body: bytes) -> str:
    if media in _GENERIC_TYPES:
        media = _sniff(body)
    if media in _HTML_TYPES:
        return "html"
    if media == "application/pdf":
        return "pdf"
    if media == "application/json" or media.endswith("+json"):
        return "json"
    if media.startswith("text/") or media in ("application/xml", "application/javascript") or media.endswith("+xml"):
        return "text"
    return "binary"


def _noted(page: Page, text: str, cut: str | None, max_chars: int) -> str:
    """`text` with why it was cut (if it was) at its end, within max_chars, where the model reads."""
    if cut is None:
        return text
    page.truncated = True
    note = f"\n\n[{cut}]"
    return text[: max(0, max_chars - len(note))] + note


def extract(fetched: Fetched, max_chars: int) -> Page:
    """The Page for one fetched response (never raises for bad content: it sets `error`)."""
    page = Page(url=fetched.url, final_url=fetched.final_url, content_type=fetched.media_type or None)
    if fetched.status >= 400:
        page.error = f"HTTP {fetched.status} {fetched.reason}".strip()
        return page
    kind = _kind(fetched.media_type, fetched.body)
    if kind == "html":
        html = _decode(fetched.body, fetched.charset or html_charset(fetched.body))
        page.title = html_title(html)
        text, cut = html_to_markdown(html, fetched.final_url, max_chars)
        text = _noted(page, text, cut, max_chars)
    elif kind == "pdf":
        if fetched.truncated:
            page.error = "the PDF is larger than the download cap (tools.web.max_bytes); its text cannot be extracted"
            return page
        try:
            page.title, text, cut = pdf_to_text(fetched.body, max_chars)
        except Exception as e:  # pypdf raises many types on damaged files
            page.error = f"cannot read the PDF: {type(e).__name__}: {str(e)[:300]}"
            return page
        if not text:
            page.error = f"the PDF has no extractable text ({cut or 'scanned images?'})"
            return page
        text = _noted(page, text, cut, max_chars)
    elif kind == "json":
        raw = _decode(fetched.body, fetched.charset)
        text = pretty_json(raw, max_chars)
        if text is None:
            text = raw  # cut by the byte cap, or not really JSON, or nested too deep: show it as text
    elif kind == "text":
        text = _decode(fetched.body, fetched.charset)
    else:
        page.error = f"unsupported content type {fetched.media_type or 'unknown'} (binary data is not returned)"
        return page
    page.truncated = page.truncated or fetched.truncated or len(text) > max_chars
    page.content = text[:max_chars]
    return page
