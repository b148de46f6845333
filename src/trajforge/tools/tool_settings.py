"""The tools layer's section of the run's configuration, and ToolSettings, all the tools know of the run.

ToolSection declares the tools' flags and --config keys (`tool_timeout`, and `tools:`, one typed
section per toolset: trajforge.catalog.tools_config); trajforge.config collects it into RunConfig.
`tool_settings()` builds one ToolSettings per process from it and what the tools need of the other
layers' sections (the run's model, its network), which goes to every toolset's `build`
(tools/toolsets.py) and, through ToolContext, to every tool call. Tools never see RunConfig
(tests/test_architecture.py forbids trajforge.tools importing trajforge.config).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from trajforge.catalog.tools_config import ToolsConfig
from trajforge.fields import FILE_ONLY

if TYPE_CHECKING:
    from trajforge.model.types import ModelSettings


class ToolSection(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tool_timeout: float = Field(120.0, gt=0, description="seconds per terminal command")
    tools: ToolsConfig = Field(default_factory=ToolsConfig, json_schema_extra=FILE_ONLY)

    def tool_settings(self, model: ModelSettings, network_allow: tuple[str, ...],
                      fetch_model_urls: bool) -> ToolSettings:
        """What the toolsets and their tools read, with the run's model settings and network."""
        return ToolSettings(sections=self.tools, model=model, network_allow=network_allow,
                            fetch_model_urls=fetch_model_urls, tool_timeout=self.tool_timeout)


@dataclass(frozen=True, slots=True)
class ToolSettings:
    """The run's settings that tools read, and nothing else.

    - sections: the config's `tools:` sections, one per toolset (catalog.tools_config.ToolsConfig).
    - model: the run's model settings, the defaults of the tools' own model endpoints
      (tools/aux_models.py: model, base_url, the explicit --api_key, retries, provider routing).
    - network_allow: `network.allow`, the exceptions of the egress policy (tools/web/egress.py).
    - fetch_model_urls: False under --sandbox_network none; then no tool fetches a URL the model
      chose (web_extract, vision URLs, the browser are not offered).
    - tool_timeout: seconds one terminal command may run (--tool_timeout).
    """

    sections: ToolsConfig
    model: ModelSettings
    network_allow: tuple[str, ...]
    fetch_model_urls: bool
    tool_timeout: float
