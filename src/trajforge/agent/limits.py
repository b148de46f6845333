"""Per-sample spend limits (--max_tokens_per_sample, --max_cost_per_sample), checked by the loop.

A sample that reaches one stops asking the model, like a --max_turns stop: it is saved as
partial and its `end_reason` names the limit. The check runs after each turn's tool calls, so
the overshoot is at most one model call and the tools it called. What counts is everything the
sample paid for: every call's prompt and completion tokens (each call re-sends the conversation,
and is billed for it) and the cost of tools' own model calls (vision, moa). Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from trajforge.model.types import Usage


@dataclass(frozen=True, slots=True)
class SpendLimits:
    max_tokens: int | None = None
    max_cost: float | None = None

    def reached(self, *spent: Usage | None) -> str | None:
        """The end_reason when the summed usage reached a limit, else None."""
        tokens = sum(u.prompt_tokens + u.completion_tokens for u in spent if u is not None)
        cost = sum(u.cost for u in spent if u is not None)
        if self.max_tokens is not None and tokens >= self.max_tokens:
            return "max_tokens_per_sample"
        if self.max_cost is not None and cost >= self.max_cost:
            return "max_cost_per_sample"
        return None
