"""Compressing one trajectory: count, plan, summarise, assemble; never lose the original.

`analyse` is the CPU part (JSON parse, validation, token counts, plan) and runs in a worker thread;
`compress` adds the model call. The budget is planned with the summary's target size; when the
summary comes back larger than planned and the result misses the budget, the region is planned
once more with the summary's real size and summarised again (two rounds at most). Any summary
failure or timeout keeps the original line byte for byte, as does a trajectory under the budget.
The summary turn is a `human` turn, as in the reference. Captured token ids stay as they were,
and the record says which calls the summary replaced (`with_dropped_turns`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import orjson

from trajforge.agent.segments import TOKENS
from trajforge.compress.config import CompressionConfig
from trajforge.compress.select import Plan, Protection, Region, choose_region
from trajforge.compress.summarize import SUMMARY_PREFIX, CallCount, Summariser, SummaryFailed
from trajforge.compress.tokenize import TokenCounter
from trajforge.errors import InputError
from trajforge.jsonio import dumps

@dataclass(slots=True)
class Outcome:
    """What happened to one trajectory; one line of the per-trajectory metrics."""

    status: str  # under_target | compressed | failed | uncompressible
    tokens_before: int
    tokens_after: int
    over_limit: bool
    turns_before: int
    turns_after: int
    region: tuple[int, int] | None = None
    summary_calls: int = 0
    summary_errors: int = 0
    error: str | None = None


@dataclass(slots=True)
class Analysis:
    entry: dict[str, Any]
    counts: list[int]
    total: int
    notice_delta: int  # tokens the summary notice adds to the first system turn
    plan: Plan
    outcome: Outcome | None = None  # set when no model call is needed


def parse_entry(data: bytes, where: str) -> dict[str, Any]:
    """Decode and check one trajectory line; errors name the file and line."""
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise InputError(f"{where}: not valid JSON: {e}") from None
    if not isinstance(obj, dict):
        raise InputError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    conv = obj.get("conversations")
    if not isinstance(conv, list):
        raise InputError(f"{where}: field 'conversations' is missing or not a list")
    for k, turn in enumerate(conv):
        if not (isinstance(turn, dict) and isinstance(turn.get("from"), str) and isinstance(turn.get("value"), str)):
            raise InputError(f"{where}: conversations[{k}] must be an object with string 'from' and 'value'")
    return obj


class TrajectoryCompressor:
    def __init__(self, config: CompressionConfig, counter: TokenCounter, summariser: Summariser | None) -> None:
        self.cfg = config
        self.counter = counter
        self.summariser = summariser
        pt = config.protected_turns
        self.protection = Protection(pt.first_system, pt.first_human, pt.first_gpt, pt.first_tool, pt.last_n_turns)
        self.target = config.compression.target_max_tokens
        self.summary_budget = config.compression.summary_target_tokens + counter.count(SUMMARY_PREFIX + " ")
        # Summaries run one request at a time per trajectory, so this bounds requests in flight too.
        self._slots = asyncio.Semaphore(config.processing.max_concurrent_requests)

    def analyse(self, data: bytes, where: str) -> Analysis:
        entry = parse_entry(data, where)
        conv = entry["conversations"]
        counts = self.counter.turn_counts(conv)
        total = sum(counts)
        n = len(conv)
        if total <= self.target:
            out = Outcome("under_target", total, total, False, n, n)
            return Analysis(entry, counts, total, 0, Plan(None, True), out)
        notice_delta = self._notice_delta(conv)
        roles = [t["from"] for t in conv]
        plan = choose_region(roles, counts, target=self.target, overhead=self.summary_budget + notice_delta,
                             protection=self.protection)
        out = None if plan.region else Outcome("uncompressible", total, total, True, n, n)
        return Analysis(entry, counts, total, notice_delta, plan, out)

    def _notice_delta(self, conv: list[dict[str, Any]]) -> int:
        if not self.cfg.output.add_summary_notice:
            return 0
        system = next((t["value"] for t in conv if t["from"] == "system"), None)
        if system is None:
            return 0
        return self.counter.count(system + self.cfg.output.summary_notice_text) - self.counter.count(system)

    async def compress(self, a: Analysis) -> tuple[dict[str, Any] | None, Outcome]:
        """(new entry or None when the original stays, outcome)."""
        if a.outcome is not None:
            return None, a.outcome
        assert a.plan.region is not None and self.summariser is not None
        conv = a.entry["conversations"]
        n = len(conv)
        calls = CallCount()
        best: tuple[Region, str, int] | None = None
        error = ""
        timeout = self.cfg.processing.per_trajectory_timeout
        try:
            async with self._slots, asyncio.timeout(timeout):
                best = await self._summarise(conv, a, a.plan.region, calls)
                if best[2] > self.target and a.plan.reaches_target:
                    retry = choose_region([t["from"] for t in conv], a.counts, target=self.target,
                                          overhead=self.counter.count(best[1]) + a.notice_delta,
                                          protection=self.protection)
                    if retry.region is not None and retry.region.tokens > best[0].tokens:
                        second = await self._summarise(conv, a, retry.region, calls)
                        best = second if second[2] < best[2] else best
        except SummaryFailed as e:
            error = str(e)
        except TimeoutError:
            error = f"summarising timed out after {timeout:g}s"
        if best is None:  # a failed second round still leaves the first round's result
            return None, Outcome("failed", a.total, a.total, True, n, n, None, calls.calls, calls.errors, error)
        region, summary, after = best
        if after >= a.total:  # a summary longer than what it replaces only makes things worse
            msg = f"the summary is not shorter than the {region.tokens} tokens it would replace"
            return None, Outcome("failed", a.total, a.total, True, n, n, None, calls.calls, calls.errors, msg)
        new_conv = self._assemble(conv, region, summary)
        outcome = Outcome("compressed", a.total, after, after > self.target, n, len(new_conv),
                          (region.start, region.end), calls.calls, calls.errors)
        return with_dropped_turns(dict(a.entry, conversations=new_conv), conv, region), outcome

    async def _summarise(self, conv: list[dict[str, Any]], a: Analysis, region: Region,
                         calls: CallCount) -> tuple[Region, str, int]:
        assert self.summariser is not None
        summary = await self.summariser.summarise(conv[region.start:region.end], region.start, calls)
        after = a.total - region.tokens + self.counter.count(summary)
        if self._notice_target(conv, region) is not None:
            after += a.notice_delta
        return region, summary, after

    def _notice_target(self, conv: list[dict[str, Any]], region: Region) -> int | None:
        """Index of the system turn that gets the notice: the first one, if it stays."""
        if not self.cfg.output.add_summary_notice:
            return None
        idx = next((i for i, t in enumerate(conv) if t["from"] == "system"), None)
        if idx is None or region.start <= idx < region.end:
            return None
        return idx

    def _assemble(self, conv: list[dict[str, Any]], region: Region, summary: str) -> list[dict[str, Any]]:
        notice_at = self._notice_target(conv, region)
        out = []
        for i, turn in enumerate(conv[:region.start]):
            if i == notice_at:
                turn = dict(turn, value=turn["value"] + self.cfg.output.summary_notice_text)
            out.append(turn)
        out.append({"from": "human", "value": summary})
        out.extend(conv[region.end:])
        if notice_at is not None and notice_at >= region.end:
            k = notice_at - region.end + region.start + 1
            out[k] = dict(out[k], value=out[k]["value"] + self.cfg.output.summary_notice_text)
        return out


def with_dropped_turns(entry: dict[str, Any], conv: list[dict[str, Any]], region: Region) -> dict[str, Any]:
    """A record with token ids keeps its segments as the model saw them (the summary is text no
    model call saw) and says which calls' turns the summary replaced: `tokens.dropped_turns`,
    0-based like its `turns`."""
    tokens = entry.get(TOKENS)
    if not isinstance(tokens, dict):
        return entry
    first = sum(1 for t in conv[:region.start] if t["from"] == "gpt")
    dropped = sum(1 for t in conv[region.start:region.end] if t["from"] == "gpt")
    return dict(entry, **{TOKENS: dict(tokens, dropped_turns=list(range(first, first + dropped)))})


def encode_entry(entry: dict[str, Any]) -> bytes:
    return dumps(entry) + b"\n"
