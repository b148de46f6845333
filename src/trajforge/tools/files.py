"""The `file` toolset: read_file, write_file, patch and search_files on the sample's workspace.

Every file access is a method of the sandbox (read_file, write_file, search), with the path as
the model gave it: the backend refuses anything outside the workspace and never follows a link
that changes while it works (sandbox/inside/fsops.py), inside the sample's own view where it has one.
This module owns the model-facing contract: argument checks, line slicing, the patch logic and
the messages. Whatever the model can fix (missing file, ambiguous patch, bad regex, a link
swapped in meanwhile) comes back as an error result.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, TypeVar

from trajforge.sandbox.interface import FileOpError, PathEscapeError, SandboxError, SymlinkError
from trajforge.sandbox.inside.fsops import SKIP_DIRS, compile_pattern
from trajforge.sandbox.inside.safe_fs import MAX_DEPTH
from trajforge.tools.tool import Tool, ToolContext, ToolInfraError, Toolset, error, ok
from trajforge.tools.patch_hints import change_diff, closest_hint, occurrence_lines
from trajforge.tools.read_lines import Binary, TooLarge, Window, read_window

if TYPE_CHECKING:
    from trajforge.tools.tool_settings import ToolSettings

MAX_READ_BYTES = 256 << 20  # beyond this, reading (even counting lines) is a job for `sed -n`
# Bytes all of a sample's read_file calls may stream through the runner (~3 ms of its CPU per MiB,
# to count lines): reading a 256 MB file for one line, over and over, was the model's to repeat.
READ_BUDGET = 4 << 30
MAX_PATCH_BYTES = 16 << 20  # patch holds the file in the runner, outside the sample's memory limit
MAX_READ_CHARS = 100_000  # content returned by one read_file call
MAX_LINE_CHARS = 4_000  # also fsops.MAX_LINE_CHARS, for search
MAX_SEARCH_FILE = 2 << 20  # larger files are skipped by content search
MAX_SEARCH_FILES = 50_000
T = TypeVar("T")


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


class _FileTool(Tool):
    toolset = "file"

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        try:
            return await self.act(args, ctx)
        except SymlinkError as e:  # only when a link appeared while the path was walked: a race
            return error(f"{args.get('path') or '.'} is or goes through a symbolic link ({e.link} in the "
                         "workspace); the file tools do not follow links that change while they work")
        except (_Refused, PathEscapeError) as e:
            return error(str(e))
        except FileOpError as e:
            return error(f"{args.get('path') or '.'}: {e}")
        except SandboxError as e:  # the sandbox itself is gone: fail the sample, not the call
            raise ToolInfraError(str(e)) from e
        except UnicodeDecodeError:
            return error(f"{args.get('path')} is not UTF-8 text")
        except OSError as e:
            return error(f"{args.get('path')}: {e.strerror or e}")

    async def act(self, args: dict[str, Any], ctx: ToolContext) -> str:  # the tool's work
        raise NotImplementedError


async def _read_existing(ctx: ToolContext, shown: str) -> bytes:
    """The bytes of the regular file to patch; the model's errors as _Refused."""
    return await _refusing(ctx.sandbox.read_file(shown, max_bytes=MAX_PATCH_BYTES), shown)


