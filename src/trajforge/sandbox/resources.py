"""Per-sample resource limits of the bwrap sandbox: memory, /tmp and /dev/shm, workspace disk.

- memory: a memory cgroup per sample (cgroup v2 `memory.max` + `memory.swap.max=0` where the
  unified hierarchy has the memory controller, else the v1 controller's `memory.limit_in_bytes`
  and `memory.memsw.limit_in_bytes`). The holder and every command join it before anything
  runs, so the whole sample (tmpfs pages it writes included) shares one budget and the kernel's
  OOM killer acts inside it. Without a usable cgroup (unprivileged runner), RLIMIT_AS per
  process stands in: weaker (per process, virtual) but never unlimited.
- /tmp and /dev/shm: tmpfs with bwrap's `--size`.
- workspace disk: a sparse ext4 image of `sandbox_disk` bytes, loop-mounted on the workspace
  directory. The kernel refuses writes beyond it (ENOSPC), so a sample can never take more of
  the host disk than that; the image is deleted when the sample ends. Needs root and loop devices.
A runner killed with SIGKILL cannot unmount or remove anything: `sweep_leftovers` (once per
process, before the first sample's limits are set up) unmounts and deletes the disk images and
removes the cgroups of runners that no longer exist; both carry the owner's pid in their name.
After each command `Resources.check` turns a hit limit into a SandboxError (the sample fails as
`sandbox` with a message naming the limit), so other samples run on while this one ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path

from trajforge.sandbox.base import SandboxError

V2_ROOTS = (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified"))
V1_MEMORY = Path("/sys/fs/cgroup/memory")
_GROUP = "trajforge"


@dataclass(frozen=True, slots=True)
class SampleLimits:
    memory: int | None = 4 << 30
    tmp_size: int | None = 1 << 30
    shm_size: int | None = 256 << 20
    disk: int | None = 10 << 30
    cpu_seconds: int | None = 600


def human(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n} bytes"


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
        self._seen = 0

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

    def oom_kills(self) -> int:
        name = "memory.events" if self.version == "v2" else "memory.oom_control"
        try:
            for line in (self.path / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def new_oom_kill(self) -> bool:
        n = self.oom_kills()
        hit, self._seen = n > self._seen, n
        return hit

    def remove(self) -> None:
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
                import time

                time.sleep(0.01)  # bounded (0.5 s): processes of a killed namespace are still exiting


def disk_usable() -> str | None:
    """None when a loop-mounted image can limit the workspace here, else why not."""
    if os.geteuid() != 0:
        return "needs root (loop mounts)"
    missing = [t for t in ("mkfs.ext4", "mount", "umount") if shutil.which(t, path="/usr/sbin:/usr/bin:/sbin:/bin") is None]
    if missing:
        return f"missing {', '.join(missing)}"
    if not os.path.exists("/dev/loop-control"):
        return "no /dev/loop-control (loop devices)"
    return None


async def _run(*argv: str) -> None:
    proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.DEVNULL,
                                                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
                                                env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}, cwd="/")
    _, err = await proc.communicate()
    if proc.returncode != 0:
        raise SandboxError(f"{argv[0]} failed: {err.decode(errors='replace').strip()[-300:]}")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_IMAGE_TAG = ".trajforge-"
_swept = False


async def sweep_leftovers(force: bool = False) -> list[str]:
    """Unmount/delete disk images and remove memory cgroups whose runner is dead; what went.
    Once per process unless `force` (the container backend's own sweep of dead runners' leftovers)."""
    global _swept
    if (_swept and not force) or os.geteuid() != 0:
        return []
    _swept = True
    gone: list[str] = []
    try:
        mounts = [line.split() for line in Path("/proc/self/mounts").read_text().splitlines()]
    except OSError:
        mounts = []
    for fields in mounts:
        if len(fields) < 2 or not fields[0].startswith("/dev/loop"):
            continue
        point = fields[1].replace("\\040", " ")
        try:
            backing = Path(f"/sys/block/{Path(fields[0]).name}/loop/backing_file").read_text().strip()
        except OSError:
            continue
        name = Path(backing).name
        if not (backing.startswith(point + _IMAGE_TAG) and name.endswith(".img")):
            continue
        pid = name[len(Path(point).name) + len(_IMAGE_TAG):-len(".img")]
        if pid.isdigit() and not _pid_alive(int(pid)):
            with contextlib.suppress(SandboxError):
                await _run("umount", "-l", point)
            with contextlib.suppress(OSError):
                os.unlink(backing)
            gone.append(point)
    where = cgroup_parent()
    if where is not None and where[1].is_dir():
        for group in where[1].iterdir():
            parts = group.name.split("-")
            if len(parts) == 3 and parts[0] == "s" and parts[1].isdigit() and not _pid_alive(int(parts[1])):
                with contextlib.suppress(OSError):
                    group.rmdir()  # only succeeds once its processes are gone, which is what we want
                    gone.append(str(group))
    return gone


class DiskImage:
    """A size-limited ext4 filesystem mounted on a workspace directory for one sample."""

    def __init__(self, workspace: Path, size: int) -> None:
        self.workspace, self.size = workspace, size
        # The owner's pid in the name lets sweep_leftovers tell a dead runner's image from a live one's.
        self.image = workspace.with_name(f"{workspace.name}{_IMAGE_TAG}{os.getpid()}.img")
        self.mounted = False

    async def mount(self) -> None:
        try:
            with open(self.image, "wb") as f:
                f.truncate(self.size)  # sparse: takes host disk only as the sample writes
            await _run("mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal",
                       "-E", "nodiscard,lazy_itable_init=1", str(self.image))
            await _run("mount", "-o", "loop,nosuid,nodev", str(self.image), str(self.workspace))
            self.mounted = True
            with contextlib.suppress(OSError):
                os.rmdir(self.workspace / "lost+found")
        except (OSError, SandboxError) as e:
            await self.unmount(keep=False)
            raise SandboxError(f"cannot create the workspace disk of {human(self.size)}: {e}") from e

    def full(self) -> bool:
        try:
            st = os.statvfs(self.workspace)
        except OSError:
            return False
        return st.f_bavail * st.f_frsize < max(1 << 20, self.size // 1000)

    async def unmount(self, keep: bool) -> None:
        """Unmount and delete the image; with keep, the files are copied to a plain directory."""
        if self.mounted:
            self.mounted = False
            if keep:
                kept = self.workspace.with_name(self.workspace.name + ".kept")
                with contextlib.suppress(SandboxError):
                    await _run("cp", "-a", f"{self.workspace}/.", str(kept))
            with contextlib.suppress(SandboxError):
                await _run("umount", "-l", str(self.workspace))
            if keep and kept.exists():
                with contextlib.suppress(OSError):
                    self.workspace.rmdir()
                    kept.rename(self.workspace)
        with contextlib.suppress(FileNotFoundError):
            self.image.unlink()


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

    def wrap(self, argv: list[str]) -> list[str]:
        """argv that first joins the sample's cgroup (a spawned nsenter is the runner's child)."""
        if self.memory is None:
            return argv
        return ["/bin/sh", "-c", 'echo $$ > "$0" || exit 125; exec "$@"', self.memory.procs, *argv]

    def check(self) -> None:
        """After a command: SandboxError naming the limit the sample hit, if any."""
        lim = self.limits
        if self.memory is not None and self.memory.new_oom_kill():
            raise SandboxError(f"the sample exceeded its memory limit of {human(lim.memory or 0)} "
                               "(sandbox_memory): a process was killed by the kernel")
        if self.ns_pid:
            for path, size, key in ((f"/proc/{self.ns_pid}/root/tmp", lim.tmp_size, "sandbox_tmp_size"),
                                    (f"/proc/{self.ns_pid}/root/dev/shm", lim.shm_size, "sandbox_shm_size")):
                if tmpfs_full(path, size):
                    inside = path.split("/root", 1)[1]
                    raise SandboxError(f"the sample filled {inside} ({human(size or 0)}, {key})")
        if self.disk is not None and self.disk.full():
            raise SandboxError(f"the sample filled its workspace disk limit of {human(self.disk.size)} "
                               "(sandbox_disk)")

    async def close(self, keep: bool) -> None:
        if self.memory is not None:
            await asyncio.to_thread(self.memory.remove)
            self.memory = None
        if self.disk is not None:
            await self.disk.unmount(keep)
            self.disk = None
