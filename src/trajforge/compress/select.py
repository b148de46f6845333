"""Choosing which turns of one trajectory to summarise (pure: roles and token counts in, a region out).

A region is a half-open turn range [start, end) that one summary turn replaces. Rules:
- The protected head (the first system, human, gpt and tool turns, each switchable) and the last
  `last_n_turns` turns are never inside it; the region lies after the last protected head turn.
- It never splits a tool-call/tool-response pair: a `tool` turn always belongs with the `gpt`
  turn before it, so neither end of the region may sit on a `tool` turn (a cut just before a
  tool turn would separate it from its call).
- Among the regions that bring the trajectory under the budget, it is the one holding the fewest
  tokens (the rest stays verbatim), the earliest on ties. When none suffices, it is the whole
  compressible middle and the trajectory is flagged as over the limit.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate


@dataclass(frozen=True, slots=True)
class Protection:
    first_system: bool = True
    first_human: bool = True
    first_gpt: bool = True
    first_tool: bool = True
    last_n_turns: int = 4


@dataclass(frozen=True, slots=True)
class Region:
    start: int
    end: int  # exclusive
    tokens: int  # tokens of the turns in the region


@dataclass(frozen=True, slots=True)
class Plan:
    region: Region | None  # None: nothing to summarise (under budget, or nothing compressible helps)
    reaches_target: bool  # whether the planned result is expected to fit the budget


def is_cut(roles: list[str], i: int) -> bool:
    """Whether a region may start or end just before turn i (i == len(roles): at the very end)."""
    return i <= 0 or i >= len(roles) or roles[i] != "tool"


def compressible_window(roles: list[str], protection: Protection) -> tuple[int, int]:
    """(lo, hi): every allowed region lies within [lo, hi); both are valid cuts. lo >= hi: none."""
    n = len(roles)
    head_end = 0
    for role in ("system", "human", "gpt", "tool"):
        if getattr(protection, f"first_{role}") and role in roles:
            head_end = max(head_end, roles.index(role) + 1)
    tail_start = max(0, n - protection.last_n_turns)
    lo = head_end
    while lo < n and not is_cut(roles, lo):
        lo += 1  # a head tool turn's siblings stay with the head
    hi = tail_start
    while hi > lo and not is_cut(roles, hi):
        hi -= 1  # the tail starts on a tool turn: keep its gpt call out of the region too
    return lo, hi


def choose_region(roles: list[str], tokens: list[int], *, target: int, overhead: int,
                  protection: Protection) -> Plan:
    """Plan the summary region. `overhead` = tokens the replacement adds (summary turn + notice)."""
    if len(roles) != len(tokens):
        raise ValueError("roles and tokens differ in length")
    total = sum(tokens)
    if total <= target:
        return Plan(None, True)
    need = total - target + overhead  # the region must hold at least this many tokens
    lo, hi = compressible_window(roles, protection)
    cuts = [i for i in range(lo, hi + 1) if is_cut(roles, i)]
    if len(cuts) < 2:
        return Plan(None, False)
    prefix = [0, *accumulate(tokens)]
    best: Region | None = None
    j = 1
    # Two pointers: for each start cut, the first end cut whose region holds `need` tokens. That end
    # only moves forward as the start does, because token counts are never negative.
    for a in range(len(cuts) - 1):
        j = max(j, a + 1)
        while j < len(cuts) and prefix[cuts[j]] - prefix[cuts[a]] < need:
            j += 1
        if j == len(cuts):
            break
        held = prefix[cuts[j]] - prefix[cuts[a]]
        if best is None or held < best.tokens:
            best = Region(cuts[a], cuts[j], held)
    if best is not None:
        return Plan(best, True)
    whole = Region(cuts[0], cuts[-1], prefix[cuts[-1]] - prefix[cuts[0]])
    if whole.tokens <= overhead:
        return Plan(None, False)  # a summary would be as large as what it replaces
    return Plan(whole, False)
