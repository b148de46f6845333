"""The HTTP exchange of one chat-completion request: POST JSON bytes, get status, headers, body.

The client (model.client) owns what a request says and what a failure means; this module owns
connections. A transport returns every HTTP response, error statuses included, as a RawResponse,
and raises only TransportError (the connection failed or dropped) or TimeoutError.

AiohttpTransport is the one implementation: aiohttp's C HTTP parser and a connection pool whose
cost does not grow with its size, cheaper per request than the openai SDK's stack over httpx
(bench/http_clients.py, its figures in bench/RESULTS.md). It honours HTTP(S)_PROXY / NO_PROXY,
verifies TLS against the system's store (or SSL_CERT_FILE / SSL_CERT_DIR), follows no redirects,
stops reading a reply past MAX_RESPONSE_BYTES (error replies included) and has no connection cap:
the runner's concurrency limit is the only one.
"""

from __future__ import annotations

import ssl
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

from trajforge import __version__

# A reply larger than this is refused as it arrives: it would be held whole in the runner, and
# no completion is this large (a 300 MB reply took the runner to ~1 GB).
MAX_RESPONSE_BYTES = 64 << 20
_KEEPALIVE_SECONDS = 30.0


class TransportError(Exception):
    """The request got no complete response: connection refused, reset or dropped."""


@dataclass(slots=True)
class RawResponse:
    status: int
    headers: Mapping[str, str]  # case-insensitive lookups
    body: bytes


class Transport(Protocol):
    async def post(self, payload: bytes) -> RawResponse: ...

    async def aclose(self) -> None: ...


def env_proxy(url: str) -> str | None:
    """The proxy the environment sets for `url` (HTTP(S)_PROXY, ALL_PROXY, minus NO_PROXY)."""
    parts = urlsplit(url)
    proxies = urllib.request.getproxies_environment()
    if parts.hostname and urllib.request.proxy_bypass_environment(parts.hostname, proxies):
        return None
    return proxies.get(parts.scheme) or proxies.get("all")


class AiohttpTransport:
    def __init__(self, base_url: str, api_key: str, request_timeout: float) -> None:
        self._url = base_url.rstrip("/") + "/chat/completions"
        # Looked up once: aiohttp's trust_env would also consult ~/.netrc on every request.
        self._proxy = env_proxy(self._url)
        self._headers = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json",
                         "Accept": "application/json", "User-Agent": f"trajforge/{__version__}"}
        self._connect_timeout = min(request_timeout, 30.0)
        self._session: Any = None  # created on first use: aiohttp wants a running loop

    def _open(self) -> Any:
        import aiohttp  # imported on first use, as is every heavy dependency of a module others import

        ssl_context: Any = None
        if self._url.startswith("https:"):  # reading a CA store takes a while: only when needed
            ssl_context = ssl.create_default_context()
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=_KEEPALIVE_SECONDS, ssl=ssl_context)
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=None, sock_connect=self._connect_timeout))
        return self._session

    async def post(self, payload: bytes) -> RawResponse:
        import aiohttp

        session = self._session or self._open()
        try:
            async with session.post(self._url, data=payload, headers=self._headers, allow_redirects=False,
                                    proxy=self._proxy) as r:
                return RawResponse(r.status, r.headers, await _read_capped(r))
        except aiohttp.ClientError as exc:
            failure = f"{type(exc).__name__}: {exc}"
        # Raised outside the handler so the aiohttp error is neither __cause__ nor __context__: its
        # request_info holds the request headers, Authorization included, and its repr prints them.
        raise TransportError(failure)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


async def _read_capped(r: Any) -> bytes:
    if (r.content_length or 0) > MAX_RESPONSE_BYTES:
        raise TransportError(f"the response is {r.content_length} bytes, more than {MAX_RESPONSE_BYTES >> 20} MiB")
    body = bytearray()
    async for chunk in r.content.iter_any():
        body += chunk
        if len(body) > MAX_RESPONSE_BYTES:
            raise TransportError(f"the response is more than {MAX_RESPONSE_BYTES >> 20} MiB")
    return bytes(body)
