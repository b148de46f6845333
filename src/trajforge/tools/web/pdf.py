"""A PDF's text for web_extract, with its work bounded by what it returns.

It runs in a worker thread of the runner (web_content.extract), which no timeout can cancel and no
sandbox limits; so it stops at whichever comes first: max_chars of text, PDF_MAX_PAGES pages, or
PDF_CPU_SECONDS of the thread's CPU time, with pypdf's own limits lowered for the call.
"""

from __future__ import annotations

import io
import time

from pypdf import PdfReader, apply_configuration

TITLE_CHARS = 500  # a PDF's title, and a page's (web_content), is cut to this

# PDF text extraction stops at whichever comes first: max_chars of text, this many pages, or this
# much CPU time of the worker thread. A tiny PDF can make pypdf work for minutes: 200 pages sharing
# one compressed content stream, a page of a million empty text operators, a form drawn 5000 times.
PDF_MAX_PAGES = 50
PDF_CPU_SECONDS = 3.0
# pypdf's own limits, lowered (its defaults let one stream inflate to 75 MB and parse into 2M tokens,
# seconds of CPU and hundreds of MB before our per-operator check below first runs).
_PDF_LIMITS = {
    "zlib_maximum_output_length": 16_000_000,
    "lzw_maximum_output_length": 16_000_000,
    "run_length_maximum_output_length": 16_000_000,
    "brotli_maximum_output_length": 16_000_000,
    "array_based_stream_maximum_output_length": 16_000_000,
    "stream_decoding_work_maximum_length": 32_000_000,
    "stream_parsing_work_maximum_count": 300_000,
    "xform_maximum_invocations_per_extraction": 500,
    "page_tree_maximum_page_entries": 200_000,  # entries copied while listing the pages (default 2M)
}


class _StopExtraction(BaseException):
    """Raised from pypdf's visitor callbacks to end a page early. A BaseException, since pypdf
    catches and logs any Exception raised while it extracts a form XObject, and would go on."""


def _page_text(page: object, room: int, deadline: float) -> tuple[str, str | None]:
    """The page's text and None, or when `room` chars or the CPU deadline ran out first, the text
    extracted so far and which of the two ("chars" or "cpu") ended it."""
    pieces: list[str] = []
    size = 0

    def on_text(text: str, *_: object) -> None:
        nonlocal size
        pieces.append(text)
        size += len(text)
        if size > room:
            raise _StopExtraction("chars")

    def on_operator(*_: object) -> None:  # before every content-stream operator, forms included
        if time.thread_time() > deadline:
            raise _StopExtraction("cpu")

    try:
        text = page.extract_text(visitor_text=on_text, visitor_operand_before=on_operator)  # type: ignore[attr-defined]
    except _StopExtraction as stop:
        return "".join(pieces).strip(), str(stop)  # the pieces join to what extract_text returns
    except Exception as e:  # a damaged page, or one over the limits above: keep what it gave, go on
        done = "".join(pieces).strip()
        return f"{done}\n[the rest of this page cannot be read: {type(e).__name__}]" if done else \
            f"[this page cannot be read: {type(e).__name__}]", None
    return (text or "").strip(), None


def pdf_to_text(data: bytes, max_chars: int) -> tuple[str | None, str, str | None]:
    """(title, text of the first pages, why the text was cut or None); see the caps above."""
    with apply_configuration(**_PDF_LIMITS):  # a ContextVar: this thread's extraction only
        deadline = time.thread_time() + PDF_CPU_SECONDS
        reader = PdfReader(io.BytesIO(data))
        meta = reader.metadata
        title = " ".join(str(meta.title).split())[:TITLE_CHARS] if meta is not None and meta.title else ""
        total = len(reader.pages)
        parts: list[str] = []
        size = 0
        cut = f"only the first {PDF_MAX_PAGES} of {total} pages are extracted" if total > PDF_MAX_PAGES else None
        for n in range(1, min(total, PDF_MAX_PAGES) + 1):
            stopped = "cpu" if time.thread_time() > deadline else None
            if not stopped:
                text, stopped = _page_text(reader.pages[n - 1], max_chars - size, deadline)
                if text:
                    parts.append(f"--- page {n} ---\n{text}")
                    size += len(parts[-1]) + 2
            if stopped == "cpu":
                cut = f"text extraction stopped after {PDF_CPU_SECONDS:g} s of CPU time, at page {n} of {total}"
                break
            if stopped or size >= max_chars:
                cut = f"text cut at {max_chars} characters, in page {n} of {total}"
                break
    return title or None, "\n\n".join(parts), cut
