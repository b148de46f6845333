"""The HTTP exchange of one chat-completion request: POST JSON bytes, get status, headers, body.

The client (model.client) owns what a request says and what a failure means; this module owns
connections. A transport returns every HTTP response, error statuses included, as a RawResponse,
and raises only TransportError (the connection failed or dropped) or TimeoutError.

Two implementations, chosen by `make_transport`:
- AiohttpTransport, when aiohttp is installed: a C HTTP parser and a connection pool whose cost
  does not grow with its size: the cheaper of the two per request (bench/http_clients.py, its
  figures in bench/RESULTS.md).
- SdkTransport otherwise: the openai SDK's raw `post` over httpx2. httpcore's pool rescans every
  connection (probing idle sockets) when a request starts or ends, so each task gets a pool of its
  own, up to POOL_SHARDS, sharing one SSL context; a task keeps its pool, so its keep-alive
  connection is reused.
Both honour HTTP(S)_PROXY / NO_PROXY and verify TLS with the same SSL context, follow no redirects,
stop reading a reply past MAX_RESPONSE_BYTES (error replies included) and have no connection cap:
the runner's concurrency limit is the only one.
"""

from __future__ import annotations

import asyncio
import itertools
import urllib.request
import weakref
from collections.abc import Mapping
from urllib.parse import urlsplit
from dataclasses import dataclass
from typing import Any, Protocol

from trajforge import __version__

POOL_SHARDS = 256
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


def make_transport(base_url: str, api_key: str, request_timeout: float, kind: str = "auto") -> Transport:
    """`kind`: "aiohttp", "sdk", or "auto" (aiohttp when installed)."""
    if kind in ("auto", "aiohttp"):
        try:
            import aiohttp  # noqa: F401
        except ModuleNotFoundError:
            if kind == "aiohttp":
                raise
        else:
            return AiohttpTransport(base_url, api_key, request_timeout)
    return SdkTransport(base_url, api_key, request_timeout)


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
        import aiohttp

        ssl_context: Any = None
        if self._url.startswith("https:"):  # httpx2 and a CA store cost ~0.1 s: only when needed
            import httpx2

            ssl_context = httpx2.create_ssl_context()
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


class _TooLarge(Exception):
    """A reply past MAX_RESPONSE_BYTES (raised from the SDK's read, which passes it on untouched)."""


def _capped_transport(inner: Any) -> Any:
    """An httpx2 transport whose responses stop reading past MAX_RESPONSE_BYTES: the SDK reads a
    reply (an error status's too) whole into memory before the client sees it."""
    import httpx2

    class Capped(httpx2.AsyncBaseTransport):
        async def handle_async_request(self, request: Any) -> Any:
            response = await inner.handle_async_request(request)
            length = response.headers.get("content-length", "")
            if length.isdigit() and int(length) > MAX_RESPONSE_BYTES:
                await response.aclose()
                raise _TooLarge(f"the response is {length} bytes, more than {MAX_RESPONSE_BYTES >> 20} MiB")
            return httpx2.Response(response.status_code, headers=response.headers,
                                   stream=_CappedStream(response.stream), extensions=response.extensions)

        async def aclose(self) -> None:
            await inner.aclose()

    class _CappedStream(httpx2.AsyncByteStream):
        def __init__(self, stream: Any) -> None:
            self._stream = stream

        async def __aiter__(self) -> Any:
            seen = 0
            async for chunk in self._stream:
                seen += len(chunk)
                if seen > MAX_RESPONSE_BYTES:
                    raise _TooLarge(f"the response is more than {MAX_RESPONSE_BYTES >> 20} MiB")
                yield chunk

        async def aclose(self) -> None:
            await self._stream.aclose()

    return Capped()


class SdkTransport:
    def __init__(self, base_url: str, api_key: str, request_timeout: float) -> None:
        import httpx2
        from openai import AsyncOpenAI

        timeout = httpx2.Timeout(request_timeout, connect=min(request_timeout, 30.0))
        limits = httpx2.Limits(max_connections=None, max_keepalive_connections=1000,
                               keepalive_expiry=_KEEPALIVE_SECONDS)
        ssl_context = httpx2.create_ssl_context()
        # A transport of our own (for the size cap) turns off httpx2's proxy lookup: do it here.
        proxy = env_proxy(base_url.rstrip("/") + "/chat/completions")

        def new_api() -> AsyncOpenAI:
            transport = _capped_transport(httpx2.AsyncHTTPTransport(verify=ssl_context, limits=limits, proxy=proxy))
            return AsyncOpenAI(api_key=api_key, base_url=base_url, max_retries=0, timeout=timeout,
                               http_client=httpx2.AsyncClient(transport=transport, timeout=timeout))

        self._new_api = new_api
        self._apis = [new_api()]
        self._api_of: weakref.WeakKeyDictionary[asyncio.Task[Any], AsyncOpenAI] = weakref.WeakKeyDictionary()
        self._tasks_seen = itertools.count()

    def _api(self) -> Any:
        task = asyncio.current_task()
        if task is None:
            return self._apis[0]
        api = self._api_of.get(task)
        if api is None:
            n = next(self._tasks_seen)
            if n >= len(self._apis) and len(self._apis) < POOL_SHARDS:
                self._apis.append(self._new_api())
            api = self._api_of[task] = self._apis[n % len(self._apis)]
        return api

    async def post(self, payload: bytes) -> RawResponse:
        import openai

        try:
            # The documented route for custom requests: our bytes out, bytes back, none of the
            # TypedDict transform and pydantic parsing of `chat.completions.create`.
            body = await self._api().post(
                "/chat/completions", cast_to=bytes, content=payload,
                options={"headers": {"Content-Type": "application/json"}, "security": {"bearer_auth": True}})
        except openai.APIStatusError as exc:
            return RawResponse(exc.status_code, exc.response.headers, exc.response.content)
        except openai.APITimeoutError as exc:
            raise TimeoutError(str(exc)) from exc
        except openai.APIError as exc:  # connection errors, and anything else short of a response
            raise TransportError(str(exc)) from exc
        except _TooLarge as exc:
            raise TransportError(str(exc)) from None
        return RawResponse(200, {}, body)

    async def aclose(self) -> None:
        for api in self._apis:
            await api.close()
