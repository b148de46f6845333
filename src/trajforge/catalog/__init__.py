"""What the run can be configured with, declared where config reads it without importing tools.

A leaf, like trajforge.config that reads it: of trajforge it imports only the registry shape
(trajforge.registry) and its own modules.
- TOOLSETS: one spec per toolset (its name, its builder, its settings section, and as
  capabilities its tools and the settings that name its API keys' variables); the lists of
  toolset names and tools are derived from it (toolset_names, TOOLSET_TOOLS, KNOWN_TOOLS).
- catalog.sandboxes: the sandbox backends and the network modes; catalog.executors: where
  samples run; catalog.tools_config: the typed `tools:` sections; catalog.distributions: the named
  distributions and the seeded draw of a sample's toolsets.

Adding a toolset is one module in trajforge/tools exposing `build(settings) -> Toolset | Unavailable`
plus one `register(toolset(...))` line below (and, if it has settings, its section class in
catalog.tools_config).
"""

from __future__ import annotations

from dataclasses import dataclass

from trajforge.registry import Registry, Spec


@dataclass(frozen=True, slots=True)
class ToolsetCaps:
    tools: tuple[str, ...]  # the tool names it offers, in the order the model sees them
    # Fields of its settings section that name an environment variable holding an API key: the
    # run's secret scrubber (trajforge.redact) reads those variables' values as secrets.
    key_settings: tuple[str, ...] = ()


ToolsetSpec = Spec[ToolsetCaps]
TOOLSETS: Registry[ToolsetCaps] = Registry("toolset", ToolsetCaps)


def toolset(name: str, tools: tuple[str, ...], builder: str, settings: str | None = None, *,
            key_settings: tuple[str, ...] = (), needs: tuple[str, ...] = (), extra: str | None = None) -> ToolsetSpec:
    """A toolset's spec. `builder`: "module:function", called once per process as
    `await function(tool_settings)`; `settings`: its section of the config's `tools:`; `needs`,
    `extra`: the modules it needs beyond the base install and the pip extra that brings them."""
    return Spec(name, builder, capabilities=ToolsetCaps(tools, key_settings), settings=settings, needs=needs,
                extra=extra)


def register(spec: ToolsetSpec) -> ToolsetSpec:
    """Declare a toolset (tests declare their own the same way, then remove it)."""
    return TOOLSETS.register(spec)


def toolset_names() -> tuple[str, ...]:
    """Every declared toolset, in registration order (the order --list_distributions and the user guide list them)."""
    return TOOLSETS.names()


register(toolset("web", ("web_search", "web_extract"), "trajforge.tools.web.toolset:build", "web",
                 key_settings=("brave_api_key_env", "tavily_api_key_env")))
register(toolset("vision", ("vision_analyze",), "trajforge.tools.vision:build", "vision",
                 key_settings=("api_key_env",)))
register(toolset("image_gen", ("image_generate",), "trajforge.tools.image_gen:build", "image_gen",
                 key_settings=("api_key_env",)))
register(toolset("terminal", ("terminal", "process"), "trajforge.tools.terminal:build"))
register(toolset("file", ("read_file", "write_file", "patch", "search_files"), "trajforge.tools.files:build"))
register(toolset("moa", ("mixture_of_agents",), "trajforge.tools.moa:build", "moa", key_settings=("api_key_env",)))
register(toolset("browser", ("browser_navigate", "browser_snapshot", "browser_click", "browser_type",
                             "browser_scroll", "browser_back", "browser_press", "browser_get_images",
                             "browser_vision", "browser_console"), "trajforge.tools.browser.toolset:build", "browser",
                 needs=("playwright",), extra="browser"))

# The built-in toolsets' tools, in the fixed order of every trajectory's tool_stats (docs/user-guide.md, "Output"):
# a record's schema does not change with what a run or a test registers later.
_STATS_ORDER = ("terminal", "file", "web", "browser", "vision", "image_gen", "moa")
TOOLSET_TOOLS: dict[str, tuple[str, ...]] = {name: TOOLSETS[name].capabilities.tools for name in _STATS_ORDER}
KNOWN_TOOLS: tuple[str, ...] = tuple(t for tools in TOOLSET_TOOLS.values() for t in tools)


def known_tools() -> tuple[str, ...]:
    """KNOWN_TOOLS, then the tools of toolsets registered beyond the built-in ones (a plugin's)."""
    extra = tuple(t for spec in TOOLSETS.specs() if spec.name not in TOOLSET_TOOLS for t in spec.capabilities.tools)
    return KNOWN_TOOLS + extra if extra else KNOWN_TOOLS


_KNOWN_SET: list[tuple[tuple[str, ...], frozenset[str]]] = [(KNOWN_TOOLS, frozenset(KNOWN_TOOLS))]


def known_tool_set() -> frozenset[str]:
    """known_tools() as a set for per-record lookups (the merge checks every record of a run)."""
    tools = known_tools()
    if tools is not _KNOWN_SET[0][0]:
        _KNOWN_SET[0] = (tools, frozenset(tools))
    return _KNOWN_SET[0][1]
