"""Sandbox uids are unique on the host (host/uids.py): within a process, between processes (two
runs, two test suites), and a killed process's ids are free again.

Before, each sandbox drew its uid at random from 200 million: two of 5,000 sandboxes alive at
once shared one about 6% of the time, and with it the kernel's per-uid limits and accounts. The
allocator's tests use a tiny range (16 ids in blocks of 8) and a lease directory of their own,
where a random draw would collide almost surely; the last test runs two real runs' sandboxes."""

from __future__ import annotations

import asyncio
import inspect
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import REPO
from trajforge.sandbox.backends.bwrap.bwrap_backend import probe
from trajforge.sandbox.host import uids
from trajforge.sandbox.host.uids import SANDBOX_UIDS, Leases
from trajforge.sandbox.interface import SandboxError

BASE, SPAN, BLOCK = 1000, 16, 8
HOLDER = """
import sys
from pathlib import Path
{mutant}
from trajforge.sandbox.host.uids import Leases
leases = Leases("t", {base}, {span}, {block}, leases=Path(sys.argv[1]))
try:
    print(" ".join(str(leases.take()) for _ in range(int(sys.argv[2]))), flush=True)
except Exception as e:
    print("refused", type(e).__name__, flush=True)
sys.stdin.readline()  # holds its leases until told, or killed
"""


def test_a_process_never_hands_out_one_id_twice(tmp_path: Path) -> None:
    leases = Leases("t", BASE, SPAN, BLOCK, leases=tmp_path)
    taken = [leases.take() for _ in range(SPAN)]
    assert sorted(taken) == list(range(BASE, BASE + SPAN))  # every one, once
    with pytest.raises(SandboxError, match="every block"):
        leases.take()
    leases.give_back(BASE + 5)
    assert leases.take() == BASE + 5  # the one free again, and only it
    leases.close()


class Holder:
    """A process holding `n` ids of the test range until it is told to go, or killed."""

    def __init__(self, leases: Path, n: int, mutant: str = "") -> None:
        code = HOLDER.format(mutant=mutant, base=BASE, span=SPAN, block=BLOCK)
        self.proc = subprocess.Popen([sys.executable, "-c", code, str(leases), str(n)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO / "src")})
        assert self.proc.stdout is not None
        self.line = self.proc.stdout.readline().strip()  # once its ids are taken

    @property
    def ids(self) -> set[int]:
        return set(map(int, self.line.split())) if not self.line.startswith("refused") else set()

    def end(self, kill: bool = False) -> None:
        if kill:
            self.proc.send_signal(signal.SIGKILL)
        else:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        self.proc.wait(30)


def test_processes_never_share_an_id_and_a_killed_one_s_go_back(tmp_path: Path, mutant: str = "") -> None:
    first = Holder(tmp_path, BLOCK, mutant)
    second = Holder(tmp_path, BLOCK, mutant)
    try:
        assert len(first.ids) == len(second.ids) == BLOCK and not first.ids & second.ids, (first.line, second.line)
        third = Holder(tmp_path, 1, mutant)  # every block is leased by a live process
        assert third.line == "refused SandboxError", third.line
        third.end()
        first.end(kill=True)  # SIGKILL: nothing of it can give its block back but the kernel
        fourth = Holder(tmp_path, BLOCK, mutant)
        assert fourth.ids == first.ids, (fourth.line, first.line)  # its block, free again
        fourth.end()
    finally:
        for holder in (first, second):
            if holder.proc.poll() is None:
                holder.end(kill=True)


def test_without_the_lease_s_lock_processes_collide(tmp_path: Path) -> None:
    """Mutation check: leases that lock nothing are caught."""
    with pytest.raises(AssertionError):
        test_processes_never_share_an_id_and_a_killed_one_s_go_back(
            tmp_path, mutant="import fcntl; fcntl.flock = lambda *args: None")


def test_without_the_in_use_check_a_process_hands_out_an_id_twice(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutation check: a take that does not skip the ids in use is caught."""
    source = textwrap.dedent(inspect.getsource(Leases.take))
    assert source.count("if offset not in live:") == 1
    namespace = dict(vars(uids))
    exec(compile(source.replace("if offset not in live:", "if True:"), "mutant", "exec"), namespace)
    monkeypatch.setattr(Leases, "take", namespace["take"])
    with pytest.raises(AssertionError):
        test_a_process_never_hands_out_one_id_twice(tmp_path)


STATUS = asyncio.run(probe())
RUN = """
import asyncio, os, sys, tempfile
from pathlib import Path
from trajforge.catalog.sandboxes import NetworkMode
from trajforge.sandbox.backends.bwrap.bwrap_sandbox import BwrapSandbox, root_runtime

async def main():
    with tempfile.TemporaryDirectory() as tmp:
        runtime = await root_runtime(None, NetworkMode.NONE)
        samples = [BwrapSandbox(Path(tmp), network=NetworkMode.NONE, runtime=runtime) for _ in range(int(sys.argv[1]))]
        await asyncio.gather(*(sb.start() for sb in samples))
        seen = [int((await sb.exec("id -u", timeout=30)).stdout) for sb in samples]
        assert seen == [sb.uid for sb in samples], seen
        print(" ".join(map(str, seen)), flush=True)
        await asyncio.to_thread(sys.stdin.readline)  # every sandbox alive until the test has both runs' uids
        await asyncio.gather(*(sb.close() for sb in samples))
        await runtime.aclose()

asyncio.run(main())
"""


@pytest.mark.skipif(not STATUS.usable or STATUS.mode != "root", reason=f"needs root-mode bwrap ({STATUS.detail})")
def test_two_runs_at_once_give_their_samples_uids_of_their_own() -> None:
    """Two runner processes, six sandboxes alive in each: twelve uids, each a sample's alone, from
    one leased block per run (where a random draw would spread them over the whole range)."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    runs = [subprocess.Popen([sys.executable, "-c", RUN, "6"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, env=env) for _ in range(2)]
    try:
        got = []
        for run in runs:
            assert run.stdout is not None
            got.append([int(x) for x in run.stdout.readline().split()])
    finally:
        for run in runs:
            assert run.stdin is not None
            run.stdin.close()
        codes = [run.wait(120) for run in runs]
    assert codes == [0, 0] and [len(g) for g in got] == [6, 6], (codes, got)
    _, base, span, block = SANDBOX_UIDS
    assert len(set(got[0]) | set(got[1])) == 12 and all(base <= u < base + span for g in got for u in g), got
    blocks = [{(u - base) // block for u in g} for g in got]
    assert all(len(b) == 1 for b in blocks) and blocks[0] != blocks[1], blocks
