"""Fast JSON encoding and the durable-write primitives every output file uses."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import orjson

loads = orjson.loads


def dumps(obj: Any) -> bytes:
    """Compact JSON bytes (non-ASCII kept as UTF-8), with non-str keys allowed."""
    return orjson.dumps(obj, option=orjson.OPT_NON_STR_KEYS)


def dumps_str(obj: Any) -> str:
    return dumps(obj).decode()


def dumps_pretty(obj: Any) -> bytes:
    return orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS) + b"\n"


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Replace `path` with `data` so a reader sees either the old or the new file, never a mix."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, dumps_pretty(obj))
