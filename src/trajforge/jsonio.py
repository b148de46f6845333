"""Fast JSON encoding and the durable-write primitives every output file uses."""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import orjson

loads = orjson.loads


def dumps(obj: Any) -> bytes:
    """Compact JSON bytes (non-ASCII kept as UTF-8), with non-str keys allowed."""
    return orjson.dumps(obj, option=orjson.OPT_NON_STR_KEYS)


def dumps_str(obj: Any) -> str:
    return dumps(obj).decode()


def dumps_pretty(obj: Any) -> bytes:
    return orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS) + b"\n"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_FILE_MODE = 0o666 & ~_umask()


# What a path that is not a regular file is, for messages ("X is a FIFO; give a regular file path").
_KINDS = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"))


def not_regular(path: Path, *, follow_symlinks: bool = False) -> str | None:
    """What `path` is ("a symbolic link", "a FIFO", "a character device", ...) when it exists and is
    not a regular file; None when it is one or does not exist. An output is checked with this before
    any work: renaming a temp file over a link or a device node (atomic_writer, an export's staging
    path) replaces the link or node itself, never writing what it points to."""
    try:
        mode = os.stat(path, follow_symlinks=follow_symlinks).st_mode
    except OSError:
        return None  # missing (or unreachable: the write itself then says why)
    if stat.S_ISREG(mode):
        return None
    return next((kind for test, kind in _KINDS if test(mode)), "a special file")


@contextlib.contextmanager
def atomic_writer(path: Path, *, buffering: int = -1) -> Iterator[BinaryIO]:
    """Write `path` through a temp file in the same directory, fsynced, then os.replace'd:
    a reader sees either the old file or the complete new one, never a mix or a fragment."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb", buffering=buffering) as f:
            os.fchmod(f.fileno(), _FILE_MODE)  # mkstemp makes files private; outputs are meant to be read
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_bytes(path: Path, data: bytes) -> None:
    with atomic_writer(path) as f:
        f.write(data)


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, dumps_pretty(obj))
