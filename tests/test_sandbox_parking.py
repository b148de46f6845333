"""Parking (root-mode bwrap, sandbox/bwrap.py): a sample that holds nothing in its slot after a
command gives the slot back and takes one again at its next operation. Played by a sample that
tries to keep something across the move (a file, a process, an IPC object, a changed mode) or
to see that it moved; and the pool that a burst of such samples needs."""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from trajforge.sandbox.bwrap import BwrapSandbox, root_runtime
from trajforge.sandbox.bwrap_root import RootRuntime
from trajforge.sandbox.bwrap_backend import probe
from trajforge.sandbox.channel import SlotIdle
from trajforge.sandbox.resources import SampleLimits, cgroup_parent
from trajforge.sandbox.slots import MAKING

STATUS = asyncio.run(probe())
pytestmark = pytest.mark.skipif(not STATUS.usable or STATUS.mode != "root",
                                reason=f"needs root-mode bwrap ({STATUS.detail})")
LIMITS = SampleLimits(memory=512 << 20 if cgroup_parent() else None, disk=64 << 20, tmp_size=64 << 20,
                      shm_size=32 << 20)
LOOK = "id -u; pwd; stat -c '%a %u %g' .; ls -lAn --time-style=+ .; ls -A /tmp /dev/shm; ipcs -m 2>/dev/null | grep -c 0x || true"


def _sandbox(root: Path, runtime: object, *, cwd: str | None = None, park: bool = True) -> BwrapSandbox:
    return BwrapSandbox(root, network=False, sample_limits=LIMITS, runtime=runtime, cwd=cwd,  # type: ignore[arg-type]
                        park=park)


def _with_sample(tmp_path: Path, body: Callable[[BwrapSandbox, RootRuntime], Awaitable[None]]) -> None:
    """`body` with a started parking sample of a runtime of its own, both closed after it."""
    async def main() -> None:
        runtime = await root_runtime(None, "none", (), LIMITS)
        try:
            sb = _sandbox(tmp_path, runtime)
            await sb.start()
            try:
                await body(sb, runtime)
            finally:
                await sb.close()
        finally:
            await runtime.aclose()

    asyncio.run(main())


@pytest.mark.parametrize("cwd", [None, "sub/dir", "/app/src"])
def test_a_sample_holding_nothing_parks_and_finds_its_sandbox_as_it_left_it(tmp_path: Path, cwd: str | None) -> None:
    async def main() -> None:
        runtime = await root_runtime(None, "none", (), LIMITS)
        try:
            a = _sandbox(tmp_path, runtime, cwd=cwd)
            await a.start()
            try:
                before = (await a.exec(LOOK, timeout=30)).stdout
                assert a._slot is None and a.workspace is None  # parked: its slot is free for another
                pool = runtime.pool(tmp_path)
                assert pool.parked == 1
                b = _sandbox(tmp_path, runtime, park=False)  # takes the slot a gave back
                await b.start()
                await b.exec("echo b > mine", timeout=10)
                after = (await a.exec(LOOK, timeout=30)).stdout  # a takes another slot
                assert a.helper_pid != b.helper_pid and a._slot is not None and pool.parked == 0  # kept now
                assert after == before, (before, after)  # same uid, cwd, modes and owners, nothing else
                assert "mine" not in after
                await b.close()
                # reading and writing work on the new slot; the file keeps a there from now on
                assert (await a.write_file("note.txt", b"kept")).endswith("note.txt")
                await a.exec("true", timeout=10)
                assert a._slot is not None
                assert await a.read_file("note.txt") == b"kept"
            finally:
                await a.close()
            assert pool.parked == 0
        finally:
            await runtime.aclose()
        assert not any(tmp_path.glob(".slots.*")), list(tmp_path.iterdir())

    asyncio.run(main())


