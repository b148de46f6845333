"""Token capture statistics (pure aggregation over trajectory records), as runner.figures.CaptureFigures.

Per record: whether it carries its calls' token ids (agent.segments) or says why not, how many
of its replies lacked the ids that were asked for, and how its calls fell into segments. Prefix
integrity is the share of calls after a sample's first whose prompt extended the sample's
current segment exactly (each later call either extends it or starts a new one): 1.0 when every
prompt started with the previous prompt and what the model generated.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from trajforge.agent.segments import MISSING_CALLS, TOKENS, TOKENS_MISSING
from trajforge.model.types import NOT_REQUESTED, NOT_RETURNED
from trajforge.runner.reporting.figures import CaptureFigures

_STATE = ("captured", "calls", "continuing", "segments", "missing_calls")


@dataclass
class CaptureTotals:
    captured: int = 0  # records with token ids
    missing: Counter[str] = field(default_factory=Counter)  # records without, by reason
    missing_calls: int = 0  # replies that came back without the ids asked for
    calls: int = 0  # calls of the captured records
    continuing: int = 0  # their calls after each sample's first
    segments: int = 0

    def add(self, rec: dict[str, Any]) -> None:
        tokens = rec.get(TOKENS)
        if isinstance(tokens, dict):
            turns, segments = tokens.get("turns"), tokens.get("segments")
            if isinstance(turns, list) and isinstance(segments, list) and turns:
                self.captured += 1
                self.calls += len(turns)
                self.continuing += len(turns) - 1
                self.segments += len(segments)
        elif isinstance(rec.get(TOKENS_MISSING), str):
            self.missing[rec[TOKENS_MISSING]] += 1
            calls = rec.get(MISSING_CALLS)
            self.missing_calls += calls if isinstance(calls, int) and not isinstance(calls, bool) else 0

    def state(self) -> dict[str, Any]:
        return {**{name: getattr(self, name) for name in _STATE}, "missing": dict(self.missing)}

    def load_state(self, state: dict[str, Any] | None) -> None:
        """`state` as `state()` gave it; None from a run merged before token capture existed."""
        if state is not None:
            for name in _STATE:
                setattr(self, name, state[name])
            self.missing = Counter(state["missing"])

    def figures(self) -> CaptureFigures | None:
        """None when no record says anything beyond `not_requested` (a run that never asked)."""
        if not self.captured and not set(self.missing) - {NOT_REQUESTED}:
            return None
        breaks = self.segments - self.captured
        extended = self.continuing - breaks
        return CaptureFigures(
            samples_captured=self.captured, samples_without=dict(sorted(self.missing.items())),
            replies_without_ids=self.missing_calls, calls=self.calls, segments=self.segments, prefix_breaks=breaks,
            prefix_integrity=round(extended / self.continuing, 4) if self.continuing else None)


def table_rows(c: CaptureFigures | None) -> list[tuple[str, str]]:
    """Rows of the end-of-run table."""
    if c is None:
        return []
    integrity = "-" if c.prefix_integrity is None else f"{c.prefix_integrity:.3f}"
    rows = [("prefix integrity", f"{integrity} ({c.calls} calls in {c.segments} segments, "
                                 f"{c.prefix_breaks} prefix breaks)")]
    without = sum(c.samples_without.values())
    reasons = ", ".join(f"{n} {why}" for why, n in c.samples_without.items())
    rows.append(("token ids captured", f"{c.samples_captured} samples" + (f"; {without} without ({reasons})"
                                                                          if without else "")))
    return rows


def missing_note(c: CaptureFigures | None) -> str | None:
    """The end of the run names the replies that lacked the ids asked for (the run goes on)."""
    if c is None or not c.replies_without_ids:
        return None
    samples = c.samples_without.get(NOT_RETURNED, 0)
    return (f"{c.replies_without_ids} model repl{'y' if c.replies_without_ids == 1 else 'ies'} came back without "
            "the token ids --capture_tokens asked for (the server ignored return_token_ids, or does not know it: "
            f"vLLM reports them); {samples} sample(s) say tokens: null, tokens_missing: {NOT_RETURNED}")
