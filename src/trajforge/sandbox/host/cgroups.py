"""One cgroup per root-mode sandbox: its memory, its CPU share and its number of processes.

- memory: `memory.max` + `memory.swap.max=0` on the unified hierarchy (cgroup v2), else the v1
  controller's `memory.limit_in_bytes` and `memory.memsw.limit_in_bytes`. The sandbox's first
  process joins before anything else (sandbox_init.py), and commands fork from it, so the whole
  sample (tmpfs pages it writes included) shares one budget and the kernel's OOM killer acts in it.
- CPU: `cpu.max` (v2) or `cpu.cfs_quota_us` over `cpu.cfs_period_us` (v1): `sandbox_cpus` CPUs'
  worth of time per period, so busy loops of one sample leave the rest of the machine alone.
- processes: `pids.max` (`sandbox_nproc`), beside the per-uid RLIMIT_NPROC.
On a hybrid host (v1 controllers, an empty unified hierarchy) every controller has a tree of its
own: the sandbox gets a group in each. Group names carry the runner's pid, so `sweep` removes
those of a killed runner. Without a usable hierarchy (an unprivileged runner) there is none:
RLIMIT_AS and RLIMIT_NPROC per process stand in (factory.limits_for), and the start says so.
"""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from trajforge.sandbox.interface import SandboxError
from trajforge.sandbox.host.disk import pid_alive

ROOT = Path("/sys/fs/cgroup")
_GROUP = "trajforge"
_PERIOD = 100_000  # microseconds


@dataclass(frozen=True, slots=True)
class Hierarchies:
    """Where sandbox groups go: "v2" (one directory for every controller) or "v1" (a directory
    per controller); a controller missing from `parents` is not limited here."""

    version: str
    parents: dict[str, Path]

    def has(self, controller: str) -> bool:
        return controller in self.parents


def _writable_dir(p: Path) -> bool:
    return p.is_dir() and os.access(p, os.W_OK)


@functools.cache
def hierarchies(root: Path = ROOT) -> Hierarchies | None:
    """The hierarchies with a memory controller this runner may use, or None (not root, or none)."""
    if os.geteuid() != 0:
        return None
    for unified in (root, root / "unified"):
        with contextlib.suppress(OSError):
            controllers = (unified / "cgroup.controllers").read_text().split()
            if "memory" in controllers and _writable_dir(unified):
                parent = unified / _GROUP
                return Hierarchies("v2", {c: parent for c in ("memory", "cpu", "pids") if c in controllers})
    parents = {}
    for controller, names in (("memory", ("memory",)), ("cpu", ("cpu", "cpu,cpuacct")), ("pids", ("pids",))):
        for name in names:
            if _writable_dir(root / name) and (root / name / "cgroup.procs").exists():
                parents[controller] = root / name / _GROUP
                break
    return Hierarchies("v1", parents) if "memory" in parents else None


