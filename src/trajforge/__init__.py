"""trajforge: run a tool-using LLM agent over a JSONL dataset and save ShareGPT trajectories."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    """`trajforge.Rollouts` (the rollout service's Python API), imported when first asked for: the
    command line starts without it."""
    if name == "Rollouts":
        from trajforge.service.rollouts import Rollouts

        return Rollouts
    raise AttributeError(f"module 'trajforge' has no attribute {name!r}")
