"""A container sample's disk limit: a sparse ext4 image of `sandbox_disk` bytes per sample, so the
kernel refuses writes beyond it (ENOSPC) and a sample can never take more of the host disk than
that. The image is mounted beside the workspace; its `ws` directory is bound onto the workspace
and, with Podman, its `layer` directory onto the container's own copy-on-write layer (the
directory of its overlay upper and work directories, `attach_layer`), so the workspace and
everything the container writes elsewhere in its filesystem (`/root`, `/usr`...) share the one
limit. The image is deleted when the sample ends; the images of a runner killed with SIGKILL (its
pid is in their names) are unmounted and deleted by `sweep_images`, every mount of them with it.
Needs root and loop devices; `disk_usable` says why not otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import subprocess
from pathlib import Path

from trajforge.sandbox.interface import SandboxError

_IMAGE_TAG = ".trajforge-"
# The runner's pid in a disk image's name, and `.img` (with the image's number, for a pool's) or
# nothing (a pool's tmpfs of mount points).
_IMAGE_PID = re.compile(r".*\.trajforge-(\d+)((?:-\d+)?\.img)?")
_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
_layers: set[Path] = set()  # containers' layer directories bound to a disk now, for detach_all_now


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
    images: set[str] = set()
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
        # every mount of the image (a container's disk has three) before the image goes: the
        # loop device names its backing file "(deleted)" after that
        with contextlib.suppress(SandboxError):
            await _run("umount", "-l", point)
        images.add(backing)
        gone.append(point)
    for backing in images:
        with contextlib.suppress(OSError):
            os.unlink(backing)
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


def detach_all_now() -> None:
    """At interpreter exit, before the engine removes containers no sample closed: their layers."""
    for layer in list(_layers):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(["umount", "-l", str(layer)], env={"PATH": _PATH}, capture_output=True, timeout=30)
    _layers.clear()


class DiskImage:
    """A size-limited ext4 filesystem for one container sample: its workspace and, once attached,
    the container's copy-on-write layer."""

    def __init__(self, workspace: Path, size: int) -> None:
        self.workspace, self.size = workspace, size
        # The owner's pid in the name lets sweep_leftovers tell a dead runner's image from a live one's.
        self.image = workspace.with_name(f"{workspace.name}{_IMAGE_TAG}{os.getpid()}.img")
        self.point = workspace.with_name(f"{workspace.name}.disk")  # beside it: no sample sees it
        self.mounts: list[Path] = []  # the disk and the workspace's bind: unmounted last first
        self.layer: Path | None = None  # the container's layer directory, while bound

    async def mount(self) -> None:
        try:
            with open(self.image, "wb") as f:
                f.truncate(self.size)  # sparse: takes host disk only as the sample writes
            await _run("mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal",
                       "-E", "nodiscard,lazy_itable_init=1", str(self.image))
            os.mkdir(self.point, 0o700)
            await _run("mount", "-o", "loop,nosuid,nodev", str(self.image), str(self.point))
            self.mounts.append(self.point)
            os.rmdir(self.point / "lost+found")
            os.mkdir(self.point / "ws", 0o700)
            await _run("mount", "--bind", str(self.point / "ws"), str(self.workspace))
            self.mounts.append(self.workspace)
        except (OSError, SandboxError) as e:
            await self.unmount(keep=False)
            raise SandboxError(f"cannot create the disk of {human(self.size)}: {e}") from e

    async def attach_layer(self, upper: str, work: str) -> None:
        """Put the container's copy-on-write layer on this disk: `upper` and `work` are its overlay
        directories, as the engine reported them after `create` and before `start` (no process of
        the sample exists yet; the engine mounts the overlay at start, through this bind). Overlay
        wants both under one mount: their common parent is copied here and bound over."""
        layer = Path(upper).parent
        if not (Path(upper).is_absolute() and Path(work).parent == layer and layer.is_dir()
                and not layer.is_symlink() and Path(upper).is_dir()):
            raise SandboxError(f"the container's layer is not where the engine said ({upper}, {work})")
        if self.layer is not None:
            raise SandboxError("the container's layer is already on this sample's disk")
        try:
            await _run("cp", "-a", f"{layer}/.", str(self.point / "layer"))  # owners and modes kept
            await _run("mount", "--bind", str(self.point / "layer"), str(layer))
            self.layer = layer
            _layers.add(layer)
        except SandboxError as e:
            raise SandboxError(f"cannot put the container's filesystem on the sample's disk: {e}") from e

    async def detach_layer(self) -> None:
        """Before the engine removes the container: it deletes the layer's directory, which must no
        longer be a mount point then. Lazily: the container may still run on it."""
        layer, self.layer = self.layer, None
        if layer is not None:
            _layers.discard(layer)
            with contextlib.suppress(SandboxError):
                await _run("umount", "-l", str(layer))

    def full(self) -> bool:
        try:
            st = os.statvfs(self.point)
        except OSError:
            return False
        return st.f_bavail * st.f_frsize < max(1 << 20, self.size // 1000)

    async def unmount(self, keep: bool) -> None:
        """Unmount and delete the image; with keep, the workspace's files are copied to a plain
        directory."""
        await self.detach_layer()
        kept = self.workspace.with_name(self.workspace.name + ".kept")
        if self.workspace in self.mounts and keep:
            with contextlib.suppress(SandboxError):
                await _run("cp", "-a", f"{self.workspace}/.", str(kept))
        while self.mounts:
            with contextlib.suppress(SandboxError):
                await _run("umount", "-l", str(self.mounts.pop()))
        if keep and kept.exists():
            with contextlib.suppress(OSError):
                self.workspace.rmdir()
                kept.rename(self.workspace)
        with contextlib.suppress(OSError):
            self.point.rmdir()
        with contextlib.suppress(FileNotFoundError):
            self.image.unlink()
