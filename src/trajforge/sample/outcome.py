"""The result of processing one sample: a plain, picklable value (it crosses Ray too)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

FAILURE_CLASSES = ("rate_limit", "api_error", "timeout", "sandbox", "build", "model_error", "internal")
# The discard reason of a finished record that called a tool it was not offered: the run's merge
# drops it (trajforge.runner.reporting.merge), and the run's readers count it as discarded.
HALLUCINATED = "hallucinated_tool"
Status = Literal["done", "discarded", "failed"]


def batch_number(index: int, batch_size: int | None) -> int:
    """The batch file (batch_N.jsonl) a sample's record goes to: the one place this is computed."""
    return index // (batch_size or 1)


@dataclass(slots=True)
class Outcome:
    index: int
    identity: str
    batch_num: int
    status: Status
    record: dict[str, Any] | None = None  # the trajectory, when status == "done"
    reason: str | None = None  # discard reason or failure class
    message: str | None = None  # human-readable failure detail
    attempts: int = 1
    seconds: float = 0.0
    worker: str = "local"
    usage: dict[str, Any] | None = None  # tokens/cost of a discarded sample (a kept one has them in its record)
    api_calls: int = 0
    cost: float = 0.0  # USD spent by attempts that ran in another process (Ray); runner.scheduling.engine adds its own
    retryable: bool = True  # False: another attempt would fail the same way (a sandbox limit): no in-run retry

    def scrubbed(self, scrub: Callable[[Any], Any]) -> Outcome:
        """A copy with `scrub` (trajforge.redact.REGISTRY.value) applied to the record and message:
        done where the outcome is made when that process may hold keys the runner does not know
        (a Ray node's own environment)."""
        return replace(self, record=scrub(self.record) if self.record is not None else None,
                       message=scrub(self.message) if self.message is not None else None)
