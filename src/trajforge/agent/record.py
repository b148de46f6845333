"""Build the saved trajectory record of one session (pure).

Key order matters: `prompt_index` then `sample_id` lead every line so resume can read a sample's
identity from a line's first bytes without decoding the whole conversation.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from trajforge.agent.loop import SessionResult
from trajforge.agent.segments import POLICY_VERSIONS
from trajforge.agent.sharegpt import conversations
from trajforge.agent.stats import reasoning_stats, tool_stats


def build_record(
    session: SessionResult,
    *,
    prompt_index: int,
    sample_id: str,
    batch_num: int,
    model: str,
    toolsets_used: list[str],
    known_tools: tuple[str, ...],
    now: datetime | None = None,
    dataset_line: int | None = None,
    row: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """`dataset_line` (1-based line of the row in the dataset file) and `row` (the row's fields
    other than the ones that decide how it runs) let users join a result back to its input. The
    calls' token ids close the record (agent.segments), with each call's policy version when the
    run stamps one."""
    stats, errors = tool_stats(session, known_tools)
    ts = (now or datetime.now(timezone.utc)).replace(microsecond=0, tzinfo=None).isoformat()
    versions = [t.policy_version for t in session.turns]
    record = {
        "prompt_index": prompt_index,
        "sample_id": sample_id,
        "dataset_line": dataset_line,
        "conversations": conversations(session),
        "metadata": {"batch_num": batch_num, "timestamp": ts, "model": model},
        "completed": session.completed,
        "partial": session.partial,
        "end_reason": session.end_reason,
        "api_calls": session.api_calls,
        "toolsets_used": toolsets_used,
        "tool_stats": stats,
        "tool_error_counts": errors,
        "reasoning": reasoning_stats(session),
        "usage": session.usage.as_dict(),
        "row": dict(row or {}),
        **session.segments.fields(),
    }
    if any(v is not None for v in versions):  # each call's, when the run was given one (--policy_version)
        record[POLICY_VERSIONS] = versions
    return record
