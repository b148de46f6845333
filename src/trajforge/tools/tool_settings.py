"""ToolSettings: all the tools layer knows of the run, handed down by the sample layer.

Tools never see RunConfig (tests/test_architecture.py forbids trajforge.tools importing
trajforge.config): trajforge.sample.lower_settings.tool_settings builds one ToolSettings from it per
process, which goes to every toolset's `build` (tools/toolsets.py) and, through ToolContext, to
every tool call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trajforge.catalog.tools_config import ToolsConfig
    from trajforge.model.types import ModelSettings


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
