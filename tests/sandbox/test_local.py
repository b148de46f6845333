"""LocalSandbox and the process layer: real shells in real temp dirs, real process trees."""

from __future__ import annotations

import asyncio
import os
import select
import subprocess
import sys
from pathlib import Path

import pytest

from trajforge.config import RunConfig
from trajforge.sandbox.interface import PathEscapeError, SandboxError
from trajforge.sandbox.backends.bwrap.bwrap_sandbox import BwrapSandbox
from trajforge.sandbox.backends.bwrap.bwrap_backend import probe
from tests.support.sandboxes import create_sandbox
from trajforge.sandbox.backends.local import reaper
from trajforge.sandbox.factory import SandboxProvider
from trajforge.sandbox.backends.local.local_sandbox import LocalSandbox
from trajforge.sandbox.process import Limits


def alive(pid: int) -> bool:
    """True while `pid` runs; a zombie waiting for init to reap it counts as dead."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def gone(pid: int, within: float = 60.0) -> bool:
    """True once `pid` has exited (a zombie counts), waited for as an event on its pidfd; `within`
    only keeps a process that was never killed from hanging the test, so it is generous: a killed
    process exits long before it even on a loaded host."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], within)[0])
    finally:
        os.close(fd)


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


async def started(root: Path, **kw) -> LocalSandbox:  # type: ignore[no-untyped-def]
    sb = LocalSandbox(root, **kw)
    await sb.start()
    return sb


def test_workspace_layout_and_cwd_mapping(tmp_path: Path) -> None:
    async def body() -> None:
        sb = await started(tmp_path, cwd="proj/src")
        assert sb.workspace.parent == tmp_path.resolve() and sb.workspace.name.startswith("sample-")
        assert sb.workdir == str(sb.workspace)
        assert sb.cwd == str(sb.workspace / "proj" / "src") and Path(sb.cwd).is_dir()
        res = await sb.exec("pwd", timeout=5)
        assert res.stdout.strip() == str(sb.cwd)
        other = await started(tmp_path, cwd="/app")  # absolute cwd lands inside the workspace
        assert other.cwd == str(other.workspace / "app") and other.workspace != sb.workspace
        await sb.close()
        await other.close()
        with pytest.raises(SandboxError, match="outside"):
            await started(tmp_path, cwd="../escape")

    run(body())


def test_exec_output_exit_code_and_stderr(tmp_path: Path) -> None:
    async def body() -> None:
        async with LocalSandbox(tmp_path) as sb:
            res = await sb.exec("echo token-123; echo oops >&2; exit 3", timeout=5)
            assert res.stdout == "token-123\n" and res.stderr == "oops\n"
            assert res.exit_code == 3 and not res.timed_out and not res.truncated

    run(body())


def test_timeout_kills_the_whole_process_tree(tmp_path: Path) -> None:
    async def body() -> None:
        async with LocalSandbox(tmp_path) as sb:
            # The sleeps outlast the suite's per-test timeout: a command left to run to its end, or
            # an exec waiting for its children's pipes, fails the test instead of passing slowly.
            res = await sb.exec("sleep 3600 & echo $!; sh -c 'echo $$; exec sleep 3600'; echo never", timeout=1)
            assert res.timed_out and res.exit_code is None and "never" not in res.stdout
            pids = [int(p) for p in res.stdout.split()]
            assert len(pids) == 2
            assert all(gone(p) for p in pids)
            res = await sb.exec("sh -c 'sleep 3600 & echo $!; wait'", timeout=1)
            assert res.timed_out and gone(int(res.stdout.split()[0]))

    run(body())


def test_attached_background_child_does_not_block_until_timeout(tmp_path: Path) -> None:
    async def body() -> None:
        async with LocalSandbox(tmp_path) as sb:
            # Neither the child (an hour) nor the command's timeout (an hour) ends before the suite's
            # per-test timeout: only the detach grace lets exec return with the shell's exit code.
            res = await sb.exec("sleep 3600 & echo $!", timeout=3600)
            assert res.exit_code == 0 and not res.timed_out
            assert "process tool" in res.stderr and gone(int(res.stdout))

    run(body())


def test_detached_and_setsid_children_survive_until_close(tmp_path: Path) -> None:
    async def body() -> None:
        sb = await started(tmp_path)
        res = await sb.exec("nohup sleep 300 >/dev/null 2>&1 & echo $!; setsid sleep 301 >/dev/null 2>&1 & echo $!", timeout=5)
        pids = [int(p) for p in res.stdout.split()]
        await asyncio.sleep(0.2)
        assert all(alive(p) for p in pids)
        await sb.close()
        assert all(gone(p) for p in pids)

    run(body())


