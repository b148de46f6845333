"""Building the toolsets of a run from their declarations (trajforge.catalog.TOOLSETS).

Each toolset lives in its own module exposing `build(settings) -> Toolset | Unavailable`, where
settings is the run's ToolSettings (tools/tool_settings.py); modules are imported only when a run
samples their toolset, so heavy backends (Playwright) cost nothing otherwise. KNOWN_TOOLS is
fixed (the built-in toolsets' tools, in one order) so every trajectory has the same stats schema.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trajforge.catalog import KNOWN_TOOLS, TOOLSET_TOOLS, TOOLSETS
from trajforge.registry import NotInstalled
from trajforge.tools.tool import Tool, Toolset, Unavailable

if TYPE_CHECKING:
    from trajforge.tools.tool_settings import ToolSettings

__all__ = ["KNOWN_TOOLS", "TOOLSET_TOOLS", "build_toolsets", "tools_for"]


async def build_toolsets(names: list[str], settings: ToolSettings) -> tuple[dict[str, Toolset], list[Unavailable]]:
    """Build each named toolset once per run; report the ones that cannot be offered and why."""
    ready: dict[str, Toolset] = {}
    missing: list[Unavailable] = []
    for name in names:
        try:
            build = TOOLSETS[name].load()
        except NotInstalled as e:  # an optional extra of this toolset is not installed
            missing.append(Unavailable(name, str(e)))
            continue
        built = await build(settings)
        if isinstance(built, Unavailable):
            missing.append(built)
        else:
            ready[name] = built
    return ready, missing


def tools_for(toolsets: list[str], ready: dict[str, Toolset]) -> list[Tool]:
    """The tools offered to one sample: those of its sampled toolsets that are available."""
    return [tool for ts in toolsets if ts in ready for tool in ready[ts].tools]
