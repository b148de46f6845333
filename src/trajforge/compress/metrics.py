"""Counting what a compression run did, and the `<output stem>_metrics.json` report.

Per-trajectory outcomes are streamed to a side file as they happen (so memory stays flat and a
resumed run keeps them); at the end they are copied, still streaming, into the report's
`trajectories` list after the run totals. Token counts use the run's tokenizer and are the sum
of the turns' `value` tokens, so recounting the output with the same tokenizer gives the same
numbers.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from trajforge.compress.compressor import Outcome
from trajforge.jsonio import atomic_writer, dumps, dumps_pretty

FLAGGED_LISTED = 1000  # input line numbers of over-limit trajectories listed in the summary


@dataclass(slots=True)
class Totals:
    trajectories: int = 0  # trajectories processed (after sampling)
    written: int = 0
    compressed: int = 0
    skipped_under_target: int = 0
    failed: int = 0  # summary failed or timed out: the original was kept
    uncompressible: int = 0  # over the budget with nothing that could be summarised: kept as is
    over_limit: int = 0  # over the budget after processing (flagged), whether written or not
    dropped_over_limit: int = 0  # over-limit trajectories left out (processing.save_over_limit: false)
    tokens_before: int = 0
    tokens_after: int = 0  # of the written trajectories
    turns_before: int = 0
    turns_after: int = 0
    summary_calls: int = 0
    summary_errors: int = 0

    def add(self, o: Outcome, written: bool) -> None:
        self.trajectories += 1
        self.written += written
        self.compressed += o.status == "compressed"
        self.skipped_under_target += o.status == "under_target"
        self.failed += o.status == "failed"
        self.uncompressible += o.status == "uncompressible"
        self.over_limit += o.over_limit
        self.dropped_over_limit += not written
        self.tokens_before += o.tokens_before
        self.turns_before += o.turns_before
        if written:
            self.tokens_after += o.tokens_after
            self.turns_after += o.turns_after
        self.summary_calls += o.summary_calls
        self.summary_errors += o.summary_errors

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Totals:
        names = {f.name for f in fields(cls)}
        return cls(**{k: int(v) for k, v in data.items() if k in names})


def detail_line(o: Outcome, input_line: int, output_line: int | None, score: float | None) -> bytes:
    rec: dict[str, Any] = {"input_line": input_line, "output_line": output_line, "status": o.status,
                           "tokens_before": o.tokens_before, "tokens_after": o.tokens_after,
                           "over_limit": o.over_limit, "turns_before": o.turns_before, "turns_after": o.turns_after,
                           "summarised_turns": list(o.region) if o.region else None,
                           "summary_calls": o.summary_calls, "error": o.error}
    if score is not None:
        rec["quality_score"] = score
    return dumps(rec) + b"\n"


def report(totals: Totals, info: dict[str, Any], flagged: list[int]) -> dict[str, Any]:
    t = totals
    return {
        **info,
        "summary": {"total_trajectories": t.trajectories, "written": t.written, "compressed": t.compressed,
                    "skipped_under_target": t.skipped_under_target, "over_limit": t.over_limit,
                    "failed": t.failed, "uncompressible": t.uncompressible,
                    "dropped_over_limit": t.dropped_over_limit,
                    "over_limit_input_lines": flagged[:FLAGGED_LISTED]},
        "tokens": {"total_before": t.tokens_before, "total_after": t.tokens_after,
                   "total_saved": t.tokens_before - t.tokens_after,
                   "ratio": round(t.tokens_after / t.tokens_before, 4) if t.tokens_before else 1.0},
        "turns": {"total_before": t.turns_before, "total_after": t.turns_after},
        "summarization": {"api_calls": t.summary_calls, "errors": t.summary_errors},
    }


def write_report(path: Path, summary: dict[str, Any], details: Path) -> None:
    """Write the report atomically: the summary, then `trajectories` streamed from `details`."""
    head = dumps_pretty(summary).rstrip()
    assert head.endswith(b"}")
    with atomic_writer(path) as out:
        out.write(head[:-1].rstrip() + b',\n  "trajectories": [')
        first = True
        if details.exists():
            with details.open("rb") as src:
                for line in src:
                    line = line.rstrip(b"\n")
                    if line:
                        out.write((b"\n    " if first else b",\n    ") + line)
                        first = False
        out.write(b"\n  ]\n}\n" if not first else b"]\n}\n")


def flagged_lines(details: Path, limit: int = FLAGGED_LISTED) -> list[int]:
    """Input line numbers of over-limit trajectories, read back from the details file."""
    import orjson

    found: list[int] = []
    if details.exists():
        with details.open("rb") as src:
            for line in src:
                if len(found) >= limit:
                    break
                if b'"over_limit":true' in line:
                    found.append(orjson.loads(line)["input_line"])
    return found
