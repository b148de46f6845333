"""One Harbor-format task directory read into a TaskSpec (pure parsing, plus reading its files).

The format (Harbor's task directory, used by Terminal-Bench 2.0 and others):

    my-task/
      task.toml          [task] name, description; [metadata] free-form; [agent] timeout_sec;
                         [verifier] timeout_sec, env, user, isolation ("sealed"), outputs;
                         [environment] build_timeout_sec, cpus, memory ("2G") / memory_mb,
                         storage ("10G") / storage_mb, allow_internet, docker_image (prebuilt,
                         instead of a build), workdir, build_args
      instruction.md     the agent's instruction (its first user message)
      environment/       build context with a Dockerfile: the agent's container and starting state
      tests/test.sh      the verifier (+ helper files); never visible to the agent
      solution/solve.sh  optional reference solution (`--agent oracle`)

[verifier].isolation, [verifier].outputs and [environment].build_args are trajforge's own (Harbor
ignores keys it does not know). Keys this module does not know are ignored, as Harbor ignores them; features that would change what
a task means and that trajforge does not run (multi-step tasks, a separate verifier container,
several containers) are a named problem rather than a silently different task. Every problem is
`TaskProblem(path, message)`; the loader lists them like bad dataset lines.
"""

from __future__ import annotations

import datetime
import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trajforge.failures import MODES

DEFAULT_AGENT_TIMEOUT: float | None = None  # Harbor: none; the run's --timeout still bounds a sample
DEFAULT_VERIFIER_TIMEOUT = 600.0
DEFAULT_BUILD_TIMEOUT = 600.0
MAX_INSTRUCTION_BYTES = 1 << 20
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1 << 20, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}  # a bare number: MiB
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_UNSUPPORTED = {
    "steps": "multi-step tasks ([[steps]])",
}


class TaskProblem(ValueError):
    """What is wrong with one task directory; `path` is the file or directory to look at."""

    def __init__(self, path: Path, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path, self.message = path, message


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """A task as the runner needs it. Picklable (it crosses to Ray actors inside a Sample)."""

    name: str
    path: str  # the task directory, absolute
    instruction: str
    metadata: dict[str, Any] = field(default_factory=dict)
    agent_timeout: float | None = DEFAULT_AGENT_TIMEOUT
    verifier_timeout: float = DEFAULT_VERIFIER_TIMEOUT
    verifier_env: tuple[tuple[str, str], ...] = ()
    verifier_user: str | None = None
    verifier_isolation: str | None = None  # "default" | "sealed" ([verifier].isolation); None: the run's --verifier
    verifier_outputs: tuple[str, ...] = ()  # absolute paths the sealed verifier gets; (): the agent's workdir
    solution_env: tuple[tuple[str, str], ...] = ()
    build_timeout: float = DEFAULT_BUILD_TIMEOUT
    cpus: float | None = None
    memory: int | None = None  # bytes
    storage: int | None = None  # bytes
    allow_internet: bool | None = None  # None: not said (the run's default network)
    docker_image: str | None = None  # prebuilt image instead of environment/
    workdir: str | None = None  # [environment].workdir: overrides the image's WORKDIR
    build_args: tuple[tuple[str, str], ...] = ()  # [environment].build_args: --build-arg of its build
    environment_hash: str | None = None  # content hash of environment/ (None with docker_image)
    has_solution: bool = False

    @property
    def tests_dir(self) -> Path:
        return Path(self.path) / "tests"

    @property
    def solution_dir(self) -> Path:
        return Path(self.path) / "solution"

    @property
    def environment_dir(self) -> Path:
        return Path(self.path) / "environment"

    def summary(self) -> dict[str, Any]:
        """What a record says of its task (`task` field)."""
        return {"name": self.name, "path": self.path, "metadata": self.metadata}


def parse_size(value: Any) -> int | None:
    """Bytes of "2G", "512M", "1.5GiB"; None for anything else (a bare number means MiB, as Harbor's *_mb)."""
    if isinstance(value, bool) or not isinstance(value, str):
        return None
    m = _SIZE.match(value)
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()]) if m else None


def _jsonable(value: Any) -> Any:
    """TOML dates and times become ISO strings, so a record's metadata is plain JSON."""
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value


