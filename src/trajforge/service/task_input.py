"""Harbor task paths as a rollout service's group input: POST /v1/groups {"tasks": [...], "n": N}.

A remote client must not name arbitrary host paths: the service takes task paths only when it was
started with --tasks_root DIR, and only paths inside DIR once resolved (no `..`, no symlink out of
it); each is checked as `run --tasks` checks a task (trajforge.tasks.load.read_task) before the
group is accepted. An accepted task is copied into its lane's run directory at once, so the run
goes on with what was checked; the lane's task directory holds one link per rollout to its
group's copy, named by the rollout's sample index, so `run --tasks` over it sees the groups'
rollouts in the order the store gave them.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from trajforge.errors import UsageError
from trajforge.task_spec import TaskProblem
from trajforge.tasks.load import read_task


def accepted_task(root: Path | None, given: Any, i: int) -> Path:
    """The task directory `given` (relative to `root`, or absolute inside it), resolved; UsageError
    naming field tasks[i] and why."""
    where = f"field 'tasks[{i}]'"
    if root is None:
        raise UsageError(f"{where}: this service takes no task paths (start it with --tasks_root DIR)")
    if not isinstance(given, str) or not given or "\0" in given:
        raise UsageError(f"{where} must be the path of a task directory under --tasks_root")
    path = Path(given)
    if ".." in path.parts:
        raise UsageError(f"{where}: {given!r} must not hold '..'")
    inside = root.resolve()
    resolved = (inside / path).resolve()  # an absolute `given` stays itself
    if not resolved.is_relative_to(inside):
        raise UsageError(f"{where}: {given!r} is not inside --tasks_root once its links are resolved")
    if not resolved.is_dir():
        raise UsageError(f"{where}: {given!r} is not a task directory under --tasks_root")
    try:
        read_task(resolved)
    except TaskProblem as e:
        raise UsageError(f"{where}: {given!r}: {e.path.name} {e.message}") from None
    return resolved


def copy_task(task: Path, dest: Path) -> None:
    """The checked task, copied (links kept as links, as they were checked)."""
    shutil.copytree(task, dest, symlinks=True)


def link_rollouts(tasks: Path, copies: Path, rollouts: Iterable[tuple[int, str]]) -> None:
    """One link per rollout (sample index, group id) in `tasks` to its group's copy in `copies`."""
    tasks.mkdir(parents=True, exist_ok=True)
    for index, gid in rollouts:
        link = tasks / f"{index:08d}"
        if not link.is_symlink():
            link.symlink_to(Path("..") / copies.name / gid)
