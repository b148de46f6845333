"""read_file, write_file, patch and search_files on a real workspace in a temp dir."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from trajforge.config import RunConfig
from trajforge.sandbox.local import LocalSandbox
from trajforge.tools import files
from trajforge.tools.base import ToolContext, result_failed

READ, WRITE, PATCH, SEARCH = files.ReadFileTool(), files.WriteFileTool(), files.PatchTool(), files.SearchFilesTool()


def in_sandbox(tmp_path: Path, body: Callable[[ToolContext], Coroutine[Any, Any, None]], cwd: str | None = None) -> None:
    async def main() -> None:
        async with LocalSandbox(tmp_path, cwd=cwd) as sandbox:
            await body(ToolContext(sandbox=sandbox, config=RunConfig()))

    asyncio.run(main())


async def call(tool: Any, ctx: ToolContext, **args: Any) -> dict[str, Any]:
    text = await tool.run(args, ctx)
    data = json.loads(text)
    assert result_failed(text) == (data.get("error") is not None)
    return data


def test_write_then_read_roundtrip(tmp_path: Path) -> None:
    async def body(ctx: ToolContext) -> None:
        r = await call(WRITE, ctx, path="pkg/deep/mod.py", content="héllo\nworld\n")
        assert r["success"] is True
        assert r["bytes_written"] == len("héllo\nworld\n".encode())
        assert (ctx.sandbox.cwd / "pkg" / "deep" / "mod.py").read_text() == "héllo\nworld\n"
        r = await call(READ, ctx, path="pkg/deep/mod.py")
        assert r["content"] == "héllo\nworld\n" and r["total_lines"] == 2 and "next_offset" not in r
        r = await call(READ, ctx, path=str(ctx.sandbox.cwd / "pkg/deep/mod.py"))  # absolute, inside
        assert r["content"].startswith("héllo")
        r = await call(WRITE, ctx, path="empty.txt", content="")
        assert r["bytes_written"] == 0

    in_sandbox(tmp_path, body, cwd="task")


def test_read_offset_limit_and_errors(tmp_path: Path) -> None:
    async def body(ctx: ToolContext) -> None:
        ws = ctx.sandbox.workspace
        (ws / "ten.txt").write_text("".join(f"line{i}\n" for i in range(1, 11)))
        r = await call(READ, ctx, path="ten.txt", offset=3, limit=2)
        assert r["content"] == "line3\nline4\n" and r["total_lines"] == 10
        assert (r["start_line"], r["end_line"], r["next_offset"]) == (3, 4, 5)
        r = await call(READ, ctx, path="ten.txt", offset=11)
        assert "past the end" in r["error"] and "10 lines" in r["error"]
        assert "not found" in (await call(READ, ctx, path="nope.txt"))["error"]
        (ws / "adir").mkdir()
        assert "is a directory" in (await call(READ, ctx, path="adir"))["error"]
        (ws / "blob.bin").write_bytes(b"\x89PNG\x00\x01\x02")
        assert "binary" in (await call(READ, ctx, path="blob.bin"))["error"]
        assert "integer" in (await call(READ, ctx, path="ten.txt", offset="3"))["error"]
        assert "required" in (await call(READ, ctx))["error"]
        (ws / "wide.txt").write_text("x" * 10_000 + "\n")
        r = await call(READ, ctx, path="wide.txt")
        assert "line truncated" in r["content"] and len(r["content"]) < 5000

    in_sandbox(tmp_path, body)


def test_paths_outside_the_workspace_are_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("private")

    async def body(ctx: ToolContext) -> None:
        ws = ctx.sandbox.workspace
        (ws / "root").symlink_to("/")
        (ws / "out").symlink_to(tmp_path)
        for path in ("../../etc/passwd", "/etc/passwd", "root/etc/passwd", "out/outside.txt", str(outside)):
            r = await call(READ, ctx, path=path)
            assert "outside the workspace" in r["error"], path
        for path in ("/tmp/x", "../x", "out/new.txt", "root/tmp/x"):
            r = await call(WRITE, ctx, path=path, content="pwned")
            assert "outside the workspace" in r["error"], path
        r = await call(PATCH, ctx, path="out/outside.txt", old_string="private", new_string="public")
        assert "outside the workspace" in r["error"]
        r = await call(SEARCH, ctx, pattern="private", path="..")
        assert "outside the workspace" in r["error"]

    in_sandbox(tmp_path, body)
    assert outside.read_text() == "private" and not (tmp_path / "new.txt").exists()


def test_patch_unique_replace_and_diff(tmp_path: Path) -> None:
    async def body(ctx: ToolContext) -> None:
        path = ctx.sandbox.workspace / "app.py"
        path.write_text("def f():\n    return 1\n\ndef g():\n    return 1\n")
        r = await call(PATCH, ctx, path="app.py", old_string="def g():\n    return 1", new_string="def g():\n    return 2")
        assert r["replacements"] == 1 and "-    return 1" in r["diff"] and "+    return 2" in r["diff"]
        assert path.read_text() == "def f():\n    return 1\n\ndef g():\n    return 2\n"

        r = await call(PATCH, ctx, path="app.py", old_string="return", new_string="yield")
        assert "occurs 2 times" in r["error"] and "lines 2, 5" in r["error"] and "replace_all" in r["error"]
        r = await call(PATCH, ctx, path="app.py", old_string="return", new_string="yield", replace_all=True)
        assert r["replacements"] == 2 and path.read_text().count("yield") == 2

        r = await call(PATCH, ctx, path="app.py", old_string="def gg():", new_string="def k():")
        assert "not found" in r["error"] and "closest line is 4: 'def g():'" in r["error"]
        r = await call(PATCH, ctx, path="app.py", old_string="def f():\n  yield 1", new_string="x")
        assert "whitespace" in r["error"]
        r = await call(PATCH, ctx, path="app.py", old_string="zzz qqq", new_string="x")
        assert "not found" in r["error"] and "read_file" in r["error"]
        r = await call(PATCH, ctx, path="missing.py", old_string="a", new_string="b")
        assert "not found" in r["error"]
        r = await call(PATCH, ctx, path="app.py", old_string="", new_string="b")
        assert "old_string" in r["error"]

        crlf = ctx.sandbox.workspace / "win.txt"
        crlf.write_bytes(b"one\r\ntwo\r\nthree\r\n")
        r = await call(PATCH, ctx, path="win.txt", old_string="one\ntwo", new_string="1\n2")
        assert r["replacements"] == 1 and crlf.read_bytes() == b"1\r\n2\r\nthree\r\n"

    in_sandbox(tmp_path, body)


def test_search_content_and_names(tmp_path: Path) -> None:
    async def body(ctx: ToolContext) -> None:
        ws = ctx.sandbox.workspace
        (ws / "src" / "pkg").mkdir(parents=True)
        (ws / "src" / "pkg" / "core.py").write_text("import os\n\ndef find_me():\n    return 'needle'\n")
        (ws / "src" / "notes.md").write_text("a needle in the docs\n")
        (ws / "src" / "data.bin").write_bytes(b"needle\x00\x01")
        (ws / "node_modules").mkdir()
        (ws / "node_modules" / "dep.js").write_text("needle\n")
        (ws / "etc-link").symlink_to("/etc")

        r = await call(SEARCH, ctx, pattern=r"needle")
        assert sorted(r["matches"]) == ["src/notes.md:1: a needle in the docs", "src/pkg/core.py:4: return 'needle'"]
        r = await call(SEARCH, ctx, pattern="needle", path="src", file_glob="*.py")
        assert r["matches"] == ["src/pkg/core.py:4: return 'needle'"]
        r = await call(SEARCH, ctx, pattern=r"def \w+_me", path="src/pkg/core.py")
        assert r["matches"] == ["src/pkg/core.py:3: def find_me():"]
        r = await call(SEARCH, ctx, pattern=r"^core\.py$", target="files")
        assert r["files"] == ["src/pkg/core.py"]
        r = await call(SEARCH, ctx, pattern=r"\.(py|md)$", target="files", path="./src")
        assert r["files"] == ["src/notes.md", "src/pkg/core.py"]
        r = await call(SEARCH, ctx, pattern="root")  # /etc/passwd behind the symlink is never read
        assert r["matches"] == [] and r["count"] == 0

        r = await call(SEARCH, ctx, pattern="(unclosed")
        assert "invalid regular expression" in r["error"]
        r = await call(SEARCH, ctx, pattern="x", target="everything")
        assert "target" in r["error"]
        r = await call(SEARCH, ctx, pattern="x", path="no-such-dir")
        assert "not found" in r["error"]

        (ws / "many.txt").write_text("hit\n" * 20)
        r = await call(SEARCH, ctx, pattern="hit", max_results=5)
        assert r["count"] == 5 and r["truncated"] and "narrow" in r["hint"]

    in_sandbox(tmp_path, body)


@pytest.mark.parametrize("tool", [READ, WRITE, PATCH, SEARCH])
def test_schemas_name_required_arguments(tool: Any) -> None:
    params = tool.schema()["function"]["parameters"]
    assert params["required"] and set(params["required"]) <= set(params["properties"])
    assert all(p.get("description") for p in params["properties"].values())
