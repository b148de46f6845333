"""read_file, write_file, patch and search_files on a real workspace in a temp dir."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import stat
from collections.abc import Callable, Coroutine
from pathlib import Path, PurePosixPath
from typing import Any

from trajforge.catalog.sandboxes import NetworkMode
import pytest

from trajforge.config import RunConfig
from trajforge.sandbox.inside import safe_fs
from trajforge.sandbox.backends.bwrap.bwrap_sandbox import BwrapSandbox
from trajforge.sandbox.backends.bwrap.bwrap_backend import probe
from trajforge.sandbox.backends.local.local_sandbox import LocalSandbox
from trajforge.tools import files
from trajforge.tools.tool import ToolContext, result_failed

READ, WRITE, PATCH, SEARCH = files.ReadFileTool(), files.WriteFileTool(), files.PatchTool(), files.SearchFilesTool()


def in_sandbox(tmp_path: Path, body: Callable[[ToolContext], Coroutine[Any, Any, None]], cwd: str | None = None,
               sandbox_cls: type[LocalSandbox] = LocalSandbox) -> None:
    async def main() -> None:
        async with sandbox_cls(tmp_path, cwd=cwd) as sandbox:
            await body(ToolContext(sandbox=sandbox, settings=RunConfig().tool_settings()))

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
        assert (Path(ctx.sandbox.cwd) / "pkg" / "deep" / "mod.py").read_text() == "héllo\nworld\n"
        r = await call(READ, ctx, path="pkg/deep/mod.py")
        assert r["content"] == "héllo\nworld\n" and r["total_lines"] == 2 and "next_offset" not in r
        r = await call(READ, ctx, path=str(Path(ctx.sandbox.cwd) / "pkg/deep/mod.py"))  # absolute, inside
        assert r["content"].startswith("héllo")
        r = await call(WRITE, ctx, path="empty.txt", content="")
        assert r["bytes_written"] == 0

    in_sandbox(tmp_path, body, cwd="task")


def test_patch_on_a_hostile_file_never_holds_the_event_loop(tmp_path: Path) -> None:
    """patch's hints and diff run on the loop every session shares: on a file the model wrote to be
    slow (20,000 lines whose every pair difflib scores at ~1 ms) the closest-line hint is looked for
    within its time budget (get_close_matches took ~20 s here), and a file over 64 KB gets the diff of
    its first change only (difflib over the whole file took minutes)."""
    import random
    import time

    from trajforge.tools.patch_hints import HINT_SECONDS, closest_hint

    rng = random.Random(1)
    text = "\n".join("".join(rng.choice("ab") for _ in range(100)) for _ in range(20_000))
    # The budget is a documented time, so it is measured, but in this thread's CPU seconds: other
    # load on the host stretches the wall clock, not them, and within a wall-clock budget the
    # search cannot use more CPU than that. The uncut search takes many seconds of CPU; the bound
    # is the budget and a second for splitting and joining the text around it.
    cpu = time.thread_time()
    hint = closest_hint(text, "".join(rng.choice("ab") for _ in range(100)))
    assert time.thread_time() - cpu < HINT_SECONDS + 1.0 and "closest line is" in hint

    async def body(ctx: ToolContext) -> None:
        path = ctx.sandbox.workspace / "big.txt"
        path.write_text("".join(f"row {i}\n" for i in range(200_000)))  # ~1.5 MB
        r = await call(PATCH, ctx, path="big.txt", old_string="row ", new_string="ROW ", replace_all=True)
        assert r["replacements"] == 200_000 and "first change only" in r["diff"] and "+ROW 0" in r["diff"], r
        assert path.read_text().startswith("ROW 0\nROW 1\n")
        slow = ctx.sandbox.workspace / "slow.txt"  # short repeated lines: a whole-file difflib took ~3 minutes
        slow.write_text("".join(f"v{i % 100}\n" for i in range(260_000)))
        r = await call(PATCH, ctx, path="slow.txt", old_string="v1\n", new_string="w1\n", replace_all=True)
        assert r["replacements"] == 2_600 and "+w1" in r["diff"] and "first change only" in r["diff"], r

    in_sandbox(tmp_path, body)


def test_patch_never_builds_a_file_past_its_limit_in_the_runner(tmp_path: Path) -> None:
    """The hostile model: a 15 MB one-line file of 'a', replace_all 'a' by 60 characters. The
    result (900 MB) was built, encoded and diffed in the runner (2.6 GB of its memory); now it is
    refused before it is built, and a large file's diff holds a bounded window."""
    import tracemalloc

    async def body(ctx: ToolContext) -> None:
        path = ctx.sandbox.workspace / "one.txt"
        path.write_bytes(b"a" * (15 << 20))
        tracemalloc.start()
        try:
            r = await call(PATCH, ctx, path="one.txt", old_string="a", new_string="b" * 60, replace_all=True)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert "over patch's limit" in r["error"] and "sed -i" in r["error"], r
        assert peak < 100 << 20, f"{peak >> 20} MB"
        assert path.stat().st_size == 15 << 20  # untouched
        path.write_bytes(b"x" * (4 << 20) + b"needle" + b"y" * (4 << 20))  # one line of 8 MB
        r = await call(PATCH, ctx, path="one.txt", old_string="needle", new_string="pin")
        assert r["success"] and len(r["diff"]) < 5000 and "first change only" in r["diff"], r["diff"][:300]
        assert path.read_bytes() == b"x" * (4 << 20) + b"pin" + b"y" * (4 << 20)

    in_sandbox(tmp_path, body)


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


