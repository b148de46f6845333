"""Size-limited filesystems for workspaces, made by copying a template instead of mkfs each time.

The workspace disk limit is a sparse ext4 image of `sandbox_disk` bytes, loop-mounted, so the
kernel refuses writes beyond it (ENOSPC). `mkfs.ext4` per image costs ~13 ms of CPU; here it
runs once per run (`Template`, with no resize inode and no journal, an empty image holds ~230 KB
of data), and every further image is a sparse copy of it (copy_file_range over its data
extents), attached with the loop ioctls and mounted with mount(2): ~2 ms, no process started.
`noinit_itable`: the kernel would otherwise zero the inode tables in the background, writing
~100 MB into each sparse image for nothing (unused inodes are flagged in the group descriptors).
The template holds one directory, WORKSPACES, under which the samples' workspaces are made, and
no lost+found (a sample never sees the disk's root): ext4 spreads directories made in the root
over the block groups (Orlov), which costs ~0.25 ms per workspace on a 10 GB disk, while one
made in a subdirectory stays in its parent's group (~0.03 ms).

Images carry the runner's pid in their name (`<mount point>.trajforge-<pid>.img`), so
disk.sweep_images unmounts and deletes those of a runner that was killed. Root only.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import struct
import subprocess
from pathlib import Path

from trajforge.sandbox.base import SandboxError
from trajforge.sandbox.disk import _IMAGE_TAG, human
from trajforge.sandbox.process import SAFE_PATH

_LOOP_CTL_GET_FREE, _LOOP_CONFIGURE, _LO_FLAGS_AUTOCLEAR = 0x4C82, 0x4C0A, 4
_MS_NOSUID, _MS_NODEV, _MNT_DETACH = 0x2, 0x4, 0x2
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
WORKSPACES = "w"


def image_for(point: Path) -> Path:
    return point.with_name(f"{point.name}{_IMAGE_TAG}{os.getpid()}.img")


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


def _sparse_copy(src: Path, dst: Path) -> None:
    s = os.open(src, os.O_RDONLY | os.O_CLOEXEC)
    try:
        d = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            size = os.fstat(s).st_size
            os.ftruncate(d, size)
            offset = 0
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
                    pos += os.copy_file_range(s, d, end - pos, pos, pos)
                offset = end
        finally:
            os.close(d)
    finally:
        os.close(s)


def _attach(image: Path) -> tuple[str, int]:
    """(loop device, its descriptor) backed by `image`, autoclear: it detaches at the unmount."""
    ctl = os.open("/dev/loop-control", os.O_RDWR | os.O_CLOEXEC)
    try:
        for _ in range(20):  # another process may take the free device first: EBUSY, try the next
            number = fcntl.ioctl(ctl, _LOOP_CTL_GET_FREE)
            dev = f"/dev/loop{number}"
            loop = os.open(dev, os.O_RDWR | os.O_CLOEXEC)
            backing = os.open(image, os.O_RDWR | os.O_CLOEXEC)
            try:
                info = bytearray(232)  # struct loop_info64; lo_flags at offset 52
                struct.pack_into("=I", info, 52, _LO_FLAGS_AUTOCLEAR)
                fcntl.ioctl(loop, _LOOP_CONFIGURE, struct.pack("=II", backing, 0) + bytes(info) + bytes(64))
                return dev, loop
            except OSError as e:
                os.close(loop)
                if e.errno != errno.EBUSY:
                    raise
            finally:
                os.close(backing)
        raise OSError(errno.EBUSY, "no free loop device")
    finally:
        os.close(ctl)


def mount_copy(template: Template, point: Path) -> Path:
    """Mount a fresh copy of `template` on the (existing, empty) directory `point`; its image.
    Workspaces go in `point / WORKSPACES`."""
    image = image_for(point)
    try:
        _sparse_copy(template.path, image)
        dev, loop = _attach(image)
        try:
            if _libc.mount(dev.encode(), str(point).encode(), b"ext4", _MS_NOSUID | _MS_NODEV, b"noinit_itable"):
                err = ctypes.get_errno()
                raise OSError(err, f"mount: {os.strerror(err)}")
        finally:
            os.close(loop)  # the mount holds the device now; autoclear frees it at the unmount
    except OSError as e:
        with contextlib.suppress(FileNotFoundError):
            image.unlink()
        raise SandboxError(f"cannot mount a workspace disk of {human(template.size)} on {point}: {e}") from e
    return image


def unmount(point: Path, image: Path) -> None:
    """Lazy unmount (nothing of the sample is left, but the kernel may still be writing) and delete."""
    _libc.umount2(str(point).encode(), _MNT_DETACH)
    with contextlib.suppress(FileNotFoundError):
        image.unlink()


def full(point: Path, size: int) -> bool:
    try:
        st = os.statvfs(point)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < max(1 << 20, size // 1000)