def test_output_is_capped_with_head_tail_and_marker(tmp_path: Path) -> None:
    async def body() -> None:
        async with LocalSandbox(tmp_path, output_cap=1000) as sb:
            res = await sb.exec("printf 'HEAD'; head -c 200000 /dev/zero | tr '\\0' a; printf 'TAIL'", timeout=10)
            assert res.truncated and res.exit_code == 0
            assert res.stdout.startswith("HEAD") and res.stdout.endswith("TAIL")
            assert "\n[... 199008 bytes truncated ...]\n" in res.stdout
            assert len(res.stdout) < 1100

    run(body())


def test_environment_is_clean(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "secret-xyz")
    monkeypatch.setenv("OPENROUTER_API_KEY", "secret-xyz")

    async def body() -> None:
        async with LocalSandbox(tmp_path) as sb:
            res = await sb.exec("env", timeout=5)
            assert "secret-xyz" not in res.stdout
            env = dict(line.split("=", 1) for line in res.stdout.splitlines())
            assert env["HOME"] == sb.workdir and env["LANG"] == "C.UTF-8" and env["TERM"] == "dumb"
            assert ".venv" not in env["PATH"]

    run(body())


def test_file_paths_are_confined_to_the_workspace(tmp_path: Path) -> None:
    async def body() -> None:
        async with LocalSandbox(tmp_path, cwd="sub") as sb:
            ws = sb.workspace
            assert await sb.write_file("a.txt", b"a") == "sub/a.txt" and (ws / "sub" / "a.txt").read_bytes() == b"a"
            assert await sb.write_file("../b.txt", b"b") == "b.txt"
            assert await sb.write_file(str(ws / "c.txt"), b"c") == "c.txt"
            assert await sb.write_file("~/d.txt", b"d") == "d.txt"
            (ws / "inner").mkdir()
            (ws / "link-in").symlink_to(ws / "inner")
            assert await sb.write_file(str(ws / "link-in" / "f"), b"f") == "inner/f"
            assert await sb.read_file("../inner/f") == b"f"
            (ws / "root").symlink_to("/")
            (ws / "dangling").symlink_to("/nonexistent-dir/x")
            for bad in ("../../etc/passwd", "/etc/passwd", "/tmp/x", str(ws / "root" / "etc" / "passwd"),
                        "../root/etc", str(ws / "dangling"), "", "a\0b"):
                with pytest.raises(PathEscapeError):
                    await sb.read_file(bad)
                with pytest.raises(PathEscapeError):
                    await sb.write_file(bad, b"x")

    run(body())


def test_close_kills_background_jobs_and_removes_workspace(tmp_path: Path) -> None:
    async def body() -> None:
        sb = await started(tmp_path)
        proc = await sb.spawn("echo started; exec sleep 300")
        assert proc.returncode is None and alive(proc.pid)
        async with asyncio.timeout(5):
            while not (await proc.read(0, 100)).head:
                await asyncio.sleep(0.02)
        assert (await proc.read(0, 100)).head == b"started\n"
        ws = sb.workspace
        await sb.close()
        assert proc.returncode is not None and gone(proc.pid)
        assert not ws.exists()
        await sb.close()  # idempotent
        with pytest.raises(SandboxError):
            await sb.exec("true", timeout=1)

        kept = await started(tmp_path, keep=True)
        (kept.workspace / "result.txt").write_text("x")
        job = await kept.spawn("sleep 300")
        await kept.close()
        assert gone(job.pid) and (kept.workspace / "result.txt").exists()

    run(body())


def test_cancelled_exec_kills_its_process(tmp_path: Path) -> None:
    async def body() -> None:
        sb = await started(tmp_path)
        try:
            task = asyncio.create_task(sb.exec("echo $$ > pid; exec sleep 300", timeout=60))
            pidfile = sb.workspace / "pid"
            async with asyncio.timeout(5):
                while not pidfile.exists() or not pidfile.read_text().strip():
                    await asyncio.sleep(0.02)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert gone(int(pidfile.read_text()))
        finally:
            await sb.close()

    run(body())


def test_workspace_recreated_if_the_model_deletes_it(tmp_path: Path) -> None:
    async def body() -> None:
        async with LocalSandbox(tmp_path, cwd="w") as sb:
            await sb.exec("rm -rf ~", timeout=5)
            res = await sb.exec("pwd", timeout=5)
            assert res.exit_code == 0 and res.stdout.strip() == str(sb.cwd)

    run(body())


def test_rlimits_apply_to_commands(tmp_path: Path) -> None:
    async def body() -> None:
        limits = Limits(file_size_bytes=1000, cpu_seconds=1)
        async with LocalSandbox(tmp_path, limits=limits) as sb:
            res = await sb.exec("head -c 5000 /dev/zero > big; echo rc=$?", timeout=10)
            assert (sb.workspace / "big").stat().st_size <= 1000 and "rc=0" not in res.stdout
            res = await sb.exec("while :; do :; done", timeout=20)
            assert not res.timed_out and res.exit_code != 0  # SIGXCPU, long before the timeout

    run(body())


