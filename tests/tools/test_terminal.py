"""The terminal and process tools over a real LocalSandbox: real shells, real process trees."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from trajforge.catalog.sandboxes import NetworkMode
import pytest

from trajforge.config import RunConfig
from trajforge.sandbox.backends.bwrap.bwrap_sandbox import BwrapSandbox
from trajforge.sandbox.backends.bwrap.bwrap_backend import probe
from trajforge.sandbox.backends.local.local_sandbox import LocalSandbox
from trajforge.tools import terminal
from trajforge.tools.tool import ToolContext, result_failed
from trajforge.tools.toolsets import build_toolsets

from tests.sandbox.test_local import alive, gone

TERMINAL = terminal.TerminalTool()
PROCESS = terminal.ProcessTool()


@contextlib.asynccontextmanager
async def session(root: Path, **config: Any) -> AsyncIterator[ToolContext]:
    sandbox = LocalSandbox(root)
    await sandbox.start()
    ctx = ToolContext(sandbox=sandbox, settings=RunConfig(**{"tool_timeout": 10, **config}).tool_settings())
    try:
        yield ctx
    finally:
        await ctx.cleanup.aclose()
        await sandbox.close()


async def call(tool: Any, ctx: ToolContext, **args: Any) -> dict[str, Any]:
    text = await tool.run(args, ctx)
    data = json.loads(text)
    data["_failed"] = result_failed(text)
    return data


def test_command_output_and_exit_codes(tmp_path: Path) -> None:
    async def body() -> None:
        async with session(tmp_path) as ctx:
            r = await call(TERMINAL, ctx, command="echo token-42")
            assert r["output"] == "token-42\n" and r["exit_code"] == 0 and r["error"] is None
            assert not r["_failed"]
            r = await call(TERMINAL, ctx, command="echo out; echo err >&2; exit 3")
            assert r["output"] == "out\nerr\n" and r["exit_code"] == 3
            assert r["error"] is None and not r["_failed"]  # a non-zero exit is not a tool failure
            r = await call(TERMINAL, ctx, command="ls /definitely-missing")
            assert r["exit_code"] != 0 and "definitely-missing" in r["output"]

    asyncio.run(body())


def test_timeout_kills_process_tree_and_is_an_error(tmp_path: Path) -> None:
    async def body() -> None:
        async with session(tmp_path) as ctx:
            # The sleeps outlast the suite's per-test timeout: a command left to run to its end fails the
            # test instead of passing slowly, and 'never' would show it had.
            r = await call(TERMINAL, ctx, command="sleep 3600 & echo $!; sh -c 'echo $$; exec sleep 3600'; echo never",
                           timeout=1)
            assert r["error"].startswith("command timed out after 1s") and r["exit_code"] is None
            assert "never" not in r["output"]
            assert r["_failed"]
            pids = [int(p) for p in r["output"].split()]
            assert len(pids) == 2 and all(gone(p) for p in pids)

    asyncio.run(body())


def test_timeout_is_capped_by_the_run_setting(tmp_path: Path) -> None:
    async def body() -> None:
        async with session(tmp_path, tool_timeout=1) as ctx:
            # Asked for an hour (past the suite's per-test timeout): only the run's 1 s cap ends it.
            r = await call(TERMINAL, ctx, command="sleep 3600; echo never", timeout=3600)
            assert "timed out after 1s" in r["error"] and "never" not in r["output"]

    asyncio.run(body())


def test_long_output_keeps_head_and_tail(tmp_path: Path) -> None:
    async def body() -> None:
        async with session(tmp_path) as ctx:
            r = await call(TERMINAL, ctx, command="seq 1 100000")
            out = r["output"]
            assert out.startswith("1\n2\n3\n") and out.endswith("99999\n100000\n")
            assert "bytes truncated ...]" in out and len(out.encode()) < terminal.OUTPUT_CAP + 200
            assert r["exit_code"] == 0 and r["error"] is None

    asyncio.run(body())


def test_no_secrets_in_the_command_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "secret-xyz")
    monkeypatch.setenv("OPENROUTER_API_KEY", "secret-xyz")
    assert os.environ["OPENAI_API_KEY"] == "secret-xyz"

    async def body() -> None:
        async with session(tmp_path) as ctx:
            r = await call(TERMINAL, ctx, command="env; cat /proc/self/environ")
            assert r["exit_code"] == 0 and "HOME=" in r["output"]
            assert "secret-xyz" not in r["output"]

    asyncio.run(body())


def test_bad_arguments_are_error_results(tmp_path: Path) -> None:
    async def body() -> None:
        async with session(tmp_path) as ctx:
            for args in ({}, {"command": ""}, {"command": 5}, {"command": "ls", "timeout": -1},
                         {"command": "ls", "timeout": "soon"}):
                r = await call(TERMINAL, ctx, **args)
                assert r["_failed"] and r["error"]
            for args in ({"action": "explode"}, {}, {"action": "start"}, {"action": "poll", "id": "proc_9"}):
                r = await call(PROCESS, ctx, **args)
                assert r["_failed"] and r["error"]

    asyncio.run(body())


BWRAP = asyncio.run(probe())


@pytest.mark.parametrize("backend", ["local", pytest.param("bwrap", marks=pytest.mark.skipif(
    not BWRAP.usable, reason=f"bwrap not usable here: {BWRAP.detail}"))])
def test_commands_no_shell_can_take_are_error_results_on_every_backend(tmp_path: Path, backend: str) -> None:
    # A NUL byte once raised out of the tool (a traceback in the log); a 200 KB heredoc failed
    # the whole sample under local (E2BIG from exec), on every --resume again.
    async def body() -> None:
        sandbox = LocalSandbox(tmp_path) if backend == "local" else BwrapSandbox(tmp_path, network=NetworkMode.NONE)
        await sandbox.start()
        ctx = ToolContext(sandbox=sandbox, settings=RunConfig(tool_timeout=30).tool_settings())
        try:
            heredoc = "cat > big.txt <<'EOF'\n" + ("y" * 99 + "\n") * 2_000 + "EOF\nwc -c big.txt"  # 200 KB
            for tool, args, expect in ((TERMINAL, {"command": "echo a\0b"}, "NUL byte"),
                                       (PROCESS, {"action": "start", "command": "echo a\0b"}, "NUL byte"),
                                       (TERMINAL, {"command": heredoc}, "write_file"),
                                       (TERMINAL, {"command": heredoc, "background": True}, "write_file")):
                r = await call(tool, ctx, **args)
                assert r["_failed"] and expect in r["error"], r
            fits = "cat > ok.txt <<'EOF'\n" + ("z" * 99 + "\n") * 1_000 + "EOF\nwc -c < ok.txt"
            r = await call(TERMINAL, ctx, command=fits)  # 100 KB: still one command
            assert not r["_failed"] and r["output"].strip() == "100000", r
        finally:
            await ctx.cleanup.aclose()
            await sandbox.close()

    asyncio.run(body())


async def wait_exited(ctx: ToolContext, job_id: str) -> dict[str, Any]:
    """Poll until the job has exited, accumulating its output."""
    output = ""
    async with asyncio.timeout(10):
        while True:
            r = await call(PROCESS, ctx, action="poll", id=job_id)
            output += r["output"]
            if r["status"] == "exited":
                return {**r, "output": output}
            await asyncio.sleep(0.05)


def test_process_start_poll_kill_list(tmp_path: Path) -> None:
    async def body() -> None:
        async with session(tmp_path) as ctx:
            r = await call(PROCESS, ctx, action="start", command="echo hello; echo problem >&2; exit 7")
            assert r["id"] == "proc_1" and not r["_failed"]
            done = await wait_exited(ctx, "proc_1")
            assert done["output"] == "hello\nproblem\n" and done["exit_code"] == 7
            again = await call(PROCESS, ctx, action="poll", id="proc_1")
            assert again["output"] == ""  # only output produced since the last poll

            r = await call(PROCESS, ctx, action="start", command="echo $$; exec sleep 300")
            job2 = r["id"]
            listed = await call(PROCESS, ctx, action="list")
            assert {p["id"]: p["status"] for p in listed["processes"]} == {"proc_1": "exited", job2: "running"}
            assert list(ctx.sandbox.workspace.iterdir()) == []  # logs live outside the workspace
            pid = r["pid"]
            assert alive(pid)
            killed = await call(PROCESS, ctx, action="kill", id=job2)
            assert killed["status"] == "exited" and killed["signal"] == 9 and gone(pid)

    asyncio.run(body())


def test_a_sample_starting_jobs_without_end_holds_no_more_than_its_cap(tmp_path: Path) -> None:
    # The hostile model starts short jobs one after another. Each job's log is a descriptor of
    # the runner: exited jobs used to be dropped without closing it, so a sample could exhaust
    # the runner's descriptors and fail every other sample. Now a sample starts at most
    # MAX_JOBS, and every log is closed when it ends.
    fds = lambda: len(os.listdir("/proc/self/fd"))  # noqa: E731
    before = fds()

    async def body() -> None:
        async with session(tmp_path) as ctx:
            for i in range(terminal.MAX_JOBS):
                r = await call(PROCESS, ctx, action="start", command=f"echo job {i}; exit 0")
                assert not r["_failed"], r
                await ctx.sandbox._jobs[-1].wait(10)  # type: ignore[attr-defined]
            refused = await call(PROCESS, ctx, action="start", command="echo one more")
            assert refused["_failed"] and f"started {terminal.MAX_JOBS}" in refused["error"]
            assert (await call(PROCESS, ctx, action="poll", id="proc_1"))["output"] == "job 0\n"  # still readable
            listed = await call(PROCESS, ctx, action="list")
            assert len(listed["processes"]) == terminal.LIST_LAST
            assert listed["not_shown"] == terminal.MAX_JOBS - terminal.LIST_LAST
            assert listed["processes"][-1]["id"] == f"proc_{terminal.MAX_JOBS}"
            assert fds() <= before + terminal.MAX_JOBS + 8

    asyncio.run(body())
    assert fds() <= before + 2, "the jobs' logs outlived the sample"


def test_list_cuts_long_commands(tmp_path: Path) -> None:
    async def body() -> None:
        async with session(tmp_path) as ctx:
            await call(PROCESS, ctx, action="start", command="true # " + "x" * 10_000)
            listed = await call(PROCESS, ctx, action="list")
            assert len(listed["processes"][0]["command"]) == terminal.LIST_COMMAND_CHARS

    asyncio.run(body())


def test_terminal_background_and_poll_truncation(tmp_path: Path) -> None:
    async def body() -> None:
        async with session(tmp_path) as ctx:
            r = await call(TERMINAL, ctx, command="seq 1 100000", background=True)
            assert r["error"] is None and r["id"] == "proc_1" and "process tool" in r["output"]
            done = await wait_exited(ctx, "proc_1")
            assert done["exit_code"] == 0 and "bytes truncated ...]" in done["output"]
            assert done["output"].endswith("100000\n")

    asyncio.run(body())


def test_background_jobs_die_with_the_sample(tmp_path: Path) -> None:
    async def body() -> list[int]:
        pids = []
        async with session(tmp_path) as ctx:
            for _ in range(2):
                r = await call(PROCESS, ctx, action="start", command="sleep 300 & sleep 301")
                pids.append(r["pid"])
            assert list(ctx.sandbox.workspace.iterdir()) == []  # the logs are nowhere the model can reach
        return pids

    assert all(gone(p) for p in asyncio.run(body()))

    async def sandbox_close_alone() -> int:
        sandbox = LocalSandbox(tmp_path)
        await sandbox.start()
        ctx = ToolContext(sandbox=sandbox, settings=RunConfig().tool_settings())
        r = await call(PROCESS, ctx, action="start", command="exec sleep 300")
        await sandbox.close()  # even without the tool cleanup, closing the sandbox kills the job
        await ctx.cleanup.aclose()
        return r["pid"]

    assert gone(asyncio.run(sandbox_close_alone()))


def test_build_and_registry(tmp_path: Path) -> None:
    async def body() -> None:
        ready, missing = await build_toolsets(["terminal", "file"], RunConfig().tool_settings())
        assert not missing
        assert [t.name for t in ready["terminal"].tools] == ["terminal", "process"]
        assert [t.name for t in ready["file"].tools] == ["read_file", "write_file", "patch", "search_files"]
        for tool in ready["terminal"].tools + ready["file"].tools:
            fn = tool.schema()["function"]
            assert fn["description"] and fn["parameters"]["type"] == "object"
            assert set(fn["parameters"]["required"]) <= set(fn["parameters"]["properties"])

    asyncio.run(body())


def test_a_closed_sandbox_is_an_infrastructure_failure(tmp_path: Path) -> None:
    from trajforge.tools.tool import ToolInfraError
    from trajforge.tools.files import ReadFileTool

    async def body() -> None:
        sandbox = LocalSandbox(tmp_path)
        await sandbox.start()
        ctx = ToolContext(sandbox=sandbox, settings=RunConfig().tool_settings())
        await sandbox.close()
        for tool, args in ((TERMINAL, {"command": "true"}), (PROCESS, {"action": "start", "command": "true"}),
                           (ReadFileTool(), {"path": "a.txt"})):
            with pytest.raises(ToolInfraError):
                await tool.run(args, ctx)
        await ctx.cleanup.aclose()

    asyncio.run(body())
