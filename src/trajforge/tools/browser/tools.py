"""The ten `browser` tools (docs/user-guide.md, "Toolsets and distributions"), each a thin action on the sample's current page.

Every call runs under the sample's session lock and an overall deadline, on top of Playwright's
own navigation/action timeouts (page scripts can hang `evaluate`). The tools' own scripts run in
an isolated world of the page (BrowserSession.evaluate), so their caps hold in the page whatever
its scripts redefine; the console the page logged is drained before and after every action. Whatever the model can
correct (a bad URL, a refused connection, a stale ref, an unknown key) comes back as an error
result; only a dead Chromium raises ToolInfraError, which fails the sample.
"""

from __future__ import annotations

import asyncio
from abc import abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar

from playwright.async_api import Error as PlaywrightError

from trajforge.tools.tool import Tool, ToolContext, error, ok
from trajforge.tools.browser.images import IMAGES_JS, capped_images
from trajforge.tools.browser.snapshot import normalize_ref, ref_locator, take_snapshot

if TYPE_CHECKING:
    from playwright.async_api import Locator, Page

    from trajforge.tools.browser.session import BrowserBackend, BrowserSession

_NO_ARGS: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}
_TITLE_CHARS, _URL_CHARS = 500, 2000  # a page may set either to megabytes
_REF = {"type": "string", "description": "element ref from the latest browser_snapshot, e.g. e12"}
_TITLE_JS = f"() => String(document.title).slice(0, {_TITLE_CHARS})"
_IS_SELECT_JS = """(ref) => {
  const e = document.querySelector('[data-tf-ref="' + ref + '"]');
  return !!e && e.tagName === 'SELECT';
}"""
_SCROLL_JS = """(dir) => {
  window.scrollBy(0, (dir === 'up' ? -0.8 : 0.8) * window.innerHeight);
  const h = document.documentElement.scrollHeight;
  return {scroll_y: Math.round(window.scrollY), page_height: h, viewport_height: window.innerHeight,
          at_top: window.scrollY <= 0, at_bottom: window.scrollY + window.innerHeight >= h - 1};
}"""


def _message(e: PlaywrightError) -> str:
    """Playwright's first lines, without the multi-line call log it appends."""
    text = (e.message or str(e)).split("\nCall log:")[0].strip()
    return text[:600]


class BrowserTool(Tool):
    toolset: ClassVar[str] = "browser"

    def __init__(self, backend: BrowserBackend) -> None:
        self.backend = backend

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        session = self.backend.session(ctx)
        s = self.backend.settings
        async with session.use() as page:  # waiting for a free context slot is not the call's time
            try:
                async with asyncio.timeout(s.navigation_timeout + s.action_timeout):
                    await session.drain_console()  # before the action may leave the page
                    try:
                        return await self.act(page, args, session, ctx)
                    finally:
                        await session.drain_console()  # the page it is on now (maybe a new tab)
            except TimeoutError:
                return error(f"{self.name} timed out; the page may be busy or hung")
            except PlaywrightError as e:
                self.backend.check_alive()
                return error(_message(e))

    @abstractmethod
    async def act(self, page: Page, args: dict[str, Any], session: BrowserSession, ctx: ToolContext) -> str:
        """Do the action on the sample's page; return the result JSON."""

    async def _settle(self, page: Page) -> None:
        """After an action that may navigate: wait (bounded) until the new document is parsed."""
        try:
            await page.wait_for_load_state("domcontentloaded",
                                           timeout=self.backend.settings.navigation_timeout * 1000)
        except PlaywrightError:
            pass  # a slow page is still usable; the model sees whatever has loaded

    async def _locate(self, page: Page, raw_ref: Any) -> Locator | str:
        """The element for a ref, or an error result telling the model to take a new snapshot."""
        ref = normalize_ref(raw_ref)
        if ref is None:
            return error(f"invalid ref {raw_ref!r}: use a ref such as 'e12' from browser_snapshot")
        loc = ref_locator(page, ref)
        if await loc.count() == 0:
            return error(f"no element with ref {ref} on the current page (it changed or navigated): "
                         "call browser_snapshot for fresh refs")
        return loc.first

    @staticmethod
    async def _where(page: Page, session: BrowserSession) -> dict[str, Any]:
        try:  # cut in the page: a page may set its title to megabytes
            title = await session.evaluate(page, _TITLE_JS)
        except PlaywrightError:  # a navigation started by the action replaced the document meanwhile
            title = ""
        title = title[:_TITLE_CHARS] if isinstance(title, str) else ""
        return {"url": page.url[:_URL_CHARS], "title": title}


