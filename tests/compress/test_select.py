"""Boundary selection of the compressor: pairs never split, head and tail protected, smallest region."""

from __future__ import annotations

import random

import pytest

from trajforge.compress.select import Protection, choose_region, compressible_window, is_cut


def _roles(steps: int) -> list[str]:
    roles = ["system", "human"]
    for _ in range(steps):
        roles += ["gpt", "tool"]
    return roles + ["gpt"]


def test_under_budget_is_left_alone() -> None:
    roles = _roles(3)
    plan = choose_region(roles, [10] * len(roles), target=1000, overhead=50, protection=Protection())
    assert plan.region is None and plan.reaches_target


def test_smallest_region_that_fits_and_head_tail_protected() -> None:
    roles = _roles(6)  # 15 turns: head = 0..3, tail = 11..14
    tokens = [100, 50] + [20, 500] * 6 + [30]
    tokens[7] = 2000  # one huge tool response in the middle
    plan = choose_region(roles, tokens, target=sum(tokens) - 1500, overhead=100, protection=Protection())
    r = plan.region
    assert plan.reaches_target and r is not None
    # the single gpt+tool pair holding the huge response is enough, and it is the cheapest choice
    assert (r.start, r.end) == (6, 8)
    assert r.tokens == 2020


def test_region_never_ends_on_a_tool_turn() -> None:
    roles = _roles(6)
    tokens = [10] * len(roles)
    tokens[4] = 400  # a gpt turn; its tool turn (5) must come along
    plan = choose_region(roles, tokens, target=sum(tokens) - 350, overhead=10, protection=Protection())
    assert plan.region is not None
    assert (plan.region.start, plan.region.end) == (4, 6)


def test_tail_starting_on_a_tool_turn_keeps_its_call_out_of_the_region() -> None:
    roles = _roles(6)  # n=15; last 3 turns = tool(12)? -> 12 is gpt, use last 4 -> starts at 11 (tool)
    assert roles[11] == "tool"
    lo, hi = compressible_window(roles, Protection(last_n_turns=4))
    assert lo == 4 and hi == 10  # the gpt turn 10 that called tool 11 stays with the tail
    assert is_cut(roles, lo) and is_cut(roles, hi)


def test_head_with_first_tool_unprotected_still_keeps_the_pair_together() -> None:
    roles = _roles(5)
    lo, _ = compressible_window(roles, Protection(first_tool=False))
    assert lo == 4  # index 3 is the first tool turn: a region cannot start there, cut moves past it


def test_unreachable_budget_takes_the_whole_middle_and_says_so() -> None:
    roles = _roles(5)
    tokens = [1000] * len(roles)
    plan = choose_region(roles, tokens, target=100, overhead=50, protection=Protection())
    assert not plan.reaches_target and plan.region is not None
    lo, hi = compressible_window(roles, Protection())
    assert (plan.region.start, plan.region.end) == (lo, hi)


def test_nothing_compressible_when_head_meets_tail() -> None:
    roles = ["system", "human", "gpt", "tool", "gpt"]
    plan = choose_region(roles, [5000] * 5, target=100, overhead=50, protection=Protection())
    assert plan.region is None and not plan.reaches_target


def test_summary_no_smaller_than_the_middle_is_not_planned() -> None:
    roles = _roles(4)
    tokens = [3000, 10] + [10] * (len(roles) - 2)
    plan = choose_region(roles, tokens, target=100, overhead=500, protection=Protection())
    assert plan.region is None and not plan.reaches_target


def _random_roles(rng: random.Random) -> list[str]:
    roles = ["system", "human"] if rng.random() < 0.9 else ["human"]
    for _ in range(rng.randint(0, 14)):
        r = rng.random()
        if r < 0.6:
            roles += ["gpt", "tool"] + (["tool"] if rng.random() < 0.2 else [])
        elif r < 0.8:
            roles.append("gpt")
        else:
            roles.append("human")
    return roles


@pytest.mark.parametrize("seed", range(6))
def test_random_plans_obey_every_rule_and_are_minimal(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(300):
        roles = _random_roles(rng)
        tokens = [rng.randint(0, 400) for _ in roles]
        prot = Protection(*(rng.random() < 0.8 for _ in range(4)), last_n_turns=rng.randint(0, 5))
        target = rng.randint(100, max(101, sum(tokens)))
        overhead = rng.randint(1, 200)
        plan = choose_region(roles, tokens, target=target, overhead=overhead, protection=prot)
        total = sum(tokens)
        if total <= target:
            assert plan.region is None
            continue
        lo, hi = compressible_window(roles, prot)
        # every region both ends on a valid cut inside the window
        candidates = [(s, e) for s in range(lo, hi + 1) for e in range(s + 1, hi + 1)
                      if is_cut(roles, s) and is_cut(roles, e)]
        fitting = [(sum(tokens[s:e]), s, e) for s, e in candidates if total - sum(tokens[s:e]) + overhead <= target]
        if fitting:
            best = min(fitting)
            assert plan.reaches_target and plan.region is not None
            assert (plan.region.tokens, plan.region.start, plan.region.end)[0] == best[0]
            assert plan.region.start == min(s for t, s, _ in fitting if t == best[0])
        else:
            assert not plan.reaches_target
        r = plan.region
        if r is None:
            continue
        assert lo <= r.start < r.end <= hi
        assert roles[r.start] != "tool" and (r.end == len(roles) or roles[r.end] != "tool")
        n = len(roles)
        for role in ("system", "human", "gpt", "tool"):
            if getattr(prot, f"first_{role}") and role in roles:
                assert roles.index(role) < r.start
        assert r.end <= n - prot.last_n_turns
