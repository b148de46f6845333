"""The run's Chromium and each sample's private browser context.

One Chromium process serves the whole run (BrowserBackend, started by toolset.py's build()
and closed by the toolset's aclose()). Each sample gets its own BrowserContext (cookies,
storage, cache) and page, created lazily on the sample's first browser tool call, kept in
`ctx.state["browser"]` and closed by the sample's cleanup stack, so no two samples ever share
state. A semaphore bounds how many contexts are open at once; one lock per sample serialises
its browser calls because they all drive the same page.

The page is not trusted: its scripts can redefine anything in their JavaScript world, and
whatever a tool script returns is carried to this process whole before Python could cut it. So
the tools' scripts run in an isolated world of the page's main frame (`evaluate`: CDP
Page.createIsolatedWorld, the same DOM with untouched built-ins), where their caps hold, and the
console is collected and capped inside the page (console.py). What still reaches this
process from a page uncut is Playwright's own traffic: each navigation's URL (at most 2 MB in
Chromium; cut to 1,000 characters here) and uncaught exceptions (`pageerror`, which the driver
always sends).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from playwright.async_api import Error as PlaywrightError

from trajforge.jsonio import dumps_str
from trajforge.tools.browser import console
from trajforge.tools.tool import ToolContext, ToolInfraError

if TYPE_CHECKING:
    from playwright.async_api import Browser, BrowserContext, CDPSession, Page, Playwright

    from trajforge.catalog.tools_config import BrowserSettings
    from trajforge.netpolicy import Policy

STATE_KEY = "browser"
_CONSOLE_CAP = console.KEEP  # per sample; older messages are dropped first
_TEXT_CAP = console.TEXT_CHARS  # an error's text and its page's URL (which a page can make megabytes long)
_ERROR_CHARS = 2000  # of a failed script's message


class BrowserBackend:
    """The run-level Playwright driver and Chromium process shared by every sample."""

    def __init__(self, playwright: Playwright, browser: Browser, settings: BrowserSettings) -> None:
        self.playwright = playwright
        self.browser = browser
        self.settings = settings
        self.slots = asyncio.Semaphore(settings.max_contexts)
        self.policy: Policy | None = None  # the egress policy its proxy enforces (toolset.py)

    def session(self, ctx: ToolContext) -> BrowserSession:
        """This sample's session, registered for cleanup the first time it is asked for."""
        session = ctx.state.get(STATE_KEY)
        if session is None:
            session = BrowserSession(self)
            ctx.state[STATE_KEY] = session
            ctx.cleanup.push_async_callback(session.close)
        return session

    def check_alive(self) -> None:
        if not self.browser.is_connected():
            raise ToolInfraError("the shared Chromium process is gone (crashed or closed)")

    async def aclose(self) -> None:
        with contextlib.suppress(PlaywrightError):
            await self.browser.close()
        with contextlib.suppress(PlaywrightError):
            await self.playwright.stop()