KEEPERS = {
    "a file": ("echo x > f", "cat f", "x"),
    "an empty file": ("touch f", "ls", "f"),
    "a directory": ("mkdir d", "ls", "d"),
    "a symlink": ("ln -s /etc/hostname l", "readlink l", "/etc/hostname"),
    "a mode": ("chmod 755 .", "stat -c %a .", "755"),
    "an extended attribute": ("python3 -c 'import os; os.setxattr(\".\", \"user.k\", b\"v\")'",
                              "python3 -c 'import os; print(os.getxattr(\".\", \"user.k\").decode())'", "v"),
    "a file in /tmp": ("echo x > /tmp/f", "cat /tmp/f", "x"),
    "a file in /dev/shm": ("echo x > /dev/shm/f", "cat /dev/shm/f", "x"),
    "a process": ("setsid sleep 1000 > /dev/null 2>&1 &", "pgrep -x sleep > /dev/null && echo up", "up"),
    "a process that will change a file": ("echo x > f; (sleep 0.3; rm f) > /dev/null 2>&1 &", "sleep 1; ls", ""),
}
if shutil.which("ipcmk"):
    KEEPERS["an IPC object"] = ("ipcmk -M 4096 > /dev/null", "ipcs -m | grep -c 0x", "1")


@pytest.mark.parametrize("what", sorted(KEEPERS))
def test_a_sample_holding_anything_keeps_its_slot(tmp_path: Path, what: str) -> None:
    make, look, expect = KEEPERS[what]

    async def body(sb: BwrapSandbox, runtime: RootRuntime) -> None:
        helper = sb.helper_pid
        await sb.exec(make, timeout=10)
        assert sb._slot is not None and sb.helper_pid == helper, what
        other = _sandbox(tmp_path, runtime, park=False)  # a neighbour: it must get another slot
        await other.start()
        assert other.helper_pid != helper
        await other.close()
        assert (await sb.exec(look, timeout=10)).stdout.strip() == expect, what
        assert sb.helper_pid == helper

    _with_sample(tmp_path, body)


def test_only_the_first_command_parks(tmp_path: Path) -> None:
    """A sample back for more keeps the slot it takes: moving costs a sample's set-up per move."""
    async def body(sb: BwrapSandbox, runtime: RootRuntime) -> None:
        await sb.exec("true", timeout=10)
        assert sb._slot is None  # parked
        await sb.exec("true", timeout=10)
        helper = sb.helper_pid
        for _ in range(3):
            assert (await sb.exec("echo again", timeout=10)).stdout == "again\n"
            assert sb._slot is not None and sb.helper_pid == helper

    _with_sample(tmp_path, body)


def test_a_sample_with_a_job_never_parks(tmp_path: Path) -> None:
    async def body(sb: BwrapSandbox, runtime: RootRuntime) -> None:
        job = await sb.spawn("echo done")
        assert await job.wait(10) == 0
        await sb.exec("true", timeout=10)  # the job's log is the sample's still
        assert sb._slot is not None

    _with_sample(tmp_path, body)


def test_operations_in_flight_keep_the_slot_until_the_last_ends(tmp_path: Path) -> None:
    """Two commands at once: the first to end must not park the sample under the second."""
    async def body(sb: BwrapSandbox, runtime: RootRuntime) -> None:
        slow = asyncio.ensure_future(sb.exec("sleep 0.5; echo slow", timeout=10))
        await asyncio.sleep(0.1)
        assert (await sb.exec("echo fast", timeout=10)).stdout == "fast\n"
        assert sb._slot is not None
        assert (await slow).stdout == "slow\n"
        assert sb._slot is None  # now it holds nothing

    _with_sample(tmp_path, body)


