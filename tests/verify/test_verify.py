"""The pure parts of verification: answer matching, pass@k, judge replies, combining parts,
row fields and their defaults, and the rollout scheduler's choices (no model, no sandbox)."""

from __future__ import annotations

import asyncio
from collections import Counter
from math import comb
from pathlib import Path

import pytest

from trajforge.config import RunConfig
from trajforge.dataset import load_dataset, rollout_identity, split_rollout
from trajforge.errors import DatasetError
from trajforge.sample.outcome import Outcome
from trajforge.runner.scheduling.rollouts import RolloutScheduler, expand
from trajforge.sandbox.interface import ExecResult
from trajforge.verify.answer import last_number, matches, normalise, parse_number
from trajforge.verify.check import check_part
from trajforge.verify.judge import InvalidReply, judge_messages, parse_reply
from trajforge.verify.passk import mean_pass_at_k, pass_at_k
from trajforge.verify.result import Part, combine
from trajforge.verify.spec import VerifySpec, parse_row, problem_of, resolve
from trajforge.verify.verifier import resolve_for, validate_verification


@pytest.mark.parametrize(("answer", "expected", "mode", "ok"), [
    ("  The Answer is   PARIS. ", "the answer is paris.", "exact", True),
    ("The answer is Paris", "paris", "exact", False),
    ("I think it is\n\tParis, France", "paris, france", "contains", True),
    ("London", "paris", "contains", False),
    ("result: 42 apples", r"\b42 apples$", "regex", True),
    ("RESULT:   abc-123", r"abc-\d+", "regex", True),
    ("result 43", r"^42", "regex", False),
    ("so 3 + 4 = 7, and the answer is 42.", "42", "number", True),
    ("the total is 1,234.50 dollars", "1234.5", "number", True),
    ("it is 42 or maybe 41", "42", "number", False),  # the last number counts
    ("no digits here", "0", "number", False),
    ("-0.5", "-.5", "number", True),
    ("2e3", "2000", "number", True),
])
def test_matching_modes(answer: str, expected: str, mode: str, ok: bool) -> None:
    assert matches(answer, expected, mode) is ok


def test_number_helpers() -> None:
    assert normalise("  A\n b\tC ") == "a b c"
    assert parse_number("1,000") == 1000 and parse_number("+3") == 3 and parse_number("abc") is None
    assert parse_number("1e999") is None  # not finite
    assert last_number("x=1, y=2.5") == 2.5 and last_number("none") is None


def brute_pass_at_k(n: int, c: int, k: int) -> float:
    """pass@k by enumerating every draw of k out of n (ground truth for the estimator)."""
    from itertools import combinations

    draws = list(combinations([True] * c + [False] * (n - c), k))
    return sum(any(d) for d in draws) / len(draws)


@pytest.mark.parametrize(("n", "c", "k"), [(4, 0, 1), (4, 1, 1), (4, 2, 2), (4, 3, 4), (10, 3, 5), (6, 6, 3),
                                           (5, 1, 4)])
def test_pass_at_k_is_the_unbiased_estimator(n: int, c: int, k: int) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(brute_pass_at_k(n, c, k))
    if n >= k and n - c >= k:
        assert pass_at_k(n, c, k) == pytest.approx(1 - comb(n - c, k) / comb(n, k))


def test_pass_at_k_edges() -> None:
    assert pass_at_k(1, 1, 4) == 1.0  # stopped after its first pass: any k draws hold it
    assert pass_at_k(2, 0, 4) == 0.0
    assert pass_at_k(4, 1, 1) == 0.25
    with pytest.raises(ValueError):
        pass_at_k(2, 3, 1)
    assert mean_pass_at_k([(4, 1), (4, 0), (0, 0)], 1) == pytest.approx(0.125)
    assert mean_pass_at_k([], 1) is None


@pytest.mark.parametrize(("text", "score"), [
    ('{"score": 0.8, "reasoning": "good"}', 0.8),
    ('Here you go:\n```json\n{"score": 1, "reasoning": "exact"}\n```', 1.0),
    ('{"reasoning": "bad", "score": 0}', 0.0),
])
def test_judge_reply_parses(text: str, score: float) -> None:
    assert parse_reply(text)[0] == score


@pytest.mark.parametrize("text", ["score: 0.9", '{"score": "0.9"}', '{"score": true}', '{"score": 1.5}',
                                  '{"score": -0.1}', '{"grade": 1}', '{"score": 0.5', "", "[0.5]"])
def test_judge_reply_without_a_valid_score_is_invalid(text: str) -> None:
    with pytest.raises(InvalidReply):
        parse_reply(text)


def test_judge_prompt_holds_task_answer_and_rubric() -> None:
    msgs = judge_messages("add 2+2", None, "must say 4")
    assert msgs[0]["role"] == "system" and "score" in msgs[0]["content"]
    assert "add 2+2" in msgs[1]["content"] and "must say 4" in msgs[1]["content"]
    assert "no final answer" in msgs[1]["content"]


