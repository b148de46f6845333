"""File access beneath a workspace root that never follows a symbolic link.

A path is checked (fsops.locate) a moment before it is opened, and a background job of the
sample can swap a directory of that path for a symlink in between. So every open/create/replace
happens here: from a descriptor of the root, one component at a time, each opened relative to
the previous one with O_NOFOLLOW. A link met anywhere raises SymlinkError (the model's problem);
nothing is ever read or written through it, and files are opened O_NONBLOCK and fstat-checked,
so a FIFO swapped in never blocks.

Stdlib only and pathlib-free on purpose: this module is also part of the in-sandbox helper
(sandbox/inside/helper.py), which runs with a bare interpreter and must start fast. `rel` is a relative
POSIX path string ("" or "." for the root itself); roots are anything os.open takes.
Everything here is synchronous; callers run it in a thread (or in the helper).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Collection, Iterator

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: opening a FIFO swapped in for a file must not hang the tool thread.
_FILE = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
MAX_DEPTH = 100  # directory levels walk_files descends


class PathEscapeError(ValueError):
    """A path given by the model points outside the workspace; returned to the model as an error."""


class SymlinkError(PathEscapeError):
    """`rel` is, or goes through, a symbolic link (`link`, relative to the root)."""

    def __init__(self, rel: str, link: str) -> None:
        super().__init__(f"{rel} is or goes through a symbolic link ({link})")
        self.rel, self.link = rel, link


class NotRegularFileError(OSError):
    """The path exists but is not a regular file (a FIFO, socket or device)."""


def _parts(rel: str) -> tuple[str, ...]:
    rel = os.fspath(rel)
    parts = tuple(p for p in rel.split("/") if p not in ("", "."))
    if rel.startswith("/") or ".." in parts:
        raise PathEscapeError(f"{rel} is not a plain path beneath the workspace")
    return parts


def _join(parts: tuple[str, ...]) -> str:
    return "/".join(parts) or "."


def _raise_if_link(dir_fd: int, name: str, rel: str, link: str) -> None:
    """After ELOOP/ENOTDIR: whether `name` is a symlink (ENOTDIR is also a plain file)."""
    with contextlib.suppress(OSError):
        if stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
            raise SymlinkError(rel, link)


def _open_at(dir_fd: int, name: str, flags: int, mode: int, rel: str, link: str) -> int:
    try:
        return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            _raise_if_link(dir_fd, name, rel, link)
        raise


def open_dir_in(root: str | os.PathLike[str], rel: str, *, create: bool = False) -> int:
    """A descriptor of the directory root/rel, walked without following links; missing
    directories are created when `create`."""
    parts = _parts(rel)
    fd = os.open(root, _DIR)
    try:
        for i, name in enumerate(parts):
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, dir_fd=fd)
            nxt = _open_at(fd, name, _DIR, 0, rel, _join(parts[: i + 1]))
            os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        os.close(fd)
        raise


def open_in(root: str | os.PathLike[str], rel: str, flags: int, *, create_dirs: bool = False, mode: int = 0o644) -> int:
    """os.open(root/rel, flags | O_NOFOLLOW) with no symlink followed on the way."""
    parts = _parts(rel)
    if not parts:
        return os.open(root, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    parent = open_dir_in(root, _join(parts[:-1]), create=create_dirs)
    try:
        return _open_at(parent, parts[-1], flags, mode, rel, rel)
    finally:
        os.close(parent)


def _checked_regular(fd: int, rel: str) -> os.stat_result:
    st = os.fstat(fd)
    if stat.S_ISDIR(st.st_mode):
        os.close(fd)
        raise IsADirectoryError(errno.EISDIR, "Is a directory", rel)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise NotRegularFileError(errno.EINVAL, "Not a regular file", rel)
    return st


def open_regular_in(root: str | os.PathLike[str], rel: str) -> tuple[int, os.stat_result]:
    """A read descriptor of the regular file root/rel and its stat (IsADirectoryError,
    NotRegularFileError, FileNotFoundError or SymlinkError otherwise)."""
    fd = open_in(root, rel, os.O_RDONLY | _FILE)
    return fd, _checked_regular(fd, rel)


def open_regular_at(dir_fd: int, name: str, rel: str | None = None) -> tuple[int, os.stat_result]:
    """Like open_regular_in for an entry of an open directory; `rel` names it in errors."""
    rel = rel or name
    fd = _open_at(dir_fd, name, os.O_RDONLY | _FILE, 0, rel, rel)
    return fd, _checked_regular(fd, rel)


def read_bytes_in(root: str | os.PathLike[str], rel: str, *, max_bytes: int | None = None) -> bytes:
    """The content of the regular file root/rel (EFBIG past `max_bytes`)."""
    fd, st = open_regular_in(root, rel)
    with os.fdopen(fd, "rb") as f:
        if max_bytes is not None and st.st_size > max_bytes:
            raise OSError(errno.EFBIG, f"File too large ({st.st_size} bytes)", rel)
        return f.read()


def write_bytes_in(root: str | os.PathLike[str], rel: str, data: bytes, *, create_dirs: bool = True, mode: int = 0o644) -> None:
    """Create or overwrite the regular file root/rel in place (its inode, mode and owner kept)."""
    # Not O_TRUNC: nothing is truncated before fstat says it is a regular file.
    try:
        fd = open_in(root, rel, os.O_WRONLY | os.O_CREAT | _FILE, create_dirs=create_dirs, mode=mode)
    except OSError as e:
        if e.errno == errno.ENXIO:  # a FIFO nobody reads
            raise NotRegularFileError(errno.EINVAL, "Not a regular file", rel) from None
        raise
    _checked_regular(fd, rel)
    with os.fdopen(fd, "wb") as f:
        f.truncate(0)
        f.write(data)


def replace_in(root: str | os.PathLike[str], rel: str, data: bytes) -> None:
    """Atomically replace the existing regular file root/rel with `data`: a temp file in the
    same directory, renamed over it. Keeps permission bits (not setuid/setgid) and, as root, the
    owner; a hard link to the old file keeps the old content."""
    parts = _parts(rel)
    if not parts:
        raise IsADirectoryError(errno.EISDIR, "Is a directory", rel)
    name = parts[-1]
    dir_fd = open_dir_in(root, _join(parts[:-1]))
    try:
        old, st = open_regular_at(dir_fd, name, rel)
        os.close(old)
        tmp = f".{name[:200]}.{os.urandom(4).hex()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                if os.geteuid() == 0 and (st.st_uid, st.st_gid) != (0, 0):
                    os.fchown(f.fileno(), st.st_uid, st.st_gid)  # before chmod: chown may clear mode bits
                os.fchmod(f.fileno(), stat.S_IMODE(st.st_mode) & 0o777)
            os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)
            raise
    finally:
        os.close(dir_fd)


def walk_files(root: str | os.PathLike[str], rel: str, *, skip_dirs: Collection[str] = ()) -> Iterator[tuple[str, int, str]]:
    """(path relative to root/rel, directory fd, name) of every regular file beneath root/rel
    (or of root/rel itself if it is a file), in sorted order, files of a directory before its
    subdirectories. Symlinks are skipped, never followed; the fds are valid until the next item.
    Iterative with at most MAX_DEPTH open directories: a sample's 10,000 nested directories
    cost neither the recursion limit nor the runner's descriptors."""
    parts = _parts(rel)
    if parts:
        parent = open_dir_in(root, _join(parts[:-1]))
        try:
            st = os.stat(parts[-1], dir_fd=parent, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                raise SymlinkError(rel, rel)
            if stat.S_ISREG(st.st_mode):
                yield "", parent, parts[-1]
                return
        finally:
            os.close(parent)
    stack: list[tuple[int, str, list[str]]] = []  # (dir fd, its prefix, subdirectories still to visit)
    try:
        fd, prefix = open_dir_in(root, rel), ""
        while True:
            stack.append((fd, prefix, []))
            with contextlib.suppress(OSError):  # unreadable: nothing to list
                files, stack[-1][2][:] = _list_dir(fd, skip_dirs)
                for name in files:
                    yield prefix + name, fd, name
            fd = -1
            while stack and fd < 0:
                parent, parent_prefix, dirs = stack[-1]
                if not dirs:
                    os.close(stack.pop()[0])
                elif len(stack) >= MAX_DEPTH:
                    dirs.clear()
                else:
                    name = dirs.pop()
                    with contextlib.suppress(OSError):  # vanished, swapped for a link: skip it
                        fd, prefix = os.open(name, _DIR, dir_fd=parent), f"{parent_prefix}{name}/"
            if fd < 0:
                return
    finally:
        for fd, _, _ in stack:
            os.close(fd)


def _list_dir(fd: int, skip_dirs: Collection[str]) -> tuple[list[str], list[str]]:
    """(regular files sorted, subdirectories reverse-sorted so pop() takes them in order)."""
    files: list[str] = []
    dirs: list[str] = []
    with os.scandir(fd) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                if entry.name not in skip_dirs:
                    dirs.append(entry.name)
            elif entry.is_file(follow_symlinks=False):
                files.append(entry.name)
    return sorted(files), sorted(dirs, reverse=True)
