"""--sample_percent: which trajectories a run keeps, chosen in one streaming pass over the input.

The sample size is max(1, floor(N * P / 100)) of the N trajectories, as in the reference; kept
trajectories stay in input order. `random` draws a seeded uniform sample (the same --seed gives
the same sample). `quality` keeps the highest-scoring trajectories:

    score = 4 * finished                  completed is true and partial is not true
          + 2 * tool_success_rate          successes / calls over tool_stats (0 with no calls)
          + 2 * has_reasoning              some gpt turn has <think> or <REASONING_SCRATCHPAD>
          + 2 * no_hallucinated_calls      every <tool_call> parses and names a tool offered in
                                           the system turn's <tools> list (unchecked when there
                                           is no parseable list)

When a trajectory carries a verification score (`verification.score`, written by a run whose
rows have a check, expected answer or rubric), that score ranks first: a higher verification
score always wins, and the formula above only orders trajectories with equal verification
scores. A trajectory whose verification has no score (none asked, or it could not run) ranks
below every scored one. Remaining ties go to the trajectory that used more distinct tools, then
to a seeded hash of its number.
A first pass counts the lines; only the k best are held in memory (a heap) during the scoring
pass, so any input size works.
"""

from __future__ import annotations

import hashlib
import heapq
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from trajforge.compress.compressor import parse_entry
from trajforge.compress.records import iter_lines

SCORE_FORMULA = ("verification.score when present, then 4*finished + 2*tool_success_rate + 2*has_reasoning + "
                 "2*no_hallucinated_calls; ties: more distinct tools used, then a seeded hash")
_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_TOOLS = re.compile(r"<tools>\s*(.*?)\s*</tools>", re.DOTALL)
_REASONING = ("<think>", "<REASONING_SCRATCHPAD>")


@dataclass(frozen=True, slots=True)
class Quality:
    score: float
    distinct_tools: int
    parts: dict[str, float]
    verification: float | None = None  # the run's verification score, ranked before `score`


@dataclass(slots=True)
class Selection:
    mode: str  # all | random | quality
    total: int
    chosen: set[int] | None  # trajectory ordinals kept; None keeps all
    scores: dict[int, float]  # quality mode: score of each kept trajectory

    def keeps(self, ordinal: int) -> bool:
        return self.chosen is None or ordinal in self.chosen

    @property
    def size(self) -> int:
        return self.total if self.chosen is None else len(self.chosen)


def sample_size(total: int, percent: float) -> int:
    return min(total, max(1, int(total * percent / 100))) if total else 0


def _offered_tools(system: str) -> set[str] | None:
    m = _TOOLS.search(system)
    if not m:
        return None
    try:
        listed = orjson.loads(m.group(1))
    except orjson.JSONDecodeError:
        return None
    if not isinstance(listed, list):
        return None
    names = set()
    for item in listed:
        if isinstance(item, dict):
            fn = item.get("function") if isinstance(item.get("function"), dict) else item
            if isinstance(fn.get("name"), str):
                names.add(fn["name"])
    return names


def _called_tools(conv: list[dict[str, Any]]) -> Iterator[str | None]:
    for turn in conv:
        if turn["from"] == "gpt":
            for block in _TOOL_CALL.findall(turn["value"]):
                try:
                    call = orjson.loads(block)
                except orjson.JSONDecodeError:
                    yield None
                    continue
                yield call.get("name") if isinstance(call, dict) and isinstance(call.get("name"), str) else None


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def quality(entry: dict[str, Any]) -> Quality:
    conv = entry["conversations"]
    finished = float(entry.get("completed") is True and entry.get("partial") is not True)
    calls = successes = 0
    stats = entry.get("tool_stats")
    if isinstance(stats, dict):
        for s in stats.values():
            if isinstance(s, dict):
                calls += _count(s.get("count"))
                successes += _count(s.get("success"))
    success_rate = successes / calls if calls else 0.0
    reasoning = float(any(t["from"] == "gpt" and any(m in t["value"] for m in _REASONING) for t in conv))
    system = next((t["value"] for t in conv if t["from"] == "system"), "")
    offered = _offered_tools(system)
    called = list(_called_tools(conv))
    bad = [c for c in called if c is None or (offered is not None and c not in offered)]
    no_hallucination = float(not bad)
    parts = {"finished": finished, "tool_success_rate": round(success_rate, 4), "has_reasoning": reasoning,
             "no_hallucinated_calls": no_hallucination}
    score = 4 * finished + 2 * success_rate + 2 * reasoning + 2 * no_hallucination
    distinct = len({c for c in called if c is not None and c not in bad})
    return Quality(round(score, 4), distinct, parts, verification_score(entry))


def verification_score(entry: dict[str, Any]) -> float | None:
    v = entry.get("verification")
    score = v.get("score") if isinstance(v, dict) else None
    return float(score) if isinstance(score, (int, float)) and not isinstance(score, bool) else None


def _tiebreak(seed: int, ordinal: int) -> int:
    digest = hashlib.blake2b(f"{seed}:{ordinal}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def checked_count(path: Path) -> int:
    """The input's trajectories, every line checked (compressor.parse_entry) on the way: a line that
    is no trajectory is named (InputError) before any file is written or any summary paid for."""
    total = 0
    for raw in iter_lines(path):
        parse_entry(raw.data, f"{path}:{raw.line_no}")
        total += 1
    return total


def select(path: Path, percent: float | None, mode: str, seed: int) -> Selection:
    """The selection for this input: a counting pass that checks every line, plus a scoring pass
    in quality mode."""
    total = checked_count(path)
    if percent is None:
        return Selection("all", total, None, {})
    k = sample_size(total, percent)
    if mode == "random":
        return Selection("random", total, set(random.Random(seed).sample(range(total), k)), {})
    # k is known before the scoring pass, so the heap never holds more than k entries.
    # min-heap of the best: (verification score, score, tools, tiebreak, ordinal)
    heap: list[tuple[float, float, int, int, int]] = []
    for raw in iter_lines(path):
        q = quality(parse_entry(raw.data, f"{path}:{raw.line_no}"))
        verified = -1.0 if q.verification is None else q.verification
        item = (verified, q.score, q.distinct_tools, _tiebreak(seed, raw.ordinal), raw.ordinal)
        if len(heap) < k:
            heapq.heappush(heap, item)
        elif k and item > heap[0]:
            heapq.heapreplace(heap, item)
    return Selection("quality", total, {o for *_, o in heap}, {o: s for _, s, _, _, o in heap})