def test_a_burst_of_first_calls_shares_a_few_slots(tmp_path: Path) -> None:
    """40 samples call their first tool at once and hold nothing after it: the pool makes slots
    only a few at a time and hands the ones given back to the samples still waiting."""
    async def main() -> None:
        runtime = await root_runtime(None, "none", (), LIMITS)
        try:
            boxes = [_sandbox(tmp_path, runtime) for _ in range(40)]
            pool = runtime.pool(tmp_path)
            make, at_once, most = pool._make, [0], [0]

            async def counted(index: int) -> object:
                at_once[0] += 1
                most[0] = max(most[0], at_once[0])
                try:
                    return await make(index)
                finally:
                    at_once[0] -= 1

            pool._make = counted  # type: ignore[method-assign]

            async def one(sb: BwrapSandbox) -> str:
                await sb.start()  # the lazy sandbox's first use (sandbox/lazy.py)
                return (await sb.exec("echo ok", timeout=30)).stdout

            assert await asyncio.gather(*(one(sb) for sb in boxes)) == ["ok\n"] * 40
            await pool.settle()  # slots still being made when the last sample got one go idle
            made = next(pool._ids)
            assert most[0] == MAKING and made < 40, (most, made)  # slots given back were handed on
            assert len(pool._free) == made and pool.parked == 40
            await asyncio.gather(*(sb.close() for sb in boxes))
            assert pool.parked == 0
        finally:
            await runtime.aclose()
        assert not any(tmp_path.glob(".slots.*"))

    asyncio.run(main())


def test_a_caller_cancelled_while_waiting_for_a_slot_leaks_none(tmp_path: Path) -> None:
    async def main() -> None:
        runtime = await root_runtime(None, "none", (), LIMITS)
        try:
            pool = runtime.pool(tmp_path)
            tasks = [asyncio.ensure_future(pool.acquire()) for _ in range(10)]
            await asyncio.sleep(0)
            for t in tasks[::2]:
                t.cancel()
            done = await asyncio.gather(*tasks, return_exceptions=True)
            slots = [s for s in done if not isinstance(s, BaseException)]
            assert len(slots) == 5
            await pool.settle()
            made = next(pool._ids)
            assert len(pool._free) == made - 5  # every other slot made is idle, none lost
            for slot in slots:
                await pool.release(slot, None, keep=False, clean_exit=True)
            assert len(pool._free) == made
        finally:
            await runtime.aclose()
        assert not any(tmp_path.glob(".slots.*"))

    asyncio.run(main())


def test_a_request_sent_as_the_sample_parks_runs_on_its_next_slot(tmp_path: Path) -> None:
    """The helper ends the sample after a command; a second request of the sample, sent before
    the runner read that exit, is refused unrun by the helper and runs on the sample's next slot."""
    async def body(sb: BwrapSandbox, runtime: RootRuntime) -> None:
        assert sb._channel is not None
        token = sb._channel.token
        first = asyncio.ensure_future(sb.exec("true", timeout=10))
        for _ in range(3):
            await asyncio.sleep(0)  # its request is sent
        time.sleep(0.5)  # the loop held: the helper runs it, parks, and reports it
        second = asyncio.ensure_future(sb.exec("echo second; id -u", timeout=10))  # sent before that is read
        assert (await first).exit_code == 0
        assert (await second).stdout == f"second\n{sb.uid}\n"
        # it ran after the sample took a slot again (a new token): it had not run before the
        # sample parked (it would have kept the sample in its first slot, with its token)
        assert sb._slot is not None and sb._channel is not None and sb._channel.token != token

    _with_sample(tmp_path, body)


def test_a_request_of_a_sample_that_left_the_slot_is_refused(tmp_path: Path) -> None:
    """Whatever the runner's timing, a slot's helper runs requests of its current sample only:
    one carrying an earlier sample's token does nothing in the next sample's sandbox."""
    async def main() -> None:
        runtime = await root_runtime(None, "none", (), LIMITS)
        try:
            a = _sandbox(tmp_path, runtime)
            await a.start()
            assert a._channel is not None
            channel, old = a._channel, a._channel.token
            await a.exec("true", timeout=10)  # parks
            b = _sandbox(tmp_path, runtime, park=False)
            await b.start()
            try:
                assert b._channel is channel and channel.token != old
                for request in ({"op": "exec", "cmd": "echo a > /workspace/from-a", "cwd": None, "cap": 1000},
                                {"op": "write", "path": "from-a", "how": "overwrite"},
                                {"op": "kill", "pgid": 2}):
                    with pytest.raises(SlotIdle):
                        await channel.call({**request, "tok": old}, b"x")
                assert (await b.exec("ls -A", timeout=10)).stdout == ""
            finally:
                await b.close()
                await a.close()
        finally:
            await runtime.aclose()

    asyncio.run(main())
