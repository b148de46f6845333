"""Bounded HTTP GETs for tools that read from the web (web_extract, vision URLs, image_gen URLs).

This module owns the limits every tool fetch obeys: http(s) only, a capped number of redirects,
one wall-clock deadline for the whole exchange (a server that drips bytes cannot hold a sample
past it), and a byte cap enforced while streaming so a huge response is never held in memory.
Failures become FetchError with a message fit for the model; nothing here raises httpx errors.

Clients for model-chosen URLs are made with a `policy` (tools/web/egress.py): every connection,
redirects included, goes only to addresses the run's egress policy allows, checked after DNS
resolution; a refusal comes back to the model saying why.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx

from trajforge.netpolicy import Policy
from trajforge.tools.web.egress import PolicyTransport, refusal_of


class FetchError(Exception):
    """A fetch that failed in a way the model should be told about (bad URL, timeout, ...)."""


@dataclass(slots=True)
class Fetched:
    url: str
    final_url: str
    status: int
    reason: str
    media_type: str  # lower-case type/subtype without parameters, "" when the server sent none
    charset: str | None
    body: bytes
    truncated: bool  # the body was cut at the byte cap


def new_client(*, timeout: float, max_redirects: int, user_agent: str,
               policy: Policy | None = None) -> httpx.AsyncClient:
    """One pooled client per toolset and run; limits below are per request. With `policy`,
    every connection is checked by it (model-chosen URLs); without, for user-configured endpoints."""
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=16)
    return httpx.AsyncClient(
        follow_redirects=True, max_redirects=max_redirects,
        timeout=httpx.Timeout(timeout, connect=min(timeout, 10.0)),
        headers={"User-Agent": user_agent, "Accept": "text/html,application/xhtml+xml,*/*;q=0.8"},
        limits=limits, transport=PolicyTransport(policy, limits) if policy is not None else None,
    )


def check_url(url: str) -> str:
    """The URL stripped, or FetchError when it is not an absolute http(s) URL."""
    url = url.strip()
    try:
        parts = urlsplit(url)
    except ValueError as e:
        raise FetchError(f"invalid URL {url!r}: {e}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise FetchError(f"invalid URL {url!r}: only absolute http:// and https:// URLs can be fetched")
    return url


def split_content_type(value: str | None) -> tuple[str, str | None]:
    """('text/html', 'utf-8') from 'text/html; charset=UTF-8'."""
    if not value:
        return "", None
    media, _, params = value.partition(";")
    charset = None
    for param in params.split(";"):
        key, _, val = param.partition("=")
        if key.strip().lower() == "charset" and val.strip():
            charset = val.strip().strip("\"'").lower()
    return media.strip().lower(), charset


async def fetch(client: httpx.AsyncClient, url: str, *, max_bytes: int, timeout: float) -> Fetched:
    """GET `url`, following at most the client's redirect limit, reading at most `max_bytes`."""
    url = check_url(url)
    try:
        async with asyncio.timeout(timeout):
            async with client.stream("GET", url) as response:
                chunks: list[bytes] = []
                size = 0
                truncated = False
                async for chunk in response.aiter_bytes():
                    if size + len(chunk) > max_bytes:
                        chunks.append(chunk[: max_bytes - size])
                        truncated = True
                        break
                    chunks.append(chunk)
                    size += len(chunk)
                media, charset = split_content_type(response.headers.get("content-type"))
                return Fetched(url=url, final_url=str(response.url), status=response.status_code,
                               reason=response.reason_phrase, media_type=media, charset=charset,
                               body=b"".join(chunks), truncated=truncated)
    except TimeoutError:
        raise FetchError(f"fetching {url} timed out after {timeout:g}s") from None
    except httpx.TooManyRedirects:
        raise FetchError(f"fetching {url} exceeded the redirect limit ({client.max_redirects})") from None
    except (httpx.InvalidURL, httpx.UnsupportedProtocol) as e:
        raise FetchError(f"cannot fetch {url}: {e}") from None
    except httpx.HTTPError as e:
        if (refused := refusal_of(e)) is not None:
            raise FetchError(f"cannot fetch {url}: {refused}") from None
        raise FetchError(f"fetching {url} failed: {type(e).__name__}: {e or 'connection error'}") from None
