"""A container sample's disk limit: a sparse ext4 image of `sandbox_disk` bytes per sample, so the
kernel refuses writes beyond it (ENOSPC) and a sample can never take more of the host disk than
that. The image is mounted beside the workspace; its `ws` directory is bound onto the workspace
and, with rootful Podman, its `rootfs` directory holds the upper and work directories of the
container's own root filesystem, an overlay mounted beside the workspace (`attach_rootfs`,
backends/container/rootfs.py), so the workspace and everything the container writes elsewhere
(`/root`, `/usr`...) share the one limit. Nothing is ever mounted inside a container engine's
storage. The image is deleted when the sample ends; the images of a runner killed with SIGKILL
(its pid is in their names) are unmounted and deleted by `sweep_images`, every mount of them with
it, and so are its root filesystems' mounts (named with its pid too). Needs root and loop devices;
`disk_usable` says why not otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import re
import shutil
import tempfile
from pathlib import Path

from trajforge.sandbox.host.idmap import UserNamespace, idmapped_bind, unmount_lazily
from trajforge.sandbox.interface import SandboxError

_IMAGE_TAG = ".trajforge-"
# The runner's pid in a disk image's name, and `.img` (with the image's number, for a pool's) or
# nothing (a pool's tmpfs of mount points).
_IMAGE_PID = re.compile(r".*\.trajforge-(\d+)((?:-\d+)?\.img)?")
# A container's root filesystem (an overlay) and its lower layer while it is being mounted.
_ROOTFS_PID = re.compile(r".*\.trajforge-(\d+)\.(rootfs|lower)")
_ROOTFS_DIR = "trajforge-rootfs-"  # + the runner's pid: where its containers' root filesystems are
_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
_MS_NODEV = 0x4
_OVERLAY_UNSAFE = (",", ":", "\\")  # what overlay's option string cannot carry in a path
_rootfs: set[Path] = set()  # containers' root filesystems mounted now, for detach_all_now
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]


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
        rootfs = _ROOTFS_PID.fullmatch(Path(point).name)
        if rootfs is not None and not pid_alive(int(rootfs.group(1))):
            # A container's root filesystem (its upper directory is on the disk swept below) or its
            # lower layer: lazily, as a container may still run on it until the engine removes it.
            unmount_lazily(Path(point))
            with contextlib.suppress(OSError):
                os.rmdir(point)
            gone.append(point)
            continue
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
    gone += _sweep_rootfs_dirs()
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


def rootfs_dir(owner: int) -> Path:
    """A directory for containers' root filesystems that only `owner` (the host id their user
    namespace maps root to) and root may enter: the OCI runtime binds a root filesystem from inside
    the container's user namespace, so every directory on the way must let that id through (the
    runs' workspace roots are root's alone). Named with the runner's pid for sweep_images."""
    path = Path(tempfile.mkdtemp(prefix=f"{_ROOTFS_DIR}{os.getpid()}-"))
    for parent in path.parents:
        if not os.stat(parent).st_mode & 0o001:
            os.rmdir(path)
            raise SandboxError(f"{parent} does not let other users through (o+x), which the OCI runtime needs to "
                               f"reach a container's root filesystem beneath it; set TMPDIR to a directory that does")
    os.chown(path, owner, owner)
    return path


def _sweep_rootfs_dirs() -> list[str]:
    """The rootfs_dir of runners that are gone, whose mounts were unmounted: its empty mount points."""
    gone = []
    with contextlib.suppress(OSError), os.scandir(tempfile.gettempdir()) as entries:
        for entry in entries:
            pid = entry.name[len(_ROOTFS_DIR):].split("-", 1)[0]
            if entry.name.startswith(_ROOTFS_DIR) and pid.isdigit() and not pid_alive(int(pid)):
                with contextlib.suppress(OSError):
                    for point in os.scandir(entry.path):
                        os.rmdir(point.path)  # a directory: never anything a sample could have written
                    os.rmdir(entry.path)
                    gone.append(entry.path)
    return gone


