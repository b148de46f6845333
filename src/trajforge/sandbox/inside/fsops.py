"""The file operations of the Sandbox interface, run in the sandbox's own view of the filesystem.

`locate` turns a model-given path (relative to the working directory, `~/...`, or absolute as
the sample sees it) into (root, relative path) beneath one of the workspace's mount points,
following symlinks only as far as they stay inside; `read`, `write` and `search` then work
through safe_fs, which never follows a link and never opens a FIFO blocking. Failures the model
can act on are FileOpError (with a `kind` the tools turn into their messages) or PathEscapeError.

Who runs this: the local backend calls it in a thread on the host (its view *is* the host),
except `search`, which it runs in a child process (search_child.py, with `limited`);
the bwrap helper runs the same code inside the sample's mount namespace as the sample's uid
(sandbox/inside/helper.py), so a link can only ever reach what the sample itself could. Stdlib only,
pathlib-free, `re`/`fnmatch` imported on first search: the helper starts with a bare interpreter.
"""

from __future__ import annotations

import errno
import os

from trajforge.sandbox.inside.guard import preload, seal
from trajforge.sandbox.inside.safe_fs import (
    NotRegularFileError, PathEscapeError, SymlinkError, open_in, open_regular_at, open_regular_in, replace_in,
    walk_files, write_bytes_in,
)

MAX_LINE_CHARS = 4_000
SEARCH_SECONDS = 20.0  # search_files' time limit: the walk and the matching
SKIP_DIRS = (".git", ".hg", ".svn", "node_modules", "__pycache__", ".venv", ".mypy_cache", ".pytest_cache", ".tox")
_KINDS = {errno.ENOENT: "not_found", errno.EISDIR: "is_dir", errno.ENOTDIR: "not_dir", errno.EFBIG: "too_large",
          errno.EEXIST: "exists"}


