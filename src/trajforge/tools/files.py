"""The `file` toolset: read_file, write_file, patch and search_files on the sample's workspace.

Every path goes through `sandbox.resolve`, which refuses anything outside the workspace
(`..`, absolute paths elsewhere, symlinks pointing out) and returns its real host path. The
runner (often root) then opens that path with `sandbox.safe_fs`, component by component from
the workspace root without following links, so a sample's background job swapping a directory
for a symlink after resolve() cannot steer a read or write outside the workspace. File work runs
in a thread so a large file never stalls the event loop. Whatever the model can fix (missing
file, ambiguous patch, bad regex, a link swapped in meanwhile) comes back as an error result.
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import fnmatch
import io
import os
import posixpath
import re
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from trajforge.sandbox import safe_fs
from trajforge.sandbox.base import PathEscapeError, SandboxError
from trajforge.tools.base import Tool, ToolContext, ToolInfraError, Toolset, error, ok

if TYPE_CHECKING:
    from trajforge.config import RunConfig

MAX_READ_BYTES = 256 << 20  # beyond this, reading (even counting lines) is a job for `sed -n`
MAX_READ_CHARS = 100_000  # content returned by one read_file call
MAX_LINE_CHARS = 4_000
MAX_SEARCH_FILE = 2 << 20  # larger files are skipped by content search
MAX_SEARCH_FILES = 50_000
SKIP_DIRS = {".git", ".hg", ".svn", "node_modules", "__pycache__", ".venv", ".mypy_cache", ".pytest_cache", ".tox"}


class _Refused(Exception):
    """A problem the model can act on; becomes an error result."""


def _str(args: dict[str, Any], name: str, *, allow_empty: bool = False) -> str:
    value = args.get(name)
    if not isinstance(value, str) or (not allow_empty and not value):
        raise _Refused(f"'{name}' is required and must be a {'' if allow_empty else 'non-empty '}string")
    return value


def _opt_str(args: dict[str, Any], name: str, default: str | None) -> str | None:
    value = args.get(name)
    if value is None or value == "":
        return default
    if not isinstance(value, str):
        raise _Refused(f"'{name}' must be a string")
    return value


def _int(args: dict[str, Any], name: str, default: int, lo: int, hi: int) -> int:
    value = args.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Refused(f"'{name}' must be an integer")
    if not lo <= value <= hi:
        raise _Refused(f"'{name}' must be between {lo} and {hi}, got {value}")
    return value


def _is_binary(raw: io.BufferedReader) -> bool:
    """A NUL in the first 8 KB; leaves `raw` at the start."""
    head = raw.read(8192)
    raw.seek(0)
    return b"\0" in head


def _locate(ctx: ToolContext, shown: str) -> tuple[Path, PurePosixPath]:
    """(real workspace root, path relative to it) of a model-given path, checked by resolve()."""
    root = Path(os.path.realpath(ctx.sandbox.workspace))
    return root, safe_fs.relative_in(root, ctx.sandbox.resolve(shown))


class _FileTool(Tool):
    toolset = "file"

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        try:
            return await self.act(args, ctx)
        except safe_fs.SymlinkError as e:  # only when a link appeared after resolve(): a race
            return error(f"{args.get('path') or '.'} is or goes through a symbolic link ({e.link} in the "
                         "workspace); the file tools do not follow links that change while they work")
        except (_Refused, PathEscapeError) as e:
            return error(str(e))
        except SandboxError as e:  # the sandbox itself is gone: fail the sample, not the call
            raise ToolInfraError(str(e)) from e
        except UnicodeDecodeError:
            return error(f"{args.get('path')} is not UTF-8 text")
        except OSError as e:
            return error(f"{args.get('path')}: {e.strerror or e}")

    async def act(self, args: dict[str, Any], ctx: ToolContext) -> str:  # the tool's work
        raise NotImplementedError


def _open_existing(root: Path, rel: PurePosixPath, shown: str) -> io.BufferedReader:
    """The regular file to read, opened without following links."""
    try:
        fd, _ = safe_fs.open_regular_in(root, rel)
    except FileNotFoundError:
        raise _Refused(f"file not found: {shown}") from None
    except IsADirectoryError:
        raise _Refused(f"{shown} is a directory; list it with search_files (target='files') or the terminal") from None
    except safe_fs.NotRegularFileError:  # a FIFO or device would block or never end
        raise _Refused(f"{shown} is not a regular file") from None
    return os.fdopen(fd, "rb")


class ReadFileTool(_FileTool):
    name = "read_file"
    description = (
        "Read a text file. Returns the lines offset..offset+limit-1 as plain content plus "
        "total_lines; call again with the returned next_offset to continue."
    )
    parameters = {
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "File path, relative to the working directory."},
            "offset": {"type": "integer", "minimum": 1, "default": 1, "description": "First line to read (1-based)."},
            "limit": {"type": "integer", "minimum": 1, "maximum": 2000, "default": 500, "description": "Maximum lines to read."},
        },
        "required": ["path"],
    }

    async def act(self, args: dict[str, Any], ctx: ToolContext) -> str:
        shown = _str(args, "path")
        offset = _int(args, "offset", 1, 1, 10**9)
        limit = _int(args, "limit", 500, 1, 2000)
        root, rel = _locate(ctx, shown)
        return await asyncio.to_thread(self._read, root, rel, shown, offset, limit)

    @staticmethod
    def _read(root: Path, rel: PurePosixPath, shown: str, offset: int, limit: int) -> str:
        lines: list[str] = []
        chars, total, cut = 0, 0, False
        with _open_existing(root, rel, shown) as raw:
            size = os.fstat(raw.fileno()).st_size
            if size > MAX_READ_BYTES:
                raise _Refused(f"{shown} is too large ({size} bytes); read parts with the terminal (sed -n, head)")
            if _is_binary(raw):
                raise _Refused(f"{shown} is a binary file ({size} bytes); inspect it with terminal tools (file, xxd)")
            for total, line in enumerate(io.TextIOWrapper(raw, encoding="utf-8", errors="replace"), 1):
                if total < offset or total >= offset + limit or cut:
                    continue
                if len(line) > MAX_LINE_CHARS:
                    line = line[:MAX_LINE_CHARS] + " [... line truncated ...]\n"
                if chars + len(line) > MAX_READ_CHARS and lines:
                    cut = True
                    continue
                lines.append(line)
                chars += len(line)
        if offset > max(total, 1):
            raise _Refused(f"offset {offset} is past the end of {shown} ({total} lines)")
        end = offset + len(lines) - 1
        more = {"next_offset": end + 1} if end < total else {}
        return ok(path=shown, content="".join(lines), total_lines=total, start_line=offset,
                  end_line=end, truncated=cut, **more)


class WriteFileTool(_FileTool):
    name = "write_file"
    description = "Create or overwrite a text file with `content`; parent directories are created."
    parameters = {
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "File path, relative to the working directory."},
            "content": {"type": "string", "description": "The complete new file content."},
        },
        "required": ["path", "content"],
    }

    async def act(self, args: dict[str, Any], ctx: ToolContext) -> str:
        shown = _str(args, "path")
        data = _str(args, "content", allow_empty=True).encode("utf-8")
        root, rel = _locate(ctx, shown)
        try:
            await asyncio.to_thread(safe_fs.write_bytes_in, root, rel, data, create_dirs=True)
        except (IsADirectoryError, safe_fs.NotRegularFileError):
            raise _Refused(f"{shown} exists and is not a regular file") from None
        return ok(path=shown, bytes_written=len(data))


class PatchTool(_FileTool):
    name = "patch"
    description = (
        "Edit a file by replacing an exact string. `old_string` must occur exactly once (include "
        "surrounding lines to make it unique) unless replace_all is true. Returns a diff."
    )
    parameters = {
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "File to edit, relative to the working directory."},
            "old_string": {"type": "string", "description": "Exact text to replace, including whitespace."},
            "new_string": {"type": "string", "description": "Replacement text."},
            "replace_all": {"type": "boolean", "default": False, "description": "Replace every occurrence."},
        },
        "required": ["path", "old_string", "new_string"],
    }

    async def act(self, args: dict[str, Any], ctx: ToolContext) -> str:
        shown = _str(args, "path")
        old = _str(args, "old_string")
        new = _str(args, "new_string", allow_empty=True)
        replace_all = args.get("replace_all", False) is True
        if old == new:
            raise _Refused("old_string and new_string are identical; nothing to change")
        root, rel = _locate(ctx, shown)
        return await asyncio.to_thread(self._patch, root, rel, shown, old, new, replace_all)

    @staticmethod
    def _patch(root: Path, rel: PurePosixPath, shown: str, old: str, new: str, replace_all: bool) -> str:
        with _open_existing(root, rel, shown) as f:
            text = f.read().decode("utf-8")  # bytes, not text mode: CRLF stays as it is
        count = text.count(old)
        if count == 0 and "\r\n" in text and "\r\n" not in old:
            old, new = old.replace("\n", "\r\n"), new.replace("\n", "\r\n")
            count = text.count(old)
        if count == 0:
            raise _Refused(f"old_string not found in {shown}; {_closest_hint(text, old)}")
        if count > 1 and not replace_all:
            lines = _occurrence_lines(text, old)
            raise _Refused(f"old_string occurs {count} times in {shown} (lines {lines}); add surrounding "
                           "context to make it unique, or pass replace_all=true")
        updated = text.replace(old, new) if replace_all else text.replace(old, new, 1)
        try:  # a temp file renamed over it: a reader never sees half a file
            safe_fs.replace_in(root, rel, updated.encode("utf-8"))
        except (IsADirectoryError, safe_fs.NotRegularFileError, FileNotFoundError):
            raise _Refused(f"{shown} changed while it was patched; read it again") from None
        diff = "".join(difflib.unified_diff(text.splitlines(True), updated.splitlines(True), shown, shown, n=2))
        if len(diff) > 4000:
            diff = diff[:4000] + "\n[... diff truncated ...]\n"
        return ok(path=shown, replacements=count if replace_all else 1, diff=diff)


def _occurrence_lines(text: str, needle: str, shown: int = 5) -> str:
    starts = [m.start() for m in re.finditer(re.escape(needle), text)]
    nums = [str(text.count("\n", 0, s) + 1) for s in starts[:shown]]
    return ", ".join(nums) + (", ..." if len(starts) > shown else "")


def _closest_hint(text: str, old: str) -> str:
    if " ".join(old.split()) in " ".join(text.split()):
        return "it matches only when whitespace is ignored: copy the exact indentation and line breaks from read_file"
    first = next((ln.strip() for ln in old.splitlines() if ln.strip()), "")
    lines = text.splitlines()[:20_000]
    close = difflib.get_close_matches(first, [ln.strip() for ln in lines], n=1, cutoff=0.6) if first else []
    if close:
        num = next(i for i, ln in enumerate(lines, 1) if ln.strip() == close[0])
        return f"the closest line is {num}: {close[0][:200]!r}; read_file the file and copy the text exactly"
    return "read_file the file and copy the text to replace exactly"


class SearchFilesTool(_FileTool):
    name = "search_files"
    description = (
        "Search with a regular expression (Python syntax). target='content' (default) returns "
        "matching lines as path:line: text; target='files' matches file names (or relative paths) "
        f"and returns paths. Binary files, files over {MAX_SEARCH_FILE >> 20} MB, symlinks and "
        f"{', '.join(sorted(SKIP_DIRS))} directories are skipped."
    )
    parameters = {
        "type": "object",
        "properties": {
            "pattern": {"type": "string", "description": "Regular expression to search for."},
            "path": {"type": "string", "default": ".", "description": "Directory (or file) to search in."},
            "target": {"type": "string", "enum": ["content", "files"], "default": "content",
                       "description": "Search file contents or file names."},
            "file_glob": {"type": "string", "description": "Only files whose name matches this glob, e.g. '*.py'."},
            "max_results": {"type": "integer", "minimum": 1, "maximum": 500, "default": 50,
                            "description": "Maximum results to return."},
        },
        "required": ["pattern"],
    }

    async def act(self, args: dict[str, Any], ctx: ToolContext) -> str:
        pattern = _str(args, "pattern")
        shown = _opt_str(args, "path", ".") or "."
        target = _opt_str(args, "target", "content")
        if target not in ("content", "files"):
            raise _Refused("'target' must be 'content' or 'files'")
        glob = _opt_str(args, "file_glob", None)
        limit = _int(args, "max_results", 50, 1, 500)
        try:
            rx = re.compile(pattern)
        except re.error as e:
            raise _Refused(f"invalid regular expression {pattern!r}: {e}") from None
        root, rel = _locate(ctx, shown)
        try:
            found, more = await asyncio.to_thread(_search, root, rel, shown, rx, target, glob, limit)
        except FileNotFoundError:
            raise _Refused(f"path not found: {shown}") from None
        key = "matches" if target == "content" else "files"
        hint = {"hint": "more results exist; narrow the pattern, path or file_glob"} if more else {}
        return ok(**{key: found}, count=len(found), truncated=more, **hint)


def _search(root: Path, rel: PurePosixPath, shown: str, rx: re.Pattern[str], target: str, glob: str | None,
            limit: int) -> tuple[list[str], bool]:
    with contextlib.closing(safe_fs.walk_files(root, rel, skip_dirs=SKIP_DIRS)) as walk:  # closes its fds on return
        return _scan(walk, shown, rx, target, glob, limit)


def _scan(walk: Iterator[tuple[str, int, str]], shown: str, rx: re.Pattern[str], target: str, glob: str | None,
          limit: int) -> tuple[list[str], bool]:
    found: list[str] = []
    seen = 0
    for sub, dir_fd, name in walk:
        if sub and glob and not fnmatch.fnmatch(name, glob):  # a file named by `path` itself is searched
            continue
        seen += 1
        if seen > MAX_SEARCH_FILES:
            break
        display = posixpath.normpath(posixpath.join(shown, sub)) if sub else shown
        if target == "files":
            if rx.search(name) or rx.search(sub):
                if len(found) == limit:
                    return found, True
                found.append(display)
            continue
        try:
            fd, st = safe_fs.open_regular_at(dir_fd, name)
            with open(fd, "rb") as raw:
                if st.st_size > MAX_SEARCH_FILE or _is_binary(raw):
                    continue
                for num, line in enumerate(io.TextIOWrapper(raw, encoding="utf-8", errors="replace"), 1):
                    if rx.search(line[:MAX_LINE_CHARS]):
                        if len(found) == limit:
                            return found, True
                        found.append(f"{display}:{num}: {line.strip()[:300]}")
        except (OSError, PathEscapeError):  # vanished, swapped for a link or unreadable: skip it
            continue
    return found, False


async def build(config: RunConfig) -> Toolset:
    return Toolset("file", [ReadFileTool(), WriteFileTool(), PatchTool(), SearchFilesTool()])