def detach_all_now() -> None:
    """At interpreter exit: the root filesystems of containers no sample closed (lazily: the
    containers may still run on them until the engine removes them)."""
    for rootfs in list(_rootfs):
        unmount_lazily(rootfs)
    _rootfs.clear()


class DiskImage:
    """A size-limited ext4 filesystem for one container sample: its workspace and, once attached,
    what the container writes to its own root filesystem."""

    def __init__(self, workspace: Path, size: int) -> None:
        self.workspace, self.size = workspace, size
        # The owner's pid in the name lets sweep_leftovers tell a dead runner's image from a live one's.
        self.image = workspace.with_name(f"{workspace.name}{_IMAGE_TAG}{os.getpid()}.img")
        self.point = workspace.with_name(f"{workspace.name}.disk")  # beside it: no sample sees it
        self.mounts: list[Path] = []  # the disk and the workspace's bind: unmounted last first
        self.rootfs: Path | None = None  # the container's root filesystem, while mounted

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

    async def attach_rootfs(self, lower: Path, userns: UserNamespace | None, where: Path) -> Path:
        """Mount the container's root filesystem: an overlay of `lower` (the image's root, read-only,
        shown through `userns`'s id map when given) with its upper and work directories on this
        disk, in `where` (rootfs_dir); its mount point. No process of the sample exists yet."""
        if self.rootfs is not None:
            raise SandboxError("the container's filesystem is already on this sample's disk")
        stem = f"{self.workspace.name}{_IMAGE_TAG}{os.getpid()}"
        top, bottom, merged = self.point / "rootfs", where / f"{stem}.lower", where / f"{stem}.rootfs"
        for path in (top, bottom, merged):
            if any(c in str(path) for c in _OVERLAY_UNSAFE):
                raise SandboxError(f"cannot mount the container's filesystem at {path}: overlay's options "
                                   f"cannot name a path holding {' or '.join(map(repr, _OVERLAY_UNSAFE))}")
        try:
            st = os.stat(lower)
            shift = userns.base if userns is not None else 0
            os.mkdir(top, 0o700)
            os.mkdir(top / "work", 0o700)
            # The overlay's root takes its upper directory's owner and mode: the image's root's.
            os.mkdir(top / "upper")
            os.chown(top / "upper", st.st_uid + shift, st.st_gid + shift)
            os.chmod(top / "upper", st.st_mode & 0o7777)
            os.mkdir(merged, 0o700)
            if userns is not None:
                os.mkdir(bottom, 0o700)
                try:
                    idmapped_bind(lower, bottom, userns)
                except OSError:
                    os.rmdir(bottom)
                    raise
            try:
                options = f"lowerdir={bottom if userns is not None else lower},upperdir={top / 'upper'}," \
                          f"workdir={top / 'work'},index=off"
                if _libc.mount(b"overlay", os.fsencode(merged), b"overlay", _MS_NODEV, options.encode()) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"mount overlay on {merged}: {os.strerror(err)}")
            finally:
                if userns is not None:  # the overlay holds its own reference to the layer
                    unmount_lazily(bottom)
                    with contextlib.suppress(OSError):
                        os.rmdir(bottom)
        except OSError as e:
            with contextlib.suppress(OSError):
                merged.rmdir()
            raise SandboxError(f"cannot mount the container's filesystem on the sample's disk: {e}") from e
        self.rootfs = merged
        _rootfs.add(merged)
        return merged

    def detach_rootfs(self) -> None:
        """After the engine removed the container (or at the sample's end): lazily, as the
        container may still run on it when its removal failed."""
        rootfs, self.rootfs = self.rootfs, None
        if rootfs is not None:
            _rootfs.discard(rootfs)
            unmount_lazily(rootfs)
            with contextlib.suppress(OSError):
                rootfs.rmdir()

    def full(self) -> bool:
        try:
            st = os.statvfs(self.point)
        except OSError:
            return False
        return st.f_bavail * st.f_frsize < max(1 << 20, self.size // 1000)

    async def unmount(self, keep: bool) -> None:
        """Unmount and delete the image; with keep, the workspace's files are copied to a plain
        directory."""
        self.detach_rootfs()
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
