"""The narrow settings the sample layer hands to the layers below it, built from RunConfig.

Layers below the sample (tools, model) never see RunConfig; each gets its own settings object,
built here once per process from the run's configuration.
"""

from __future__ import annotations

from trajforge.config import RunConfig
from trajforge.tools.settings import ToolSettings


def tool_settings(config: RunConfig) -> ToolSettings:
    """What the toolsets and their tools read of the run (tools/settings.py)."""
    return ToolSettings(sections=config.tools, model=config.model_settings(),
                        network_allow=tuple(config.network.allow),
                        fetch_model_urls=config.sandbox_network != "none", tool_timeout=config.tool_timeout)
