"""The `web` toolset: web_search (pluggable providers) and web_extract (pages as markdown).

This module owns the two tools, their argument schemas and result shapes, and the run-level
resources they share: one pooled HTTP client and the chosen search provider, both created once
in `build` and released by `WebToolset.aclose`. The toolset is all-or-nothing, so it is offered
only when a search provider is configured (see WebSettings); without one `build` returns
Unavailable rather than offering a web_search that can only fail.

Result shapes (JSON):
  web_search  -> {success, query, provider, results: [{title, url, snippet}]}
  web_extract -> {success, results: [{url, final_url, title, content_type, content, truncated,
                 error}]}; success is false only when every URL failed, with `error` set.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from trajforge.tools.web import fetch
from trajforge.netpolicy import Policy
from trajforge.tools.tool import Tool, ToolContext, Toolset, Unavailable, error, ok
from trajforge.catalog.tools_config import WebSettings
from trajforge.tools.web.egress import policy_for
from trajforge.tools.web.content import Page, extract
from trajforge.tools.web.search import SearchError, SearchProvider, choose_provider

if TYPE_CHECKING:
    from trajforge.tools.tool_settings import ToolSettings


class WebToolset(Toolset):
    def __init__(self, settings: WebSettings, provider: SearchProvider, policy: Policy | None = None) -> None:
        self.settings = settings
        self.provider = provider
        # Search goes to the user's provider (any address); extraction to the model's URLs, through
        # the egress policy. Without a policy (--sandbox_network none) web_extract is not offered.
        self.http = fetch.new_client(timeout=settings.timeout, max_redirects=settings.max_redirects,
                                          user_agent=settings.user_agent)
        self.fetch_http = (fetch.new_client(timeout=settings.timeout, max_redirects=settings.max_redirects,
                                                 user_agent=settings.user_agent, policy=policy)
                           if policy is not None else None)
        tools: list[Tool] = [WebSearchTool(self)] + ([WebExtractTool(self)] if policy is not None else [])
        super().__init__("web", tools)

    async def aclose(self) -> None:
        await self.http.aclose()
        if self.fetch_http is not None:
            await self.fetch_http.aclose()


class WebSearchTool(Tool):
    name = "web_search"
    toolset = "web"
    description = ("Search the web for information on any topic. Returns a list of results, each with a "
                   "title, URL and snippet. Use web_extract to read a result's full page.")
    parameters = {
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "The search query."},
            "limit": {"type": "integer", "description": "Number of results to return (default 5, at most 20)."},
        },
        "required": ["query"],
    }

    def __init__(self, owner: WebToolset) -> None:
        self.owner = owner

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        query = str(args.get("query") or "").strip()
        if not query:
            return error("query must be a non-empty string")
        settings = self.owner.settings
        limit = args.get("limit") or settings.max_results
        limit = max(1, min(int(limit), 20)) if isinstance(limit, int | float) else settings.max_results
        provider = self.owner.provider
        try:
            hits = await provider.search(self.owner.http, query, limit, settings.timeout)
        except SearchError as e:
            return error(str(e), query=query, provider=provider.name)
        return ok(query=query, provider=provider.name,
                  results=[{"title": h.title, "url": h.url, "snippet": h.snippet} for h in hits])


class WebExtractTool(Tool):
    name = "web_extract"
    toolset = "web"
    description = ("Fetch web pages and return their main content as markdown (HTML), text (PDF, plain "
                   "text) or pretty-printed JSON. Long pages are truncated.")
    parameters = {
        "type": "object",
        "properties": {
            "urls": {"type": "array", "items": {"type": "string"},
                     "description": "http(s) URLs to fetch (at most 5 by default)."},
        },
        "required": ["urls"],
    }

    def __init__(self, owner: WebToolset) -> None:
        self.owner = owner

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        urls = args.get("urls")
        if isinstance(urls, str):  # a lone URL is an easy mistake to forgive
            urls = [urls]
        if not isinstance(urls, list) or not urls or not all(isinstance(u, str) and u.strip() for u in urls):
            return error("urls must be a non-empty list of URL strings")
        limit = self.owner.settings.max_urls
        if len(urls) > limit:
            return error(f"at most {limit} URLs per call; got {len(urls)}")
        async with asyncio.TaskGroup() as tg:
            tasks = [tg.create_task(self._one(url)) for url in urls]
        pages = [t.result().as_dict() for t in tasks]
        if all(p["error"] for p in pages):
            return error("; ".join(str(p["error"]) for p in pages), results=pages)
        return ok(results=pages)

    async def _one(self, url: str) -> Page:
        settings = self.owner.settings
        try:
            assert self.owner.fetch_http is not None
            fetched = await fetch.fetch(self.owner.fetch_http, url, max_bytes=settings.max_bytes,
                                             timeout=settings.timeout)
        except fetch.FetchError as e:
            return Page(url=url.strip(), error=str(e))
        # Markdown conversion of a 2 MB page or a long PDF takes real CPU: keep the event loop free.
        return await asyncio.to_thread(extract, fetched, settings.max_chars)


async def build(run: ToolSettings, environ: Mapping[str, str] | None = None) -> WebToolset | Unavailable:
    """The web toolset when a search provider is configured, else Unavailable saying how to add one."""
    settings = run.sections.web
    provider = choose_provider(settings, os.environ if environ is None else environ)
    if isinstance(provider, str):
        return Unavailable("web", provider)
    # Under --sandbox_network none model-chosen URLs are not fetched at all: no web_extract policy.
    return WebToolset(settings, provider, policy_for(run) if run.fetch_model_urls else None)