def test_combine_parts() -> None:
    assert combine([]) == {"passed": None, "score": None, "method": "none", "detail": {}, "error": None}
    ok = Part.verdict("check", True, {"exit_code": 0})
    judged = Part.verdict("rubric", True, {}, score=0.7)
    v = combine([ok, judged])
    assert v["passed"] is True and v["score"] == 0.7 and v["method"] == "check+rubric"
    assert v["detail"] == {"check": {"exit_code": 0}, "rubric": {}}
    assert combine([ok, Part.verdict("expected", False, {})])["passed"] is False
    err = combine([Part.verdict("expected", False, {}), Part.failure("check", "check_timeout", {})])
    assert err["passed"] is None and err["score"] is None and err["error"] == "check_timeout"


def test_check_part_from_exec_results() -> None:
    assert check_part(ExecResult(0, "ok\n", ""), 0.2, 5).passed is True
    failed = check_part(ExecResult(3, "x" * 5000, "boom"), 0.2, 5)
    assert failed.passed is False and failed.detail["exit_code"] == 3
    assert failed.detail["output_tail"].endswith("boom") and len(failed.detail["output_tail"]) < 2100
    hung = check_part(ExecResult(None, "", "", timed_out=True), 1.0, 1)
    assert hung.passed is None and hung.error == "check_timeout"


def test_row_fields_parse_and_validate() -> None:
    assert parse_row({"prompt": "p"}) == (None, None)
    problem, spec = parse_row({"check": "test -f x", "expected": 42, "match": "number", "check_timeout": 5})
    assert problem is None and spec == VerifySpec(check="test -f x", check_timeout=5.0, expected="42", match="number")
    for bad, needle in [({"check": ""}, "'check'"), ({"match": "fuzzy"}, "'match'"),
                        ({"check_timeout": 0}, "greater than 0"), ({"judge_threshold": 2}, "0..1"),
                        ({"expected": "(", "match": "regex"}, "regular expression"),
                        ({"expected": "abc", "match": "number"}, "must be a number"),
                        ({"rubric": 5}, "'rubric'"), ({"check_timeout": True}, "number")]:
        problem, _ = parse_row(bad)
        assert problem is not None and needle in problem, (bad, problem)


def test_row_wins_over_task_type_over_run_defaults() -> None:
    config = RunConfig(task_types={"code": {"check": "pytest -q", "check_timeout": 60, "match": "exact"}},
                       judge_threshold=0.7)
    r = resolve_for(config, VerifySpec(expected="ok"), "code")
    assert (r.check, r.check_timeout, r.expected, r.match, r.judge_threshold) == ("pytest -q", 60, "ok", "exact", 0.7)
    r = resolve_for(config, VerifySpec(check="make test", match="contains"), "code")
    assert r.check == "make test" and r.match == "contains" and r.methods == ["check"]
    r = resolve_for(config, None, "other")
    assert r.methods == [] and r.check_timeout == 300 and r.match == "contains"
    assert problem_of(resolve(VerifySpec(expected="a("), VerifySpec(match="regex"), check_timeout=1,
                              judge_threshold=0.5)) is not None


def test_dataset_keeps_verification_out_of_extra_and_checks_task_defaults(tmp_path: Path) -> None:
    ds = tmp_path / "d.jsonl"
    ds.write_text('{"prompt": "a", "check": "true", "topic": "x"}\n{"prompt": "b", "task_type": "num", '
                  '"expected": "seven"}\n')
    loaded = load_dataset(ds)
    assert loaded.samples[0].verify == VerifySpec(check="true") and loaded.samples[0].extra == {"topic": "x"}
    validate_verification(RunConfig(), loaded)
    config = RunConfig(task_types={"num": {"match": "number"}})
    with pytest.raises(DatasetError) as e:
        validate_verification(config, loaded)
    assert f"{ds}:2:" in str(e.value) and "must be a number" in str(e.value)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a", "match": "fuzzy"}\n')
    with pytest.raises(DatasetError) as e:
        load_dataset(bad)
    assert f"{bad}:1: field 'match'" in str(e.value)


def test_rollout_identities() -> None:
    assert rollout_identity("abc:0", 0) == "abc:0" and rollout_identity("abc:0", 3) == "abc:0#3"
    assert split_rollout("abc:0#3") == ("abc:0", 3) and split_rollout("abc:1") == ("abc:1", 0)


def _rows(tmp_path: Path, n_rows: int, n: int) -> list:
    ds = tmp_path / "d.jsonl"
    ds.write_text("".join(f'{{"prompt": "p{i}", "check": "true"}}\n' for i in range(n_rows)))
    return expand(load_dataset(ds).samples, n)


