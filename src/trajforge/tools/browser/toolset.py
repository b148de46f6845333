"""The `browser` toolset: Playwright driving the system's Chromium, one Chromium per run.

build() finds a Chromium executable (Debian's `chromium` by default; nothing ever downloads a
browser), starts Playwright's driver and launches Chromium headless, and returns the toolset;
when Chromium is missing it returns Unavailable with the reason, so the toolset is simply not
offered (so is it without Playwright, its spec's `needs`). Playwright is imported inside build()
so importing this module stays cheap.
The per-sample contexts live in session.py, the tools in tools.py.
Chromium reaches the network only through the run's egress proxy (tools/web/egress_proxy.py), so
every request of every page is checked by the egress policy; WebRTC may not bypass it either.
With `--sandbox_network none` the toolset is not offered (it would fetch model-chosen URLs).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from trajforge.tools.tool import Toolset, Unavailable

if TYPE_CHECKING:
    from trajforge.catalog.tools_config import BrowserSettings
    from trajforge.tools.browser.session import BrowserBackend
    from trajforge.tools.web.egress_proxy import EgressProxy
    from trajforge.tools.tool_settings import ToolSettings

NAME = "browser"
CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
# Headless, as root, without GPU; the background-networking flags stop Chromium from calling
# home (updates, sync, safe browsing), which on a closed network means endless failing retries.
LAUNCH_ARGS = ("--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               "--disable-dev-shm-usage")
NOT_FOUND = "install Debian's chromium or set tools.browser.executable_path"


class BrowserToolset(Toolset):
    """The ten browser tools plus the run's Chromium, which aclose() shuts down."""

    def __init__(self, backend: BrowserBackend, proxy: EgressProxy | None = None) -> None:
        from trajforge.tools.browser.tools import make_tools

        super().__init__(NAME, make_tools(backend))
        self.backend = backend
        self.proxy = proxy

    async def aclose(self) -> None:
        try:
            await self.backend.aclose()
        finally:
            if self.proxy is not None:
                await self.proxy.aclose()


def find_chromium(settings: BrowserSettings) -> Path | None:
    """The configured executable if it exists, else the first known Chromium name on PATH."""
    if settings.executable_path is not None:
        path = settings.executable_path.expanduser()
        return path if path.is_file() and os.access(path, os.X_OK) else None
    for name in CANDIDATES:
        found = shutil.which(name)
        if found:
            return Path(found)
    return None


async def build(run: ToolSettings) -> BrowserToolset | Unavailable:
    settings = run.sections.browser
    if not run.fetch_model_urls:
        return Unavailable(NAME, "--sandbox_network none: the browser would fetch model-chosen URLs")
    executable = find_chromium(settings)
    if executable is None:
        where = f" at {settings.executable_path}" if settings.executable_path else ""
        return Unavailable(NAME, f"Chromium not found{where}: {NOT_FOUND}")
    # Playwright is the spec's `needs` (trajforge.catalog), checked before this module loads.
    from playwright.async_api import Error as PlaywrightError
    from playwright.async_api import async_playwright

    from trajforge.tools.browser.session import BrowserBackend
    from trajforge.tools.web.egress import policy_for
    from trajforge.tools.web.egress_proxy import EgressProxy

    proxy = EgressProxy(policy_for(run))
    proxy_url = await proxy.start()
    playwright = await async_playwright().start()
    try:
        browser = await playwright.chromium.launch(
            executable_path=str(executable), headless=settings.headless,
            # The user's extra_args come first: ours, later on the line, win on a conflict.
            args=[*settings.extra_args, *LAUNCH_ARGS, *proxy_args(proxy_url)],
            timeout=settings.navigation_timeout * 1000,
        )
    except PlaywrightError as e:
        await playwright.stop()
        await proxy.aclose()
        first = (e.message or str(e)).split("\n")[0]
        return Unavailable(NAME, f"Chromium at {executable} failed to start: {first}")
    except BaseException:
        await playwright.stop()
        await proxy.aclose()
        raise
    backend = BrowserBackend(playwright, browser, settings)
    backend.policy = proxy.policy
    return BrowserToolset(backend, proxy)


def proxy_args(proxy_url: str) -> list[str]:
    """Every request through the egress proxy: loopback too (`<-loopback>` drops Chromium's
    implicit bypass), and WebRTC only over the proxy (no direct UDP)."""
    return [f"--proxy-server={proxy_url}", "--proxy-bypass-list=<-loopback>",
            "--force-webrtc-ip-handling-policy=disable_non_proxied_udp",
            "--webrtc-ip-handling-policy=disable_non_proxied_udp"]
