"""Who pays for a model call: the sample whose session made it, tool calls included.

The runner binds a `SampleSpend` to the task that runs a sample (`bound`); every successful
call of any model client in that task (the agent's, and a tool's auxiliary vision/moa call)
is charged to it through `charge`. A context variable does this because tool clients are built
deep inside toolsets, and threading a meter through every toolset would couple all of them to
the runner. Spend is charged as each call returns, so the runner can see an in-flight sample's
cost while it runs (the budget projects from it), and failed attempts are paid for too.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from contextvars import ContextVar
from dataclasses import dataclass

from trajforge.model import ctxvar
from trajforge.model.types import Usage


@dataclass(slots=True, eq=False)  # compared and hashed by identity: one per running sample
class SampleSpend:
    cost: float = 0.0
    tokens: int = 0  # prompt + completion
    calls: int = 0
    parent: SampleSpend | None = None  # also charged (the run's total), so nobody sums every sample


_CURRENT: ContextVar[SampleSpend | None] = ContextVar("trajforge_sample_spend", default=None)


def charge(usage: Usage) -> None:
    """Add one call's usage to the sample running in this task, if any."""
    spend = _CURRENT.get()
    while spend is not None:
        spend.cost += usage.cost
        spend.tokens += usage.prompt_tokens + usage.completion_tokens
        spend.calls += 1
        spend = spend.parent


def bound(spend: SampleSpend) -> AbstractContextManager[SampleSpend]:
    """Charge this task's model calls (and those of tasks it starts) to `spend`."""
    return ctxvar.bound(_CURRENT, spend)
