"""The viewer's records as columns: a few numbers a sample, in arrays, never an object each.

A million-sample run kept a million `Entry` objects (~600 bytes each with their strings); here a
record is ~90 bytes of arrays plus its prompt's text for search, and an `Entry` is made only for
the samples a page shows (`entry`), its key and prompt read back from the record. Strings that
repeat (tool sets, task types, reasons) are stored once and referred to by number (`Codes`).
The prompts' text, casefolded and cut at PROMPT_CAP characters, is one byte string with a start
offset per record, so a search is a few `find` calls over it (`search`).
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_right
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from trajforge.view.summary import PROMPT_CAP, Entry

STATUSES = ("completed", "partial", "failed", "discarded")
OUTCOME = 1 << 31  # samples without a record (view.index's outcomes) are numbered from here, records from 0
# How a record's key is spelled (runner records name their sample; lines of another file may not)
BY_ID, BY_LINE, BY_ID_AT_LINE = 0, 1, 2

T = TypeVar("T")


class Codes(Generic[T]):
    """Values by number: 0 is None."""

    def __init__(self) -> None:
        self.values: list[T | None] = [None]
        self._numbers: dict[T, int] = {}

    def number(self, value: T | None) -> int:
        if value is None:
            return 0
        n = self._numbers.get(value)
        if n is None:
            n = self._numbers[value] = len(self.values)
            self.values.append(value)
        return n

    def known(self, value: T) -> int | None:
        return self._numbers.get(value)


def _opt(value: int | None) -> int:
    return -1 if value is None else value


def _optf(value: float | None) -> float:
    return math.nan if value is None else value


@dataclass
class Columns:
    file: array = field(default_factory=lambda: array("H"))
    offset: array = field(default_factory=lambda: array("Q"))
    length: array = field(default_factory=lambda: array("I"))
    line: array = field(default_factory=lambda: array("I"))  # line number in its file
    key: array = field(default_factory=lambda: array("Q"))  # runner.state.keys.key_of(sample_id)
    spelled: array = field(default_factory=lambda: array("B"))  # BY_ID, BY_LINE or BY_ID_AT_LINE
    prompt_index: array = field(default_factory=lambda: array("q"))  # -1: none
    batch: array = field(default_factory=lambda: array("q"))  # -1: none
    status: array = field(default_factory=lambda: array("B"))  # index into STATUSES
    reason: array = field(default_factory=lambda: array("H"))  # reasons.values
    turns: array = field(default_factory=lambda: array("I"))
    tools: array = field(default_factory=lambda: array("I"))  # tool_sets.values: the tools a record called
    tool_calls: array = field(default_factory=lambda: array("I"))
    tool_failures: array = field(default_factory=lambda: array("I"))
    tokens: array = field(default_factory=lambda: array("q"))  # -1: none
    cost: array = field(default_factory=lambda: array("d"))  # nan: none
    passed: array = field(default_factory=lambda: array("b"))  # -1: none
    score: array = field(default_factory=lambda: array("d"))  # nan: none
    task_type: array = field(default_factory=lambda: array("H"))  # task_types.values
    verdict: array = field(default_factory=lambda: array("H"))  # verdicts.values
    text: bytearray = field(default_factory=bytearray)  # casefolded prompts, each followed by a NUL
    text_at: array = field(default_factory=lambda: array("Q"))  # where each record's prompt starts in `text`
    reasons: Codes[str] = field(default_factory=Codes)
    tool_sets: Codes[tuple[str, ...]] = field(default_factory=Codes)
    task_types: Codes[str] = field(default_factory=Codes)
    verdicts: Codes[str] = field(default_factory=Codes)

    def __len__(self) -> int:
        return len(self.key)

    def add(self, e: Entry, key: int, spelled: int, line: int) -> None:
        """Take in a record summarised as `e` (its key and prompt are not kept: `entry` reads them back)."""
        self.file.append(e.file)
        self.offset.append(e.offset)
        self.length.append(e.length)
        self.line.append(line)
        self.key.append(key)
        self.spelled.append(spelled)
        self.prompt_index.append(_opt(e.prompt_index))
        self.batch.append(_opt(e.batch))
        self.status.append(STATUSES.index(e.status))
        self.reason.append(self.reasons.number(e.reason))
        self.turns.append(e.turns)
        self.tools.append(self.tool_sets.number(e.tools))
        self.tool_calls.append(e.tool_calls)
        self.tool_failures.append(e.tool_failures)
        self.tokens.append(_opt(e.tokens))
        self.cost.append(_optf(e.cost))
        self.passed.append(-1 if e.passed is None else int(e.passed))
        self.score.append(_optf(e.score))
        self.task_type.append(self.task_types.number(e.task_type))
        self.verdict.append(self.verdicts.number(e.verdict))
        self.text_at.append(len(self.text))
        self.text += e.prompt[:PROMPT_CAP].casefold().replace("\0", " ").encode() + b"\0"

    def entry(self, i: int, key: str, prompt: str) -> Entry:
        """Record `i` as an Entry (the list's row), with its key and prompt read back by the caller."""
        def opt(v: int) -> int | None:
            return None if v < 0 else v

        def optf(v: float) -> float | None:
            return None if math.isnan(v) else v

        passed = self.passed[i]
        return Entry(key=key, seq=i, file=self.file[i], offset=self.offset[i], length=self.length[i],
                     prompt_index=opt(self.prompt_index[i]), batch=opt(self.batch[i]),
                     status=STATUSES[self.status[i]], reason=self.reasons.values[self.reason[i]], message=None,
                     turns=self.turns[i], tools=self.tool_sets.values[self.tools[i]] or (),
                     tool_calls=self.tool_calls[i], tool_failures=self.tool_failures[i], tokens=opt(self.tokens[i]),
                     cost=optf(self.cost[i]), passed=None if passed < 0 else bool(passed), score=optf(self.score[i]),
                     task_type=self.task_types.values[self.task_type[i]], prompt=prompt[:PROMPT_CAP],
                     verdict=self.verdicts.values[self.verdict[i]])

    def search(self, needle: str) -> set[int]:
        """The records whose prompt holds `needle`, case-insensitively."""
        found: set[int] = set()
        want = needle.casefold().encode()
        if not want:
            return set(range(len(self)))
        text, at = self.text, self.text_at
        pos = text.find(want)
        while pos >= 0:
            i = bisect_right(at, pos) - 1
            found.add(i)
            nxt = at[i + 1] if i + 1 < len(at) else len(text)
            pos = text.find(want, nxt)
        return found

    def value(self, name: str, i: int) -> Any:
        """A sortable figure of record `i` (None when it has none): turns, tool_calls, tokens, cost."""
        v = getattr(self, name)[i]
        if name == "tokens":
            return None if v < 0 else v
        if name == "cost":
            return None if math.isnan(v) else v
        return v