class BrowserSession:
    """One sample's browser context, its current page, console log and ref counter."""

    def __init__(self, backend: BrowserBackend) -> None:
        self.backend = backend
        self.next_ref = 1
        self.console: deque[dict[str, Any]] = deque(maxlen=_CONSOLE_CAP)
        self.errors: deque[dict[str, Any]] = deque(maxlen=_CONSOLE_CAP)
        self.context: BrowserContext | None = None
        self._page: Page | None = None
        self._cdp: dict[Page, CDPSession] = {}
        self._lock = asyncio.Lock()
        self._holds_slot = False
        self.closed = False

    @contextlib.asynccontextmanager
    async def use(self) -> AsyncIterator[Page]:
        """Exclusive use of this sample's current page, opening the context on first use."""
        async with self._lock:
            if self.closed:
                raise ToolInfraError("browser tool called after the sample's browser was closed")
            self.backend.check_alive()
            if self.context is None:
                await self._open()
            yield await self.current_page()

    async def _open(self) -> None:
        s = self.backend.settings
        await self.backend.slots.acquire()
        self._holds_slot = True
        try:
            self.context = await self.backend.browser.new_context(
                viewport={"width": s.viewport_width, "height": s.viewport_height},
                accept_downloads=False, service_workers="block",
            )
        except PlaywrightError as e:
            self._release_slot()
            raise ToolInfraError(f"could not open a browser context: {e.message}") from e
        await self.context.add_init_script(script=console.CONSOLE_JS)
        self.context.set_default_timeout(s.action_timeout * 1000)
        self.context.set_default_navigation_timeout(s.navigation_timeout * 1000)
        # Pages opened by the site (target=_blank, window.open) become the current page.
        self.context.on("page", self._adopt)

    async def current_page(self) -> Page:
        """The page the model is on: the newest open one (a site may open or close tabs)."""
        assert self.context is not None
        if self._page is None or self._page.is_closed():
            open_pages = [p for p in self.context.pages if not p.is_closed()]
            if open_pages:
                self._page = open_pages[-1]
            else:
                self._page = await self.context.new_page()  # fires "page", which adopts it
        return self._page

    def _adopt(self, page: Page) -> None:
        self._page = page
        # No "console" listener: Playwright would then carry every message whole (drain_console).
        page.on("pageerror", lambda err: self._on_error(page, err))
        page.on("close", lambda closed: self._cdp.pop(closed, None))

    async def _session(self, page: Page) -> CDPSession:
        cdp = self._cdp.get(page)
        if cdp is None:
            assert self.context is not None
            cdp = self._cdp[page] = await self.context.new_cdp_session(page)
        return cdp

    async def _evaluate(self, page: Page, expression: str, context_id: int | None = None) -> Any:
        # awaitPromise: a script may be async (browser_images waits for images still loading)
        params: dict[str, Any] = {"expression": expression, "returnByValue": True, "awaitPromise": True}
        if context_id is not None:
            params["contextId"] = context_id
        reply = await (await self._session(page)).send("Runtime.evaluate", params)
        if "exceptionDetails" in reply:
            details = reply["exceptionDetails"]
            text = (details.get("exception") or {}).get("description") or details.get("text") or "script failed"
            raise PlaywrightError(str(text)[:_ERROR_CHARS])
        return reply.get("result", {}).get("value")

    async def evaluate(self, page: Page, script: str, arg: Any = None) -> Any:
        """`script` (a JS function) called with `arg` in an isolated world of the page's main frame:
        the page's own scripts cannot change what it calls, so its caps hold before its result
        leaves the page."""
        cdp = await self._session(page)
        frame = (await cdp.send("Page.getFrameTree"))["frameTree"]["frame"]["id"]
        world = await cdp.send("Page.createIsolatedWorld", {"frameId": frame, "worldName": "trajforge"})
        return await self._evaluate(page, f"({script})({dumps_str(arg)})", world["executionContextId"])

    async def drain_console(self) -> None:
        """Move what the current page logged since the last drain into this sample's console log."""
        page = self._page
        if page is None or page.is_closed():
            return
        try:
            raw = await self._evaluate(page, console.READ_EXPRESSION)
        except PlaywrightError:  # the page navigated or closed meanwhile: its messages are gone
            return
        self.console.extend(console.parse(raw))

    def _on_error(self, page: Page, err: Exception) -> None:
        message = getattr(err, "message", None) or str(err)
        self.errors.append({"type": "exception", "text": message[:_TEXT_CAP], "url": page.url[:_TEXT_CAP]})

    def _release_slot(self) -> None:
        if self._holds_slot:
            self._holds_slot = False
            self.backend.slots.release()

    async def close(self) -> None:
        """End of the sample: drop the context (and with it every page and cookie). Idempotent."""
        self.closed = True
        context, self.context, self._page = self.context, None, None
        self._cdp.clear()
        try:
            if context is not None:
                with contextlib.suppress(PlaywrightError):
                    await context.close()
        finally:
            self._release_slot()