class FileOpError(Exception):
    """A file operation failed in a way the model can act on; `kind` names the case."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def check_model_path(path: object) -> str:
    """The first check of every model-given path, before any backend maps it."""
    if not isinstance(path, str) or not path.strip():
        raise PathEscapeError("path must be a non-empty string")
    if "\0" in path:
        raise PathEscapeError("path contains a NUL byte")
    return path


def locate(path: str, *, cwd: str, roots: list[str], workdir: str) -> tuple[str, str]:
    """(root, path relative to it) of `path`, or PathEscapeError. `roots` are real paths in this
    view (the workspace and its aliases), `workdir` is the workspace as the sample sees it."""
    path = check_model_path(path)
    if path == "~" or path.startswith("~/"):  # HOME is the workspace
        path = workdir + path[1:]
    # realpath follows every link (dangling ones as far as they go): one pointing out lands out.
    joined = path if path.startswith("/") else os.path.join(cwd, path)
    for _ in range(3):
        try:
            real = os.path.realpath(joined)
            break
        except OSError:  # a link swapped for a directory between lstat and readlink
            continue
    else:
        raise FileOpError("other", "the path kept changing while it was looked up; try again")
    for root in sorted(roots, key=len, reverse=True):
        if real == root or real.startswith(root.rstrip("/") + "/"):
            return root, real[len(root):].lstrip("/") or "."
    raise PathEscapeError(f"{path!r} is outside the workspace {workdir}; use a path relative to the working "
                          f"directory {cwd} or an absolute path under {workdir}")


def _classify(e: OSError) -> FileOpError:
    if isinstance(e, NotRegularFileError) or e.errno == errno.ENXIO:  # ENXIO: a FIFO nobody reads
        return FileOpError("not_regular", "not a regular file")
    return FileOpError(_KINDS.get(e.errno or 0, "other"), e.strerror or str(e))


def read(root: str, rel: str, max_bytes: int, offset: int | None = None) -> bytes:
    """The content of a regular file; FileOpError too_large past `max_bytes`. With `offset`, at
    most `max_bytes` from there instead (b"" past the end), never too_large."""
    try:
        fd, st = open_regular_in(root, rel)
    except SymlinkError:
        raise
    except OSError as e:
        raise _classify(e) from None
    with os.fdopen(fd, "rb") as f:
        if offset is not None:
            return os.pread(f.fileno(), max_bytes, offset)
        if st.st_size > max_bytes:
            raise FileOpError("too_large", f"{st.st_size} bytes")
        data = f.read(max_bytes + 1)  # it may have grown since fstat
    if len(data) > max_bytes:
        raise FileOpError("too_large", f"more than {max_bytes} bytes")
    return data


def write(root: str, rel: str, data: bytes, how: str = "overwrite") -> str:
    """Write a regular file, creating parent directories; returns the path written (relative).

    how: "overwrite" (create or truncate in place), "replace" (an existing file, atomically, mode
    kept), "new" (never replace: `name-2.ext`, `name-3.ext`... when taken)."""
    try:
        if how == "overwrite":
            write_bytes_in(root, rel, data, create_dirs=True)
        elif how == "replace":
            replace_in(root, rel, data)
        elif how == "new":
            return _write_new(root, rel, data)
        else:
            raise ValueError(f"unknown write mode {how!r}")
    except SymlinkError:
        raise
    except OSError as e:
        raise _classify(e) from None
    return rel


def _write_new(root: str, rel: str, data: bytes) -> str:
    stem, dot, ext = rel.rpartition(".") if "." in rel.rsplit("/", 1)[-1] else (rel, "", "")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    candidate, n = rel, 1
    while True:
        try:
            fd = open_in(root, candidate, flags, create_dirs=True)
            break
        except FileExistsError:
            n += 1
            candidate = f"{stem}-{n}{dot}{ext}"
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return candidate


def search(root: str, rel: str, shown: str, pattern: str, *, target: str, glob: str | None, limit: int,
           max_file: int, max_files: int, seconds: float | None = None) -> tuple[list[str], bool]:
    """search_files: matching lines ("path:line: text") or file paths, shown relative to `shown`;
    (results, more exist). Links, binaries, files over `max_file` and SKIP_DIRS are skipped.
    Stopped after `seconds` (a FileOpError "timeout") when run in a process's main thread."""
    walk = walk_files(root, rel, skip_dirs=SKIP_DIRS)

    def entries():  # type: ignore[no-untyped-def]
        for sub, dir_fd, name in walk:
            yield sub, name, lambda d=dir_fd, n=name: _small_file(d, n, max_file)

    try:
        return limited(seconds, scan, entries(), shown, pattern, target=target, glob=glob, limit=limit,
                       max_files=max_files)
    except SymlinkError:
        raise
    except OSError as e:
        raise _classify(e) from None
    finally:
        walk.close()


def limited(seconds: float | None, fn, *args, **kw):  # type: ignore[no-untyped-def]
    """fn(*args, **kw), stopped after `seconds` by SIGALRM: `re` checks for signals while it
    matches, so a pattern that backtracks without end (`(a+)+$`) stops too. Only a main thread
    can take the signal: the helper and search_child.py's process, never the runner's threads."""
    import _signal

    def alarm(*_):  # type: ignore[no-untyped-def]
        raise FileOpError("timeout", f"the search took over {seconds:g} s, so it was stopped: the pattern may "
                                     "backtrack without end (nested quantifiers such as (a+)+); narrow the "
                                     "pattern, the path or file_glob")

    if not seconds:
        return fn(*args, **kw)
    old = _signal.signal(_signal.SIGALRM, alarm)  # ValueError outside the main thread: a caller's bug
    _signal.setitimer(_signal.ITIMER_REAL, seconds)
    try:
        return fn(*args, **kw)
    finally:
        _signal.setitimer(_signal.ITIMER_REAL, 0)
        _signal.signal(_signal.SIGALRM, old)