# Patterns `re` cannot compile, each for another reason than a syntax error: a repeat count over
# its limit (OverflowError), nesting deeper than its parser recurses (RecursionError).
UNCOMPILABLE = {"a{1,99999999999}": "repetition number is too large",
                "x{99999999999}": "repetition number is too large",
                "(" * 100_000 + "a" + ")" * 100_000: "nested too deeply"}


@pytest.mark.parametrize("pattern", list(UNCOMPILABLE), ids=["range", "count", "nesting"])
def test_a_pattern_re_cannot_compile_is_an_error_result_and_no_traceback(
        tmp_path: Path, pattern: str, caplog: pytest.LogCaptureFixture) -> None:
    """Through the agent's dispatch, which logs a traceback for whatever a tool raises: the model
    gets a plain error naming the reason, and the run's log stays clean."""
    from trajforge.agent.loop import call_tool
    from trajforge.model.types import ToolCall

    async def body(ctx: ToolContext) -> None:
        (ctx.sandbox.workspace / "f.txt").write_text("aaa\n")
        call_ = ToolCall("c1", SEARCH.name, json.dumps({"pattern": pattern}))
        with caplog.at_level("DEBUG"):
            res = await call_tool(call_, {SEARCH.name: SEARCH}, ctx)
        assert res.failed, res.result
        message = json.loads(res.result)["error"]
        assert message.startswith("invalid regular expression") and UNCOMPILABLE[pattern] in message, message
        assert len(message) < 500, message  # the pattern is shortened, not echoed whole
        assert not caplog.records, [r.getMessage() for r in caplog.records]

    in_sandbox(tmp_path, body)


def test_the_matching_side_refuses_an_uncompilable_pattern_as_the_model_s_error() -> None:
    """Where the matching runs (a helper whose Python may differ from the runner's), the same
    patterns are a FileOpError the tool shows the model, not an "other" failure."""
    from trajforge.sandbox.inside import fsops

    for pattern, why in UNCOMPILABLE.items():
        with pytest.raises(fsops.FileOpError, match=why) as err:
            fsops.scan(iter([("f.txt", "f.txt", lambda: b"aaa\n")]), ".", pattern, target="content", glob=None,
                       limit=5, max_files=10)
        assert err.value.kind == "invalid_pattern"


@pytest.mark.parametrize("tool", [READ, WRITE, PATCH, SEARCH])
def test_schemas_name_required_arguments(tool: Any) -> None:
    params = tool.schema()["function"]["parameters"]
    assert params["required"] and set(params["required"]) <= set(params["properties"])
    assert all(p.get("description") for p in params["properties"].values())


# --- the resolve()-then-open race: a sandboxed job swaps a directory for a symlink in between ---


def swap_for_link(directory: Path, target: Path) -> None:
    """What a background job of the sample does: replace `directory` by a symlink to `target`."""
    shutil.rmtree(directory)
    directory.symlink_to(target, target_is_directory=True)


def outside_tree(tmp_path: Path) -> Path:
    outside = tmp_path / "outside"
    (outside / "b").mkdir(parents=True)
    (outside / "b" / "f.txt").write_text("outside secret\n")
    return outside


def test_low_level_helpers_refuse_a_directory_swapped_for_a_symlink(tmp_path: Path) -> None:
    outside = outside_tree(tmp_path)
    root = tmp_path / "ws"
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "f.txt").write_text("inside\n")
    rel = "a/b/f.txt"  # what fsops.locate() returned
    assert safe_fs.read_bytes_in(root, rel) == b"inside\n"

    swap_for_link(root / "a", outside)  # the race is lost: a/ now leads to the outside tree
    for attempt in (lambda: safe_fs.write_bytes_in(root, rel, b"pwned"),
                    lambda: safe_fs.write_bytes_in(root, PurePosixPath("a/b/new.txt"), b"pwned"),
                    lambda: safe_fs.write_bytes_in(root, PurePosixPath("a/c/d/new.txt"), b"pwned"),
                    lambda: safe_fs.replace_in(root, rel, b"pwned"),
                    lambda: safe_fs.read_bytes_in(root, rel),
                    lambda: os.close(safe_fs.open_in(root, rel, os.O_RDONLY)),
                    lambda: os.close(safe_fs.open_dir_in(root, PurePosixPath("a/b")))):
        with pytest.raises(safe_fs.SymlinkError) as info:
            attempt()
        assert info.value.link == "a" and "symbolic link" in str(info.value)
    assert sorted(p.relative_to(outside).as_posix() for p in outside.rglob("*")) == ["b", "b/f.txt"]
    assert (outside / "b" / "f.txt").read_text() == "outside secret\n"