def _outcome(sample, ok: bool) -> Outcome:
    rec = {"verification": {"passed": ok}}
    return Outcome(sample.index, sample.identity, 0, "done", record=rec)


def test_expand_gives_each_rollout_its_own_identity(tmp_path: Path) -> None:
    samples = _rows(tmp_path, 2, 3)
    assert [(s.index, s.rollout) for s in samples] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert len({s.identity for s in samples}) == 6 and samples[0].identity + "#2" == samples[2].identity


def test_scheduler_runs_the_shortest_prefix_holding_k_passes_in_any_completion_order(tmp_path: Path) -> None:
    """Outcomes per rollout are fixed; whatever order rollouts finish in, the same ones run."""
    samples = _rows(tmp_path, 3, 4)
    truth = {0: [False, True, True, True], 1: [False] * 4, 2: [True, False, True, False]}

    async def drive(k: int, lifo: bool) -> tuple[list[tuple[int, int]], int]:
        sched = RolloutScheduler.build(samples, k)
        started: list[tuple[int, int]] = []
        in_flight: list = []
        while True:
            while len(in_flight) < 5:  # five workers
                s = await asyncio.wait_for(sched.next(), 1) if sched._ready or not in_flight else None
                if s is None:
                    break
                started.append((s.index, s.rollout))
                in_flight.append(s)
            if not in_flight:
                return sorted(started), sched.skipped
            s = in_flight.pop() if lifo else in_flight.pop(0)
            sched.done(s, _outcome(s, truth[s.index][s.rollout]))

    for lifo in (False, True):
        started, skipped = asyncio.run(drive(1, lifo))
        assert started == [(0, 0), (0, 1), (1, 0), (1, 1), (1, 2), (1, 3), (2, 0)] and skipped == 3 + 2
        started, skipped = asyncio.run(drive(2, lifo))
        assert started == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2), (1, 3), (2, 0), (2, 1), (2, 2)]
        assert skipped == 1 + 1


def test_scheduler_counts_passes_found_on_disk(tmp_path: Path) -> None:
    samples = _rows(tmp_path, 2, 4)
    row0 = split_rollout(samples[0].identity)[0]
    todo = [s for s in samples if s.rollout >= 2]  # rollouts 0 and 1 finished before the resume

    async def drain() -> tuple[list[tuple[int, int]], int]:
        sched = RolloutScheduler.build(todo, 1, Counter({row0: 1}))
        got = []
        while (s := await sched.next()) is not None:
            got.append((s.index, s.rollout))
            sched.done(s, _outcome(s, False))
        return got, sched.skipped

    assert asyncio.run(drain()) == ([(1, 2), (1, 3)], 2)


def test_plain_scheduler_without_stop_after_passes_is_the_list(tmp_path: Path) -> None:
    samples = _rows(tmp_path, 2, 2)

    async def drain() -> list:
        sched = RolloutScheduler.build(samples, None)
        return [s async for s in _aiter(sched)]

    async def _aiter(sched):
        while (s := await sched.next()) is not None:
            yield s

    assert asyncio.run(drain()) == samples


def test_the_example_dataset_and_config_are_valid() -> None:
    from trajforge.config.load import build_config

    root = Path(__file__).resolve().parents[2] / "examples"
    config = build_config({}, root / "verified.yaml")
    assert config.samples_per_prompt == 4 and config.stop_after_passes == 1 and config.keep == "passed"
    loaded = load_dataset(root / "verified_tasks.jsonl")
    validate_verification(config, loaded)
    methods = {m for s in loaded.samples for m in resolve_for(config, s.verify, s.task_type).methods}
    assert methods == {"check", "expected", "rubric"}
    assert resolve_for(config, loaded.samples[3].verify, "math").match == "number"


def test_passes_on_disk_reads_the_verification_not_the_text(tmp_path: Path) -> None:
    import orjson

    from trajforge.run_layout import RunLayout
    from trajforge.runner.scheduling.rollouts import passes_on_disk

    def rec(sid: str, ok: bool, text: str = "hi", tools: dict | None = None) -> bytes:
        return orjson.dumps({"prompt_index": 0, "sample_id": sid, "conversations": [{"from": "gpt", "value": text}],
                             "tool_stats": tools or {}, "verification": {"passed": ok}}) + b"\n"

    (tmp_path / "batch_0.jsonl").write_bytes(
        rec("r:0", True) + rec("r:0#1", False, text='{"verification": {"passed": true}} "passed":true')
        + rec("r:0#1", True)  # a later duplicate of a finished sample does not count
        + rec("r:0#2", True, tools={"unoffered:rm": {"count": 1}})  # dropped at the merge: no pass
        + rec("q:0", False) + b'{"prompt_index": 1, "sample_id": "q:0#1", "verif')  # torn last line
    assert passes_on_disk(RunLayout(tmp_path)) == Counter({"r:0": 1})
