"""What each invocation of a run used, so a resume with another model never mixes them silently.

`--resume` may change any setting (config.json is rewritten each time), and the records of one
run may then come from several models. Each invocation's checkpoint entry keeps the model and the
settings that shape what its samples are (`SHAPING`, as config.json spells them); at the start
of a resume that changes any of them the runner says which, and statistics.json lists the
models and every change (`history`), as the viewer shows them. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trajforge.runner.reporting.figures import SettingsChange

# config.json keys whose change makes the new samples different data (not how fast they come)
SHAPING = ("model", "base_url", "distribution", "max_turns", "max_tokens", "reasoning_effort", "reasoning_disabled",
           "ephemeral_system_prompt", "prefill_messages_file", "sandbox", "sandbox_network", "keep_no_reasoning",
           "temperature", "top_p", "samples_per_prompt", "judge_model")


def shaping(masked: dict[str, Any]) -> dict[str, Any]:
    """The settings of `SHAPING` that config.json (`masked`) holds."""
    return {k: masked[k] for k in SHAPING if k in masked}


def changes(before: dict[str, Any] | None, now: dict[str, Any]) -> dict[str, list[Any]]:
    """setting -> [previous value, this value] for each one that differs; nothing when the earlier
    invocation recorded no settings (a run made before they were recorded)."""
    if before is None:
        return {}
    return {k: [before.get(k), v] for k, v in now.items() if before.get(k) != v and (k in before or v is not None)}


def describe(diff: dict[str, list[Any]]) -> str:
    return "; ".join(f"{k} {_short(a)} -> {_short(b)}" for k, (a, b) in diff.items())


def _short(value: Any) -> str:
    text = repr(value) if not isinstance(value, (dict, list)) else "{...}" if isinstance(value, dict) else "[...]"
    return text if len(text) <= 80 else text[:77] + "..."


def history(invocations: Sequence[Any]) -> tuple[list[str], list[SettingsChange]]:
    """(the models of the run's invocations, in order of first use; every change of settings from
    one invocation that recorded them to the next)."""
    models: list[str] = []
    found: list[SettingsChange] = []
    before: dict[str, Any] | None = None
    for n, inv in enumerate(invocations, start=1):
        if inv.model is not None and inv.model not in models:
            models.append(inv.model)
        if inv.settings is None:
            continue
        diff = changes(before, inv.settings)
        if diff:
            found.append(SettingsChange(n, diff))
        before = inv.settings
    return models, found
