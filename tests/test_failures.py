"""The failure-class table (trajforge.failures): what a trainer masks and what it scores, and the
docs' copy of the table (docs/training.md)."""

from __future__ import annotations

import re

import pytest

from tests.conftest import REPO
from tests.support.docs import documents
from trajforge.failures import (
    AGENT, DROPPED, ERROR, FAILED, PARTIAL, REWARD_0, SAMPLE_CLASSES, TABLE, failure_class, masks, rollout_class,
)
from trajforge.runner.reporting.stats import Totals
from trajforge.sample.outcome import FAILURE_CLASSES


def _row(cls) -> str:  # type: ignore[no-untyped-def]
    return f"| `{cls.name}` | {cls.stage} | {cls.mode or 'any'} | {cls.cause} | {cls.becomes} | {cls.when} |"


def test_the_docs_hold_the_table_as_the_code_has_it() -> None:
    found = [t for doc in documents() for t in re.findall(r"<!-- failure-table -->\n(.*?)<!-- /failure-table -->",
                                                           (REPO / doc).read_text(encoding="utf-8"), re.S)]
    assert len(found) == 1, "one failure table in the docs"
    lines = found[0].strip().splitlines()
    assert lines[:2] == ["| failure | stage | mode | cause | becomes | when |", "| --- | --- | --- | --- | --- | --- |"]
    assert lines[2:] == [_row(c) for c in TABLE]


def test_the_sample_stage_is_the_outcomes_failure_classes() -> None:
    assert FAILURE_CLASSES == SAMPLE_CLASSES
    assert all(masks(failure_class(c)) and failure_class(c).becomes == FAILED for c in SAMPLE_CLASSES)


def test_the_cause_decides_the_mask_and_each_becoming_has_one_kind_of_cause() -> None:
    for row in TABLE:
        assert masks(row) == (row.cause != AGENT)
        if row.becomes in (FAILED, ERROR):
            assert masks(row), row  # no record or no verdict: never a score
        if row.becomes in (REWARD_0, DROPPED):
            assert not masks(row), row


def record(**fields):  # type: ignore[no-untyped-def]
    return {"end_reason": "answer", "verification": {"passed": True, "score": 1.0, "error": None}, **fields}


@pytest.mark.parametrize(("status", "reason", "rec", "name", "masked"), [
    ("done", None, record(), None, None),
    ("done", None, record(verification={"passed": False, "score": 0.0, "error": None}), None, None),
    ("done", None, record(end_reason="max_turns"), "max_turns", False),
    ("done", None, record(end_reason="length"), "length", False),
    ("done", None, record(end_reason="max_cost_per_sample"), "max_cost_per_sample", True),
    ("done", None, record(end_reason="max_tokens_per_sample"), "max_tokens_per_sample", True),
    ("done", None, record(verification={"passed": None, "score": None, "error": "check_timeout"}), "check_timeout",
     True),
    ("done", None, record(verification={"passed": None, "score": None, "error": "judge_failed"}), "judge_failed", True),
    # a task's verifier: an error (sealed mode) masks, a failure the agent could have caused scores 0
    ("done", None, record(verification={"passed": None, "error": "verifier_timeout"}), "verifier_timeout", True),
    ("done", None, record(verification={"passed": False, "score": 0.0, "failure": "verifier_timeout"}),
     "verifier_timeout", False),
    ("done", None, record(verification={"passed": None, "error": "a_new_kind"}), "a_new_kind", True),
    ("failed", "sandbox", None, "sandbox", True),
    ("failed", "api_error", None, "api_error", True),
    ("failed", "build", None, "build", True),
    ("failed", "no_such_class", None, "internal", True),
    ("discarded", "no_reasoning", None, "no_reasoning", False),
    ("done", "hallucinated_tool", record(), "hallucinated_tool", False),
])
def test_a_rollout_is_masked_only_when_the_policy_cannot_be_blamed(status, reason, rec, name, masked) -> None:  # type: ignore[no-untyped-def]
    row = rollout_class(status, reason, rec)
    assert (row and row.name) == name
    if row is not None:
        assert masks(row) is masked


def test_run_statistics_count_what_a_trainer_masks_by_the_same_table() -> None:
    totals = Totals()
    totals.add_record(record())
    totals.add_record(record(end_reason="max_turns"))
    totals.add_record(record(end_reason="max_cost_per_sample"))
    totals.add_record(record(verification={"passed": None, "score": None, "error": "check_error"}))
    totals.failed["sandbox"] += 2
    samples = totals.figures().samples
    assert samples.masked == 4
    assert samples.masked_by_class == {"sandbox": 2, "check_error": 1, "max_cost_per_sample": 1}
    again = Totals()
    again.load_state(totals.state())  # the incremental merge keeps them
    assert again.masked == totals.masked
    assert failure_class("max_turns").becomes == PARTIAL
