"""Which tools exist, which toolset each belongs to, and building the toolsets of a run.

Each toolset lives in its own module exposing `build(config) -> Toolset | Unavailable`; modules
are imported only when a run samples their toolset, so heavy backends (Playwright) cost nothing
otherwise. KNOWN_TOOLS is fixed (SPEC section 4) so every trajectory has the same stats schema.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from trajforge.tools.base import Tool, Toolset, Unavailable

if TYPE_CHECKING:
    from trajforge.config import RunConfig

TOOLSET_TOOLS: dict[str, tuple[str, ...]] = {
    "terminal": ("terminal", "process"),
    "file": ("read_file", "write_file", "patch", "search_files"),
    "web": ("web_search", "web_extract"),
    "browser": ("browser_navigate", "browser_snapshot", "browser_click", "browser_type",
                "browser_scroll", "browser_back", "browser_press", "browser_get_images",
                "browser_vision", "browser_console"),
    "vision": ("vision_analyze",),
    "image_gen": ("image_generate",),
    "moa": ("mixture_of_agents",),
}
KNOWN_TOOLS: tuple[str, ...] = tuple(t for tools in TOOLSET_TOOLS.values() for t in tools)

_MODULES = {
    "terminal": "trajforge.tools.terminal",
    "file": "trajforge.tools.files",
    "web": "trajforge.tools.web",
    "browser": "trajforge.tools.browser",
    "vision": "trajforge.tools.vision",
    "image_gen": "trajforge.tools.image_gen",
    "moa": "trajforge.tools.moa",
}


async def build_toolsets(names: list[str], config: RunConfig) -> tuple[dict[str, Toolset], list[Unavailable]]:
    """Build each named toolset once per run; report the ones that cannot be offered and why."""
    ready: dict[str, Toolset] = {}
    missing: list[Unavailable] = []
    for name in names:
        try:
            module = importlib.import_module(_MODULES[name])
        except ModuleNotFoundError as e:
            if e.name != _MODULES[name]:
                missing.append(Unavailable(name, f"backend not installed ({e.name})"))
            else:
                missing.append(Unavailable(name, "not implemented yet"))
            continue
        built = await module.build(config)
        if isinstance(built, Unavailable):
            missing.append(built)
        else:
            ready[name] = built
    return ready, missing


def tools_for(toolsets: list[str], ready: dict[str, Toolset]) -> list[Tool]:
    """The tools offered to one sample: those of its sampled toolsets that are available."""
    return [tool for ts in toolsets if ts in ready for tool in ready[ts].tools]
