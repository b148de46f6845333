"""trajforge: run a tool-using LLM agent over a JSONL dataset and save ShareGPT trajectories."""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"
__all__ = ["Rollouts", "__version__"]


def __getattr__(name: str) -> Any:
    """`trajforge.Rollouts` (the rollout service's Python API), imported when first asked for: the
    command line starts without it."""
    if name == "Rollouts":
        # by name, on first use: every module of trajforge imports this package (its __version__),
        # and none of them asks for Rollouts, so no import runs in a circle
        return importlib.import_module("trajforge.service.rollouts").Rollouts
    raise AttributeError(f"module 'trajforge' has no attribute {name!r}")