class _Table:
    """One TOML table with typed getters whose errors name `[section].key`."""

    def __init__(self, toml: Path, data: dict[str, Any], section: str) -> None:
        raw = data.get(section, {})
        if not isinstance(raw, dict):
            raise TaskProblem(toml, f"[{section}] must be a table")
        self.toml, self.section, self.raw = toml, section, raw

    def _bad(self, key: str, what: str) -> TaskProblem:
        return TaskProblem(self.toml, f"[{self.section}].{key} must be {what}, got {self.raw[key]!r}")

    def number(self, key: str, *, positive: bool = True) -> float | None:
        v = self.raw.get(key)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or (positive and v <= 0):
            raise self._bad(key, "a number above 0" if positive else "a number")
        return float(v)

    def text(self, key: str) -> str | None:
        v = self.raw.get(key)
        if v is None:
            return None
        if not isinstance(v, str) or not v.strip():
            raise self._bad(key, "a non-empty string")
        return v

    def flag(self, key: str) -> bool | None:
        v = self.raw.get(key)
        if v is not None and not isinstance(v, bool):
            raise self._bad(key, "true or false")
        return v

    def user(self, key: str) -> str | None:
        v = self.raw.get(key)
        if v is None:
            return None
        if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
            return str(v)
        if isinstance(v, str) and re.fullmatch(r"[A-Za-z0-9_.][A-Za-z0-9_.-]*(:[A-Za-z0-9_.][A-Za-z0-9_.-]*)?", v):
            return v
        raise self._bad(key, "a user name or uid")

    def env(self, key: str) -> tuple[tuple[str, str], ...]:
        v = self.raw.get(key, {})
        if not isinstance(v, dict):
            raise self._bad(key, "a table of NAME = \"value\"")
        out = []
        for name, value in v.items():
            if not _ENV_NAME.match(name) or not isinstance(value, (str, int, float)) or isinstance(value, bool):
                raise TaskProblem(self.toml, f"[{self.section}].{key}.{name} must be a variable name with a "
                                             "string or number value")
            out.append((name, str(value)))
        return tuple(out)

    def choice(self, key: str, choices: tuple[str, ...]) -> str | None:
        v = self.raw.get(key)
        if v is not None and v not in choices:
            raise self._bad(key, " or ".join(repr(c) for c in choices))
        return v

    def paths(self, key: str) -> tuple[str, ...]:
        """A list of absolute paths, none `/` itself and none with `..`."""
        v = self.raw.get(key, [])
        if not isinstance(v, list) or not all(isinstance(p, str) and p.startswith("/") and p.strip("/")
                                                and ".." not in p.split("/") for p in v):
            raise self._bad(key, "a list of absolute paths (not / itself, no ..)")
        return tuple(p.rstrip("/") for p in v)

    def size(self, key: str) -> int | None:
        """`memory = "2G"` or `memory_mb = 2048`, in bytes; both given must agree."""
        text, mb = self.raw.get(key), self.number(f"{key}_mb")
        size = None
        if text is not None:
            size = parse_size(text) if isinstance(text, str) else None
            if size is None or size <= 0:
                raise self._bad(key, 'a size such as "2G" or "512M"')
        if mb is not None:
            if size is not None and int(mb) << 20 != size:
                raise TaskProblem(self.toml, f"[{self.section}].{key} ({text}) and {key}_mb ({mb:g}) disagree")
            size = int(mb) << 20
        return size


def parse_task_toml(toml: Path, text: bytes) -> dict[str, Any]:
    try:
        data = tomllib.loads(text.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise TaskProblem(toml, f"not valid UTF-8 (byte {e.start})") from None
    except tomllib.TOMLDecodeError as e:
        raise TaskProblem(toml, f"invalid TOML: {e}") from None
    for key, what in _UNSUPPORTED.items():
        if key in data:
            raise TaskProblem(toml, f"uses {what}, which trajforge does not run")
    verifier = data.get("verifier")
    if isinstance(verifier, dict) and (verifier.get("environment_mode") == "separate" or "environment" in verifier):
        raise TaskProblem(toml, "asks for a separate verifier container ([verifier].environment), which trajforge "
                                "does not run")
    return data


def build_spec(task_dir: Path, data: dict[str, Any], instruction: str, environment_hash: str | None) -> TaskSpec:
    """The TaskSpec of a parsed task.toml. Raises TaskProblem."""
    toml = task_dir / "task.toml"
    task, agent = _Table(toml, data, "task"), _Table(toml, data, "agent")
    verifier, env, solution = _Table(toml, data, "verifier"), _Table(toml, data, "environment"), \
        _Table(toml, data, "solution")
    metadata = data.get("metadata", {})
    if not isinstance(metadata, dict):
        raise TaskProblem(toml, "[metadata] must be a table")
    workdir = env.text("workdir")
    if workdir is not None and not workdir.startswith("/"):
        raise TaskProblem(toml, f"[environment].workdir must be an absolute path, got {workdir!r}")
    return TaskSpec(
        name=task.text("name") or task_dir.name, path=str(task_dir), instruction=instruction,
        metadata=_jsonable(metadata), agent_timeout=agent.number("timeout_sec"),
        verifier_timeout=verifier.number("timeout_sec") or DEFAULT_VERIFIER_TIMEOUT,
        verifier_env=verifier.env("env"), verifier_user=verifier.user("user"), solution_env=solution.env("env"),
        verifier_isolation=verifier.choice("isolation", MODES), verifier_outputs=verifier.paths("outputs"),
        build_args=env.env("build_args"),
        build_timeout=env.number("build_timeout_sec") or DEFAULT_BUILD_TIMEOUT, cpus=env.number("cpus"),
        memory=env.size("memory"), storage=env.size("storage"), allow_internet=env.flag("allow_internet"),
        docker_image=env.text("docker_image"), workdir=workdir, environment_hash=environment_hash,
        has_solution=(task_dir / "solution" / "solve.sh").is_file(),
    )
