"""kill_tagged and its memory of /proc: what a scan remembers never hides a process it must kill."""

from __future__ import annotations

import os
import secrets
import subprocess
import time

import pytest

from trajforge.sandbox import process
from trajforge.sandbox.host import tagkill

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs Linux /proc")


def _tagged_sleep(tag: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(["sleep", "60"], env={"PATH": process.SAFE_PATH, "TF_TEST_TAG": tag},
                            start_new_session=True)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # until exec has replaced the forked copy of our environment
        try:
            with open(f"/proc/{proc.pid}/environ", "rb") as f:
                if f"TF_TEST_TAG={tag}".encode() in f.read():
                    return proc
        except OSError:
            pass
        time.sleep(0.01)
    proc.kill()
    raise AssertionError("tagged process did not start")


def test_remembered_and_new_processes_are_both_killed() -> None:
    a, b = secrets.token_hex(4), secrets.token_hex(4)
    first = _tagged_sleep(a)
    try:
        assert tagkill.kill_tagged(f"TF_TEST_TAG={secrets.token_hex(4)}") == 0  # remembers `first` as a
        assert first.poll() is None
        second = _tagged_sleep(b)  # started after that scan: not in its memory
        try:
            assert tagkill.kill_tagged(f"TF_TEST_TAG={b}") == 1
            assert second.wait(5) == -9 and first.poll() is None
            assert tagkill.kill_tagged(f"TF_TEST_TAG={a}") == 1  # found through the memory
            assert first.wait(5) == -9
        finally:
            second.kill()
            second.wait()
    finally:
        first.kill()
        first.wait()


def test_memory_expires(monkeypatch: pytest.MonkeyPatch) -> None:
    tag = secrets.token_hex(4)
    tagkill.kill_tagged(f"TF_TEST_TAG={tag}")
    stamp, _ = tagkill._tag_cache[b"TF_TEST_TAG="]
    monkeypatch.setattr(tagkill, "_TAG_CACHE_SECONDS", -1.0)  # every call now starts afresh
    tagkill.kill_tagged(f"TF_TEST_TAG={tag}")
    assert tagkill._tag_cache[b"TF_TEST_TAG="][0] > stamp


def test_values_of_a_variable_are_read_exactly() -> None:
    tag = secrets.token_hex(4)
    proc = _tagged_sleep(tag)
    try:
        assert tagkill._env_values(str(proc.pid), b"TF_TEST_TAG=") == {tag.encode()}
        assert tagkill._env_values(str(proc.pid), b"TF_TEST_TA=") == frozenset()
        assert tagkill._env_values("999999999", b"TF_TEST_TAG=") == frozenset()  # no such process
    finally:
        proc.kill()
        proc.wait()


def test_with_wait_it_returns_once_the_killed_have_exited() -> None:
    tag = secrets.token_hex(4)
    proc = _tagged_sleep(tag)
    try:
        assert tagkill.kill_tagged(f"TF_TEST_TAG={tag}", wait=5.0) == 1
        # Exited already, not merely signalled: waitid without waiting finds it dead.
        info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        assert info is not None and info.si_status == 9
    finally:
        proc.kill()
        proc.wait()