def test_low_level_helpers_refuse_a_final_symlink_and_never_create_through_it(tmp_path: Path) -> None:
    outside = outside_tree(tmp_path)
    root = tmp_path / "ws"
    root.mkdir()
    (root / "f.txt").symlink_to(outside / "b" / "f.txt")
    (root / "dangling").symlink_to(outside / "created-by-root.txt")
    for rel in ("f.txt", "dangling"):
        with pytest.raises(safe_fs.SymlinkError):
            safe_fs.write_bytes_in(root, PurePosixPath(rel), b"pwned")
        with pytest.raises(safe_fs.SymlinkError):
            safe_fs.read_bytes_in(root, PurePosixPath(rel))
    with pytest.raises(safe_fs.SymlinkError):
        safe_fs.replace_in(root, PurePosixPath("f.txt"), b"pwned")
    assert not (outside / "created-by-root.txt").exists()
    assert (outside / "b" / "f.txt").read_text() == "outside secret\n"
    with pytest.raises(safe_fs.PathEscapeError):
        safe_fs.read_bytes_in(root, PurePosixPath("../outside/b/f.txt"))


def test_low_level_write_replace_and_non_regular_files(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    safe_fs.write_bytes_in(root, PurePosixPath("x/y/z.txt"), b"long first version\n")
    safe_fs.write_bytes_in(root, PurePosixPath("x/y/z.txt"), b"short\n")  # truncated, not appended
    assert (root / "x" / "y" / "z.txt").read_bytes() == b"short\n"
    target = root / "x" / "y" / "z.txt"
    target.chmod(0o751)
    safe_fs.replace_in(root, PurePosixPath("x/y/z.txt"), b"replaced\n")
    assert target.read_bytes() == b"replaced\n" and stat.S_IMODE(target.stat().st_mode) == 0o751
    assert sorted(p.name for p in (root / "x" / "y").iterdir()) == ["z.txt"]  # no temp file left behind
    os.mkfifo(root / "pipe")  # would block a plain open() forever
    with pytest.raises(safe_fs.NotRegularFileError):
        safe_fs.read_bytes_in(root, PurePosixPath("pipe"))
    with pytest.raises(safe_fs.NotRegularFileError):
        safe_fs.write_bytes_in(root, PurePosixPath("pipe"), b"x")
    with pytest.raises(IsADirectoryError):
        safe_fs.read_bytes_in(root, PurePosixPath("x"))
    with pytest.raises(FileNotFoundError):
        safe_fs.write_bytes_in(root, PurePosixPath("missing/f.txt"), b"x", create_dirs=False)


def test_walk_files_skips_links_and_survives_deep_trees(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    (root / "b" / "skip").mkdir(parents=True)
    (root / "a").mkdir()
    for name in ("z.txt", "a/1.txt", "b/2.txt", "b/skip/3.txt"):
        (root / name).write_text("x")
    (root / "to-etc").symlink_to("/etc")
    (root / "to-passwd").symlink_to("/etc/passwd")
    deep = root.joinpath(*["d"] * (safe_fs.MAX_DEPTH + 20))
    deep.mkdir(parents=True)
    (deep / "too-deep.txt").write_text("x")
    walk = safe_fs.walk_files(root, PurePosixPath("."), skip_dirs={"skip"})
    names = [sub for sub, _, _ in walk]
    assert names == ["z.txt", "a/1.txt", "b/2.txt"]
    assert [sub for sub, _, _ in safe_fs.walk_files(root, PurePosixPath("b/2.txt"))] == [""]
    with pytest.raises(safe_fs.SymlinkError):
        list(safe_fs.walk_files(root, PurePosixPath("to-etc")))


class RacingSandbox(LocalSandbox):
    """The path is located, then a background job of the sample swaps `a/` for a link to
    `outside` before the file operation opens it: the race, made deterministic."""

    outside: Path | None = None

    def _where(self, path: str) -> tuple[str, str]:
        located = super()._where(path)
        assert self.workspace is not None
        if self.outside is not None and (self.workspace / "a").is_dir() and not (self.workspace / "a").is_symlink():
            swap_for_link(self.workspace / "a", self.outside)
        return located


def test_tools_refuse_a_directory_swapped_for_a_symlink_after_locating(tmp_path: Path) -> None:
    outside = outside_tree(tmp_path)

    async def body(ctx: ToolContext) -> None:
        sb = ctx.sandbox
        assert isinstance(sb, RacingSandbox)
        sb.outside = outside

        def fresh() -> None:
            if (sb.workspace / "a").is_symlink():
                (sb.workspace / "a").unlink()
            (sb.workspace / "a" / "b").mkdir(parents=True)
            (sb.workspace / "a" / "b" / "f.txt").write_text("inside\n")

        for tool, args in ((READ, {"path": "a/b/f.txt"}),
                           (WRITE, {"path": "a/b/f.txt", "content": "pwned"}),
                           (WRITE, {"path": "a/b/new/g.txt", "content": "pwned"}),
                           (PATCH, {"path": "a/b/f.txt", "old_string": "secret", "new_string": "pwned"}),
                           (PATCH, {"path": "a/b/f.txt", "old_string": "inside", "new_string": "pwned"}),
                           (SEARCH, {"pattern": "secret", "path": "a/b"})):
            fresh()
            r = await call(tool, ctx, **args)
            assert "symbolic link" in r["error"] and "(a in the workspace)" in r["error"], (tool.name, r)
            assert "secret" not in json.dumps(r)
        fresh()
        r = await call(SEARCH, ctx, pattern="secret")  # a link met while walking is skipped
        assert r["matches"] == []

    in_sandbox(tmp_path, body, sandbox_cls=RacingSandbox)
    assert sorted(p.relative_to(outside).as_posix() for p in outside.rglob("*")) == ["b", "b/f.txt"]
    assert (outside / "b" / "f.txt").read_text() == "outside secret\n"


def test_symlinks_inside_the_workspace_still_work(tmp_path: Path) -> None:
    async def body(ctx: ToolContext) -> None:
        ws = ctx.sandbox.workspace
        (ws / "real").mkdir()
        (ws / "real" / "doc.txt").write_text("hello\n")
        (ws / "alias").symlink_to("real")
        (ws / "alias.txt").symlink_to("real/doc.txt")
        assert (await call(READ, ctx, path="alias/doc.txt"))["content"] == "hello\n"
        assert (await call(READ, ctx, path="alias.txt"))["content"] == "hello\n"
        r = await call(PATCH, ctx, path="alias/doc.txt", old_string="hello", new_string="bye")
        assert r["replacements"] == 1 and (ws / "real" / "doc.txt").read_text() == "bye\n"
        assert (ws / "alias.txt").is_symlink()  # the link was not replaced by a file
        assert (await call(WRITE, ctx, path="alias/new.txt", content="n"))["success"]
        assert (ws / "real" / "new.txt").read_text() == "n"

    in_sandbox(tmp_path, body)


def test_fifos_are_refused_without_blocking(tmp_path: Path) -> None:
    async def body(ctx: ToolContext) -> None:
        os.mkfifo(ctx.sandbox.workspace / "pipe")
        async with asyncio.timeout(10):
            assert "not a regular file" in (await call(READ, ctx, path="pipe"))["error"]
            assert "not a regular file" in (await call(WRITE, ctx, path="pipe", content="x"))["error"]
            assert "not a regular file" in (await call(PATCH, ctx, path="pipe", old_string="a", new_string="b"))["error"]
            assert (await call(SEARCH, ctx, pattern="x"))["matches"] == []

    in_sandbox(tmp_path, body)


BWRAP = asyncio.run(probe())


@pytest.mark.skipif(not BWRAP.usable or BWRAP.mode != "root", reason=f"needs bwrap as root: {BWRAP.detail}")
def test_bwrap_root_mode_files_written_by_tools_belong_to_the_sandbox(tmp_path: Path) -> None:
    async def main() -> None:
        async with BwrapSandbox(tmp_path, network=NetworkMode.NONE) as sb:
            ctx = ToolContext(sandbox=sb, settings=RunConfig().tool_settings())
            assert (await call(WRITE, ctx, path="new/dir/f.txt", content="one\n"))["success"]
            res = await sb.exec("echo two >> new/dir/f.txt && stat -c %u new new/dir new/dir/f.txt", timeout=10)
            assert res.exit_code == 0 and res.stdout.split() == [str(sb.uid)] * 3, res
            assert (await call(PATCH, ctx, path="new/dir/f.txt", old_string="one", new_string="uno"))["success"]
            f = sb.workspace / "new" / "dir" / "f.txt"
            assert f.stat().st_uid == sb.uid and f.read_text() == "uno\ntwo\n"  # patch kept the owner
            res = await sb.exec("echo tre >> new/dir/f.txt && cat new/dir/f.txt", timeout=10)
            assert res.stdout == "uno\ntwo\ntre\n"

    asyncio.run(main())
