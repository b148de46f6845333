"""Search providers behind web_search, and choosing one from the config and environment.

Each provider turns a query into a list of SearchHit (title, url, snippet) over one HTTP
request: SearXNG's JSON API (self-hosted, no key), Brave Search's web endpoint and Tavily's
/search (keys from the environment variables named in tools.web). A provider holds its key
privately and scrubs it from every message it builds. Failures raise SearchError with a message
fit for the model.
"""

from __future__ import annotations

import asyncio
import os
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from trajforge.catalog.tools_config import WebSettings


class SearchError(Exception):
    pass


@dataclass(frozen=True, slots=True)
class SearchHit:
    title: str
    url: str
    snippet: str


class SearchProvider(ABC):
    name: str

    def __init__(self, endpoint: str, api_key: str | None = None) -> None:
        self.endpoint = endpoint
        self._key = api_key

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.endpoint!r})"

    @abstractmethod
    def _request(self, client: httpx.AsyncClient, query: str, limit: int) -> httpx.Request:
        """The HTTP request for one query, built by `client` so its default headers apply."""

    @abstractmethod
    def _hits(self, data: Any) -> list[dict[str, Any]]:
        """The raw result objects of a decoded response."""

    _snippet_key = "content"

    async def search(self, client: httpx.AsyncClient, query: str, limit: int, timeout: float) -> list[SearchHit]:
        request = self._request(client, query, limit)
        try:
            async with asyncio.timeout(timeout):
                response = await client.send(request, follow_redirects=False)
        except TimeoutError:
            raise SearchError(f"{self.name} search timed out after {timeout:g}s") from None
        except httpx.HTTPError as e:
            raise SearchError(self._scrub(f"{self.name} search failed: {type(e).__name__}: {e}")) from None
        if response.status_code >= 400:
            detail = self._scrub(response.text[:300].strip())
            raise SearchError(f"{self.name} search returned HTTP {response.status_code}: {detail}")
        try:
            raw = self._hits(response.json())
        except (ValueError, AttributeError, TypeError, KeyError) as e:
            raise SearchError(f"{self.name} search returned an unexpected response: {e}") from None
        hits = []
        for item in raw:
            if isinstance(item, dict) and isinstance(item.get("url"), str):
                hits.append(SearchHit(title=str(item.get("title") or ""), url=item["url"],
                                      snippet=str(item.get(self._snippet_key) or "")))
        return hits[:limit]

    def _scrub(self, text: str) -> str:
        return text.replace(self._key, "***") if self._key else text


class SearxngProvider(SearchProvider):
    name = "searxng"

    def _request(self, client: httpx.AsyncClient, query: str, limit: int) -> httpx.Request:
        url = self.endpoint.rstrip("/")
        if not url.endswith("/search"):  # accept both the instance's base URL and its /search URL
            url += "/search"
        return client.build_request("GET", url, params={"q": query, "format": "json"},
                             headers={"Accept": "application/json"})

    def _hits(self, data: Any) -> list[dict[str, Any]]:
        return list(data["results"])


class BraveProvider(SearchProvider):
    name = "brave"
    _snippet_key = "description"

    def _request(self, client: httpx.AsyncClient, query: str, limit: int) -> httpx.Request:
        return client.build_request("GET", self.endpoint, params={"q": query, "count": limit},
                             headers={"Accept": "application/json", "X-Subscription-Token": self._key or ""})

    def _hits(self, data: Any) -> list[dict[str, Any]]:
        web = data.get("web") or {}
        return list(web.get("results") or [])


class TavilyProvider(SearchProvider):
    name = "tavily"

    def _request(self, client: httpx.AsyncClient, query: str, limit: int) -> httpx.Request:
        return client.build_request("POST", self.endpoint, json={"query": query, "max_results": limit},
                             headers={"Accept": "application/json", "Authorization": f"Bearer {self._key}"})

    def _hits(self, data: Any) -> list[dict[str, Any]]:
        return list(data["results"])


def _env(environ: Mapping[str, str], name: str) -> str | None:
    value = environ.get(name, "").strip()
    return value or None


def choose_provider(settings: WebSettings, environ: Mapping[str, str] = os.environ) -> SearchProvider | str:
    """The configured provider, or the reason none is available (for Unavailable)."""
    searxng = settings.searxng_url or _env(environ, "SEARXNG_URL")
    brave = _env(environ, settings.brave_api_key_env)
    tavily = _env(environ, settings.tavily_api_key_env)
    choice = settings.provider
    if choice in ("auto", "searxng") and searxng:
        return SearxngProvider(searxng)
    if choice in ("auto", "brave") and brave:
        return BraveProvider(settings.brave_url, brave)
    if choice in ("auto", "tavily") and tavily:
        return TavilyProvider(settings.tavily_url, tavily)
    if choice == "searxng":
        return "search provider searxng has no URL: set tools.web.searxng_url in the config or SEARXNG_URL"
    if choice == "brave":
        return f"search provider brave has no API key: set {settings.brave_api_key_env}"
    if choice == "tavily":
        return f"search provider tavily has no API key: set {settings.tavily_api_key_env}"
    return (f"no search provider configured: set tools.web.searxng_url in the config or SEARXNG_URL / "
            f"{settings.brave_api_key_env} / {settings.tavily_api_key_env}")
