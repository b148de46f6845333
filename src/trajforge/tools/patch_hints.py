"""What patch tells the model: the diff of its change, or, when old_string is not found once,
where it occurs or which line comes closest. Pure functions; they run on the event loop every
session shares, so their work is bounded (the file and the text are the model's)."""

from __future__ import annotations

import difflib
import re
import time

HINT_CHARS, HINT_SECONDS = 200, 0.1  # what the closest-line search compares, and how long it looks
WHOLE_DIFF_CHARS = 64 << 10  # files up to this size get a whole-file diff
WINDOW_CHARS, LINE_CHARS = 2_000, 1_000  # a larger file's diff: around its first change, lines cut


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


def change_diff(text: str, updated: str, shown: str, old: str, new: str, *, every: bool = True) -> str:
    """The unified diff of patch's change (`every`: replace_all). difflib's time grows faster than
    the file (minutes on 1 MB of short repeated lines), so a larger file shows its first change
    only: two lines around it, at most WINDOW_CHARS either side, each line cut at LINE_CHARS (a
    one-line file of megabytes is the model's to make)."""
    if len(text) + len(updated) <= 2 * WHOLE_DIFF_CHARS:
        return "".join(difflib.unified_diff(text.splitlines(True), updated.splitlines(True), shown, shown, n=2))
    at = text.find(old)
    if at < 0:  # the CRLF form of old_string was replaced
        old, new = old.replace("\n", "\r\n"), new.replace("\n", "\r\n")
        at = text.find(old)
    if at < 0:
        return "[diff omitted: the file is over 64 KB; read_file the lines you changed]"
    lo = _line_start(text, at, 2, max(0, at - WINDOW_CHARS))
    end = at + len(old)
    window = text[lo:_line_end(text, end, 2, min(len(text), end + WINDOW_CHARS))]
    before = [line[:LINE_CHARS] for line in window.splitlines(True)]
    after = [line[:LINE_CHARS] for line in window.replace(old, new, -1 if every else 1).splitlines(True)]
    body = "".join(difflib.unified_diff(before, after, shown, shown, n=2))
    first = text.count("\n", 0, lo) + 1
    return body + f"[the file is over 64 KB: its first change only, with line numbers counted from line {first}]\n"


def _line_start(text: str, pos: int, lines: int, floor: int) -> int:
    """Where the line `lines` lines above the one holding `pos` starts, not before `floor`."""
    for _ in range(lines + 1):
        j = text.rfind("\n", floor, pos)
        if j < 0:
            return floor
        pos = j
    return pos + 1


def _line_end(text: str, pos: int, lines: int, ceil: int) -> int:
    """Where the line `lines` lines below the one holding `pos` ends, not after `ceil`."""
    for _ in range(lines + 1):
        j = text.find("\n", pos, ceil)
        if j < 0:
            return ceil
        pos = j + 1
    return pos
