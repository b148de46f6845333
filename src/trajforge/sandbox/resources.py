"""Per-sample resource limits of the bwrap sandbox: memory, /tmp and /dev/shm, workspace disk.

- memory: a memory cgroup per sample (cgroup v2 `memory.max` + `memory.swap.max=0` where the
  unified hierarchy has the memory controller, else the v1 controller's `memory.limit_in_bytes`
  and `memory.memsw.limit_in_bytes`). bwrap and the sample's helper (or the container's init)
  join it before the first command, and commands fork from the helper, so the whole sample
  (tmpfs pages it writes included) shares one budget and the kernel's OOM killer acts inside it. Without a usable cgroup (unprivileged runner), RLIMIT_AS per
  process stands in: weaker (per process, virtual) but never unlimited.
- /tmp and /dev/shm: tmpfs with bwrap's `--size`.
- workspace disk: a size-limited loop-mounted image (disk.py).
A runner killed with SIGKILL cannot unmount or remove anything: `sweep_leftovers` (once per
process, before the first sample's limits are set up) unmounts and deletes the disk images and
removes the cgroups and workspace roots of runners that no longer exist; all carry the owner's pid
in their name.
After each command `Resources.check` turns a hit limit into a SandboxError (the sample fails as
`sandbox` with a message naming the limit), so other samples run on while this one ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import time
from pathlib import Path

from trajforge.sandbox.base import SandboxError, SandboxLimitError
from trajforge.sandbox.disk import DiskImage, disk_usable, human, pid_alive, sweep_images
from trajforge.sandbox.settings import SampleLimits
from trajforge.sandbox.workspace import report_swept, sweep_roots

V2_ROOTS = (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified"))
V1_MEMORY = Path("/sys/fs/cgroup/memory")
_GROUP = "trajforge"


def _writable_dir(p: Path) -> bool:
    return p.is_dir() and os.access(p, os.W_OK)


def cgroup_parent() -> tuple[str, Path] | None:
    """("v2"|"v1", the directory our per-sample groups go under), or None when none is usable."""
    if os.geteuid() != 0:
        return None
    for root in V2_ROOTS:
        controllers = root / "cgroup.controllers"
        with contextlib.suppress(OSError):
            if "memory" in controllers.read_text().split() and _writable_dir(root):
                return "v2", root / _GROUP
    if (V1_MEMORY / "memory.limit_in_bytes").exists() and _writable_dir(V1_MEMORY):
        return "v1", V1_MEMORY / _GROUP
    return None


class MemoryGroup:
    """One sample's memory cgroup."""

    def __init__(self, version: str, parent: Path, limit: int) -> None:
        self.version, self.limit = version, limit
        self.path = parent / f"s-{os.getpid()}-{secrets.token_hex(4)}"
        self.procs = str(self.path / "cgroup.procs")
        self._events = str(self.path / ("memory.events" if version == "v2" else "memory.oom_control"))
        self._seen = 0
        self._fds: dict[str, int] = {}  # files read after every command, kept open (_read)

    def create(self) -> None:
        try:
            if self.version == "v2" and not self.path.parent.exists():
                self.path.parent.mkdir(exist_ok=True)
                (self.path.parent / "cgroup.subtree_control").write_text("+memory")
            self.path.mkdir(parents=True, exist_ok=True)
            if self.version == "v2":
                (self.path / "memory.max").write_text(str(self.limit))
                with contextlib.suppress(OSError):
                    (self.path / "memory.swap.max").write_text("0")
            else:
                (self.path / "memory.limit_in_bytes").write_text(str(self.limit))
                with contextlib.suppress(OSError):  # no swap accounting on this kernel: RAM limit only
                    (self.path / "memory.memsw.limit_in_bytes").write_text(str(self.limit))
        except OSError as e:
            self.remove()
            raise SandboxError(f"cannot create the sample's memory cgroup {self.path}: {e}") from e

    def add(self, pid: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            with open(self.procs, "w") as f:
                f.write(str(pid))

    def _read(self, path: str) -> bytes:
        """A file of the group, read often (per command or sample): kept open, since a cgroup
        file is generated afresh by each read from offset 0; bytes, no text layer."""
        fd = self._fds.get(path)
        if fd is None:
            fd = self._fds[path] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        return os.pread(fd, 1 << 16, 0)

    def pids(self) -> list[int]:
        try:
            return [int(x) for x in self._read(self.procs).split()]
        except (OSError, ValueError):
            return []

    def oom_kills(self) -> int:
        """The group's count of OOM kills (read after every command)."""
        try:
            return oom_kill_count(self._read(self._events))
        except (OSError, ValueError):
            return 0

    def new_oom_kill(self) -> bool:
        n = self.oom_kills()
        hit, self._seen = n > self._seen, n
        return hit

    def remove(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        # The group empties once its processes are reaped; a few retries cover the kernel's lag.
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                with contextlib.suppress(OSError):
                    for pid in (self.path / "cgroup.procs").read_text().split():
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


_swept = False


async def sweep_leftovers(force: bool = False) -> list[str]:
    """Remove disk images and memory cgroups of runners that are dead; what went.
    Once per process unless `force` (the container backend's own sweep of dead runners' leftovers)."""
    global _swept
    if (_swept and not force) or os.geteuid() != 0:
        return []
    _swept = True
    gone = await sweep_images()
    gone += sweep_roots()  # the workspace roots those disks were mounted in
    where = cgroup_parent()
    if where is not None and where[1].is_dir():
        for group in where[1].iterdir():
            parts = group.name.split("-")
            if len(parts) == 3 and parts[0] == "s" and parts[1].isdigit() and not pid_alive(int(parts[1])):
                with contextlib.suppress(OSError):
                    group.rmdir()  # only succeeds once its processes are gone, which is what we want
                    gone.append(str(group))
    report_swept(gone)
    return gone



def tmpfs_full(path: str, size: int | None) -> bool:
    """A sized tmpfs with (almost) nothing left: the sample filled it."""
    if size is None:
        return False
    try:
        st = os.statvfs(path)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < max(64 << 10, size // 1000)


class Resources:
    """The limits of one root-mode bwrap sample, set up around its holder."""

    def __init__(self, limits: SampleLimits) -> None:
        self.limits = limits
        self.memory: MemoryGroup | None = None
        self.disk: DiskImage | None = None
        self.ns_pid = 0

    async def before_holder(self, workspace: Path) -> None:
        await sweep_leftovers()
        if self.limits.disk and disk_usable() is None:
            self.disk = DiskImage(workspace, self.limits.disk)
            await self.disk.mount()
        where = cgroup_parent() if self.limits.memory else None
        if where is not None:
            self.memory = MemoryGroup(where[0], where[1], self.limits.memory)  # type: ignore[arg-type]
            self.memory.create()

    def after_holder(self, holder_pid: int, ns_pid: int) -> None:
        self.ns_pid = ns_pid
        if self.memory is not None:
            for pid in (holder_pid, ns_pid):
                self.memory.add(pid)

    def check(self) -> None:
        """After a command: SandboxLimitError naming the limit the sample hit, if any."""
        lim = self.limits
        if self.memory is not None and self.memory.new_oom_kill():
            raise SandboxLimitError(f"the sample exceeded its memory limit of {human(lim.memory or 0)} "
                               "(sandbox_memory): a process was killed by the kernel")
        if self.ns_pid:
            for path, size, key in ((f"/proc/{self.ns_pid}/root/tmp", lim.tmp_size, "sandbox_tmp_size"),
                                    (f"/proc/{self.ns_pid}/root/dev/shm", lim.shm_size, "sandbox_shm_size")):
                if tmpfs_full(path, size):
                    inside = path.split("/root", 1)[1]
                    raise SandboxLimitError(f"the sample filled {inside} ({human(size or 0)}, {key})")
        if self.disk is not None and self.disk.full():
            raise SandboxLimitError(f"the sample filled its workspace disk limit of {human(self.disk.size)} "
                               "(sandbox_disk)")

    async def close(self, keep: bool) -> None:
        if self.memory is not None:
            await asyncio.to_thread(self.memory.remove)
            self.memory = None
        if self.disk is not None:
            await self.disk.unmount(keep)
            self.disk = None