def reply_of(e: Exception) -> dict:  # type: ignore[type-arg]
    """The error reply of the helper protocol for a failed file operation (base.raise_reply undoes it)."""
    if isinstance(e, SymlinkError):
        return {"error": "symlink", "msg": str(e), "rel": e.rel, "link": e.link}
    if isinstance(e, PathEscapeError):
        return {"error": "escape", "msg": str(e)}
    if isinstance(e, FileOpError):
        return {"error": e.kind, "msg": str(e)}
    return {"error": "other", "msg": f"{type(e).__name__}: {e}"}


def child_main() -> None:
    """search_child.py's process: one search (marshal on stdin), its reply (marshal on stdout).
    With `--drop` (a root runner matching files a container sent), it loads what it needs and
    becomes nobody, without a privilege or a way to load code, before it reads the job."""
    import marshal
    import sys

    if sys.argv[2:] == ["--drop"]:
        preload()
        os.setgroups([])
        os.setresgid(65534, 65534, 65534)
        os.setresuid(65534, 65534, 65534)
        seal()
    job = marshal.loads(sys.stdin.buffer.read())
    opts = {k: job[k] for k in ("target", "glob", "limit", "max_files")}
    try:
        if "entries" in job:  # files another backend read: only the matching runs here
            entries = ((sub, name, lambda d=data: d) for sub, name, data in job["entries"])
            found, more = limited(job["seconds"], scan, entries, job["shown"], job["pattern"], **opts)
        else:
            found, more = search(job["root"], job["rel"], job["shown"], job["pattern"], max_file=job["max_file"],
                                 seconds=job["seconds"], **opts)
        reply = {"found": found, "more": more}
    except Exception as e:  # noqa: BLE001 (the runner raises it again)
        reply = reply_of(e)
    sys.stdout.buffer.write(marshal.dumps(reply))


def _small_file(dir_fd: int, name: str, max_file: int) -> bytes | None:
    try:
        fd, st = open_regular_at(dir_fd, name)
    except (OSError, PathEscapeError):  # vanished, swapped for a link or unreadable: skip it
        return None
    with open(fd, "rb") as raw:
        return None if st.st_size > max_file else raw.read(max_file + 1)


def compile_pattern(pattern: str):  # type: ignore[no-untyped-def]
    """search_files' regular expression compiled, or FileOpError("invalid_pattern") saying why. Not
    only syntax errors: a repeat count over `re`'s limit (`a{1,99999999999}`) raises OverflowError,
    nesting deeper than its parser recurses RecursionError, a pattern too large for memory
    MemoryError; each is the model's to fix, never a failure of the tool."""
    import re

    try:
        return re.compile(pattern)
    except (re.error, OverflowError, RecursionError, MemoryError) as e:
        why = {RecursionError: "nested too deeply", MemoryError: "too large to compile"}.get(type(e), str(e))
        shown = repr(pattern) if len(pattern) <= 100 else f"{pattern[:100]!r}... ({len(pattern)} characters)"
        raise FileOpError("invalid_pattern", f"invalid regular expression {shown}: {why}") from None


def scan(entries, shown: str, pattern: str, *, target: str, glob: str | None, limit: int,  # type: ignore[no-untyped-def]
         max_files: int) -> tuple[list[str], bool]:
    """The matching of `search` over (path below `shown`, file name, read() -> bytes or None)."""
    import fnmatch
    import posixpath

    rx = compile_pattern(pattern)
    found: list[str] = []
    seen = 0
    for sub, name, read_fn in entries:
        if sub and glob and not fnmatch.fnmatch(name, glob):  # a file named by `path` itself is searched
            continue
        seen += 1
        if seen > max_files:
            break
        display = posixpath.normpath(posixpath.join(shown, sub)) if sub else shown
        if target == "files":
            if rx.search(name) or rx.search(sub):
                if len(found) == limit:
                    return found, True
                found.append(display)
            continue
        data = read_fn()
        if data is None or b"\0" in data[:8192]:
            continue
        for num, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
            if rx.search(line[:MAX_LINE_CHARS]):
                if len(found) == limit:
                    return found, True
                found.append(f"{display}:{num}: {line.strip()[:300]}")
    return found, False
