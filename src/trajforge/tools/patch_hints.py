"""What patch tells the model when old_string is not found once: where it occurs, or which line
comes closest. Pure functions; they run on the event loop every session shares, so the closest-line
search is bounded in time (the file and the text are the model's)."""

from __future__ import annotations

import difflib
import re
import time

HINT_CHARS, HINT_SECONDS = 200, 0.1  # what the closest-line search compares, and how long it looks


def occurrence_lines(text: str, needle: str, shown: int = 5) -> str:
    starts = [m.start() for m in re.finditer(re.escape(needle), text)]
    nums = [str(text.count("\n", 0, s) + 1) for s in starts[:shown]]
    return ", ".join(nums) + (", ..." if len(starts) > shown else "")


def closest_hint(text: str, old: str) -> str:
    if " ".join(old.split()) in " ".join(text.split()):
        return "it matches only when whitespace is ignored: copy the exact indentation and line breaks from read_file"
    first = next((ln.strip() for ln in old.splitlines() if ln.strip()), "")
    found = _closest_line(first[:HINT_CHARS], text.splitlines()[:20_000]) if first else None
    if found is not None:
        num, line = found
        return f"the closest line is {num}: {line[:200]!r}; read_file the file and copy the text exactly"
    return "read_file the file and copy the text to replace exactly"


def _closest_line(first: str, lines: list[str], cutoff: float = 0.6) -> tuple[int, str] | None:
    """(number, text) of the line most like `first` (as difflib.get_close_matches scores it), looked
    for during at most HINT_SECONDS: a ratio costs up to ~1 ms on lines the model chose, and this
    runs on the event loop every session shares."""
    matcher = difflib.SequenceMatcher()
    matcher.set_seq2(first)
    best: tuple[int, str] | None = None
    deadline = time.monotonic() + HINT_SECONDS
    for num, raw in enumerate(lines, 1):
        if num % 16 == 0 and time.monotonic() > deadline:
            break
        line = raw.strip()
        matcher.set_seq1(line[:HINT_CHARS])
        if matcher.real_quick_ratio() >= cutoff and matcher.quick_ratio() >= cutoff:
            score = matcher.ratio()
            if score >= cutoff:
                best, cutoff = (num, line), score + 1e-9
    return best