class SampleGroup:
    """One sandbox's cgroup(s): created with its limits, joined by its first process, removed
    once its processes are gone."""

    def __init__(self, where: Hierarchies, *, memory: int | None, cpus: float | None, pids: int | None) -> None:
        self.where, self.memory, self.cpus, self.pid_limit = where, memory, cpus, pids
        self.name = f"s-{os.getpid()}-{secrets.token_hex(4)}"
        self.dirs = sorted({parent / self.name for parent in where.parents.values()})
        self.path = where.parents["memory"] / self.name  # the memory controller's group
        v2 = where.version == "v2"
        self._events = str(self.path / ("memory.events" if v2 else "memory.oom_control"))
        self._fds: dict[str, int] = {}  # files read after every command, kept open (_read)

    def dir_of(self, controller: str) -> Path | None:
        """Its group of one controller's hierarchy, if it has one."""
        parent = self.where.parents.get(controller)
        return None if parent is None else parent / self.name

    def cpu_quota(self) -> float | None:
        """The CPUs' worth of time the kernel gives the group per period, as set; None: no quota."""
        cpu = self.dir_of("cpu")
        if cpu is None:
            return None
        try:
            if self.where.version == "v2":
                quota, period = (cpu / "cpu.max").read_text().split()
            else:
                quota, period = (cpu / "cpu.cfs_quota_us").read_text(), (cpu / "cpu.cfs_period_us").read_text()
        except (OSError, ValueError):
            return None
        return None if quota.strip() in ("max", "-1") else int(quota) / int(period)

    @property
    def procs(self) -> list[str]:
        """The cgroup.procs file of each of its groups: a process joins by writing "0" to each."""
        return [str(d / "cgroup.procs") for d in self.dirs]

    def _settings(self) -> list[tuple[str, Path, str, bool]]:
        """(controller, file, value, required) to write once the groups exist."""
        v2, out = self.where.version == "v2", []
        mem = self.where.parents.get("memory")
        if self.memory and mem is not None:
            d = mem / self.name
            out += [("memory", d / ("memory.max" if v2 else "memory.limit_in_bytes"), str(self.memory), True),
                    ("memory", d / ("memory.swap.max" if v2 else "memory.memsw.limit_in_bytes"),
                     "0" if v2 else str(self.memory), False)]  # no swap accounting here: RAM only
        cpu = self.where.parents.get("cpu")
        if self.cpus and cpu is not None:  # v1: a new group's period is the kernel's default, _PERIOD
            quota, d = max(1000, int(self.cpus * _PERIOD)), cpu / self.name
            out += [("cpu", d / "cpu.max", f"{quota} {_PERIOD}", True)] if v2 else \
                [("cpu", d / "cpu.cfs_quota_us", str(quota), True)]
        pids = self.where.parents.get("pids")
        if self.pid_limit and pids is not None:
            out.append(("pids", pids / self.name / "pids.max", str(self.pid_limit), True))
        return out

    def create(self) -> SampleGroup:
        try:
            for parent in sorted(set(self.where.parents.values())):
                if not parent.exists():
                    parent.mkdir(exist_ok=True)
                    if self.where.version == "v2":  # the controllers for our groups beneath
                        (parent / "cgroup.subtree_control").write_text(
                            " ".join(f"+{c}" for c in self.where.parents))
            for d in self.dirs:
                d.mkdir()
            for _controller, path, value, required in self._settings():
                try:
                    write(path, value)
                except OSError:
                    if required:
                        raise
        except OSError as e:
            self.remove()
            raise SandboxError(f"cannot create the sample's cgroup {self.name}: {e}") from e
        return self

    def _read(self, path: str) -> bytes:
        """A file of the group, read often: kept open, since a cgroup file is generated afresh by
        each read from offset 0; bytes, no text layer."""
        fd = self._fds.get(path)
        if fd is None:
            fd = self._fds[path] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        return os.pread(fd, 1 << 16, 0)

    def pids(self) -> list[int]:
        try:
            return [int(x) for x in self._read(str(self.path / "cgroup.procs")).split()]
        except (OSError, ValueError):
            return []

    def oom_kills(self) -> int:
        """The group's count of OOM kills (read after every command)."""
        try:
            return oom_kill_count(self._read(self._events))
        except (OSError, ValueError):
            return 0

    def remove(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        for d in self.dirs:
            _remove(d)


def write(path: Path | str, value: str) -> None:
    """A cgroup file written in one write(2) (no text layer: a cgroup file takes one value a write)."""
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _remove(group: Path) -> None:
    # A group empties once its processes are reaped: a few retries cover the kernel's lag.
    for _ in range(50):
        try:
            group.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            with contextlib.suppress(OSError):
                for pid in (group / "cgroup.procs").read_text().split():
                    with contextlib.suppress(OSError):
                        os.kill(int(pid), 9)
            time.sleep(0.01)  # bounded (0.5 s): processes of a killed namespace are still exiting


def oom_kill_count(events: bytes) -> int:
    """The `oom_kill` line of memory.events (v2) or memory.oom_control (v1), 0 without one."""
    for line in events.splitlines():
        key, _, value = line.partition(b" ")
        if key == b"oom_kill":
            return int(value)
    return 0


def sweep() -> list[str]:
    """Remove the groups of runners that are dead (their pid is in the name); what went."""
    where = hierarchies()
    gone: list[str] = []
    for parent in sorted(set(where.parents.values())) if where is not None else ():
        if not parent.is_dir():
            continue
        for group in parent.iterdir():
            parts = group.name.split("-")
            if len(parts) == 3 and parts[0] == "s" and parts[1].isdigit() and not pid_alive(int(parts[1])):
                with contextlib.suppress(OSError):
                    group.rmdir()  # only succeeds once its processes are gone, which is what we want
                    gone.append(str(group))
    return gone
