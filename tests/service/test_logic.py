"""The rollout service's pure decisions, without a service: max_staleness, and a group as
Atropos' ScoredData."""

from __future__ import annotations

from trajforge.service.atropos import scored_data
from trajforge.service.core import too_stale


def test_max_staleness_counts_the_versions_a_group_started_under() -> None:
    assert not too_stale(set(), 3, 1)
    assert not too_stale({3}, 3, 1)
    assert too_stale({3}, 4, 1)
    assert not too_stale({3}, 4, 2)
    assert too_stale({2, 3}, 4, 2)
    assert not too_stale({None}, None, 1)  # no version stamped: one "version"


def rollout(status: str, reward: float | None, segments: list[dict] | None) -> dict:
    record = None if status != "scored" else {"sample_id": "s", "tokens": None if segments is None else
                                              {"segments": segments, "prefix_breaks": 0}}
    return {"status": status, "reward": reward, "record": record}


SEGMENT = {"input_ids": [1, 2, 3, 4], "loss_mask": [0, 0, 1, 1], "logprobs": [None, None, -0.5, -0.25], "turns": [0]}


def test_a_group_becomes_scored_data_with_atropos_masks_and_logprobs() -> None:
    group = {"rollouts": [rollout("scored", 1.0, [SEGMENT]), rollout("masked", None, None),
                          rollout("scored", 0.0, [SEGMENT, SEGMENT])]}
    body, why = scored_data(group)
    assert why is None and body is not None
    assert body["tokens"] == [[1, 2, 3, 4]] * 3
    assert body["masks"] == [[-100, -100, 3, 4]] * 3
    assert body["inference_logprobs"] == [[1.0, 1.0, -0.5, -0.25]] * 3
    assert body["scores"] == [1.0, 0.0, 0.0]  # a sequence per segment, each with its rollout's reward


def test_a_group_without_token_ids_or_scored_rollouts_is_not_pushed() -> None:
    assert scored_data({"rollouts": [rollout("scored", 1.0, [SEGMENT]), rollout("scored", 1.0, None)]}) == \
        (None, "no_tokens")
    assert scored_data({"rollouts": [rollout("masked", None, None), rollout("dropped", None, None)]}) == \
        (None, "no_usable")