async def _refusing(read: Awaitable[T], shown: str) -> T:
    """`read` of the model's file, with what the model can change as _Refused."""
    try:
        return await read
    except FileOpError as e:
        if e.kind == "not_found":
            raise _Refused(f"file not found: {shown}") from None
        if e.kind == "is_dir":
            raise _Refused(f"{shown} is a directory; list it with search_files (target='files') or the terminal") from None
        if e.kind == "not_regular":  # a FIFO or device would block or never end
            raise _Refused(f"{shown} is not a regular file") from None
        if e.kind == "too_large":
            raise _Refused(f"{shown} is too large to patch ({e}); edit it with the terminal (sed -i)") from None
        raise


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
        read_so_far = ctx.state.get("read_file_bytes", 0)
        if read_so_far >= READ_BUDGET:
            raise _Refused(f"this task has read {READ_BUDGET >> 30} GiB with read_file, the most it may; "
                           "read further with the terminal (sed -n, head, tail, grep)")
        window = Window(offset, limit, MAX_READ_CHARS, MAX_LINE_CHARS)
        try:
            await _refusing(read_window(ctx.sandbox, shown, window, max_bytes=MAX_READ_BYTES), shown)
        except Binary:
            raise _Refused(f"{shown} is a binary file; inspect it with terminal tools (file, xxd)") from None
        except TooLarge:
            raise _Refused(f"{shown} is too large (more than {MAX_READ_BYTES} bytes); read parts with "
                           "the terminal (sed -n, head)") from None
        finally:
            ctx.state["read_file_bytes"] = read_so_far + window.size
        total, lines = window.total, window.lines
        if offset > max(total, 1):
            raise _Refused(f"offset {offset} is past the end of {shown} ({total} lines)")
        end = offset + len(lines) - 1
        more = {"next_offset": end + 1} if end < total else {}
        return ok(path=shown, content="".join(lines), total_lines=total, start_line=offset,
                  end_line=end, truncated=window.cut, **more)


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
        try:
            await ctx.sandbox.write_file(shown, data)
        except FileOpError as e:
            if e.kind in ("is_dir", "not_regular"):
                raise _Refused(f"{shown} exists and is not a regular file") from None
            raise
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
        text = (await _read_existing(ctx, shown)).decode("utf-8")  # bytes: CRLF stays as it is
        updated, count = self._patch(text, shown, old, new, replace_all)
        try:  # a temp file renamed over it: a reader never sees half a file
            await ctx.sandbox.write_file(shown, updated.encode("utf-8"), how="replace")
        except FileOpError as e:
            if e.kind in ("is_dir", "not_regular", "not_found"):
                raise _Refused(f"{shown} changed while it was patched; read it again") from None
            raise
        diff = change_diff(text, updated, shown, old, new, every=replace_all)
        if len(diff) > 4000:
            diff = diff[:4000] + "\n[... diff truncated ...]\n"
        return ok(path=shown, replacements=count if replace_all else 1, diff=diff)

    @staticmethod
    def _patch(text: str, shown: str, old: str, new: str, replace_all: bool) -> tuple[str, int]:
        count = text.count(old)
        if count == 0 and "\r\n" in text and "\r\n" not in old:
            old, new = old.replace("\n", "\r\n"), new.replace("\n", "\r\n")
            count = text.count(old)
        if count == 0:
            raise _Refused(f"old_string not found in {shown}; {closest_hint(text, old)}")
        if count > 1 and not replace_all:
            lines = occurrence_lines(text, old)
            raise _Refused(f"old_string occurs {count} times in {shown} (lines {lines}); add surrounding "
                           "context to make it unique, or pass replace_all=true")
        size = len(text) + (count if replace_all else 1) * (len(new) - len(old))
        if size > MAX_PATCH_BYTES:  # checked before it is built: the runner would hold it
            raise _Refused(f"the patched {shown} would be {size} characters, over patch's limit of "
                           f"{MAX_PATCH_BYTES >> 20} MiB; edit it with the terminal (sed -i)")
        return (text.replace(old, new) if replace_all else text.replace(old, new, 1)), count


class SearchFilesTool(_FileTool):
    name = "search_files"
    description = (
        "Search with a regular expression (Python syntax). target='content' (default) returns "
        "matching lines as path:line: text; target='files' matches file names (or relative paths) "
        f"and returns paths. Binary files, files over {MAX_SEARCH_FILE >> 20} MB, symlinks and "
        f"{', '.join(sorted(SKIP_DIRS))} directories are skipped, and so is anything more than "
        f"{MAX_DEPTH} directory levels below `path`."
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
            compile_pattern(pattern)  # checked here: the backend compiles it again where it searches
            found, more = await ctx.sandbox.search(shown, pattern, target=target, glob=glob, limit=limit,
                                                   max_file=MAX_SEARCH_FILE, max_files=MAX_SEARCH_FILES)
        except FileOpError as e:
            if e.kind == "not_found":
                raise _Refused(f"path not found: {shown}") from None
            if e.kind == "invalid_pattern":  # also from a helper whose Python refuses what ours took
                raise _Refused(str(e)) from None
            raise
        key = "matches" if target == "content" else "files"
        hint = {"hint": "more results exist; narrow the pattern, path or file_glob"} if more else {}
        return ok(**{key: found}, count=len(found), truncated=more, **hint)


async def build(run: ToolSettings) -> Toolset:
    return Toolset("file", [ReadFileTool(), WriteFileTool(), PatchTool(), SearchFilesTool()])
