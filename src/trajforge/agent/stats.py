"""Per-trajectory statistics (pure): tool usage, tool errors, reasoning coverage.

tool_stats and tool_error_counts include every known tool with zeros so all records share one
schema. A call to a tool that was not offered to the sample (a name that does not exist, or a
real tool of a toolset it was not given) is counted under `unoffered:<name>`, a key outside the
known tools, which makes the record detectable (and dropped) by the corrupt-entry filter at merge.
"""

from __future__ import annotations

from typing import Any

from trajforge.agent.loop import SessionResult


def tool_stats(session: SessionResult, known: tuple[str, ...]) -> tuple[dict[str, dict[str, int]], dict[str, int]]:
    stats = {name: {"count": 0, "success": 0, "failure": 0} for name in known}
    errors = dict.fromkeys(known, 0)
    for turn in session.turns:
        for res in turn.results:
            name = res.call.name if res.offered else f"unoffered:{res.call.name}"
            entry = stats.setdefault(name, {"count": 0, "success": 0, "failure": 0})
            entry["count"] += 1
            if res.failed:
                entry["failure"] += 1
                errors[name] = errors.get(name, 0) + 1
            else:
                entry["success"] += 1
    return stats, errors


def reasoning_stats(session: SessionResult) -> dict[str, Any]:
    total = len(session.turns)
    with_r = sum(1 for t in session.turns if t.reasoning and t.reasoning.strip())
    return {"total_assistant_turns": total, "turns_with_reasoning": with_r,
            "turns_without_reasoning": total - with_r, "has_any_reasoning": with_r > 0}