class NavigateTool(BrowserTool):
    name = "browser_navigate"
    description = ("Open a URL in the browser. Then call browser_snapshot to read the page and get "
                   "element refs.")
    parameters = {"type": "object", "properties": {"url": {"type": "string", "description": "http(s) URL"}},
                  "required": ["url"], "additionalProperties": False}

    async def act(self, page: Page, args: dict[str, Any], session: BrowserSession, ctx: ToolContext) -> str:
        url = str(args.get("url", "")).strip()
        if not url:
            return error("url is empty")
        if "://" not in url:
            url = "https://" + url
        if not url.lower().startswith(("http://", "https://")):
            return error(f"only http and https URLs can be opened, not {url.split(':', 1)[0]!r}")
        if self.backend.policy is not None:  # a clear answer first; the egress proxy enforces it anyway
            from trajforge.tools.web.egress import precheck_url

            if (refused := await precheck_url(url, self.backend.policy)) is not None:
                return error(f"navigation to {url} refused: {refused}")
        try:
            response = await page.goto(url, wait_until="domcontentloaded")
        except PlaywrightError as e:
            self.backend.check_alive()
            return error(f"navigation to {url} failed: {_message(e)}")
        status = response.status if response is not None else None
        if response is not None and response.headers.get("x-trajforge-egress"):  # the egress proxy's own answer
            return error(f"navigation to {url} failed: {await response.text()}")
        return ok(**await self._where(page, session), status=status)


class SnapshotTool(BrowserTool):
    name = "browser_snapshot"
    description = ("Text outline of the current page: headings, text, links, buttons and form fields, "
                   "each actionable element with a ref like [ref=e12] for browser_click/browser_type.")
    parameters = _NO_ARGS

    async def act(self, page: Page, args: dict[str, Any], session: BrowserSession, ctx: ToolContext) -> str:
        snap = await take_snapshot(lambda script, arg: session.evaluate(page, script, arg), start_ref=session.next_ref,
                                   max_chars=self.backend.settings.snapshot_max_chars)
        session.next_ref = snap.next_ref
        text = snap.text or "(the page shows no visible content)"
        if snap.truncated:
            text += "\n[snapshot truncated: scroll or follow links to see the rest]"
        return ok(**await self._where(page, session), snapshot=text)


class ClickTool(BrowserTool):
    name = "browser_click"
    description = "Click the element with the given ref (from browser_snapshot)."
    parameters = {"type": "object", "properties": {"ref": _REF}, "required": ["ref"],
                  "additionalProperties": False}

    async def act(self, page: Page, args: dict[str, Any], session: BrowserSession, ctx: ToolContext) -> str:
        loc = await self._locate(page, args.get("ref"))
        if isinstance(loc, str):
            return loc
        await loc.click()
        page = await session.current_page()  # the click may have opened a new tab
        await self._settle(page)
        return ok(**await self._where(page, session))


class TypeTool(BrowserTool):
    name = "browser_type"
    description = ("Replace the text of an input field (ref from browser_snapshot) with `text`; for a "
                   "select box, choose the option with that label. submit=true presses Enter afterwards.")
    parameters = {"type": "object", "properties": {
        "ref": _REF, "text": {"type": "string"},
        "submit": {"type": "boolean", "description": "press Enter after typing", "default": False}},
        "required": ["ref", "text"], "additionalProperties": False}

    async def act(self, page: Page, args: dict[str, Any], session: BrowserSession, ctx: ToolContext) -> str:
        loc = await self._locate(page, args.get("ref"))
        if isinstance(loc, str):
            return loc
        text = str(args.get("text", ""))
        if await session.evaluate(page, _IS_SELECT_JS, normalize_ref(args.get("ref"))) is True:
            try:
                await loc.select_option(label=text)
            except PlaywrightError:
                await loc.select_option(value=text)
        else:
            await loc.fill(text)
        if args.get("submit"):
            await loc.press("Enter")
            await self._settle(page)
        return ok(**await self._where(page, session), typed=text, submitted=bool(args.get("submit")))


