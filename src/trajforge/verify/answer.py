"""Matching a final answer against an expected one (pure).

Both sides are normalised first: case folded, runs of whitespace collapsed to one space, ends
stripped. Modes:
- `exact`: the normalised answer equals the normalised expected text;
- `contains` (default): the normalised expected text occurs in the normalised answer;
- `regex`: the pattern (case-insensitive) is found anywhere in the normalised answer;
- `number`: the last number in the answer equals the expected number (relative tolerance 1e-9,
  thousands separators `1,234` and a leading `+` accepted), so "The answer is 42." matches 42.
"""

from __future__ import annotations

import math
import re

_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?|[-+]?\.\d+(?:[eE][-+]?\d+)?")


def normalise(text: str) -> str:
    return " ".join(text.casefold().split())


def parse_number(text: str) -> float | None:
    """A whole string read as one number (`42`, `-3.5`, `1,000`, `2e3`), or None."""
    m = _NUMBER.fullmatch(text.strip())
    if not m:
        return None
    value = float(m.group(0).replace(",", ""))
    return value if math.isfinite(value) else None


def last_number(text: str) -> float | None:
    found = _NUMBER.findall(text)
    for raw in reversed(found):
        value = float(raw.replace(",", ""))
        if math.isfinite(value):
            return value
    return None


def matches(answer: str, expected: str, mode: str) -> bool:
    if mode == "exact":
        return normalise(answer) == normalise(expected)
    if mode == "contains":
        return normalise(expected) in normalise(answer)
    if mode == "regex":
        return re.search(expected, normalise(answer), re.IGNORECASE) is not None
    if mode == "number":
        want, got = parse_number(expected), last_number(answer)
        return want is not None and got is not None and math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-12)
    raise ValueError(f"unknown match mode {mode!r}")
