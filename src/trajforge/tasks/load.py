"""`--tasks PATH`: one task directory, or a directory of task directories, read into Samples.

PATH is a task when it holds `task.toml` (or `instruction.md`: a task missing its task.toml is
named as such); otherwise each of its subdirectories (hidden ones aside, sorted by name) is one.
Every problem names the task's path and what is wrong, and they are all listed at once, like bad
dataset lines: the run stops before it touches anything unless `--skip_invalid` skips them.

A task's identity is a hash of what decides how it runs: its directory name, task.toml,
instruction, environment/ and tests/ (and solution/ for `--agent oracle`, whose runs it decides),
so an edited task runs again on `--resume` and an unchanged one does not. environment/'s own
hash (`environment_hash`) names its image, so identical build contexts share one image
(tasks/environment.py).
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections import Counter
from pathlib import Path

from trajforge.dataset import LoadedDataset, Sample, listed
from trajforge.errors import DatasetError
from trajforge.task_spec import MAX_INSTRUCTION_BYTES, TaskProblem, TaskSpec, build_spec, parse_task_toml


def tree_hash(root: Path, *, metadata: bool = False) -> str:
    """A hash of a directory's names, kinds, executable bits, file contents and link targets; with
    `metadata`, every mode bit and the owner too (what a build's COPY can carry into an image)."""
    h = hashlib.blake2b(digest_size=16)
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames.sort()
        rel_dir = os.path.relpath(dirpath, root)
        for name in sorted(filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]):
            full = os.path.join(dirpath, name)
            st = os.lstat(full)
            h.update(f"{os.path.join(rel_dir, name)}\0{stat.S_IFMT(st.st_mode)}\0{st.st_mode & 0o111}\0".encode())
            if metadata:
                h.update(f"{st.st_mode & 0o7777}\0{st.st_uid}\0{st.st_gid}\0".encode())
            if stat.S_ISLNK(st.st_mode):
                h.update(os.readlink(full).encode())
            elif stat.S_ISREG(st.st_mode):
                with open(full, "rb") as f:
                    for chunk in iter(lambda: f.read(1 << 20), b""):
                        h.update(chunk)
            h.update(b"\1")
        for d in dirnames:
            h.update(f"{os.path.join(rel_dir, d)}/\0".encode())
            if metadata:
                st = os.lstat(os.path.join(dirpath, d))
                h.update(f"{st.st_mode & 0o7777}\0{st.st_uid}\0{st.st_gid}\0".encode())
    return h.hexdigest()


def _read(path: Path, what: str, limit: int) -> bytes:
    try:
        with path.open("rb") as f:
            data = f.read(limit + 1)
    except FileNotFoundError:
        raise TaskProblem(path.parent, f"missing {what}") from None
    except IsADirectoryError:
        raise TaskProblem(path, f"{what} is a directory") from None
    except OSError as e:
        raise TaskProblem(path, f"cannot read {what}: {e.strerror or e}") from None
    if len(data) > limit:
        raise TaskProblem(path, f"{what} is larger than {limit} bytes")
    return data


def read_task(task_dir: Path, *, with_solution: bool = False) -> tuple[TaskSpec, str]:
    """(spec, identity hash) of one task directory. Raises TaskProblem."""
    data = parse_task_toml(task_dir / "task.toml", _read(task_dir / "task.toml", "task.toml", 1 << 20))
    raw = _read(task_dir / "instruction.md", "instruction.md", MAX_INSTRUCTION_BYTES)
    try:
        instruction = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TaskProblem(task_dir / "instruction.md", f"not valid UTF-8 (byte {e.start})") from None
    if not instruction.strip():
        raise TaskProblem(task_dir / "instruction.md", "is empty")
    env = task_dir / "environment"
    prebuilt = isinstance(data.get("environment"), dict) and data["environment"].get("docker_image")
    if (env / "docker-compose.yaml").exists() or (env / "docker-compose.yml").exists():
        raise TaskProblem(env, "holds a docker-compose file: tasks of several containers are not supported")
    has_dockerfile = (env / "Dockerfile").is_file()
    if not has_dockerfile and not prebuilt:
        raise TaskProblem(env, "has no Dockerfile, and task.toml names no [environment].docker_image")
    if not (task_dir / "tests" / "test.sh").is_file():
        raise TaskProblem(task_dir / "tests", "has no test.sh: the task cannot be verified")
    env_hash = tree_hash(env) if has_dockerfile and not prebuilt else None
    spec = build_spec(task_dir, data, instruction, env_hash)
    if with_solution and not spec.has_solution:
        raise TaskProblem(task_dir / "solution", "has no solve.sh, which --agent oracle runs")
    h = hashlib.blake2b(digest_size=12)
    parts = [task_dir.name.encode(), (task_dir / "task.toml").read_bytes(), raw, (env_hash or "").encode(),
             tree_hash(task_dir / "tests").encode()]
    if with_solution:
        parts.append(tree_hash(task_dir / "solution").encode())
    for part in parts:
        h.update(len(part).to_bytes(8, "little") + part)
    return spec, h.hexdigest()


def task_dirs(path: Path) -> list[Path]:
    """The task directories PATH stands for (see the module doc). Raises DatasetError."""
    if not path.exists():
        raise DatasetError(f"{path}: --tasks: no such directory")
    if not path.is_dir():
        raise DatasetError(f"{path}: --tasks: not a directory (give a task directory or a directory of them)")
    if (path / "task.toml").exists() or (path / "instruction.md").exists():
        return [path]
    try:
        entries = sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith((".", "__")))
    except OSError as e:
        raise DatasetError(f"{path}: --tasks: cannot list the directory: {e.strerror or e}") from None
    if not entries:
        raise DatasetError(f"{path}: --tasks: no task directories in it (a task directory holds task.toml)")
    return entries


def load_tasks(path: Path, *, skip_invalid: bool = False, max_samples: int | None = None,
               with_solution: bool = False) -> LoadedDataset:
    """Every task of PATH as a Sample (its prompt the instruction, `task` its spec). Raises DatasetError."""
    path = path.absolute()
    samples: list[Sample] = []
    problems: list[str] = []
    seen: Counter[str] = Counter()
    dirs = task_dirs(path)
    for number, task_dir in enumerate(dirs, start=1):
        try:
            if not (task_dir / "task.toml").exists():
                raise TaskProblem(task_dir, "missing task.toml: not a task directory")
            spec, h = read_task(task_dir, with_solution=with_solution)
        except TaskProblem as e:
            problems.append(str(e))
            continue
        if max_samples is not None and len(samples) >= max_samples:
            continue  # the rest are still checked, so a bad task set is reported whole
        occurrence = seen[h]
        seen[h] += 1
        samples.append(Sample(len(samples), number, spec.instruction, f"{h}:{occurrence}", task=spec))
    if problems and not skip_invalid:
        raise DatasetError(f"{path}: {len(problems)} invalid task(s); fix them or pass --skip_invalid to skip them",
                           listed(problems))
    if not samples:
        raise DatasetError(f"{path}: no runnable task: all {len(dirs)} are invalid", listed(problems))
    return LoadedDataset(path, samples, problems)