class ScrollTool(BrowserTool):
    name = "browser_scroll"
    description = "Scroll the page up or down by most of a screen."
    parameters = {"type": "object", "properties": {"direction": {"type": "string", "enum": ["up", "down"]}},
                  "required": ["direction"], "additionalProperties": False}

    async def act(self, page: Page, args: dict[str, Any], session: BrowserSession, ctx: ToolContext) -> str:
        direction = args.get("direction")
        if direction not in ("up", "down"):
            return error(f"direction must be 'up' or 'down', not {direction!r}")
        where = await session.evaluate(page, _SCROLL_JS, direction)
        return ok(direction=direction, **(where if isinstance(where, dict) else {}))


class BackTool(BrowserTool):
    name = "browser_back"
    description = "Go back to the previous page in the browser history."
    parameters = _NO_ARGS

    async def act(self, page: Page, args: dict[str, Any], session: BrowserSession, ctx: ToolContext) -> str:
        before = page.url
        if await page.go_back(wait_until="domcontentloaded") is None and page.url == before:
            return error("there is no previous page in this tab's history")
        return ok(**await self._where(page, session))


class PressTool(BrowserTool):
    name = "browser_press"
    description = ("Press a key in the page, e.g. Enter, Tab, Escape, ArrowDown, PageDown, Control+A "
                   "(goes to the focused element).")
    parameters = {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"],
                  "additionalProperties": False}

    async def act(self, page: Page, args: dict[str, Any], session: BrowserSession, ctx: ToolContext) -> str:
        key = str(args.get("key", "")).strip()
        if not key:
            return error("key is empty")
        await page.keyboard.press(key)
        await self._settle(page)
        return ok(**await self._where(page, session), key=key)


class GetImagesTool(BrowserTool):
    name = "browser_get_images"
    description = "List the images on the current page (src URL, alt text, pixel size)."
    parameters = _NO_ARGS

    async def act(self, page: Page, args: dict[str, Any], session: BrowserSession, ctx: ToolContext) -> str:
        max_chars = self.backend.settings.snapshot_max_chars  # the same cap as a browser_snapshot result
        images, total = capped_images(await session.evaluate(page, IMAGES_JS, max_chars), max_chars)
        more = {"truncated": True, "total": total} if total > len(images) else {}
        return ok(**await self._where(page, session), count=len(images), images=images, **more)


class ConsoleTool(BrowserTool):
    name = "browser_console"
    description = "Console messages and uncaught JavaScript errors collected from this session's pages."
    parameters = _NO_ARGS

    async def act(self, page: Page, args: dict[str, Any], session: BrowserSession, ctx: ToolContext) -> str:
        return ok(messages=list(session.console), errors=list(session.errors))


class VisionTool(BrowserTool):
    name = "browser_vision"
    description = ("Take a screenshot of the visible part of the page and ask a vision model a question "
                   "about it (layout, charts, images, CAPTCHAs, anything the text snapshot misses).")
    parameters = {"type": "object", "properties": {"question": {"type": "string"}}, "required": ["question"],
                  "additionalProperties": False}

    async def act(self, page: Page, args: dict[str, Any], session: BrowserSession, ctx: ToolContext) -> str:
        from trajforge.tools.browser.vision import ask_about_screenshot

        question = str(args.get("question", "")).strip() or "Describe this web page."
        png = await page.screenshot(type="png")
        return await ask_about_screenshot(png, question, ctx)


def make_tools(backend: BrowserBackend) -> list[Tool]:
    return [cls(backend) for cls in (NavigateTool, SnapshotTool, ClickTool, TypeTool, ScrollTool, BackTool,
                                     PressTool, GetImagesTool, VisionTool, ConsoleTool)]
