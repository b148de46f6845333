"""Verifier: the per-process object the sample worker asks to verify one finished session.

It resolves a sample's verification (row fields over task-type defaults over run defaults),
runs the `check` in the still-open sandbox (`in_sandbox`), then, once the sandbox is gone, the
expected-answer match and the rubric judge (`finish`). The judge is skipped when an earlier part
already failed: its verdict could not change the outcome, and it would cost a model call.
The judge's client is the run's own unless a judge endpoint is configured; it is built on
first use and closed with the worker.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from trajforge.model.types import ModelClient, Usage
from trajforge.sandbox.interface import Sandbox
from trajforge.verify.answer import matches
from trajforge.verify.check import run_check
from trajforge.errors import DatasetError, UsageError
from trajforge.verify.judge import judge, judge_endpoint_problem, judge_settings_differ, make_judge_client
from trajforge.verify.result import Part, combine
from trajforge.verify.spec import ROW_FIELDS, Resolved, VerifySpec, problem_of, resolve

if TYPE_CHECKING:
    from trajforge.config import RunConfig


class Row(Protocol):
    """What verification reads of a dataset row (trajforge.dataset.Sample, which sits above verify)."""

    line: int
    task_type: str | None
    verify: VerifySpec | None


class Rows(Protocol):
    """What verification reads of a loaded dataset (trajforge.dataset.LoadedDataset)."""

    path: Any
    samples: Sequence[Row]


def resolve_for(config: RunConfig, row: VerifySpec | None, task_type: str | None) -> Resolved:
    tt = config.task_type(task_type)
    default = VerifySpec(**{name: getattr(tt, name) for name in ROW_FIELDS}) if tt else None
    return resolve(row, default, check_timeout=config.check_timeout,
                   judge_threshold=config.judge_threshold)


def final_answer(turns: list[Any], end_reason: str) -> str | None:
    """The agent's final answer: the text of its last turn, when it ended by answering."""
    if end_reason != "answer" or not turns:
        return None
    return turns[-1].content or None


class Verifier:
    def __init__(self, config: RunConfig, agent_model: ModelClient) -> None:
        self.config = config
        self._agent_model = agent_model
        self._judge: ModelClient | None = None

    def spec(self, sample: Row) -> Resolved:
        return resolve_for(self.config, getattr(sample, "verify", None), sample.task_type)

    async def in_sandbox(self, spec: Resolved, sandbox: Sandbox) -> Part | None:
        """Run the check (if any); call it after the agent's last turn, before the sandbox closes."""
        if spec.check is None:
            return None
        return await run_check(sandbox, spec.check, spec.check_timeout)

    async def finish(self, spec: Resolved, check: Part | None, *, task: str,
                     answer: str | None) -> tuple[dict[str, Any], Usage]:
        parts = [check] if check is not None else []
        if spec.expected is not None:
            ok = answer is not None and matches(answer, spec.expected, spec.match)
            detail: dict[str, Any] = {"match": spec.match, "answer_tail": (answer or "")[-300:]}
            if answer is None:
                detail["message"] = "no final answer"
            parts.append(Part.verdict("expected", ok, detail))
        usage = Usage()
        if spec.rubric is not None:
            if any(p.passed is not True for p in parts):
                parts.append(Part("rubric", None, None, {"skipped": "an earlier verification did not pass"}))
            else:
                part, usage = await judge(self._judge_client(), task=task, answer=answer, rubric=spec.rubric,
                                          threshold=spec.judge_threshold)
                parts.append(part)
        return combine(parts), usage

    def _judge_client(self) -> ModelClient:
        if not judge_settings_differ(self.config):
            return self._agent_model
        if self._judge is None:
            self._judge = make_judge_client(self.config)
        return self._judge

    async def aclose(self) -> None:
        if self._judge is not None:
            await self._judge.aclose()
            self._judge = None


def validate_verification(config: RunConfig, dataset: Rows) -> None:
    """Before a run touches its directory: every row's resolved verification is usable, something
    can pass when --keep passed / --stop_after_passes ask for passes, and the judge endpoint has a
    key when some row has a rubric. Raises DatasetError / UsageError."""
    check_verification_settings(config, dataset.path, *check_row_verification(config, dataset.path, dataset.samples))


def check_row_verification(config: RunConfig, path: Any, samples: Iterable[Row]) -> tuple[bool, bool]:
    """The rows' part of validate_verification, over samples as they stream by (the runner's one
    pass over a dataset): (some row has a rubric, some row is verified). Raises DatasetError."""
    problems: list[str] = []
    rubric = verified = False
    seen: dict[tuple[VerifySpec | None, str | None], tuple[Resolved, str | None]] = {}
    for s in samples:
        if getattr(s, "task", None) is not None:  # a task's hidden tests verify it (trajforge.tasks)
            verified = True
            continue
        known = seen.get((s.verify, s.task_type))  # most rows share their (row spec, task type)
        if known is None:
            resolved = resolve_for(config, s.verify, s.task_type)
            known = seen[(s.verify, s.task_type)] = (resolved, problem_of(resolved))
        resolved, problem = known
        if problem is not None:
            problems.append(f"{path}:{s.line}: {problem} (task_type {s.task_type!r})"
                            if s.task_type else f"{path}:{s.line}: {problem}")
        rubric = rubric or resolved.rubric is not None
        verified = verified or bool(resolved.methods)
    if problems:
        listed = problems[:20] + ([f"... and {len(problems) - 20} more"] if len(problems) > 20 else [])
        raise DatasetError(f"{path}: {len(problems)} row(s) with an unusable verification", listed)
    return rubric, verified


def check_verification_settings(config: RunConfig, path: Any, rubric: bool, verified: bool) -> None:
    """The settings' part of validate_verification, once the rows are known. Raises UsageError."""
    if not verified and (config.keep == "passed" or config.stop_after_passes is not None):
        flag = "--keep passed" if config.keep == "passed" else "--stop_after_passes"
        raise UsageError(f"{flag}: no row of {path} has a check, expected answer or rubric (nor does a "
                         "task_types default give one), so no rollout could ever pass")
    if rubric:
        problem = judge_endpoint_problem(config)
        if problem is not None:
            raise UsageError(problem)
