"""What a task's tests wrote under /logs/verifier/, read back for the viewer from the run directory.

Task verification keeps that directory per sample in the run directory (tasks/verify.py) and the
record says where (`verification.detail.tests.logs`: `dir`, relative to the run directory, and its
`files`). The viewer shows each file as text, at most FILE_CAP bytes of it; a path from a record
that would leave the run directory, or pass a link, is not read.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

FILE_CAP = 256 << 10


def _read(root: Path, rel: str) -> tuple[str, bool] | None:
    """(text, truncated) of `rel` beneath `root`, no component followed as a link; None when it cannot be."""
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if not parts or ".." in parts or rel.startswith("/"):
        return None
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = nxt
        f = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        if not stat.S_ISREG(os.fstat(f).st_mode):
            return None
        data = os.read(f, FILE_CAP + 1)
    finally:
        os.close(f)
    return data[:FILE_CAP].decode("utf-8", "replace"), len(data) > FILE_CAP


def verifier_logs(run_dir: Path | None, record: dict[str, Any]) -> list[dict[str, Any]]:
    """[{"name", "text", "truncated"}] of the record's kept verifier logs (none without a run directory)."""
    logs: Any = record
    for key in ("verification", "detail", "tests", "logs"):  # any of them may be missing, or another type
        logs = logs.get(key) if isinstance(logs, dict) else None
    if run_dir is None or not isinstance(logs, dict) or not isinstance(logs.get("dir"), str):
        return []
    out = []
    for name in logs.get("files") or []:
        if isinstance(name, str):
            got = _read(run_dir, f"{logs['dir']}/{name}")
            if got is not None:
                out.append({"name": name, "text": got[0], "truncated": got[1]})
    return out
