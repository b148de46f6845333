"""The workspace disk limit: a sparse ext4 image of `sandbox_disk` bytes per sample, loop-mounted
on the workspace directory, so the kernel refuses writes beyond it (ENOSPC) and a sample can never
take more of the host disk than that. The image is deleted when the sample ends; the images of a
runner killed with SIGKILL (its pid is in their names) are unmounted and deleted by `sweep_images`.
Needs root and loop devices; `disk_usable` says why not otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
from pathlib import Path

from trajforge.sandbox.interface import SandboxError

_IMAGE_TAG = ".trajforge-"
# The runner's pid in a disk image's name, and `.img` (with the image's number, for a pool's) or
# nothing (a pool's tmpfs of mount points).
_IMAGE_PID = re.compile(r".*\.trajforge-(\d+)((?:-\d+)?\.img)?")
_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


def human(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n} bytes"


def disk_usable() -> str | None:
    """None when a loop-mounted image can limit the workspace here, else why not."""
    if os.geteuid() != 0:
        return "needs root (loop mounts)"
    missing = [t for t in ("mkfs.ext4", "debugfs", "mount", "umount") if shutil.which(t, path=_PATH) is None]
    if missing:
        return f"missing {', '.join(missing)}"
    if not os.path.exists("/dev/loop-control"):
        return "no /dev/loop-control (loop devices)"
    return None


async def _run(*argv: str) -> None:
    proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.DEVNULL,
                                                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
                                                env={"PATH": _PATH}, cwd="/")
    _, err = await proc.communicate()
    if proc.returncode != 0:
        raise SandboxError(f"{argv[0]} failed: {err.decode(errors='replace').strip()[-300:]}")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def mount_table() -> list[tuple[str, str, str]] | None:
    """(source, mount point, filesystem type) of every mount this process sees; None if unreadable."""
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return None
    return [(f[0], f[1].replace("\\040", " "), f[2]) for f in map(str.split, lines) if len(f) >= 3]


async def sweep_images() -> list[str]:
    """Unmount and delete the disk images of runners that no longer exist (a sample's own,
    `<workspace>.trajforge-<pid>.img`, or a slot pool's, `.slots.trajforge-<pid>-<n>.img`, whose
    mount points are on the tmpfs `.slots.trajforge-<pid>`, loopdisk.py); their mount points."""
    gone: list[str] = []
    pools: list[str] = []
    for source, point, kind in mount_table() or []:
        pool = _IMAGE_PID.fullmatch(Path(point).name) if kind == "tmpfs" else None
        if pool is not None and pool.group(2) is None and not pid_alive(int(pool.group(1))):
            pools.append(point)  # after the disks mounted in it
        if not source.startswith("/dev/loop"):
            continue
        try:
            backing = Path(f"/sys/block/{Path(source).name}/loop/backing_file").read_text().strip()
        except OSError:
            continue
        match = _IMAGE_PID.fullmatch(Path(backing).name)
        if match is None or not match.group(2) or pid_alive(int(match.group(1))):
            continue
        with contextlib.suppress(SandboxError):
            await _run("umount", "-l", point)
        with contextlib.suppress(OSError):
            os.unlink(backing)
        gone.append(point)
    for point in pools:
        with contextlib.suppress(SandboxError):
            await _run("umount", "-l", point)
        with contextlib.suppress(OSError):
            os.rmdir(point)
        where, pid = Path(point).parent, _IMAGE_PID.fullmatch(Path(point).name).group(1)  # type: ignore[union-attr]
        # its images whose disks were all unmounted already, and its loopdisk.Template
        for image in (*where.glob(f"{Path(point).name}-*.img"), *where.glob(f".template{_IMAGE_TAG}{pid}-*.img")):
            with contextlib.suppress(OSError):
                image.unlink()
        gone.append(point)
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