def test_factory_dispatch(tmp_path: Path) -> None:
    async def body() -> None:
        sb = await create_sandbox(RunConfig(sandbox="local", keep_workspaces=True), cwd="app", image=None, root=tmp_path)
        assert isinstance(sb, LocalSandbox) and Path(sb.cwd).is_dir()
        res = await sb.exec("echo ok", timeout=5)
        assert res.stdout == "ok\n"
        await sb.close()
        assert sb.workspace.exists()  # keep_workspaces
        auto = await create_sandbox(RunConfig(), cwd=None, image=None, root=tmp_path)
        expected = BwrapSandbox if (await probe()).usable else LocalSandbox  # auto: bwrap where it works
        assert isinstance(auto, expected)
        await auto.close()
        assert not auto.workspace.exists()
        with pytest.raises(SandboxError, match="needs an image"):
            await create_sandbox(RunConfig(sandbox="container"), cwd=None, image=None, root=tmp_path)
        with pytest.raises(SandboxError, match="cannot apply --sandbox_network none: the local sandbox has no network"):
            await create_sandbox(RunConfig(sandbox="local", sandbox_network="none"), cwd=None, image=None,
                                 root=tmp_path)
        blocker = tmp_path / "a-file"
        blocker.write_text("")
        with pytest.raises(SandboxError, match="cannot create a workspace"):
            await create_sandbox(RunConfig(sandbox="local"), cwd=None, image=None, root=blocker)

    run(body())


CGROUPS_OK = reaper.Cgroups.open()
if CGROUPS_OK is not None:
    CGROUPS_OK.close()


@pytest.mark.skipif(CGROUPS_OK is None, reason="no writable cgroup v2 here (needs root or delegation)")
def test_escaped_processes_die_with_the_sample(tmp_path: Path) -> None:
    """`setsid env -i sleep &` leaves the process group and drops the environment tag: only the
    sample's cgroup still knows it."""
    async def body() -> list[int]:
        async with SandboxProvider(RunConfig(sandbox="local").sandbox_settings()) as provider:
            sb = await provider.create(cwd=None, image=None, root=tmp_path)
            try:
                res = await sb.exec("setsid env -i sleep 1000 > /dev/null 2>&1 & echo $!", timeout=10)
                job = await sb.spawn("setsid env -i sleep 1001 > /dev/null 2>&1 & echo $!; exec sleep 1002")
                await job.wait(2)
                pids = [int(res.stdout.split()[-1]), int((await job.read(0, 100)).head.split()[0]), job.pid]
                assert all(alive(p) for p in pids)
            finally:
                await sb.close()
            return pids

    assert all(gone(p) for p in run(body()))


@pytest.mark.skipif(CGROUPS_OK is None, reason="no writable cgroup v2 here (needs root or delegation)")
def test_leftovers_of_a_killed_runner_are_killed_at_the_next_start(tmp_path: Path) -> None:
    script = (f"import asyncio, sys\nsys.path.insert(0, {str(Path(__file__).parents[2] / 'src')!r})\n"
              "from pathlib import Path\nfrom trajforge.config import RunConfig\n"
              "from trajforge.sandbox.factory import SandboxProvider\n"
              "async def main():\n"
              "    p = await SandboxProvider(RunConfig(sandbox='local').sandbox_settings()).start()\n"
              f"    sb = await p.create(cwd=None, image=None, root=Path({str(tmp_path)!r}))\n"
              "    r = await sb.exec('setsid env -i sleep 1003 > /dev/null 2>&1 & echo $!', timeout=10)\n"
              "    print(r.stdout.strip(), flush=True)\n"
              "    await asyncio.sleep(3600)\n"
              "asyncio.run(main())\n")
    runner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert runner.stdout is not None
    leftover = int(runner.stdout.readline())
    runner.kill()  # no close(): the sleep survives its runner...
    runner.wait()
    assert alive(leftover)
    cgroups = reaper.Cgroups.open()  # ...until the next run starts
    assert cgroups is not None
    try:
        assert gone(leftover)
    finally:
        cgroups.close()


def test_a_background_jobs_log_in_the_hosts_tmp_is_capped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The log is in the host's /tmp, outside the sample's disk: at most JOB_LOG_BYTES of it (64 MiB,
    1 MiB here), and a job writing more ends, as a container job does; a job that writes less finds
    every byte in its log the moment it has ended."""
    from trajforge.sandbox.backends.local import joblog

    monkeypatch.setattr(joblog, "JOB_LOG_BYTES", 1 << 20)

    async def body() -> None:
        sb = await started(tmp_path)
        try:
            big = await sb.spawn("head -c 3000000 /dev/zero | tr '\\0' x; echo after")
            assert await big.wait(30) not in (None, 0)
            chunk = await big.read(0, 4 << 20)
            assert chunk.end == 1 << 20 and chunk.head == b"x" * (1 << 20)
            small = await sb.spawn("head -c 500000 /dev/zero | tr '\\0' y; echo done")
            assert await small.wait(30) == 0
            chunk = await small.read(0, 1 << 20)
            assert chunk.head == b"y" * 500000 + b"done\n"
        finally:
            await sb.close()

    run(body())
