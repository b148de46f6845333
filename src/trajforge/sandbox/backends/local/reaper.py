"""Processes of a local sample never outlive it: one cgroup (v2) per sample, killed at close.

A process group or an environment tag misses `setsid env -i sleep 1000 &`; a cgroup does not:
membership is inherited by every descendant and only a privileged process can leave. The run
owns `<cgroup2 mount>/trajforge/run-<pid>-<start time>`; each sample a child of it. close()
writes `cgroup.kill` (Linux 5.14+; older kernels: kill the listed pids until none is left).
A runner that was killed leaves its directory behind: the next run's `Cgroups.open()` kills
what is left in directories whose owner process is gone and removes them.

Unavailable (no cgroup2 mount, not writable: an unprivileged runner without delegation)
means `Cgroups.open()` returns None and the local backend falls back to its tag sweep.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from itertools import count

_PARENT = "trajforge"


def cgroup2_mount() -> str | None:
    with contextlib.suppress(OSError), open("/proc/self/mounts", encoding="utf-8") as f:
        for line in f:
            fields = line.split()
            if len(fields) > 2 and fields[2] == "cgroup2":
                return fields[1]
    return None


def _start_time(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


class SampleCgroup:
    def __init__(self, path: str) -> None:
        self.path = path
        self.procs_file = os.path.join(path, "cgroup.procs")

    def kill(self) -> None:
        try:
            with open(os.path.join(self.path, "cgroup.kill"), "w") as f:
                f.write("1")
            return
        except OSError:
            pass
        for _ in range(50):  # no cgroup.kill: a process may fork while we read, so repeat
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)

    def pids(self) -> list[int]:
        try:
            with open(self.procs_file, encoding="utf-8") as f:
                return [int(x) for x in f.read().split()]
        except OSError:
            return []

    def remove(self) -> bool:
        for delay in (0, 0.001, 0.005, 0.02, 0.05):  # killed tasks leave the cgroup as they exit
            time.sleep(delay)
            try:
                os.rmdir(self.path)
                return True
            except FileNotFoundError:
                return True
            except OSError:
                continue
        return False  # Cgroups.close() (or the next run's sweep) removes it


class Cgroups:
    """The run's cgroup directory: one SampleCgroup per local sample."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._ids = count(1)

    @classmethod
    def open(cls) -> Cgroups | None:
        mount = cgroup2_mount()
        me = os.getpid()
        if mount is None:
            return None
        parent = os.path.join(mount, _PARENT)
        try:
            os.makedirs(parent, exist_ok=True)
            sweep(parent)
            path = os.path.join(parent, f"run-{me}-{_start_time(me)}")
            os.mkdir(path)
            with open(os.path.join(path, "cgroup.procs")):  # readable: a real cgroup
                pass
        except OSError:
            return None
        return cls(path)

    def new(self) -> SampleCgroup | None:
        path = os.path.join(self.path, f"s{next(self._ids)}")
        try:
            os.mkdir(path)
        except OSError:
            return None
        return SampleCgroup(path)

    def close(self) -> None:
        _remove_run(self.path)


def sweep(parent: str) -> list[str]:
    """Kill and remove what dead runners left under `parent`; returns the directories removed."""
    removed = []
    with contextlib.suppress(OSError), os.scandir(parent) as it:
        for entry in it:
            _, pid, started = (entry.name.split("-", 2) + ["", ""])[:3]
            if not entry.name.startswith("run-") or not pid.isdigit():
                continue
            if _start_time(int(pid)) == started:
                continue  # its runner is alive
            _remove_run(entry.path)
            removed.append(entry.path)
    return removed


def _remove_run(path: str) -> None:
    with contextlib.suppress(OSError), os.scandir(path) as it:
        for entry in it:
            if entry.is_dir(follow_symlinks=False):
                sample = SampleCgroup(entry.path)
                sample.kill()
                sample.remove()
    SampleCgroup(path).remove()
