"""Task statistics (pure aggregation over the records of `--tasks` runs), as runner.reporting.figures.TaskFigures.

Per task (by name) and per `metadata.category` and `metadata.difficulty`: rollouts, rewards read
(verdicts), mean reward, passes (reward >= --pass_threshold), verification errors, and pass@1 /
pass@k from each task's verdicts (the unbiased estimator, averaged over the tasks of the group
that have one). `below_full` lists the tasks some rollout of which did not reach a reward of 1 or
had an error: for `--agent oracle`, the tasks whose reference solution does not solve them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trajforge.runner.reporting.figures import TaskFigures, TaskGroupFigures
from trajforge.verify.passk import mean_pass_at_k

FULL_REWARD = 1.0
NONE = "(none)"


@dataclass
class _Task:
    category: str
    difficulty: str
    rollouts: int = 0
    rewards: list[float] = field(default_factory=list)
    passes: int = 0
    errors: int = 0


@dataclass
class TaskTotals:
    tasks: dict[str, _Task] = field(default_factory=dict)

    def add(self, rec: dict[str, Any]) -> None:
        task = rec.get("task")
        if not isinstance(task, dict):
            return
        meta = task.get("metadata") if isinstance(task.get("metadata"), dict) else {}
        name = str(task.get("name"))
        t = self.tasks.setdefault(name, _Task(_label(meta.get("category")), _label(meta.get("difficulty"))))
        t.rollouts += 1
        v = rec.get("verification") if isinstance(rec.get("verification"), dict) else {}
        if v.get("error"):
            t.errors += 1
        elif isinstance(v.get("reward"), (int, float)):
            t.rewards.append(float(v["reward"]))
            t.passes += v.get("passed") is True

    def figures(self, k: int) -> TaskFigures | None:
        if not self.tasks:
            return None
        per_task = {name: _group([t], k) for name, t in sorted(self.tasks.items())}
        by_category: dict[str, list[_Task]] = {}
        by_difficulty: dict[str, list[_Task]] = {}
        for t in self.tasks.values():
            by_category.setdefault(t.category, []).append(t)
            by_difficulty.setdefault(t.difficulty, []).append(t)
        below = sorted(name for name, t in self.tasks.items()
                       if t.errors or not t.rewards or min(t.rewards) < FULL_REWARD)
        return TaskFigures(all=_group(list(self.tasks.values()), k), per_task=per_task,
                           by_category={c: _group(ts, k) for c, ts in sorted(by_category.items())},
                           by_difficulty={d: _group(ts, k) for d, ts in sorted(by_difficulty.items())},
                           below_full_reward=below)


def _label(value: Any) -> str:
    return NONE if value is None or value == "" else str(value)


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 6)


def _group(tasks: list[_Task], k: int) -> TaskGroupFigures:
    rewards = [r for t in tasks for r in t.rewards]
    verdicts = [(len(t.rewards), t.passes) for t in tasks]
    return TaskGroupFigures(
        tasks=len(tasks), rollouts=sum(t.rollouts for t in tasks), verdicts=len(rewards),
        mean_reward=_round(sum(rewards) / len(rewards)) if rewards else None,
        passed=sum(t.passes for t in tasks), errors=sum(t.errors for t in tasks),
        pass_at_1=_round(mean_pass_at_k(verdicts, 1)), pass_at_k=_round(mean_pass_at_k(verdicts, k)), k=k)


def table_rows(t: TaskFigures | None) -> list[tuple[str, str]]:
    """Rows of the end-of-run table for a task run."""
    if t is None:
        return []
    fmt = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
    a = t.all
    rows = [(f"tasks: mean reward, pass@1 / pass@{a.k}",
             f"{fmt(a.mean_reward)}, {fmt(a.pass_at_1)} / {fmt(a.pass_at_k)} ({a.tasks} tasks)")]
    for title, groups in (("category", t.by_category), ("difficulty", t.by_difficulty)):
        if len(groups) > 1 or NONE not in groups:
            rows += [(f"  {title} {name}", f"reward {fmt(g.mean_reward)}, {g.passed}/{g.verdicts} passed"
                      + (f", {g.errors} errors" if g.errors else "")) for name, g in groups.items()]
    return rows
