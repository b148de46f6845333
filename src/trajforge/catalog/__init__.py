"""What the run can be configured with, declared where config reads it without importing tools.

A leaf, like trajforge.config that reads it: it imports nothing of trajforge but itself.
- TOOLSETS: one ToolsetSpec per toolset (its name, its tools, its builder, its settings section);
  the lists of toolset names and tools are derived from it (toolset_names, TOOLSET_TOOLS, KNOWN_TOOLS).
- catalog.settings: the typed `tools:` sections; catalog.distributions: the named distributions
  and the seeded sampler.

Adding a toolset is one module in trajforge/tools exposing `build(settings) -> Toolset | Unavailable`
plus one `register(ToolsetSpec(...))` line below (and, if it has settings, its section class in
catalog.settings).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ToolsetSpec:
    name: str
    tools: tuple[str, ...]  # the tool names it offers, in the order the model sees them
    builder: str  # "module:function", called once per process as `await function(tool_settings)`
    settings: str | None = None  # its section of the config's `tools:` (catalog.settings.ToolsSettings)


TOOLSETS: dict[str, ToolsetSpec] = {}


def register(spec: ToolsetSpec) -> ToolsetSpec:
    """Declare a toolset (tests declare their own the same way, then remove it)."""
    TOOLSETS[spec.name] = spec
    return spec


def toolset_names() -> tuple[str, ...]:
    """Every declared toolset, in the SPEC's listing order (registration order)."""
    return tuple(TOOLSETS)


register(ToolsetSpec("web", ("web_search", "web_extract"), "trajforge.tools.web:build", "web"))
register(ToolsetSpec("vision", ("vision_analyze",), "trajforge.tools.vision:build", "vision"))
register(ToolsetSpec("image_gen", ("image_generate",), "trajforge.tools.image_gen:build", "image_gen"))
register(ToolsetSpec("terminal", ("terminal", "process"), "trajforge.tools.terminal:build"))
register(ToolsetSpec("file", ("read_file", "write_file", "patch", "search_files"), "trajforge.tools.files:build"))
register(ToolsetSpec("moa", ("mixture_of_agents",), "trajforge.tools.moa:build", "moa"))
register(ToolsetSpec("browser", ("browser_navigate", "browser_snapshot", "browser_click", "browser_type",
                                 "browser_scroll", "browser_back", "browser_press", "browser_get_images",
                                 "browser_vision", "browser_console"), "trajforge.tools.browser:build", "browser"))

# The built-in toolsets' tools, in the fixed order of every trajectory's tool_stats (SPEC section 4):
# a record's schema does not change with what a run or a test registers later.
_STATS_ORDER = ("terminal", "file", "web", "browser", "vision", "image_gen", "moa")
TOOLSET_TOOLS: dict[str, tuple[str, ...]] = {name: TOOLSETS[name].tools for name in _STATS_ORDER}
KNOWN_TOOLS: tuple[str, ...] = tuple(t for tools in TOOLSET_TOOLS.values() for t in tools)


def known_tools() -> tuple[str, ...]:
    """KNOWN_TOOLS, then the tools of toolsets registered beyond the built-in ones (a plugin's)."""
    extra = tuple(t for name, spec in TOOLSETS.items() if name not in TOOLSET_TOOLS for t in spec.tools)
    return KNOWN_TOOLS + extra if extra else KNOWN_TOOLS


_KNOWN_SET: list[tuple[tuple[str, ...], frozenset[str]]] = [(KNOWN_TOOLS, frozenset(KNOWN_TOOLS))]


def known_tool_set() -> frozenset[str]:
    """known_tools() as a set for per-record lookups (the merge checks every record of a run)."""
    tools = known_tools()
    if tools is not _KNOWN_SET[0][0]:
        _KNOWN_SET[0] = (tools, frozenset(tools))
    return _KNOWN_SET[0][1]
