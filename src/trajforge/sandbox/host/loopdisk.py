"""Size-limited filesystems for the slots' workspaces: regions of a few sparse images, no mkfs each.

The workspace disk limit is an ext4 filesystem of `sandbox_disk` bytes on a loop device, so the
kernel refuses writes beyond it (ENOSPC). `mkfs.ext4` per disk is dear; here it runs
once per pool (`Template`, with no resize inode and no journal, an empty image holds ~230 KB of
data), and every further disk is a copy of its data extents (copy_file_range) into a *region* of
a sparse image file shared by many slots, attached with the loop ioctls at the region's offset
and size limit and mounted with mount(2): no process started. A file and a directory per slot on
the host's filesystem would cost more each (inode allocation and removal: on a churned ext4
without a journal the allocator skips recently deleted inodes one by one), so regions of
one image file (a new file every REGION_BYTES_PER_FILE) are never reused within a run (a lazily
unmounted filesystem may still be writing to its own; a released region's blocks are punched
out at once), and the mount points are directories of one small private tmpfs (`Disks.points`).
`noinit_itable`: the kernel would otherwise zero the inode tables in the background, writing
into each region for nothing (unused inodes are flagged in the group descriptors).
The template holds one directory, WORKSPACES, under which the samples' workspaces are made, and
no lost+found (a sample never sees the disk's root): ext4 spreads directories made in the root
over the block groups (Orlov), while one made in a subdirectory stays in its parent's group, at
a fraction of the cost (figures of all three: bench/RESULTS.md).

Images, the template and the tmpfs carry the runner's pid in their names (`.slots.trajforge-<pid>`
and `.slots.trajforge-<pid>-<n>.img`), so disk.sweep_images unmounts and deletes those of a
runner that was killed. Root only.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import struct
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

from trajforge.sandbox.interface import SandboxError
from trajforge.sandbox.host.disk import _IMAGE_TAG, human
from trajforge.sandbox.process import SAFE_PATH

_LOOP_CTL_GET_FREE, _LOOP_CONFIGURE, _LO_FLAGS_AUTOCLEAR = 0x4C82, 0x4C0A, 4
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MNT_DETACH = 0x2, 0x4, 0x8, 0x2
_FALLOC_FL_KEEP_SIZE, _FALLOC_FL_PUNCH_HOLE = 0x1, 0x2
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
WORKSPACES = "w"
REGION_BYTES_PER_FILE = 4 << 40  # well below ext4's largest file (16 TiB with 4 KiB blocks)
_ALIGN = 1 << 20


class Template:
    """One formatted empty image per run and size, the source of every workspace image."""

    def __init__(self, directory: Path, size: int) -> None:
        self.size = size
        self.path = directory / f".template{_IMAGE_TAG}{os.getpid()}-{size}.img"

    def create(self) -> Template:
        try:
            with open(self.path, "wb") as f:
                f.truncate(self.size)
            subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal,^resize_inode",
                            "-E", "nodiscard,lazy_itable_init=1,root_owner=0:0", str(self.path)],
                           check=True, capture_output=True, env={"PATH": SAFE_PATH}, cwd="/", timeout=120)
            # debugfs (e2fsprogs, like mkfs.ext4) edits the image without mounting it.
            subprocess.run(["debugfs", "-w", "-f", "-", str(self.path)], check=True, capture_output=True,
                           input=f"mkdir {WORKSPACES}\nset_inode_field {WORKSPACES} mode 040700\nrmdir lost+found\n"
                           .encode(), env={"PATH": SAFE_PATH}, cwd="/", timeout=120)
        except (OSError, subprocess.SubprocessError) as e:
            self.remove()
            detail = getattr(e, "stderr", b"") or b""
            raise SandboxError(f"cannot create the workspace disk template of {human(self.size)}: {e} "
                               f"{detail.decode(errors='replace').strip()[-200:]}") from e
        return self

    def remove(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


def _sparse_copy(src: Path, d: int, base: int) -> None:
    """The data extents of `src` into descriptor `d` at offset `base` (holes stay holes)."""
    s = os.open(src, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size, offset = os.fstat(s).st_size, 0
        while offset < size:
            try:
                start = os.lseek(s, offset, os.SEEK_DATA)
            except OSError as e:
                if e.errno == errno.ENXIO:  # no data past offset
                    break
                raise
            end = os.lseek(s, start, os.SEEK_HOLE)
            pos = start
            while pos < end:
                pos += os.copy_file_range(s, d, end - pos, pos, base + pos)
            offset = end
    finally:
        os.close(s)


def _attach(backing: int, offset: int, size: int) -> tuple[str, int]:
    """(loop device, its descriptor) showing `size` bytes of `backing` from `offset`, autoclear:
    it detaches at the unmount."""
    ctl = os.open("/dev/loop-control", os.O_RDWR | os.O_CLOEXEC)
    try:
        for _ in range(20):  # another process may take the free device first: EBUSY, try the next
            number = fcntl.ioctl(ctl, _LOOP_CTL_GET_FREE)
            dev = f"/dev/loop{number}"
            loop = os.open(dev, os.O_RDWR | os.O_CLOEXEC)
            try:
                info = bytearray(232)  # struct loop_info64: lo_offset at 24, lo_sizelimit at 32, lo_flags at 52
                struct.pack_into("=QQ", info, 24, offset, size)
                struct.pack_into("=I", info, 52, _LO_FLAGS_AUTOCLEAR)
                fcntl.ioctl(loop, _LOOP_CONFIGURE, struct.pack("=II", backing, 0) + bytes(info) + bytes(64))
                return dev, loop
            except OSError as e:
                os.close(loop)
                if e.errno != errno.EBUSY:
                    raise
        raise OSError(errno.EBUSY, "no free loop device")
    finally:
        os.close(ctl)


@dataclass(frozen=True, slots=True)
class Region:
    """Where one slot's disk lives: a range of an image file."""

    image: Path
    number: int  # of the image file
    offset: int


