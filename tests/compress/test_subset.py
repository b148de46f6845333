"""--sample_percent: a reproducible seeded sample, or the most valuable trajectories by a documented score."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.compress_data import read_jsonl, trajectory, write_jsonl
from trajforge.cli.compress import main
from trajforge.compress.subset import SCORE_FORMULA, quality, sample_size, select


def _run(*args: str) -> int:
    # Everything is far under this budget, so no summariser is needed.
    return main([*args, "--target_max_tokens=1000000"])


def test_sample_size_follows_the_reference() -> None:
    assert sample_size(200, 15) == 30
    assert sample_size(10, 1) == 1  # never zero from a non-empty input
    assert sample_size(7, 100) == 7
    assert sample_size(0, 50) == 0


def test_random_sample_is_seeded_ordered_and_reproducible(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [trajectory(i, steps=1, response_words=5) for i in range(100)])
    outs = []
    for n, seed in enumerate((7, 7, 8)):
        out = tmp_path / f"out{n}.jsonl"
        assert _run(f"--input={src}", f"--output={out}", "--sample_percent=20", f"--seed={seed}") == 0
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]
    assert outs[0] != outs[2]
    kept = [r["prompt_index"] for r in read_jsonl(tmp_path / "out0.jsonl")]
    assert len(kept) == 20 and kept == sorted(kept)
    src_lines = set(src.read_bytes().splitlines())
    assert all(line in src_lines for line in outs[0].splitlines())  # sampled lines are unchanged
    m = json.loads((tmp_path / "out0_metrics.json").read_text())
    assert m["sampling"] == {"mode": "random", "percent": 20.0, "seed": 7, "input_trajectories": 100, "kept": 20}


def test_quality_score_parts() -> None:
    best = quality(trajectory(0, steps=3, response_words=5))
    assert best.score == 10 and best.distinct_tools == 3
    assert quality(trajectory(0, steps=3, response_words=5, completed=False)).parts["finished"] == 0
    assert quality(trajectory(0, steps=3, response_words=5, think=False)).score == 8
    hallucinated = quality(trajectory(0, steps=3, response_words=5, offered=("terminal", "read_file")))
    assert hallucinated.parts["no_hallucinated_calls"] == 0 and hallucinated.distinct_tools == 2
    failing = quality(trajectory(0, steps=4, response_words=5, failures=1))
    assert failing.parts["tool_success_rate"] == 0.75 and failing.score == pytest.approx(9.5)
    no_tools = quality(trajectory(0, steps=0, response_words=5))
    assert no_tools.parts["tool_success_rate"] == 0 and no_tools.score == 8


def test_quality_sample_keeps_the_best_and_breaks_ties_by_tool_diversity(tmp_path: Path) -> None:
    rows = [
        trajectory(0, steps=3, response_words=5, tool="terminal"),  # score 10, one tool
        trajectory(1, steps=3, response_words=5, completed=False),  # 6
        trajectory(2, steps=3, response_words=5),  # score 10, three tools: wins the tie
        trajectory(3, steps=3, response_words=5, think=False),  # 8
        trajectory(4, steps=3, response_words=5, offered=("terminal",)),  # 8: calls tools never offered
        trajectory(5, steps=4, response_words=5, failures=2),  # 9
        trajectory(6, steps=2, response_words=5),  # score 10, two tools
        trajectory(7, steps=3, response_words=5, tool="read_file"),  # score 10, one tool
        trajectory(8, steps=0, response_words=5),  # 8: no tool calls
        trajectory(9, steps=3, response_words=5, completed=False, think=False),  # 4
    ]
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    sel = select(src, 20, "quality", seed=1)
    assert sel.chosen == {2, 6}
    assert sel.scores == {2: 10.0, 6: 10.0}
    sel4 = select(src, 40, "quality", seed=1)
    assert {2, 6} < sel4.chosen and sel4.chosen <= {0, 2, 6, 7}
    assert _run(f"--input={src}", "--sample_percent=50", "--sample_by=quality") == 0
    kept = [r["prompt_index"] for r in read_jsonl(tmp_path / "in_compressed.jsonl")]
    assert kept == [0, 2, 5, 6, 7]
    m = json.loads((tmp_path / "in_compressed_metrics.json").read_text())
    assert m["sampling"]["score_formula"] == SCORE_FORMULA
    assert m["sampling"]["kept_scores"] == {"min": 9.0, "max": 10.0, "mean": 9.8}
    assert [t["quality_score"] for t in m["trajectories"]] == [10.0, 10.0, 9.0, 10.0, 10.0]


def test_sample_by_needs_a_percent(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [trajectory(0, steps=1, response_words=5)])
    assert _run(f"--input={src}", "--sample_by=quality") == 2
    assert "--sample_by needs --sample_percent" in capsys.readouterr().err


def test_quality_ranks_by_verification_score_first(tmp_path: Path) -> None:
    """A run's verification score outranks the heuristic; unscored trajectories rank last."""
    def verified(row: dict, score: float | None) -> dict:
        row["verification"] = {"passed": None if score is None else score >= 0.5, "score": score,
                               "method": "rubric", "detail": {}, "error": None if score is not None else "judge_invalid"}
        return row

    rows = [
        verified(trajectory(0, steps=3, response_words=5), 0.2),  # heuristic 10, judged poorly
        verified(trajectory(1, steps=3, response_words=5, completed=False, think=False), 0.9),  # heuristic 4
        verified(trajectory(2, steps=3, response_words=5), None),  # could not be verified
        verified(trajectory(3, steps=3, response_words=5, think=False), 0.9),  # heuristic 8: wins the tie at 0.9
        verified(trajectory(4, steps=3, response_words=5), 0.5),
    ]
    assert quality(rows[1]).verification == 0.9 and quality(rows[2]).verification is None
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    assert select(src, 20, "quality", seed=1).chosen == {3}
    assert select(src, 40, "quality", seed=1).chosen == {1, 3}
    assert select(src, 80, "quality", seed=1).chosen == {0, 1, 3, 4}
