"""Toolset distributions (SPEC section 4): the 17 named tables, the listing, and the seeded sampler.

The sampler is checked statistically (20k draws per distribution against the exact inclusion
probability, including the guaranteed primary toolset) and for determinism, also across
processes with different PYTHONHASHSEED values, since resume relies on it.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO
from trajforge.catalog.distributions import (
    BUILTIN,
    TOOLSETS,
    Distribution,
    all_distributions,
    format_distributions,
    draw_toolsets,
)

# SPEC section 4, copied independently of the implementation.
SPEC_TABLE: dict[str, tuple[str, dict[str, float]]] = {
    "default": ("all tools, all the time", dict(web=100, vision=100, image_gen=100, terminal=100, file=100,
                                                moa=100, browser=100)),
    "image_gen": ("image generation with vision and web support",
                  dict(image_gen=90, vision=90, web=55, terminal=45, moa=10)),
    "research": ("web research with vision analysis and reasoning",
                 dict(web=90, browser=70, vision=50, moa=40, terminal=10)),
    "science": ("scientific research", dict(web=94, terminal=94, file=94, vision=65, browser=50, image_gen=15,
                                            moa=10)),
    "development": ("terminal, files, reasoning, occasional web", dict(terminal=80, file=80, moa=60, web=30,
                                                                       vision=10)),
    "safe": ("everything except terminal", dict(web=80, browser=70, vision=60, image_gen=60, moa=50)),
    "balanced": ("equal probability of all toolsets", {ts: 50 for ts in TOOLSETS}),
    "minimal": ("only web tools", dict(web=100)),
    "terminal_only": ("terminal and file tools", dict(terminal=100, file=100)),
    "terminal_web": ("terminal and file with web search", dict(terminal=100, file=100, web=100)),
    "creative": ("image generation and vision", dict(image_gen=90, vision=90, web=30)),
    "reasoning": ("heavy reasoning, few tools", dict(moa=90, web=30, terminal=20)),
    "browser_use": ("full browser interaction", dict(browser=100, web=80, vision=70)),
    "browser_only": ("only browser automation", dict(browser=100)),
    "browser_tasks": ("browser-focused", dict(browser=97, vision=12, terminal=15)),
    "terminal_tasks": ("terminal-focused, occasional others", dict(terminal=97, file=97, web=97, browser=75,
                                                                   vision=50, image_gen=10)),
    "mixed_tasks": ("browser, terminal and file heavy", dict(browser=92, terminal=92, file=92, web=35, vision=15,
                                                             image_gen=15)),
}
DRAWS = 20_000


def test_builtin_distributions_match_the_spec_exactly() -> None:
    assert list(BUILTIN) == list(SPEC_TABLE)
    for name, (description, probs) in SPEC_TABLE.items():
        d = BUILTIN[name]
        assert d.name == name
        assert d.description == description
        assert d.probabilities == probs
        assert set(d.probabilities) <= set(TOOLSETS)


def test_toolset_names_are_the_reference_ones() -> None:
    assert set(TOOLSETS) == {"terminal", "file", "web", "browser", "vision", "image_gen", "moa"}


def test_primary_is_highest_probability_first_listed_on_ties() -> None:
    assert BUILTIN["reasoning"].primary() == "moa"
    assert BUILTIN["browser_tasks"].primary() == "browser"
    assert BUILTIN["balanced"].primary() == "web"  # seven-way tie: the first listed
    assert BUILTIN["research"].primary() == "web"
    assert Distribution("x", "", {"moa": 5, "file": 40, "web": 40}).primary() == "file"


def expected_inclusion(d: Distribution) -> dict[str, float]:
    """P(toolset in sample): its own flip, plus for the primary the chance that every flip failed."""
    none_on = math.prod(1 - p / 100 for p in d.probabilities.values())
    return {ts: p / 100 + (none_on if ts == d.primary() else 0.0) for ts, p in d.probabilities.items()}


@pytest.mark.parametrize("name", list(SPEC_TABLE))
def test_sampling_frequencies_match_probabilities(name: str) -> None:
    d = BUILTIN[name]
    counts = dict.fromkeys(d.probabilities, 0)
    order = list(d.probabilities)
    for i in range(DRAWS):
        chosen = draw_toolsets(d, 1234, f"sample-{i}:0")
        assert chosen, "a sample must always get at least one toolset"
        assert len(set(chosen)) == len(chosen)
        positions = [order.index(ts) for ts in chosen]  # raises if a toolset is not in the distribution
        assert positions == sorted(positions)
        for ts in chosen:
            counts[ts] += 1
    for ts, p in expected_inclusion(d).items():
        sigma = math.sqrt(p * (1 - p) / DRAWS)
        freq = counts[ts] / DRAWS
        assert abs(freq - p) <= 5 * sigma + 0.002, f"{name}/{ts}: frequency {freq:.4f}, expected {p:.4f}"


def test_flips_are_independent_not_a_table_of_combinations() -> None:
    d = BUILTIN["balanced"]
    combos: dict[frozenset[str], int] = {}
    both = 0
    for i in range(DRAWS):
        chosen = set(draw_toolsets(d, 5, f"pair-{i}:0"))
        combos[frozenset(chosen)] = combos.get(frozenset(chosen), 0) + 1
        both += {"vision", "terminal"} <= chosen
    # P(vision and terminal) = 0.5 * 0.5 when the flips are independent.
    assert abs(both / DRAWS - 0.25) <= 5 * math.sqrt(0.25 * 0.75 / DRAWS)
    assert len(combos) > 100  # 127 non-empty subsets exist; a hand-written table would have a few
    assert frozenset() not in combos
    # {web} alone: its own flip with the others off (1/128), plus the all-failed fallback (1/128).
    assert abs(combos[frozenset({"web"})] / DRAWS - 2 / 128) <= 5 * math.sqrt((2 / 128) / DRAWS)


def test_fallback_is_the_primary_toolset_when_every_flip_fails() -> None:
    d = Distribution("tiny", "", {"web": 1, "moa": 2, "vision": 1})
    results = [draw_toolsets(d, 0, f"t-{i}:0") for i in range(2000)]
    alone = sum(r == ["moa"] for r in results)
    assert alone / 2000 > 0.9  # ~96% of draws enable nothing and fall back to the primary
    assert all(r for r in results)


def test_certain_toolsets_are_always_on_and_zero_never() -> None:
    d = Distribution("c", "", {"terminal": 100, "web": 0})
    assert {tuple(draw_toolsets(d, s, f"x{s}:0")) for s in range(500)} == {("terminal",)}
    assert all(draw_toolsets(BUILTIN["default"], s, f"id{s}:0") == list(TOOLSETS) for s in range(200))


def test_seeded_sampling_is_deterministic() -> None:
    d = BUILTIN["research"]
    first = [draw_toolsets(d, 42, f"id{i}:0") for i in range(300)]
    again = [draw_toolsets(d, 42, f"id{i}:0") for i in reversed(range(300))][::-1]
    assert first == again  # order of calls does not matter
    other_seed = [draw_toolsets(d, 43, f"id{i}:0") for i in range(300)]
    assert first != other_seed
    # The occurrence number is part of the identity: duplicate prompts draw independently.
    dup = [draw_toolsets(d, 42, f"id{i}:1") for i in range(300)]
    assert first != dup


def test_sampling_is_pinned() -> None:
    """Changing the sampler changes which toolsets resumed samples get: it must be deliberate."""
    assert draw_toolsets(BUILTIN["balanced"], 0, "abc:0") == ["vision", "image_gen", "terminal", "file"]
    assert draw_toolsets(BUILTIN["research"], 7, "abc:1") == ["web", "vision", "moa"]


def test_many_toolsets_extend_the_random_stream() -> None:
    # Only 7 toolsets exist today, but the sampler must not break past the 16 numbers of one digest.
    d = Distribution("wide", "", {f"t{i}": 50 for i in range(40)})
    picks = [draw_toolsets(d, 0, f"w{i}:0") for i in range(500)]
    per_toolset = [sum(f"t{i}" in p for p in picks) for i in range(40)]
    assert all(150 < c < 350 for c in per_toolset), per_toolset


_CHILD = """
import json, sys
from trajforge.catalog.distributions import BUILTIN, draw_toolsets
print(json.dumps({n: [draw_toolsets(d, 9, f"p{i}:{i % 3}") for i in range(150)] for n, d in BUILTIN.items()}))
"""


def test_sampling_is_identical_across_processes_and_hash_seeds() -> None:
    here = {n: [draw_toolsets(d, 9, f"p{i}:{i % 3}") for i in range(150)] for n, d in BUILTIN.items()}
    for hashseed in ("1", "987654"):
        env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "PYTHONHASHSEED": hashseed}
        out = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True,
                             check=True, timeout=60).stdout
        assert json.loads(out) == here


def test_all_distributions_adds_and_overrides_custom_ones() -> None:
    mine = Distribution("mine", "my own", {"terminal": 50, "web": 20})
    replaced = Distribution("minimal", "web and files", {"web": 100, "file": 100})
    merged = all_distributions({"mine": mine, "minimal": replaced})
    assert list(merged)[: len(BUILTIN)] == list(BUILTIN)
    assert merged["mine"] is mine and merged["minimal"] is replaced
    assert all_distributions() == BUILTIN and BUILTIN["minimal"].probabilities == {"web": 100}


def test_format_distributions_lists_every_name_description_and_probability() -> None:
    text = format_distributions(all_distributions({"mine": Distribution("mine", "my own", {"terminal": 50.0,
                                                                                            "web": 12.5})}))
    lines = text.splitlines()
    assert len(lines) == 2 * 18
    for i, name in enumerate([*SPEC_TABLE, "mine"]):
        head, probs = lines[2 * i], lines[2 * i + 1]
        desc = SPEC_TABLE[name][0] if name in SPEC_TABLE else "my own"
        assert head == f"{name}: {desc}"
        table = SPEC_TABLE[name][1] if name in SPEC_TABLE else {"terminal": 50, "web": 12.5}
        assert probs.strip() == ", ".join(f"{ts} {p:g}%" for ts, p in table.items())


def test_only_available_toolsets_are_drawn_and_one_is_always_there() -> None:
    """A missing top toolset no longer leaves a sample with no tools (balanced, seed 0, sample 16)."""
    d = BUILTIN["balanced"]
    here = {"terminal", "file"}
    for i in range(500):
        full = draw_toolsets(d, 0, f"s{i}:0")
        got = draw_toolsets(d, 0, f"s{i}:0", here)
        assert got, i
        assert set(got) <= here
        # Flips do not depend on availability: what came up and is here is kept as is.
        kept = [ts for ts in full if ts in here]
        assert got == (kept or ["terminal"]), (i, full, got)
    assert draw_toolsets(BUILTIN["minimal"], 0, "x:0", {"terminal"}) == []
    assert BUILTIN["development"].primary({"web", "vision"}) == "web"
    assert BUILTIN["development"].primary(set()) is None