class Disks:
    """The workspace disks of one slot pool: a template, image files of regions, a tmpfs of mount
    points. Blocking calls, made from several threads at once (the pool's `asyncio.to_thread`)."""

    def __init__(self, directory: Path, size: int) -> None:
        self.size = size
        self.stride = -(-size // _ALIGN) * _ALIGN  # regions start on MiB boundaries
        self.per_file = max(1, REGION_BYTES_PER_FILE // self.stride)
        self.points = directory / f".slots{_IMAGE_TAG}{os.getpid()}"  # the tmpfs of mount points
        self.template = Template(directory, size)
        self._next = 0  # regions are never reused in a run (see the module's docstring)
        self._files: dict[Path, int] = {}  # image -> open descriptor
        self._live: dict[Path, int] = {}  # image -> regions in use
        self._lock = threading.Lock()

    def create(self) -> Disks:
        self.template.create()
        try:
            self.points.mkdir(mode=0o700)
            if _libc.mount(b"tmpfs", str(self.points).encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC,
                           b"mode=0700,size=1m"):
                err = ctypes.get_errno()
                raise OSError(err, f"mount tmpfs on {self.points}: {os.strerror(err)}")
        except OSError as e:
            self.close()
            raise SandboxError(f"cannot make the workspace disks' mount points in {self.points.parent}: {e}") from e
        return self

    def mount(self, name: str) -> tuple[Path, Region]:
        """A fresh disk mounted on a new directory `name` of the mount points; (that directory,
        its region). Workspaces go in `point / WORKSPACES`."""
        point = self.points / name
        with self._lock:  # the pool mounts several disks at once, each in a thread of its own
            index, self._next = self._next, self._next + 1
        number = index // self.per_file
        region = Region(Path(f"{self.points}-{number}.img"), number, (index % self.per_file) * self.stride)
        try:
            with self._lock:
                fd = self._files.get(region.image)
                if fd is None:
                    fd = self._files[region.image] = os.open(region.image, os.O_RDWR | os.O_CREAT | os.O_EXCL
                                                             | os.O_CLOEXEC, 0o600)
                self._live[region.image] = self._live.get(region.image, 0) + 1
                end = region.offset + self.stride
                if os.fstat(fd).st_size < end:
                    os.ftruncate(fd, end)  # sparse: takes host disk only as samples write
            _sparse_copy(self.template.path, fd, region.offset)
            point.mkdir()
            dev, loop = _attach(fd, region.offset, self.size)
            try:
                if _libc.mount(dev.encode(), str(point).encode(), b"ext4", _MS_NOSUID | _MS_NODEV, b"noinit_itable"):
                    err = ctypes.get_errno()
                    raise OSError(err, f"mount: {os.strerror(err)}")
            finally:
                os.close(loop)  # the mount holds the device now; autoclear frees it at the unmount
        except OSError as e:
            self.unmount(point, region)
            raise SandboxError(f"cannot mount a workspace disk of {human(self.size)} on {point}: {e}") from e
        return point, region

    def unmount(self, point: Path, region: Region) -> None:
        """Lazy unmount (nothing of the sample is left, but the kernel may still be writing), the
        mount point removed, the region's blocks freed; an image file whose regions are all gone
        is deleted."""
        _libc.umount2(str(point).encode(), _MNT_DETACH)
        with contextlib.suppress(OSError):
            point.rmdir()
        with self._lock:
            fd = self._files.get(region.image)
            if fd is None or not self._live.get(region.image):
                return
            _libc.fallocate(fd, _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE, region.offset, self.stride)
            self._live[region.image] -= 1
            if self._live[region.image] == 0 and self._next > (region.number + 1) * self.per_file:  # no new region
                self._drop(region.image)

    def _drop(self, image: Path) -> None:
        os.close(self._files.pop(image))
        self._live.pop(image, None)
        with contextlib.suppress(FileNotFoundError):
            image.unlink()

    def close(self) -> None:
        """Every image and the template deleted, the mount points' tmpfs unmounted (the caller
        has unmounted every disk)."""
        with self._lock:
            for image in list(self._files):
                self._drop(image)
        self.template.remove()
        _libc.umount2(str(self.points).encode(), _MNT_DETACH)
        with contextlib.suppress(OSError):
            self.points.rmdir()


def full(point: Path, size: int) -> bool:
    try:
        st = os.statvfs(point)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < max(1 << 20, size // 1000)
