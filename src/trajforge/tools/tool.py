"""The Tool and Toolset interfaces, the per-sample ToolContext, and result helpers.

A Tool has a name, a description and a JSON-schema for its arguments, and an async `run` that
returns a result string (usually JSON). Anything the model can act on (bad arguments, a missing
file, a failed command) is returned as a result with an `error` field, never raised. A Tool
raises only for infrastructure failures (`ToolInfraError`), which fail the sample.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from trajforge.errors import SampleFailure
from trajforge.jsonio import dumps_str

if TYPE_CHECKING:
    from trajforge.sandbox.interface import Sandbox
    from trajforge.tools.tool_settings import ToolSettings


class ToolInfraError(SampleFailure):
    """The tool's backend broke (sandbox died, browser crashed): the sample fails as `sandbox`."""

    failure_class = "sandbox"


@dataclass
class ToolContext:
    """What a tool call may touch: this sample's sandbox and per-sample state, and the run's tool settings."""

    sandbox: Sandbox
    settings: ToolSettings
    sample_identity: str = ""
    # Per-sample state owned by toolsets (process table, browser page, ...), keyed by toolset name.
    state: dict[str, Any] = field(default_factory=dict)
    # Cleanups registered by tools; the agent session closes it when the sample ends.
    cleanup: contextlib.AsyncExitStack = field(default_factory=contextlib.AsyncExitStack)


class Tool(ABC):
    name: ClassVar[str]
    toolset: ClassVar[str]
    description: ClassVar[str]
    parameters: ClassVar[dict[str, Any]]  # JSON schema of the arguments object

    _schema_cache: dict[str, Any] | None = None

    def schema(self) -> dict[str, Any]:
        """The OpenAI `tools` entry, built once per tool object rather than per call."""
        if self._schema_cache is None:
            self._schema_cache = {
                "type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
            }
        return self._schema_cache

    @abstractmethod
    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        """Execute with validated arguments; return the result text for the model."""


class Toolset:
    """A named group of tools plus any run-level resources they share (e.g. a browser)."""

    def __init__(self, name: str, tools: list[Tool]) -> None:
        self.name = name
        self.tools = tools

    async def aclose(self) -> None:
        """Release run-level resources. Default: nothing to release."""


@dataclass(frozen=True, slots=True)
class Unavailable:
    """A toolset whose backend is not configured or not installed, and why."""

    toolset: str
    reason: str


def ok(**fields: Any) -> str:
    return dumps_str({"success": True, **fields}) if "success" not in fields else dumps_str(fields)


def error(message: str, **fields: Any) -> str:
    return dumps_str({"success": False, "error": message, **fields})


def result_failed(result: str) -> bool:
    """Whether a tool result counts as failed in tool_stats: JSON with a non-null `error` or
    `success: false`; other text, empty or starting with 'error:'."""
    text = result.strip()
    if text.startswith("{"):
        try:
            from trajforge.jsonio import loads

            obj = loads(text)
        except ValueError:
            obj = None
        if isinstance(obj, dict):
            return obj.get("error") is not None or obj.get("success") is False
    return not text or text.lower().startswith("error:")
